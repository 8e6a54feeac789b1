"""Attention the FlashAttention way, in plain numpy: keys in blocks, an
online softmax, and a backward that recomputes P instead of storing it.

The fused op (tinygrad_attn.ops.attention.ScaledDotProductAttention) keeps
the attention weights P, an (L, S) matrix per head, from forward to
backward. FlashAttention (Dao et al., 2022) keeps only the output O and one
number per query, the log-sum-exp of its scores, lse_i = log sum_j e^{S_ij}:

    forward   for each block of keys: scores S_blk, then update per query
              the running max m, the running sum l = sum e^{S - m} and the
              running output o = sum e^{S - m} v, rescaling the old l and o
              by e^{m_old - m_new} when the max grows. At the end O = o / l
              and lse = m + log l: softmax(S) V, without the whole P.
    backward  P_blk = e^{S_blk - lse} again, block by block (exact: that is
              the softmax), and the softmax backward's row sum comes from
              O instead of P: rowsum(dP * P) = rowsum(dO * O).

docs/backprop_through_attention.md, section 5b, derives both.
tests/test_numpy_flash.py checks these functions against the fused op's
output and gradients, to 1e-12 in float64. Real FlashAttention also cuts
the queries into blocks and runs each (query block, key block) pair in fast
on-chip memory; here the queries are handled all at once, so that only the
one loop that matters for the math remains. Dropout is left out (the
identity above still holds with it, since O = (P * D) V). Arrays only:
nothing here imports the framework.
"""
import math

import numpy as np


def _additive_mask(attn_mask, is_causal, L, S, dtype):
    """The mask as scores to add, (..., L, S): 0 where a query may attend, -inf where
    not (boolean attn_mask: True = may attend; is_causal: key j > query i is not),
    a float attn_mask as it is. None: no mask."""
    added = None
    if is_causal:
        added = np.where(np.triu(np.ones((L, S), bool), k=1), -np.inf, 0.0).astype(dtype)
    if attn_mask is not None:
        m = np.where(attn_mask, 0.0, -np.inf).astype(dtype) if attn_mask.dtype == bool else attn_mask
        added = m if added is None else added + m
    return added


def _scores(q, k_blk, mask_blk, scale):
    """S_blk = scale * Q K_blk^T + M_blk: every query against one block of keys."""
    s = scale * (q @ np.swapaxes(k_blk, -1, -2))
    return s if mask_blk is None else s + mask_blk


def _blocks(S, block_size):
    """The key blocks: slices [start, start + block_size) covering 0..S-1."""
    return [slice(start, min(start + block_size, S)) for start in range(0, S, block_size)]


def flash_attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, block_size=2):
    """(O, lse): O = softmax(scale * Q K^T + M) V, computed one block of keys at a time.

    Q (..., L, E), K (..., S, E), V (..., S, Ev), the mask broadcasting to
    (..., L, S); lse (..., L) is each query's log sum_j e^{S_ij}, -inf for a
    query that may attend to no key (its output is then 0, as the fused op
    gives). After the blocks up to j, for every query i:

        m = max of S_i. over those keys,   l = sum e^{S_i. - m},   o = sum e^{S_i. - m} v

    A new block with a larger max m' rescales what is there by e^{m - m'}:
    l <- e^{m - m'} l + sum_blk e^{S - m'},  o <- e^{m - m'} o + e^{S_blk - m'} V_blk.
    """
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = _additive_mask(attn_mask, is_causal, L, S, q.dtype)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2],
                                () if mask is None else mask.shape[:-2])
    m = np.full(batch + (L,), -np.inf)                      # running max of each query's scores
    total = np.zeros(batch + (L,))                          # running sum of e^{S - m}: l
    o = np.zeros(batch + (L, v.shape[-1]))                  # running sum of e^{S - m} v
    for blk in _blocks(S, block_size):
        s = _scores(q, k[..., blk, :], None if mask is None else mask[..., blk], scale)   # (..., L, b)
        m_new = np.maximum(m, s.max(axis=-1))
        m_safe = np.where(np.isfinite(m_new), m_new, 0.0)   # -inf: no key yet; e^{-inf - 0} = 0 below
        rescale = np.exp(m - m_safe)                        # e^{m - m'}: 1 if the max did not grow
        p = np.exp(s - m_safe[..., None])                   # (..., L, b) unnormalised weights of the block
        total = rescale * total + p.sum(axis=-1)
        o = rescale[..., None] * o + p @ v[..., blk, :]
        m = m_new
    has_key = total > 0                                     # else every key was masked: O = 0, lse = -inf
    safe_total = np.where(has_key, total, 1.0)
    out = np.where(has_key[..., None], o / safe_total[..., None], 0.0)
    lse = np.where(has_key, np.where(np.isfinite(m), m, 0.0) + np.log(safe_total), -np.inf)
    return out, lse


def flash_attention_backward(q, k, v, out, lse, grad, attn_mask=None, is_causal=False, scale=None,
                             block_size=2):
    """(dL/dQ, dL/dK, dL/dV, dL/dM) from O and lse alone, one block of keys at a time.

    With G = dL/dO (`grad`) and D_i = rowsum(G * O)_i, for each block:

        P_blk  = e^{S_blk - lse}                  (recomputed: the softmax, exactly)
        dV_blk = P_blk^T G                        (section 5's dV, block by block)
        dP_blk = G V_blk^T
        dS_blk = P_blk * (dP_blk - D)             (softmax backward: rowsum(dP * P) = D)
        dQ    += scale * dS_blk K_blk,   dK_blk = scale * dS_blk^T Q,   dM_blk = dS_blk

    D is a dot product of length Ev per query, known before any block of P
    exists, in place of section 5's rowsum over all S keys. dM is None unless
    attn_mask is a float mask. Batch axes that broadcast are summed back.
    """
    L, S = q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = _additive_mask(attn_mask, is_causal, L, S, q.dtype)
    D = (grad * out).sum(axis=-1, keepdims=True)            # (..., L, 1) = rowsum(dP * P)
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)[..., None]   # no key: e^{S - inf} = 0
    dq = np.zeros(np.broadcast_shapes(q.shape, grad.shape[:-1] + (q.shape[-1],)))
    dk_blocks, dv_blocks, dm_blocks = [], [], []
    for blk in _blocks(S, block_size):
        k_blk, v_blk = k[..., blk, :], v[..., blk, :]
        p = np.exp(_scores(q, k_blk, None if mask is None else mask[..., blk], scale) - lse_safe)  # (..., L, b)
        dv_blocks.append(np.swapaxes(p, -1, -2) @ grad)
        dp = grad @ np.swapaxes(v_blk, -1, -2)
        ds = p * (dp - D)
        dq = dq + scale * (ds @ k_blk)
        dk_blocks.append(scale * (np.swapaxes(ds, -1, -2) @ q))
        dm_blocks.append(ds)
    dk, dv = np.concatenate(dk_blocks, axis=-2), np.concatenate(dv_blocks, axis=-2)
    dm = None
    if attn_mask is not None and attn_mask.dtype != bool:
        dm = _sum_to(np.concatenate(dm_blocks, axis=-1), attn_mask.shape)
    return _sum_to(dq, q.shape), _sum_to(dk, k.shape), _sum_to(dv, v.shape), dm


def _sum_to(g, shape):
    """g summed back to `shape` over the axes broadcasting added or stretched."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g
