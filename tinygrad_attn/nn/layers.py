"""Basic layers: Linear, Embedding, LayerNorm, Dropout, activations.

Each takes torch.nn's arguments in torch.nn's order with its defaults, holds
its parameters with PyTorch's names, shapes and default initialisation, and
computes through `tinygrad_attn.functional`. PyTorch arguments that have no
meaning here (another device, in-place updates, sparse gradients) raise
NotImplementedError naming the argument when set to anything but their
default.
"""
import math

import numpy as np

from .. import functional as F
from ..dtypes import DTYPE_NAMES
from . import init
from .module import Module, Parameter


def _empty(*shape):
    return Parameter(np.zeros(shape, dtype=np.float32))


def _check_sizes(layer, **sizes):
    """Each size argument of a layer's constructor must be a non-negative int."""
    for name, value in sizes.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise TypeError(f"{layer}: {name} must be an integer, got {value!r}")
        if value < 0:
            raise ValueError(f"{layer}: {name} must be a non-negative integer, got {value}")


def factory_dtype(owner, device=None, dtype=None):
    """Check PyTorch's `device=` and `dtype=` layer arguments; return the
    dtype to convert the new layer to (None: keep float32).

    The CPU is the only device (None, "cpu" or a torch.device("cpu")); the
    weights are float32 or float64 (numpy, our or torch's dtype objects).
    """
    if device is not None and str(device).split(":")[0] != "cpu":
        raise NotImplementedError(f"{owner}: device={device!r} is not supported (only the CPU: "
                                  "device=None or 'cpu')")
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.") if type(dtype).__module__ == "torch" else dtype
    try:
        dt = np.dtype(DTYPE_NAMES.get(name, name) if isinstance(name, str) else name)
    except TypeError:
        dt = None
    if dt not in (np.float32, np.float64):
        raise NotImplementedError(f"{owner}: dtype={dtype!r} is not supported (weights are "
                                  "float32 or float64)")
    return dt


def no_inplace(owner, inplace):
    """PyTorch's `inplace=True` overwrites the input; tensors here are not
    modified in place, so only the default is accepted."""
    if inplace:
        raise NotImplementedError(f"{owner}: inplace=True is not implemented (tensors are not "
                                  "modified in place here); use inplace=False")


class Identity(Module):
    """y = x. Any constructor arguments are ignored, as in PyTorch."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        """Return `input` itself."""
        return input


class Linear(Module):
    """y = x W^T + b with weight W of shape (out_features, in_features).

    Linear(in_features, out_features, bias=True, device=None, dtype=None)

    Default init (PyTorch's): W ~ kaiming_uniform(a=sqrt(5)), that is
    U(-1/sqrt(in), 1/sqrt(in)), and b ~ U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        dtype = factory_dtype("Linear", device, dtype)
        _check_sizes("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty(out_features, in_features)
        self.bias = _empty(out_features) if bias else None
        self.reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """Draw the weights again with PyTorch's default initialisation."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input):
        """input (..., in_features) -> (..., out_features)."""
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices of any shape -> rows of `weight`
    (num_embeddings, embedding_dim). Init N(0, 1), as PyTorch.

    Embedding(num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
              norm_type=2.0, scale_grad_by_freq=False, sparse=False,
              _weight=None, _freeze=False, device=None, dtype=None)

    With `padding_idx`, that row starts at zero and gets no gradient (as in
    PyTorch), so a padding token keeps its embedding during training.
    `_weight` (a Tensor or array) becomes the weight as is, `_freeze=True`
    makes it not require grad (what `Embedding.from_pretrained` uses).
    max_norm, scale_grad_by_freq and sparse are not implemented: anything
    but their default raises NotImplementedError.
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        super().__init__()
        dtype = factory_dtype("Embedding", device, dtype)
        F._embedding_unsupported("Embedding", max_norm, scale_grad_by_freq, sparse)
        _check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for "
                                 f"{num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        if _weight is None:
            self.weight = _empty(num_embeddings, embedding_dim)
            self.reset_parameters()
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"Embedding: _weight has shape {tuple(_weight.shape)}, expected "
                                 f"(num_embeddings, embedding_dim) = {(num_embeddings, embedding_dim)}")
            self.weight = Parameter(_weight)
        self.weight.requires_grad = not _freeze
        if dtype is not None:
            self.to(dtype)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        """An Embedding whose weight is `embeddings` (rows, dim), shared, not
        copied; frozen (no gradient) unless freeze=False."""
        if embeddings.ndim != 2:
            raise ValueError(f"Embedding.from_pretrained: embeddings must be 2-D, got shape "
                             f"{tuple(embeddings.shape)}")
        rows, dim = embeddings.shape
        return cls(rows, dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                   _weight=embeddings, _freeze=freeze)

    def reset_parameters(self):
        """Draw the weight again from N(0, 1) (the padding row back to zero)."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    def forward(self, input):
        """Integer indices of shape S -> embeddings of shape S + (embedding_dim,)."""
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) axes (biased variance). weight starts at 1, bias at 0.

    LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
              device=None, dtype=None)

    elementwise_affine=False has neither weight nor bias; bias=False keeps
    the weight only.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        dtype = factory_dtype("LayerNorm", device, dtype)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        _check_sizes("LayerNorm", **{f"normalized_shape[{i}]": n for i, n in enumerate(normalized_shape)})
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        self.bias = (Parameter(np.zeros(self.normalized_shape, np.float32))
                     if elementwise_affine and bias else None)
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """weight back to 1, bias back to 0."""
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input):
        """Normalise `input` (..., *normalized_shape) over its last axes."""
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    """In training, zero each element with probability p and scale the others
    by 1/(1-p); in eval mode, the identity.

    Dropout(p=0.5, inplace=False); inplace=True is not implemented.
    """

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        no_inplace("Dropout", inplace)
        self.p, self.inplace = p, inplace

    def forward(self, input):
        """Dropout of `input` in training mode, `input` itself in eval mode."""
        return F.dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class ReLU(Module):
    """y = max(x, 0). ReLU(inplace=False); inplace=True is not implemented."""

    def __init__(self, inplace=False):
        super().__init__()
        no_inplace("ReLU", inplace)
        self.inplace = inplace

    def forward(self, input):
        """max(input, 0), elementwise."""
        return F.relu(input)


class SiLU(Module):
    """y = x * sigmoid(x) (SiLU, or swish). SiLU(inplace=False); inplace=True is not implemented."""

    def __init__(self, inplace=False):
        super().__init__()
        no_inplace("SiLU", inplace)
        self.inplace = inplace

    def forward(self, input):
        """SiLU of `input`, elementwise."""
        return F.silu(input)


class GELU(Module):
    """y = x * Phi(x) (Phi: the standard normal CDF; approximate="tanh" for
    the tanh approximation)."""

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        """GELU of `input`, elementwise."""
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class RMSNorm(Module):
    """y = x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape)
    axes (Llama's normalization: LayerNorm without the mean and the bias).
    weight starts at 1.

    RMSNorm(normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None)

    eps=None is PyTorch's rule: the machine epsilon of the input's dtype
    (torch.finfo(x.dtype).eps). elementwise_affine=False has no weight.
    """

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
        super().__init__()
        dtype = factory_dtype("RMSNorm", device, dtype)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        _check_sizes("RMSNorm", **{f"normalized_shape[{i}]": n for i, n in enumerate(normalized_shape)})
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        if dtype is not None:
            self.to(dtype)

    def reset_parameters(self):
        """weight back to 1."""
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x):
        """Normalise `x` (..., *normalized_shape) over its last axes."""
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
