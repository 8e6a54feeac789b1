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

Batch broadcasting uses index maps (Q index iq[i], and so on); gradients
are written per batch index and summed over broadcast axes by the caller.
The dropout mask is regenerated from (key, element index of P), the same
stream `dropout_apply` would use on P.
"""
import numpy as np
from numba import njit

from .blas import gemm
from .mathx import uniform_bits
from .reductions import KERNEL_FASTMATH, dot, max_of, store_exp


@njit(fastmath=KERNEL_FASTMATH)
def _masked_softmax_rows(p, mask, use_mask, causal):
    """P = softmax(P + mask) row by row, in place; rows with no key left become 0."""
    L, S = p.shape
    zero, one = p.dtype.type(0), p.dtype.type(1)
    for r in range(L):
        row = p[r]
        stop = (r + 1 if r + 1 < S else S) if causal else S  # causal: query r sees keys 0..r
        if use_mask:
            mr = mask[r]
            for c in range(stop):
                row[c] += mr[c]
        m = max_of(row[:stop])
        if m == -np.inf:  # every key masked
            stop = 0
        else:
            inv = one / store_exp(row[:stop], m, row[:stop])
            for c in range(stop):
                row[c] *= inv
        for c in range(stop, S):
            row[c] = zero


@njit(fastmath=KERNEL_FASTMATH)
def _times_dropout(src, dst, base, key, threshold, keep_scale):
    """dst = src * D for one (L, S) matrix whose first element has index `base` in P."""
    L, S = src.shape
    dropped = keep_scale * 0
    for r in range(L):
        for c in range(S):
            keep = uniform_bits(key, base + r * S + c) >= threshold
            dst[r, c] = src[r, c] * (keep_scale if keep else dropped)


@njit(nogil=True, cache=True, fastmath=KERNEL_FASTMATH)
def attention_forward(q, k, v, iq, ik, iv, mask, im, use_mask, causal, scale,
                      key, threshold, keep_scale, out, weights, start, stop):
    """For batch indices [start, stop): weights[i] = P (L, S) and out[i] = (P * D) V (L, Ev).

    Dropout is on when keep_scale != 1 (keep_scale = 1 / (1 - p)).
    """
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    dropped = np.empty((L, S), weights.dtype) if keep_scale != 1 else weights[0]  # this thread's buffer
    for i in range(start, stop):
        p = weights[i]
        gemm(False, True, scale, q[iq[i]], k[ik[i]], zero, p)  # scale * Q K^T
        _masked_softmax_rows(p, mask[im[i]], use_mask, causal)
        if keep_scale != 1:
            _times_dropout(p, dropped, i * L * S, key, threshold, keep_scale)
            gemm(False, False, one, dropped, v[iv[i]], zero, out[i])
        else:
            gemm(False, False, one, p, v[iv[i]], zero, out[i])


@njit(nogil=True, cache=True, fastmath=KERNEL_FASTMATH)
def attention_backward(q, k, v, iq, ik, iv, weights, grad_out, scale, key, threshold, keep_scale,
                       dq, dk, dv, dscores, want_dscores, start, stop):
    """For batch indices [start, stop): dq, dk, dv and, if asked, dscores (dL/d masked scores)."""
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    dp = np.empty((L, S), weights.dtype)  # this thread's own buffers
    dropped = np.empty((L, S), weights.dtype) if keep_scale != 1 else dp
    for i in range(start, stop):
        p, go = weights[i], grad_out[i]
        gemm(False, True, one, go, v[iv[i]], zero, dp)  # dL/d(P * D)
        if keep_scale != 1:
            _times_dropout(p, dropped, i * L * S, key, threshold, keep_scale)
            _times_dropout(dp, dp, i * L * S, key, threshold, keep_scale)
            gemm(True, False, one, dropped, go, zero, dv[i])
        else:
            gemm(True, False, one, p, go, zero, dv[i])
        for r in range(L):
            pr, dr = p[r], dp[r]
            s = dot(pr, dr)
            for c in range(S):
                dr[c] = pr[c] * (dr[c] - s)
            if want_dscores:
                ds = dscores[i, r]
                for c in range(S):  # an explicit loop: array assignment compiles slowly
                    ds[c] = dr[c]
        gemm(False, False, scale, dp, k[ik[i]], zero, dq[i])
        gemm(True, False, scale, dp, q[iq[i]], zero, dk[i])
