"""Scaled dot-product attention, one fused pass per (batch, head) matrix.

For each batch index i (all leading axes flattened), with Q: (L, E),
K: (S, E), V: (S, Ev), an additive mask M and a dropout mask D (entries 0
or 1 / (1 - p)):

    P = softmax(scale * Q K^T + M)      (L, S), the attention weights
    O = (P * D) V

The scores go from BLAS straight into P's own memory, are scaled, masked
and turned into probabilities row by row while in cache, then BLAS
multiplies by V. A query whose every key is masked (a row of -inf) gets
P = 0, so its output is 0 and no gradient flows from it (PyTorch's math
path would give NaN).

Backward, with dO = dL/dO (P is saved by forward):

    dV = (P * D)^T dO
    dP = (dO V^T) * D
    dS = P * (dP - rowsum(P * dP))       gradient w.r.t. the masked scores
    dQ = scale * dS K,   dK = scale * dS^T Q

Q, K, V, O and the gradients are read and written where they are: matrix
i of q starts at q[q_off[i]] with row stride q_ld, so the heads of a
(B, T, H, E) array, seen as (B, H, T, E), need no copy, and broadcast batch
axes are repeated offsets (their gradients are written per batch index and
summed by the caller). P is a C-ordered (n, L, S) array. The dropout mask
is regenerated from (key, element index of P), the same stream
`dropout_apply` would use on P.
"""
import numpy as np
from numba import njit

from .blas import gemm
from .mathx import exp, uniform_bits
from .reductions import KERNEL_FASTMATH, SUM_FASTMATH


@njit(fastmath=SUM_FASTMATH)  # safe to reorder here: sums, and exp of one difference
def _masked_softmax_rows(p, mask, use_mask, causal):
    """P = softmax(P + mask) row by row, in place; rows with no key left become 0."""
    L, S = p.shape
    zero, one = p.dtype.type(0), p.dtype.type(1)
    minus_inf = p.dtype.type(-np.inf)  # not -np.inf: a float64 m would make the exps float64
    for r in range(L):
        row = p[r]
        stop = (r + 1 if r + 1 < S else S) if causal else S  # causal: query r sees keys 0..r
        if use_mask:
            mr = mask[r]
            for c in range(stop):
                row[c] += mr[c]
        m = minus_inf
        for c in range(stop):
            m = row[c] if row[c] > m else m
        if m == minus_inf:  # every key masked: the row is 0
            stop = 0
        total = zero
        for c in range(stop):
            e = exp(row[c] - m)
            row[c] = e
            total += e
        inv = one / total if stop else zero
        for c in range(stop):
            row[c] *= inv
        for c in range(stop, S):
            row[c] = zero


@njit(fastmath=KERNEL_FASTMATH)
def _times_dropout(src, dst, also, base, key, threshold, keep_scale):
    """dst = src * D, and `also` *= D if it is not empty, for one (L, S)
    matrix whose first element has index `base` in P."""
    L, S = src.shape
    dropped = src.dtype.type(0)  # not keep_scale * 0: float32 * int is float64 in numba
    for r in range(L):
        for c in range(S):
            factor = keep_scale if uniform_bits(key, base + r * S + c) >= threshold else dropped
            dst[r, c] = src[r, c] * factor
            if also.size:
                also[r, c] *= factor


@njit(nogil=True, cache=True, fastmath=KERNEL_FASTMATH)
def attention_forward(blas, q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, mask, im, use_mask,
                      causal, scale, key, threshold, keep_scale, weights, out, out_off, out_ld,
                      start, stop):
    """For batch indices [start, stop): weights[i] = P (L, S) and O_i = (P * D) V (L, Ev).

    Dropout is on when keep_scale != 1 (keep_scale = 1 / (1 - p)).
    """
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    p_flat = weights.reshape(weights.size)
    dropped = np.empty((L, S) if keep_scale != 1 else (0, 0), weights.dtype)  # this thread's buffer
    for i in range(start, stop):
        gemm(blas, False, True, L, S, E, scale, q[q_off[i]:], q_ld, k[k_off[i]:], k_ld,
             zero, p_flat[i * L * S:], S)  # scale * Q K^T
        _masked_softmax_rows(weights[i], mask[im[i]], use_mask, causal)
        if keep_scale != 1:
            _times_dropout(weights[i], dropped, dropped[:0], i * L * S, key, threshold, keep_scale)
            gemm(blas, False, False, L, Ev, S, one, dropped.reshape(L * S), S, v[v_off[i]:], v_ld,
                 zero, out[out_off[i]:], out_ld)
        else:
            gemm(blas, False, False, L, Ev, S, one, p_flat[i * L * S:], S, v[v_off[i]:], v_ld,
                 zero, out[out_off[i]:], out_ld)


@njit(nogil=True, cache=True, fastmath=SUM_FASTMATH)  # sums of products only: safe to reorder
def attention_backward(blas, q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, weights,
                       grad, g_off, g_ld, scale, key, threshold, keep_scale,
                       dq, dq_off, dq_ld, dk, dk_off, dk_ld, dv, dv_off, dv_ld,
                       dscores, want_dscores, start, stop):
    """For batch indices [start, stop): dQ_i, dK_i, dV_i and, if asked, dscores[i] (dL/d masked scores)."""
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    p_flat = weights.reshape(weights.size)
    dp = np.empty((L, S), weights.dtype)  # this thread's own buffers
    dp_flat = dp.reshape(L * S)
    dropped = np.empty((L, S) if keep_scale != 1 else (0, 0), weights.dtype)
    for i in range(start, stop):
        p = weights[i]
        gemm(blas, False, True, L, S, Ev, one, grad[g_off[i]:], g_ld, v[v_off[i]:], v_ld, zero, dp_flat, S)
        if keep_scale != 1:  # dP = (G V^T) * D, dV = (P * D)^T G
            _times_dropout(p, dropped, dp, i * L * S, key, threshold, keep_scale)
            gemm(blas, True, False, S, Ev, L, one, dropped.reshape(L * S), S, grad[g_off[i]:], g_ld,
                 zero, dv[dv_off[i]:], dv_ld)
        else:
            gemm(blas, True, False, S, Ev, L, one, p_flat[i * L * S:], S, grad[g_off[i]:], g_ld,
                 zero, dv[dv_off[i]:], dv_ld)
        for r in range(L):  # dS = P * (dP - rowsum(P * dP)), in place of dP
            pr, dr = p[r], dp[r]
            s = zero
            for c in range(S):
                s += pr[c] * dr[c]
            for c in range(S):
                dr[c] = pr[c] * (dr[c] - s)
            if want_dscores:
                ds = dscores[i, r]
                for c in range(S):  # an explicit loop: array assignment compiles slowly
                    ds[c] = dr[c]
        gemm(blas, False, False, L, E, S, scale, dp_flat, S, k[k_off[i]:], k_ld, zero, dq[dq_off[i]:], dq_ld)
        gemm(blas, True, False, S, E, L, scale, dp_flat, S, q[q_off[i]:], q_ld, zero, dk[dk_off[i]:], dk_ld)
