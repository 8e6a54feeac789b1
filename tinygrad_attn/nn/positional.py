"""Position information added to token embeddings.

Attention itself ignores the order of its keys, so the Transformer adds to
each token's embedding a vector that depends on its position: a fixed
sinusoidal one (the paper's, and that of the seed notes: the lecture notes
this project's math comes from, README.md "Learn") or a learned one (GPT's).
Inputs are (batch, T, d_model), or (T, d_model) for one sequence.

Llama rotates instead: rotary embeddings (`RotaryEmbedding`,
`precompute_freqs_cis`) turn each query and key pair of features by an
angle proportional to the position, so their dot product depends on the
distance between positions only.
"""
import numpy as np

from ..shapes import ShapeError
from ..tensor import Tensor
from .. import functional as F
from . import init
from .layers import Dropout, _check_sizes
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


def precompute_freqs_cis(dim, end, theta=10000.0):
    """The rotary tables of llama2.c (its `precompute_freqs_cis`): (cos, sin),
    float32 Tensors of shape (end, dim // 2) with entry [t, i] the cos and sin
    of t * f_i, f_i = 1 / theta^(2i / dim).

    dim is the head dimension (even); pair i of a head vector turns at
    frequency f_i, from one turn per 2 pi positions (i = 0) down to about
    one per 2 pi theta. In float32 as llama2.c computes them (its model.py
    and run.c), so that its weights see the same angles: f_i and t * f_i
    are bit for bit llama2.c's under torch; cos and sin are rounded from
    float64 (correctly rounded; torch's float32 cos and sin are off by one
    unit in the last place for about 5% of entries).
    Use them with `functional.apply_rotary_emb`.
    """
    _check_sizes("precompute_freqs_cis", dim=dim, end=end)
    if dim % 2:
        raise ValueError(f"precompute_freqs_cis: dim must be even (pairs of features turn), got {dim}")
    f32 = np.float32
    exponents = np.arange(0, dim, 2, dtype=f32)[:dim // 2] / f32(dim)  # 2i / dim, (dim/2,)
    freqs = f32(1.0) / (float(theta) ** exponents.astype(np.float64)).astype(f32)  # the pow rounded once
    angles = np.outer(np.arange(end, dtype=f32), freqs).astype(f32)  # (end, dim/2): t * f_i
    return (Tensor(np.cos(angles.astype(np.float64)).astype(f32)),
            Tensor(np.sin(angles.astype(np.float64)).astype(f32)))


class RotaryEmbedding(Module):
    """Rotary position embedding for heads of `head_dim` features at positions
    0..max_seq_len-1 (llama2.c's convention: pairs (2i, 2i+1), theta = 10000).

    forward(x, start_pos=0) rotates x (..., T, n_heads, head_dim) as positions
    start_pos .. start_pos + T - 1 (`functional.apply_rotary_emb`). The tables
    (`precompute_freqs_cis`) are non-persistent buffers `freqs_cos`,
    `freqs_sin` (max_seq_len, head_dim // 2), as in llama2.c's Transformer:
    not saved in the state_dict, converted by `.to(dtype)`. No parameters.
    """

    def __init__(self, head_dim, max_seq_len, theta=10000.0):
        super().__init__()
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        cos, sin = precompute_freqs_cis(head_dim, max_seq_len, theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, x, start_pos=0):
        """x (..., T, n_heads, head_dim) rotated as positions start_pos .. start_pos + T - 1."""
        T = x.shape[-3] if x.ndim >= 3 else 0
        if x.ndim < 3 or x.shape[-1] != self.head_dim or not 0 <= start_pos <= self.max_seq_len - T:
            raise ShapeError(f"RotaryEmbedding: expected input (..., T, n_heads, {self.head_dim}) at "
                             f"positions start_pos={start_pos} .. + T - 1 below max_seq_len "
                             f"{self.max_seq_len}, got {x.shape}")
        stop = start_pos + T
        return F.apply_rotary_emb(x, self.freqs_cos.data[start_pos:stop], self.freqs_sin.data[start_pos:stop])

    def extra_repr(self):
        return f"head_dim={self.head_dim}, max_seq_len={self.max_seq_len}, theta={self.theta}"
