"""Spoilers: the answers to examples/backprop_ninja_attention.py.

Try the exercise first. Each function has the same name and arguments as
the blank it answers; `python examples/backprop_ninja_attention.py
--solution` runs these instead of yours. Plain numpy: nothing here uses
autograd. The block's shapes: batch B, heads H, positions T, d_k, d, the
feed-forward width and V token ids; every step works for any B (the
capstone trains with 32).
"""
import math

import numpy as np


def _t(a):
    """Transpose the last two axes (per batch and head)."""
    return a.swapaxes(-1, -2)


def _rows(a):
    """(..., n) as (rows, n): every position of every sequence is a row."""
    return a.reshape(-1, a.shape[-1])


def _standardize(x, eps):
    """(xhat, rstd) of LayerNorm over the last axis."""
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps)
    return xc * rstd, rstd


def _layer_norm_backward(dy, x, gamma, eps):
    """dL/dx of y = xhat * gamma + beta, the one-line form (§7)."""
    xhat, rstd = _standardize(x, eps)
    g = dy * gamma                                                  # the gradient reaching xhat
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


def _softmax_backward(dp, p):
    """dL/ds of p = softmax(s) over the last axis (§2)."""
    return p * (dp - (dp * p).sum(-1, keepdims=True))


# ------------------------------------------------------------------ warm-up 1: softmax
def d_p(dloss, G):
    return dloss * G                                                # (3, 5)


def d_ex_sum_inv(dp, ex):
    return (dp * ex).sum(-1, keepdims=True)                         # (3, 1) broadcast -> sum


def d_ex_sum(dex_sum_inv, ex_sum):
    return -dex_sum_inv / ex_sum ** 2                               # (3, 1)


def d_ex(dp, dex_sum, ex_sum_inv):
    return dp * ex_sum_inv + dex_sum                                # (3, 5) two uses: add (sum -> broadcast)


def d_shifted(dex, ex):
    return dex * ex                                                 # (3, 5)


def d_smax(dshifted):
    return -dshifted.sum(-1, keepdims=True)                         # (3, 1) zero for a softmax's dshifted


def d_s(dshifted, dsmax, s, smax):
    return dshifted + (s == smax) * dsmax                           # (3, 5) max: to the maximal entry


def fused_ds(dp, p):
    return _softmax_backward(dp, p)                                 # (3, 5)


# ------------------------------------------------------------------ warm-up 2: LayerNorm
def d_y(dloss, G):
    return dloss * G                                                # (3, 5)


def d_gamma(dy, xhat):
    return (dy * xhat).sum(0)                                       # (5,)


def d_beta(dy):
    return dy.sum(0)                                                # (5,)


def d_xhat(dy, gamma):
    return dy * gamma                                               # (3, 5)


def d_rstd(dxhat, xc):
    return (dxhat * xc).sum(-1, keepdims=True)                      # (3, 1)


def d_var(drstd, var, eps):
    return -0.5 * (var + eps) ** -1.5 * drstd                       # (3, 1)


def d_xc(dxhat, dvar, rstd, xc):
    return dxhat * rstd + 2 * xc / xc.shape[-1] * dvar              # (3, 5)


def d_mu(dxc):
    return -dxc.sum(-1, keepdims=True)                              # (3, 1)


def d_x(dxc, dmu, x):
    return dxc + np.ones_like(x) * dmu / x.shape[-1]                # (3, 5)


def fused_dx(dy, gamma, xhat, rstd):
    g = dy * gamma
    return rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))


# ------------------------------------------------------------------ the block
# cross-entropy, the log-softmax atomically (§9)
def d_picked(dloss, picked):
    return -dloss * np.ones_like(picked) / picked.size             # (N,) each target's share of the mean


def d_logprobs(dpicked, logprobs, bi, ti, targets):
    dlogprobs = np.zeros_like(logprobs)                             # (B, T, V)
    dlogprobs[bi, ti, targets[bi, ti]] = dpicked                    # distinct places: a plain scatter (§11a)
    return dlogprobs


def d_llog(dlogprobs):
    return -dlogprobs.sum(-1, keepdims=True)                        # (B, T, 1) broadcast -> sum


def d_lsum(dllog, lsum):
    return dllog / lsum                                             # (B, T, 1)


def d_lexp(dlsum, lexp):
    return np.ones_like(lexp) * dlsum                               # (B, T, V) sum -> broadcast


def d_lshift(dlogprobs, dlexp, lexp):
    return dlogprobs + dlexp * lexp                                 # (B, T, V) two uses: add


def d_logits(dlshift):
    return dlshift.copy()                                           # (B, T, V) lmax is a constant (§2a)


# the output layer (§1)
def d_H2(dlogits, Wout):
    return dlogits @ Wout.T                                         # (B, T, d)


def d_Wout(dlogits, H2):
    return _rows(H2).T @ _rows(dlogits)                             # (d, V) summed over every position


def d_bout(dlogits):
    return dlogits.sum((0, 1))                                      # (V,)


# Add & Norm 2 (§7, §8)
def d_R2(dH2, R2, g2, eps):
    return _layer_norm_backward(dH2, R2, g2, eps)                   # (B, T, d)


def d_g2(dH2, R2, eps):
    return (dH2 * _standardize(R2, eps)[0]).sum((0, 1))             # (d,)


def d_be2(dH2):
    return dH2.sum((0, 1))                                          # (d,)


def d_FF(dR2):
    return dR2.copy()                                               # (B, T, d) Add passes it on


# the feed-forward block (§12)
def d_Fa(dFF, W2):
    return dFF @ W2.T                                               # (B, T, d_ff)


def d_W2(dFF, Fa):
    return _rows(Fa).T @ _rows(dFF)                                 # (d_ff, d)


def d_b2(dFF):
    return dFF.sum((0, 1))                                          # (d,)


def d_Fh(dFa, Fh):
    Phi = 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-Fh / math.sqrt(2))   # normal CDF
    phi = np.exp(-Fh ** 2 / 2) / math.sqrt(2 * math.pi)             # normal density
    return dFa * (Phi + Fh * phi)                                   # (B, T, d_ff) gelu'(h) = Phi + h phi


def d_W1(dFh, H1):
    return _rows(H1).T @ _rows(dFh)                                 # (d, d_ff)


def d_b1(dFh):
    return dFh.sum((0, 1))                                          # (d_ff,)


def d_H1(dR2, dFh, W1):
    return dR2 + dFh @ W1.T                                         # (B, T, d) residual + feed-forward


# Add & Norm 1 (§7, §8)
def d_R1(dH1, R1, g1, eps):
    return _layer_norm_backward(dH1, R1, g1, eps)                   # (B, T, d)


def d_g1(dH1, R1, eps):
    return (dH1 * _standardize(R1, eps)[0]).sum((0, 1))             # (d,)


def d_be1(dH1):
    return dH1.sum((0, 1))                                          # (d,)


def d_A(dR1):
    return dR1.copy()                                               # (B, T, d)


# output projection and concatenation (§6)
def d_concat(dA, WO):
    return dA @ WO.T                                                # (B, T, H d_k)


def d_WO(dA, concat):
    return _rows(concat).T @ _rows(dA)                              # (H d_k, d)


def d_bo(dA):
    return dA.sum((0, 1))                                           # (d,)


def d_Z(dconcat, Z):
    n_batch, heads, n_pos, d_k = Z.shape
    return dconcat.reshape(n_batch, n_pos, heads, d_k).swapaxes(1, 2)   # (B, H, T, d_k) undo reshape, then swap


# attention, every head at once (§5, §2, §4, §3)
def d_P(dZ, V):
    return dZ @ _t(V)                                               # (B, H, T, T)


def d_V(dZ, P):
    return _t(P) @ dZ                                               # (B, H, T, d_k)


def d_masked(dP, P):
    return _softmax_backward(dP, P)                                 # (B, H, T, T) 0 where P is 0


def d_scaled(dmasked, pad):
    return np.where(pad[:, None, None, :], 0.0, dmasked)            # (B, H, T, T) nothing through -inf


def d_S(dscaled, d_k):
    return dscaled / math.sqrt(d_k)                                 # (B, H, T, T)


def d_Q(dS, K):
    return dS @ K                                                   # (B, H, T, d_k)


def d_K(dS, Q):
    return _t(dS) @ Q                                               # (B, H, T, d_k) key j: from every query


# projections and input (§1, §1a, §10, §11)
def d_WQ(dQ, X):
    return (_t(X)[:, None] @ dQ).sum(0)                             # (H, d, d_k) summed over the batch


def d_WK(dK, X):
    return (_t(X)[:, None] @ dK).sum(0)                             # (H, d, d_k)


def d_WV(dV, X):
    return (_t(X)[:, None] @ dV).sum(0)                             # (H, d, d_k)


def d_X(dQ, dK, dV, dR1, WQ, WK, WV):
    # X was broadcast over the heads: sum over them; plus the residual path
    return (dQ @ _t(WQ) + dK @ _t(WK) + dV @ _t(WV)).sum(1) + dR1   # (B, T, d)


def d_emb(dX, d_model):
    return dX * math.sqrt(d_model)                                  # (B, T, d) PE gets nothing (§10)


def d_Wemb(demb, tokens, Wemb):
    dWemb = np.zeros_like(Wemb)                                     # (V, d)
    np.add.at(dWemb, tokens, demb)                                  # a token seen twice gets both (§11a)
    return dWemb


# ------------------------------------------------------------------ the fused one-line forms
def fused_dlogits(logits, bi, ti, targets):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)                                   # (B, T, V) softmax(logits)
    dlogits = np.zeros_like(logits)
    rows = p[bi, ti]                                                # (N, V) the counted positions
    rows[np.arange(len(bi)), targets[bi, ti]] -= 1                  # minus the one-hot targets
    dlogits[bi, ti] = rows / len(bi)                                # mean over the N counted targets
    return dlogits


def fused_attention(dZ, Q, K, V, P, pad, d_k):
    dV = _t(P) @ dZ                                                 # (B, H, T, d_k)
    dP = dZ @ _t(V)                                                 # (B, H, T, T)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True)) / math.sqrt(d_k)  # softmax (0 at padding), then the scale
    return dS @ K, _t(dS) @ Q, dV                                   # dQ, dK, dV
