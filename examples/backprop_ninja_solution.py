"""Spoilers: the answers to examples/backprop_ninja_attention.py.

Try the exercise first. Each function has the same name and arguments as
the blank it answers; `python examples/backprop_ninja_attention.py
--solution` runs these instead of yours. Shapes: 8 heads, 2 words, d = 4,
d_k = 3, 3 classes. Plain numpy: nothing here uses autograd.
"""
import math

import numpy as np


def _t(a):
    """Transpose the last two axes (per head)."""
    return a.swapaxes(-1, -2)


# cross-entropy (§9): loss = -mean(picked), the log-softmax atomically
def d_picked(dloss, picked):
    return -dloss * np.ones_like(picked) / picked.size             # (2,) each word's share of the mean


def d_logprobs(dpicked, logprobs, targets):
    dlogprobs = np.zeros_like(logprobs)                             # (2, 3)
    dlogprobs[np.arange(len(targets)), targets] = dpicked           # indexing scatters back (§11)
    return dlogprobs


def d_llog(dlogprobs):
    return -dlogprobs.sum(-1, keepdims=True)                        # (2, 1) broadcast -> sum


def d_lsum(dllog, lsum):
    return dllog / lsum                                             # (2, 1)


def d_lexp(dlsum, lexp):
    return np.ones_like(lexp) * dlsum                               # (2, 3) sum -> broadcast


def d_lshift(dlogprobs, dlexp, lexp):
    return dlogprobs + dlexp * lexp                                 # (2, 3) two uses: add


def d_lmax(dlshift):
    return -dlshift.sum(-1, keepdims=True)                          # (2, 1) zero up to rounding


def d_logits(dlshift, dlmax, logits, lmax):
    return dlshift + (logits == lmax) * dlmax                       # (2, 3) max: to the maximal entry


# classifier: logits = H @ Wc + bc (§1)
def d_H(dlogits, Wc):
    return dlogits @ Wc.T                                           # (2, 4)


def d_Wc(dlogits, H):
    return H.T @ dlogits                                            # (4, 3)


def d_bc(dlogits):
    return dlogits.sum(0)                                           # (3,)


# LayerNorm (§7)
def d_gamma(dH, xhat):
    return (dH * xhat).sum(0)                                       # (4,)


def d_beta(dH):
    return dH.sum(0)                                                # (4,)


def d_xhat(dH, gamma):
    return dH * gamma                                               # (2, 4)


def d_rstd(dxhat, xc):
    return (dxhat * xc).sum(-1, keepdims=True)                      # (2, 1)


def d_var(drstd, var, eps):
    return -0.5 * (var + eps) ** -1.5 * drstd                       # (2, 1)


def d_xc(dxhat, dvar, rstd, xc):
    return dxhat * rstd + 2 * xc / xc.shape[-1] * dvar              # (2, 4)


def d_mu(dxc):
    return -dxc.sum(-1, keepdims=True)                              # (2, 1)


def d_R(dxc, dmu, R):
    return dxc + np.ones_like(R) * dmu / R.shape[-1]                # (2, 4)


# residual and output projection (§8, §6)
def d_Y(dR):
    return dR.copy()                                                # (2, 4) Add passes it on


def d_WO(dY, concat):
    return concat.T @ dY                                            # (24, 4)


def d_concat(dY, WO):
    return dY @ WO.T                                                # (2, 24)


def d_Z(dconcat, Z):
    heads, n, d_k = Z.shape
    return dconcat.reshape(n, heads, d_k).swapaxes(0, 1)            # (8, 2, 3) undo reshape, then swap


# attention, per head (§5, §2, §3)
def d_P(dZ, V):
    return dZ @ _t(V)                                               # (8, 2, 2)


def d_V(dZ, P):
    return _t(P) @ dZ                                               # (8, 2, 3)


def d_ex_sum_inv(dP, ex):
    return (dP * ex).sum(-1, keepdims=True)                         # (8, 2, 1)


def d_ex_sum(dex_sum_inv, ex_sum):
    return -dex_sum_inv / ex_sum ** 2                               # (8, 2, 1)


def d_ex(dP, dex_sum, ex_sum_inv):
    return dP * ex_sum_inv + dex_sum                                # (8, 2, 2) two uses: add


def d_shifted(dex, ex):
    return dex * ex                                                 # (8, 2, 2)


def d_smax(dshifted):
    return -dshifted.sum(-1, keepdims=True)                         # (8, 2, 1) zero up to rounding


def d_scaled(dshifted, dsmax, scaled, smax):
    return dshifted + (scaled == smax) * dsmax                      # (8, 2, 2)


def d_S(dscaled, d_k):
    return dscaled / math.sqrt(d_k)                                 # (8, 2, 2)


def d_Q(dS, K):
    return dS @ K                                                   # (8, 2, 3)


def d_K(dS, Q):
    return _t(dS) @ Q                                               # (8, 2, 3) key j: from every query


# projections and input (§1, §6, §8, §10)
def d_WQ(dQ, X):
    return X.T @ dQ                                                 # (4, 2) @ (8, 2, 3) -> (8, 4, 3)


def d_WK(dK, X):
    return X.T @ dK                                                 # (8, 4, 3)


def d_WV(dV, X):
    return X.T @ dV                                                 # (8, 4, 3)


def d_X(dQ, dK, dV, dR, WQ, WK, WV):
    # X was broadcast over the 8 heads: sum over them; plus the residual path
    return (dQ @ _t(WQ) + dK @ _t(WK) + dV @ _t(WV)).sum(0) + dR    # (2, 4)


def d_E(dX):
    return dX.copy()                                                # (2, 4) PE gets nothing (§10)


# the fused one-line forms
def fused_dlogits(logits, targets):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)                                   # (2, 3) softmax(logits)
    p[np.arange(len(targets)), targets] -= 1                        # minus the one-hot targets
    return p / len(targets)                                         # mean over the N words


def fused_dR(dH, gamma, xhat, rstd):
    g = dH * gamma                                                  # (2, 4) the gradient reaching xhat
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


def fused_dscaled(dP, P):
    return P * (dP - (dP * P).sum(-1, keepdims=True))               # (8, 2, 2)


def fused_attention(dZ, Q, K, V, P, d_k):
    dV = _t(P) @ dZ                                                 # (8, 2, 3)
    dP = dZ @ _t(V)                                                 # (8, 2, 2)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True)) / math.sqrt(d_k)  # softmax, then the scaling
    return dS @ K, _t(dS) @ Q, dV                                   # dQ, dK, dV
