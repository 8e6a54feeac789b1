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

Q, K, V, O and the gradients are read and written where they are: each
stack of matrices is one argument, a (buffer, offsets, row stride) triple
(matrix i of q starts at buffer[offsets[i]]), so the heads of a
(B, T, H, E) array, seen as (B, H, T, E), need no copy, and broadcast batch
axes are repeated offsets (their gradients are written per batch index and
summed by the caller). P is a C-ordered (n, L, S) array. The dropout mask
is regenerated from (key, element index of P), the same stream
`dropout_apply` would use on P.

Grouped-query attention: `groups` = (gk, gv, block). gk consecutive
query matrices share one key matrix and gv one value matrix (query matrix
i reads K_{i // gk} and V_{i // gv}; (1, 1, 1) is ordinary attention;
key and value may have different head counts, gk != gv), read in place,
never copied. Their gradients are sums over the group,

    dK_j = sum over i with i // gk == j of scale * dS_i^T Q_i
    dV_j = sum over i with i // gv == j of (P_i * D_i)^T G_i

so backward hands each thread whole blocks of `block` = lcm(gk, gv)
consecutive queries, which hold whole groups of both: the first query of
a group writes its dK_j or dV_j (BLAS with beta = 0), the others add to
it (beta = 1), always in the same order, so the sums are bit-identical
whatever the number of threads. (Hq is a multiple of gk and gv, so of
block: a block never straddles two batch entries.)
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
def _attention_forward(blas, q, k, v, E, Ev, mask, causal, scale, dropout, groups, weights, out, start, stop):
    """For batch indices [start, stop): weights[i] = P (L, S) and O_i = (P * D) V (L, Ev),
    with K the key matrix i // gk and V the value matrix i // gv (groups = (gk, gv, block)).

    q, k, v, out: (buffer, offsets, row stride) of each stack of matrices;
    mask: (additive masks, the mask of each batch index, whether there is
    one); dropout: (key, threshold, keep_scale), on when keep_scale != 1
    (keep_scale = 1 / (1 - p)).
    """
    q_mem, q_off, q_ld = q
    k_mem, k_off, k_ld = k
    v_mem, v_off, v_ld = v
    out_mem, out_off, out_ld = out
    masks, mask_of, use_mask = mask
    key, threshold, keep_scale = dropout
    gk, gv, _ = groups
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    minus_inf = weights.dtype.type(-np.inf)  # not -np.inf: a float64 m would make the exps float64
    dropped = np.empty((L, S), weights.dtype)  # this thread's buffer for P * D
    for i in range(start, stop):
        p, jk, jv = weights[i], i // gk, i // gv
        # P = scale Q K^T, written into P's own memory
        gemm(blas, False, True, L, S, E, scale, q_mem[q_off[i]:], q_ld, k_mem[k_off[jk]:], k_ld, zero, p.reshape(-1), S)
        m_i = masks[mask_of[i]]
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
        # O = (P * D) V
        gemm(blas, False, False, L, Ev, S, one, p_times_d.reshape(-1), S, v_mem[v_off[jv]:], v_ld,
             zero, out_mem[out_off[i]:], out_ld)


@kernel(fastmath=SUM_FASTMATH)  # sums of products only: safe to reorder
def _attention_backward(blas, q, k, v, E, Ev, weights, grad, scale, dropout, groups, dq, dk, dv, dscores,
                        start, stop):
    """For blocks b in [start, stop) of `block` query matrices (groups = (gk, gv, block)):
    each query's dQ_i and, if asked, dL/d masked scores, and the dK_j and dV_j of the
    block's key and value matrices, summed over their groups (the queries i with
    i // gk == j, resp. i // gv == j, in increasing order).

    q, k, v, grad (= dL/dO), dq, dk, dv: (buffer, offsets, row stride) of
    each stack; dropout as in forward; dscores: ((n, L, S) array, whether
    to fill it with dS).
    """
    q_mem, q_off, q_ld = q
    k_mem, k_off, k_ld = k
    v_mem, v_off, v_ld = v
    g_mem, g_off, g_ld = grad
    dq_mem, dq_off, dq_ld = dq
    dk_mem, dk_off, dk_ld = dk
    dv_mem, dv_off, dv_ld = dv
    key, threshold, keep_scale = dropout
    scores_out, want_dscores = dscores
    gk, gv, block = groups
    nb, L, S = weights.shape
    zero, one = weights.dtype.type(0), weights.dtype.type(1)
    dp = np.empty((L, S), weights.dtype)  # this thread's own buffers
    dropped = np.empty((L, S), weights.dtype)
    for b in range(start, stop):
        for i in range(b * block, (b + 1) * block):
            p, jk, jv = weights[i], i // gk, i // gv
            added_k = zero if i == jk * gk else one  # dK_j, dV_j: the group's first query writes, the others add
            added_v = zero if i == jv * gv else one
            # dP = G V^T
            gemm(blas, False, True, L, S, Ev, one, g_mem[g_off[i]:], g_ld, v_mem[v_off[jv]:], v_ld,
                 zero, dp.reshape(-1), S)
            p_times_d = p
            if keep_scale != 1:  # dP = (G V^T) * D, and P * D for dV
                base = i * L * S
                for r in range(L):
                    for c in range(S):
                        factor = keep_scale if uniform_bits(key, base + r * S + c) >= threshold else zero
                        dropped[r, c] = p[r, c] * factor
                        dp[r, c] *= factor
                p_times_d = dropped
            # dV = (P * D)^T G  (+ dV of the group's queries before)
            gemm(blas, True, False, S, Ev, L, one, p_times_d.reshape(-1), S, g_mem[g_off[i]:], g_ld,
                 added_v, dv_mem[dv_off[jv]:], dv_ld)
            for r in range(L):  # dS = P * (dP - rowsum(P * dP)), in place of dP
                pr, dr = p[r], dp[r]
                s = zero
                for c in range(S):
                    s += pr[c] * dr[c]
                for c in range(S):
                    dr[c] = pr[c] * (dr[c] - s)
                if want_dscores:
                    ds = scores_out[i, r]
                    for c in range(S):  # an explicit loop: array assignment compiles slowly
                        ds[c] = dr[c]
            # dQ = scale dS K
            gemm(blas, False, False, L, E, S, scale, dp.reshape(-1), S, k_mem[k_off[jk]:], k_ld,
                 zero, dq_mem[dq_off[i]:], dq_ld)
            # dK = scale dS^T Q  (+ dK of the group's queries before)
            gemm(blas, True, False, S, E, L, scale, dp.reshape(-1), S, q_mem[q_off[i]:], q_ld,
                 added_k, dk_mem[dk_off[jk]:], dk_ld)


def _item_size(L, S, E, Ev, directions):
    """Work of one (batch, head): its products (twice as many backward) and a pass over P."""
    return L * S * (E + Ev) * directions // MACS_PER_ELEMENT + L * S


def attention_forward(q, k, v, E, Ev, mask, causal, scale, dropout, groups, weights, out):
    """weights[i] = P_i (L, S) and O_i = (P_i * D_i) V_{i // gv}, with K_{i // gk} in P_i,
    for every batch index i (see above); the arguments are those of `_attention_forward`."""
    n, L, S = weights.shape
    parallel_for(_attention_forward, n, library(), q, k, v, E, Ev, mask, causal, scale, dropout, groups, weights,
                 out, item_size=_item_size(L, S, E, Ev, 1), blas=True)


def attention_backward(q, k, v, E, Ev, weights, grad, scale, dropout, groups, dq, dk, dv, dscores):
    """dQ_i (and dL/d masked scores if asked) for every batch index i, and dK_j, dV_j
    for every key and value matrix j, summed over its group; the arguments are those of
    `_attention_backward`. One thread does a whole block of groups, in order: deterministic."""
    n, L, S = weights.shape
    block = groups[2]
    parallel_for(_attention_backward, n // block, library(), q, k, v, E, Ev, weights, grad, scale, dropout, groups,
                 dq, dk, dv, dscores, item_size=block * _item_size(L, S, E, Ev, 2), blas=True)
