"""Basic layers: Linear, Embedding, LayerNorm, Dropout, activations.

Each holds its parameters with PyTorch's names, shapes and default
initialisation, and computes through `tinygrad_attn.functional`.
"""
import math

import numpy as np

from .. import functional as F
from ..tensor import Tensor, where
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


class Identity(Module):
    """y = x."""

    def forward(self, x):
        return x


class Linear(Module):
    """y = x W^T + b with weight W of shape (out_features, in_features).

    Default init (PyTorch's): W ~ kaiming_uniform(a=sqrt(5)), that is
    U(-1/sqrt(in), 1/sqrt(in)), and b ~ U(-1/sqrt(in), 1/sqrt(in)).
    """

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        _check_sizes("Linear", in_features=in_features, out_features=out_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _empty(out_features, in_features)
        self.bias = _empty(out_features) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: integer indices of any shape -> rows of `weight`
    (num_embeddings, embedding_dim). Init N(0, 1), as PyTorch.

    With `padding_idx`, that row starts at zero and gets no gradient (as in
    PyTorch), so a padding token keeps its embedding during training.
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        _check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for "
                                 f"{num_embeddings} embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = _empty(num_embeddings, embedding_dim)
        self.reset_parameters()

    def reset_parameters(self):
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    def forward(self, indices):
        out = F.embedding(indices, self.weight)
        if self.padding_idx is None:
            return out
        idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
        is_pad = idx == self.padding_idx
        if not is_pad.any():
            return out
        # Same values, but the padding positions are cut from the graph, so the
        # padding row receives no gradient.
        return where(Tensor(is_pad[..., None]), out.detach(), out)

    def extra_repr(self):
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) axes (biased variance). weight starts at 1, bias at 0."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        _check_sizes("LayerNorm", **{f"normalized_shape[{i}]": n for i, n in enumerate(normalized_shape)})
        self.normalized_shape, self.eps = tuple(normalized_shape), eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        self.bias = (Parameter(np.zeros(self.normalized_shape, np.float32))
                     if elementwise_affine and bias else None)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class Dropout(Module):
    """In training, zero each element with probability p and scale the others
    by 1/(1-p); in eval mode, the identity."""

    def __init__(self, p=0.5):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class ReLU(Module):
    """y = max(x, 0)."""

    def forward(self, x):
        return F.relu(x)


class GELU(Module):
    """y = x * Phi(x) (Phi: the standard normal CDF; approximate="tanh" for
    the tanh approximation)."""

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"
