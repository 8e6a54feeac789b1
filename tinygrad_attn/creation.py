"""The functions that make new tensors, with torch's signatures.

tensor, zeros, ones, full, zeros_like, ones_like, arange, randn, rand and
randint take dtype, device and requires_grad as keywords (device: None or
"cpu"); the random ones draw from the framework's generator (`manual_seed`)
unless given a numpy Generator.
"""
import numpy as np

from .dtypes import bool_, canonical_dtype, check_device, float32, int64, to_array
from .random import get_generator
from .tensor import Tensor


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new Tensor from data (array, nested lists, scalar); as torch.tensor,
    Python floats become float32 and numpy arrays keep their dtype."""
    check_device(device, "tensor")
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_size(size, op, name="size"):
    """A tensor size (an int or a sequence of ints) as a tuple, or an error
    naming the op and the argument."""
    dims = (size,) if _is_int(size) else size
    if not isinstance(dims, (tuple, list)) or not all(_is_int(d) for d in dims):
        raise TypeError(f"{op}: {name} must be an int or a tuple of ints, got {size!r}")
    if any(d < 0 for d in dims):
        raise ValueError(f"{op}: {name} must not be negative, got {tuple(dims)}")
    return tuple(int(d) for d in dims)


def _shape_args(shape, op):
    """`f(2, 3)` or `f((2, 3))`, checked."""
    return _check_size(tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape,
                       op)


def _new(data, device, requires_grad, op):
    check_device(device, op)
    return Tensor(data, requires_grad=requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of zeros of shape `size` (ints or one tuple), float32 by default."""
    return _new(np.zeros(_shape_args(size, "zeros"), dtype=canonical_dtype(dtype or float32)), device,
                requires_grad, "zeros")


def ones(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of ones of shape `size`, float32 by default."""
    return _new(np.ones(_shape_args(size, "ones"), dtype=canonical_dtype(dtype or float32)), device,
                requires_grad, "ones")


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """A tensor of shape `size` filled with `fill_value`; the dtype follows
    the value as in PyTorch (bool, int64, else float32) unless given."""
    if not isinstance(fill_value, (int, float, bool, np.number, np.bool_)):
        raise TypeError(f"full: fill_value must be a number, got {fill_value!r}")
    if dtype is None:
        dtype = (bool_ if isinstance(fill_value, (bool, np.bool_)) else
                 int64 if isinstance(fill_value, (int, np.integer)) else float32)
    return _new(np.full(_check_size(size, "full"), fill_value, dtype=canonical_dtype(dtype)), device,
                requires_grad, "full")


def zeros_like(input, *, dtype=None, device=None, requires_grad=False):
    """zeros of input's shape and (unless given) dtype."""
    return zeros(input.shape, dtype=dtype or input.dtype, device=device, requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False):
    """ones of input's shape and (unless given) dtype."""
    return ones(input.shape, dtype=dtype or input.dtype, device=device, requires_grad=requires_grad)


def arange(start=0, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    """[start, end) by step (arange(end) starts at 0): int64 for integer
    arguments, float32 if any is a float."""
    if end is None:
        start, end = 0, start
    for name, value in (("start", start), ("end", end), ("step", step)):
        if not isinstance(value, (int, float, np.number)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"arange: {name} must be a number, got {value!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    data = np.arange(start, end, step)
    data = to_array(data, dtype if dtype is not None or data.dtype.kind != "f" else float32)
    return _new(data, device, requires_grad, "arange")


def _generator(generator):
    return get_generator() if generator is None else generator


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Standard normal samples from `generator` (a numpy Generator), by
    default the framework's, seeded by `manual_seed`."""
    data = _generator(generator).standard_normal(_shape_args(size, "randn"))
    return _new(data.astype(canonical_dtype(dtype or float32)), device, requires_grad, "randn")


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    """Uniform samples in [0, 1), drawn as randn's."""
    data = _generator(generator).random(_shape_args(size, "rand"))
    return _new(data.astype(canonical_dtype(dtype or float32)), device, requires_grad, "rand")


def randint(low=0, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad=False):
    """Integers drawn uniformly from [low, high), of shape `size`, int64 by
    default; randint(high, size) starts at 0, as in PyTorch."""
    if size is None:  # randint(high, size)
        low, high, size = 0, low, high
    if not _is_int(low) or not _is_int(high):
        raise TypeError(f"randint: low and high must be integers, got low={low!r}, high={high!r}")
    if low >= high:
        raise ValueError(f"randint: low must be less than high, got low={low}, high={high}")
    data = _generator(generator).integers(low, high, size=_check_size(size, "randint"))
    return _new(to_array(data, dtype or int64), device, requires_grad, "randint")
