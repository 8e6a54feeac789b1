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

from .blas import gemm, library
from .fastmath import SUM_FASTMATH, exp
from .matmul import MACS_PER_ELEMENT
from .random_bits import uniform_bits
from .registry import kernel
from .threads import parallel_for


# One function per direction, helpers written out in place: each separate
# Numba function costs ~0.3 s more to compile, and cold start counts.
# SUM_FASTMATH: nothing here can be regrouped dangerously (sums, and the
# exp of one difference, which `exp` computes with its own flags).

@kernel(fastmath=SUM_FASTMATH)
def _attention_forward(blas, q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, mask, im, use_mask,
                      causal, scale, key, threshold, keep_scale, weights, out, out_off, out_ld,
                      start, stop):
    """For batch indices [start, stop): weights[i] = P (L, S) and O_i = (P * D) V (L, Ev).

    Dropout is on when keep_scale != 1 (keep_scale = 1 / (1 - p)).
    """
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    minus_inf = weights.dtype.type(-np.inf)  # not -np.inf: a float64 m would make the exps float64
    dropped = np.empty((L, S), weights.dtype)  # this thread's buffer for P * D
    for i in range(start, stop):
        p = weights[i]
        gemm(blas, False, True, L, S, E, scale, q[q_off[i]:], q_ld, k[k_off[i]:], k_ld,
             zero, p.reshape(-1), S)  # scale * Q K^T
        m_i = mask[im[i]]
        for r in range(L):  # P = softmax(P + mask) row by row; rows with no key left become 0
            row = p[r]
            keys = (r + 1 if r + 1 < S else S) if causal else S  # causal: query r sees keys 0..r
            if use_mask:
                mr = m_i[r]
                for c in range(keys):
                    row[c] += mr[c]
            m = minus_inf
            for c in range(keys):
                m = row[c] if row[c] > m else m
            if m == minus_inf:  # every key masked: the row is 0
                keys = 0
            total = zero
            for c in range(keys):
                e = exp(row[c] - m)
                row[c] = e
                total += e
            inv = one / total if keys else zero
            for c in range(keys):
                row[c] *= inv
            for c in range(keys, S):
                row[c] = zero
        p_times_d = p
        if keep_scale != 1:  # P * D, D regenerated from P's element index
            base = i * L * S
            for r in range(L):
                for c in range(S):
                    keep = uniform_bits(key, base + r * S + c) >= threshold
                    dropped[r, c] = p[r, c] * (keep_scale if keep else zero)
            p_times_d = dropped
        gemm(blas, False, False, L, Ev, S, one, p_times_d.reshape(-1), S, v[v_off[i]:], v_ld,
             zero, out[out_off[i]:], out_ld)


@kernel(fastmath=SUM_FASTMATH)  # sums of products only: safe to reorder
def _attention_backward(blas, q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, weights,
                       grad, g_off, g_ld, scale, key, threshold, keep_scale,
                       dq, dq_off, dq_ld, dk, dk_off, dk_ld, dv, dv_off, dv_ld,
                       dscores, want_dscores, start, stop):
    """For batch indices [start, stop): dQ_i, dK_i, dV_i and, if asked, dscores[i] (dL/d masked scores)."""
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    dp = np.empty((L, S), weights.dtype)  # this thread's own buffers
    dropped = np.empty((L, S), weights.dtype)
    for i in range(start, stop):
        p = weights[i]
        gemm(blas, False, True, L, S, Ev, one, grad[g_off[i]:], g_ld, v[v_off[i]:], v_ld, zero, dp.reshape(-1), S)
        p_times_d = p
        if keep_scale != 1:  # dP = (G V^T) * D, dV = (P * D)^T G
            base = i * L * S
            for r in range(L):
                for c in range(S):
                    factor = keep_scale if uniform_bits(key, base + r * S + c) >= threshold else zero
                    dropped[r, c] = p[r, c] * factor
                    dp[r, c] *= factor
            p_times_d = dropped
        gemm(blas, True, False, S, Ev, L, one, p_times_d.reshape(-1), S, grad[g_off[i]:], g_ld,
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
        gemm(blas, False, False, L, E, S, scale, dp.reshape(-1), S, k[k_off[i]:], k_ld, zero, dq[dq_off[i]:], dq_ld)
        gemm(blas, True, False, S, E, L, scale, dp.reshape(-1), S, q[q_off[i]:], q_ld, zero, dk[dk_off[i]:], dk_ld)


def _item_size(L, S, E, Ev, directions):
    """Work of one (batch, head): its products (twice as many backward) and a pass over P."""
    return L * S * (E + Ev) * directions // MACS_PER_ELEMENT + L * S


def attention_forward(q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, mask, im, use_mask, causal, scale,
                      key, threshold, keep_scale, weights, out, out_off, out_ld):
    """weights[i] = P_i (L, S) and O_i = (P_i * D_i) V_i for every batch index i (see above)."""
    n, L, S = weights.shape
    parallel_for(_attention_forward, n, library(), q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, mask,
                 im, use_mask, causal, scale, key, threshold, keep_scale, weights, out, out_off, out_ld,
                 item_size=_item_size(L, S, E, Ev, 1), blas=True)


def attention_backward(q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev, weights, grad, g_off, g_ld,
                       scale, key, threshold, keep_scale, dq, dq_off, dq_ld, dk, dk_off, dk_ld, dv, dv_off, dv_ld,
                       dscores, want_dscores):
    """dQ_i, dK_i, dV_i (and dscores[i] = dL/d masked scores if asked) for every batch index i."""
    n, L, S = weights.shape
    parallel_for(_attention_backward, n, library(), q, q_off, q_ld, k, k_off, k_ld, v, v_off, v_ld, E, Ev,
                 weights, grad, g_off, g_ld, scale, key, threshold, keep_scale, dq, dq_off, dq_ld, dk, dk_off,
                 dk_ld, dv, dv_off, dv_ld, dscores, want_dscores, item_size=_item_size(L, S, E, Ev, 2), blas=True)
