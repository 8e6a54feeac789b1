"""Position information added to token embeddings.

Attention itself ignores the order of its keys, so the Transformer adds to
each token's embedding a vector that depends on its position: a fixed
sinusoidal one (the paper's, and that of the seed notes: the lecture notes
this project's math comes from, README.md "Learn") or a learned one (GPT's).
Inputs are (batch, T, d_model), or (T, d_model) for one sequence.
"""
import numpy as np

from ..shapes import ShapeError
from ..tensor import Tensor
from . import init
from .layers import Dropout
from .module import Module, Parameter


def sinusoidal_table(max_len, d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)),
    as a float64 array (max_len, d_model). Each pair of columns is a rotation
    at its own frequency, so PE(pos + k) is a linear function of PE(pos)."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)
    angles = pos / 10000.0 ** (two_i / d_model)  # (max_len, ceil(d/2))
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles[:, :d_model // 2])
    return table


def _check(layer, x, d_model, max_len):
    if x.ndim < 2 or x.shape[-1] != d_model or x.shape[-2] > max_len:
        raise ShapeError(f"{layer}: expected input (..., T, {d_model}) with T <= max_len {max_len}, "
                         f"got {x.shape}")


class PositionalEncoding(Module):
    """y = dropout(x + PE[:T]) with the fixed sinusoidal table PE
    (`sinusoidal_table`). It has no parameters: the table is a
    non-persistent buffer `pe` (max_len, d_model), converted by `.to(dtype)`
    and not saved in state_dict, and its gradient is simply the identity."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("pe", Tensor(sinusoidal_table(max_len, d_model).astype(np.float32)),
                             persistent=False)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        """x (..., T, d_model), batch first (one table row per position T) -> dropout(x + PE[:T])."""
        _check("PositionalEncoding", x, self.d_model, self.max_len)
        pe = self.pe.data[:x.shape[-2]]
        return self.dropout(x + Tensor(pe.astype(x.dtype, copy=False)))

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEmbedding(Module):
    """y = dropout(x + W[:T]) with a trained table W (max_len, d_model),
    initialised N(0, 1) like an Embedding (GPT's position embedding)."""

    def __init__(self, d_model, max_len=512, dropout=0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = Parameter(np.zeros((max_len, d_model), np.float32))
        init.normal_(self.weight)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        """x (..., T, d_model), batch first -> dropout(x + W[:T])."""
        _check("LearnedPositionalEmbedding", x, self.d_model, self.max_len)
        return self.dropout(x + self.weight[:x.shape[-2]])

    def extra_repr(self):
        return f"d_model={self.d_model}, max_len={self.max_len}"
