"""Multi-head attention, as in the seed notes and in torch.nn.MultiheadAttention.

The seed notes (the seeds) are the two lecture notes on attention this
project's math comes from, kept outside the repository (README.md, "Learn",
says what they hold). They write a projection two ways: for one word as a column,
q = W x with W of shape (head_dim, E) (the column form), and for the words
as the rows of X, Q = X W with W of shape (E, head_dim) (the row form).
They are the same map when W_row = W_col^T, since row i of X W_col^T is
(W_col x_i)^T. In the row form, for one head i:

    Q_i = X W_Q^i,  K_i = X_k W_K^i,  V_i = X_v W_V^i        (W_*^i: (E, head_dim))
    Z_i = softmax(Q_i K_i^T / sqrt(head_dim) + mask) V_i      (L, head_dim)
    out = concat(Z_0, ..., Z_{h-1}) W_O + b_O                  (L, h*head_dim) (h*head_dim, E)

The matrices are stored in the column form, as PyTorch stores them (so
weights move between the two frameworks, and every projection is
`F.linear(x, W) = x W^T`): `in_proj_weight` (3*h*head_dim, E) stacks
W_Q^T, W_K^T, W_V^T, i.e. q = in_proj_weight[:h*head_dim] @ x for one word
(head i owns rows i*head_dim:(i+1)*head_dim of each third); `in_proj_bias`
stacks their biases, and `out_proj` is a Linear whose weight is W_O^T.
`head_weights(i)` returns head i's matrices in the row form. Gradients
switch in the same way: dL/dW_col = (dL/dW_row)^T = G_Q^T X.
See docs/backprop_through_attention.md for the backward of each step.
"""
from functools import reduce

import numpy as np

from .. import functional as F
from ..autograd import is_grad_enabled
from ..ops.attention import check_mask_dtype
from ..shapes import ShapeError
from ..tensor import Tensor
from . import init
from .layers import Linear, factory_dtype
from .module import Module, Parameter

_NAME = "MultiheadAttention"  # in error messages


def _mask_array(mask, name):
    """A mask as a numpy array, bool or float. Masks carry no gradient here
    (PyTorch's float masks can), so a mask that requires grad is refused."""
    if isinstance(mask, Tensor) and mask.requires_grad and is_grad_enabled():
        raise NotImplementedError(f"{_NAME}: {name} requires grad, but no gradient flows into "
                                  f"masks here; pass {name}.detach()")
    m = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    check_mask_dtype(m, _NAME, name)
    return m


class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention (self- or cross-attention),
    with torch.nn.MultiheadAttention's arguments, defaults and masks.

    MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True,
                       add_bias_kv=False, add_zero_attn=False, kdim=None,
                       vdim=None, batch_first=False, device=None, dtype=None,
                       *, head_dim=None)

    Also spelled `MultiHeadAttention` (the same class). As in PyTorch the
    default layout is sequence-first, (L, B, E); pass batch_first=True for
    (B, L, E). add_bias_kv and add_zero_attn are not implemented (True
    raises NotImplementedError); device must be None or "cpu", dtype None
    (float32), float32 or float64.

    Our extension, keyword-only: `head_dim` defaults to embed_dim //
    num_heads; it may be set apart from it (the seeds' example: embed_dim 4,
    8 heads of head_dim 3 give per-head outputs (L, 3) concatenated to
    (L, 24) and projected by W_O (24, 4)).

    Parameters, as torch.nn.MultiheadAttention: `in_proj_weight`
    (3 * num_heads * head_dim, embed_dim) and `in_proj_bias`, or
    `q_proj_weight`, `k_proj_weight` (.., kdim), `v_proj_weight` (.., vdim)
    when kdim or vdim differ from embed_dim; `out_proj.weight`, `out_proj.bias`.
    Init as PyTorch: xavier_uniform projections, zero biases.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, head_dim=None):
        super().__init__()
        dtype = factory_dtype(_NAME, device, dtype)
        for arg, value in (("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn)):
            if value:
                raise NotImplementedError(f"{_NAME}: {arg}=True is not implemented")
        if num_heads <= 0 or embed_dim <= 0:
            raise ValueError(f"{_NAME}: embed_dim and num_heads must be positive, "
                             f"got {embed_dim} and {num_heads}")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"{_NAME}: embed_dim {embed_dim} is not divisible by "
                                 f"num_heads {num_heads} (pass head_dim to choose the head size)")
            head_dim = embed_dim // num_heads
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, head_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout, self.batch_first = dropout, batch_first
        self.add_zero_attn = False
        self.bias_k = self.bias_v = None
        inner = num_heads * head_dim  # width of the concatenated heads
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(np.zeros((3 * inner, embed_dim), np.float32))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.in_proj_weight = None
            self.q_proj_weight = Parameter(np.zeros((inner, embed_dim), np.float32))
            self.k_proj_weight = Parameter(np.zeros((inner, self.kdim), np.float32))
            self.v_proj_weight = Parameter(np.zeros((inner, self.vdim), np.float32))
        self.in_proj_bias = Parameter(np.zeros(3 * inner, np.float32)) if bias else None
        self.out_proj = Linear(inner, embed_dim, bias=bias)
        self.record_weights = False
        self.last_attn_weights = None
        self._reset_parameters()
        if dtype is not None:
            self.to(dtype)

    def _reset_parameters(self):
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    def _projection_weights(self):
        """(W, b) for q, k and v, in PyTorch's (out, in) layout."""
        d = self.num_heads * self.head_dim
        if self._qkv_same_embed_dim:
            w = self.in_proj_weight
            weights = (w[:d], w[d:2 * d], w[2 * d:])
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        b = self.in_proj_bias
        biases = (None,) * 3 if b is None else (b[:d], b[d:2 * d], b[2 * d:])
        return weights, biases

    def head_weights(self, i):
        """The seeds' matrices of head i as numpy arrays, oriented for row
        vectors (q = x W_Q): W_Q^i (embed_dim, head_dim), W_K^i (kdim, head_dim),
        W_V^i (vdim, head_dim), and W_O^i (head_dim, embed_dim), the rows of
        W_O that multiply head i's output in the concatenation."""
        if not 0 <= i < self.num_heads:
            raise IndexError(f"{_NAME}.head_weights: head {i} of {self.num_heads}")
        rows = slice(i * self.head_dim, (i + 1) * self.head_dim)
        (wq, wk, wv), _ = self._projection_weights()
        return (wq.data[rows].T, wk.data[rows].T, wv.data[rows].T,
                self.out_proj.weight.data[:, rows].T)

    def _check_inputs(self, query, key, value):
        name = _NAME
        shapes = f"query {query.shape}, key {key.shape}, value {value.shape}"
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ShapeError(f"{name}: query, key and value must all be 3-D (batched) or all 2-D "
                             f"(unbatched), got {shapes}")
        if (query.shape[-1], key.shape[-1], value.shape[-1]) != (self.embed_dim, self.kdim, self.vdim):
            raise ShapeError(f"{name}: expected feature sizes (embed_dim {self.embed_dim}, kdim "
                             f"{self.kdim}, vdim {self.vdim}), got {shapes}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ShapeError(f"{name}: key and value must have the same batch and sequence "
                             f"sizes, got {shapes}")
        batch_axis = 0 if self.batch_first else 1
        if query.ndim == 3 and query.shape[batch_axis] != key.shape[batch_axis]:
            raise ShapeError(f"{name}: query and key have different batch sizes "
                             f"(batch_first={self.batch_first}), got {shapes}")

    def _merge_masks(self, key_padding_mask, attn_mask, causal_hint, B, L, S, dtype):
        """One mask for F.scaled_dot_product_attention, broadcastable to
        (B, num_heads, L, S): boolean True = MAY attend (its convention), or
        float (added). Returns (mask, is_causal for SDPA)."""
        H, name = self.num_heads, _NAME
        if causal_hint:  # attn_mask is the causal mask (the caller's promise): let SDPA build it
            return None, True
        blocked = []  # boolean (True = blocked) or additive float masks
        if attn_mask is not None:
            m = _mask_array(attn_mask, "attn_mask")
            if m.shape == (B * H, L, S):
                m = m.reshape(B, H, L, S)
            elif m.shape != (L, S):
                raise ShapeError(f"{name}: attn_mask must have shape (L, S) = {(L, S)} or "
                                 f"(batch * num_heads, L, S) = {(B * H, L, S)}, got {m.shape}")
            blocked.append(m)
        if key_padding_mask is not None:
            m = _mask_array(key_padding_mask, "key_padding_mask")
            if m.shape != (B, S):
                raise ShapeError(f"{name}: key_padding_mask must have shape (batch, S) = {(B, S)}, "
                                 f"got {m.shape}")
            blocked.append(m.reshape(B, 1, 1, S))
        if not blocked:
            return None, False
        if all(m.dtype == np.bool_ for m in blocked):
            return ~reduce(np.logical_or, blocked), False
        additive = [np.where(m, -np.inf, 0.0) if m.dtype == np.bool_ else m for m in blocked]
        return reduce(np.add, additive).astype(dtype, copy=False), False

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """Attend from `query` to `key`/`value`; returns (output, weights or None).

        Shapes (batch_first=False, the default; with batch_first=True the
        first two axes of query, key, value and output swap; 2-D inputs are
        one unbatched sequence):
            query (L, B, embed_dim), key (S, B, kdim), value (S, B, vdim),
            output (L, B, embed_dim).

        Masks follow torch.nn.MultiheadAttention exactly:
            key_padding_mask (B, S): boolean True = this key is padding,
                ignore it; a float mask is added to the scores of every query.
            attn_mask (L, S) or (B * num_heads, L, S): boolean True = query i
                may NOT attend to key j; a float mask is added to the scores
                (use -inf to block).
            is_causal: a hint that attn_mask is the causal mask; as in
                PyTorch it requires attn_mask (RuntimeError without it), and
                when there is no key_padding_mask and need_weights is False
                the causal mask is used in place of attn_mask.
        A query whose keys are all blocked gets zero weights, so its output
        is out_proj(0) = out_proj.bias, whatever need_weights is. (PyTorch
        2.13 gives NaN there when need_weights=True, its default, or on its
        batch_first inference fast path, else out_proj.bias.) (Note that
        `functional.scaled_dot_product_attention` uses the opposite boolean
        convention, True = may attend, like torch.nn.functional's; the masks
        are converted here.)

        need_weights=True (the default, as PyTorch) also returns the
        attention weights (before dropout): (B, L, S) averaged over heads, or
        (B, num_heads, L, S) with average_attn_weights=False. Setting
        `record_weights = True` keeps the per-head weights of the last call,
        detached, in `last_attn_weights` (a numpy array (B, num_heads, L, S))
        without changing the return value.
        """
        if is_causal and attn_mask is None:
            raise RuntimeError(f"{_NAME}: is_causal=True is a hint that attn_mask is the causal "
                               "mask and needs attn_mask, as in PyTorch (make it with "
                               "nn.Transformer.generate_square_subsequent_mask(L))")
        # PyTorch's rule: with no padding mask and no weights requested, the hint replaces the mask.
        causal_hint = is_causal and key_padding_mask is None and not need_weights
        self._check_inputs(query, key, value)
        # Self-attention with the stacked in_proj_weight: one packed projection (see below).
        packed = query is key and key is value and self._qkv_same_embed_dim and not need_weights
        batched = query.ndim == 3
        if not batched:  # one sequence: add a batch axis of 1
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = _mask_array(key_padding_mask, "key_padding_mask")[None]
        elif not self.batch_first:  # (L, B, E) -> (B, L, E)
            query, key, value = query.swapaxes(0, 1), key.swapaxes(0, 1), value.swapaxes(0, 1)
        B, L, S = query.shape[0], query.shape[1], key.shape[1]
        H, hd = self.num_heads, self.head_dim
        mask, causal = self._merge_masks(key_padding_mask, attn_mask, causal_hint, B, L, S, query.dtype)
        dropout_p = self.dropout if self.training else 0.0
        want_weights = need_weights or self.record_weights

        if packed:
            # Q, K, V of every head from one (E -> 3*H*hd) product; the fused op reads them
            # where they lie and returns the heads side by side, (B, L, H*hd). Same math as below.
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            result = F.packed_self_attention(qkv, H, attn_mask=mask, dropout_p=dropout_p,
                                             is_causal=causal, need_weights=want_weights)
            z, weights = result if want_weights else (result, None)
        else:
            # Project, then split the last axis into heads: (B, T, H*hd) -> (B, H, T, hd).
            (wq, wk, wv), (bq, bk, bv) = self._projection_weights()
            q = F.linear(query, wq, bq).reshape(B, L, H, hd).permute(0, 2, 1, 3)
            k = F.linear(key, wk, bk).reshape(B, S, H, hd).permute(0, 2, 1, 3)
            v = F.linear(value, wv, bv).reshape(B, S, H, hd).permute(0, 2, 1, 3)
            result = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                    is_causal=causal, need_weights=want_weights)
            heads, weights = result if want_weights else (result, None)
            # Concatenate the heads: (B, H, L, hd) -> (B, L, H*hd).
            z = heads.permute(0, 2, 1, 3).reshape(B, L, H * hd)
        out = self.out_proj(z)  # times W_O

        if self.record_weights:
            self.last_attn_weights = weights.data.copy() if batched else weights.data[0].copy()
        if not batched:
            out = out.reshape(L, self.embed_dim)
        elif not self.batch_first:
            out = out.swapaxes(0, 1)
        if not need_weights:
            return out, None
        if average_attn_weights:
            weights = weights.mean(axis=1)
        if not batched:
            weights = weights.reshape(weights.shape[1:])
        return out, weights

    def extra_repr(self):
        parts = [f"embed_dim={self.embed_dim}", f"num_heads={self.num_heads}", f"head_dim={self.head_dim}"]
        if not self._qkv_same_embed_dim:
            parts += [f"kdim={self.kdim}", f"vdim={self.vdim}"]
        parts += [f"dropout={self.dropout}", f"batch_first={self.batch_first}"]
        return ", ".join(parts)


MultiHeadAttention = MultiheadAttention  # the seeds' spelling: the same class
