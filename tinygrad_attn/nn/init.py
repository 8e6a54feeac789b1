"""Weight initialisation, in place, with PyTorch's names and formulas.

Every function fills `tensor.data` (keeping its dtype and identity) with
draws from the framework's generator, so `tinygrad_attn.manual_seed(n)`
makes initialisation reproducible (or from `generator=`, a numpy Generator,
where PyTorch takes a torch.Generator). Each returns the tensor.

fan_in / fan_out of a weight of shape (out, in, *kernel) are
in * prod(kernel) and out * prod(kernel): a Linear weight (out, in) has
fan_in = in, fan_out = out.
"""
import math

import numpy as np

from ..random import get_generator


def _fill(tensor, values):
    tensor.data[...] = values
    return tensor


def calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) of a weight with at least two dimensions."""
    if tensor.ndim < 2:
        raise ValueError(f"init: fan in and fan out need a tensor with at least 2 dimensions, "
                         f"got shape {tensor.shape}")
    receptive_field = int(np.prod(tensor.shape[2:]))
    return tensor.shape[1] * receptive_field, tensor.shape[0] * receptive_field


def calculate_gain(nonlinearity, param=None):
    """The factor that keeps activations' variance steady through `nonlinearity`:
    1 for linear/sigmoid, 5/3 for tanh, sqrt(2) for relu,
    sqrt(2 / (1 + slope^2)) for leaky_relu (slope `param`, default 0.01), 3/4 for selu."""
    if nonlinearity in ("linear", "identity", "sigmoid", "conv1d", "conv2d", "conv3d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def _rng(generator):
    return get_generator() if generator is None else generator


def uniform_(tensor, a=0.0, b=1.0, generator=None):
    """Fill with draws from U(a, b)."""
    return _fill(tensor, _rng(generator).uniform(a, b, size=tensor.shape))


def normal_(tensor, mean=0.0, std=1.0, generator=None):
    """Fill with draws from N(mean, std^2)."""
    return _fill(tensor, _rng(generator).normal(mean, std, size=tensor.shape))


def constant_(tensor, val):
    """Fill with the value `val`."""
    return _fill(tensor, val)


def zeros_(tensor):
    """Fill with zeros."""
    return _fill(tensor, 0)


def ones_(tensor):
    """Fill with ones."""
    return _fill(tensor, 1)


def xavier_uniform_(tensor, gain=1.0, generator=None):
    """Glorot: U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor, gain=1.0, generator=None):
    """Glorot: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)


def _kaiming_std(tensor, a, mode, nonlinearity):
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"kaiming init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He: U(-b, b) with b = gain * sqrt(3 / fan). nn.Linear's default is
    a = sqrt(5), which gives b = 1 / sqrt(fan_in)."""
    if tensor.numel() == 0:
        return tensor
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu", generator=None):
    """He: N(0, std^2) with std = gain / sqrt(fan)."""
    if tensor.numel() == 0:
        return tensor
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity), generator)
