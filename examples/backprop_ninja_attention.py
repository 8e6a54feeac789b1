# %% [markdown]
# # Becoming a backprop ninja, through a whole encoder block
#
# In the spirit of Andrej Karpathy's "Building makemore Part 4: Becoming a
# Backprop Ninja": you write the backward pass by hand, one gradient at a
# time, and autograd checks every one. Then you train a model with it.
#
# 1. **Warm-up 1, softmax** alone, taken apart into exp, sum, reciprocal and
#    the max shift (whose gradient is zero by construction).
# 2. **Warm-up 2, LayerNorm** alone: mean, centring, variance, 1/sigma.
# 3. **The block**: a whole Transformer encoder block with its input and its
#    loss, on a batch of two sequences of the sort task: embedding lookup
#    (tokens repeat), sinusoidal positions, 4 heads of self-attention with a
#    padding mask, Add & Norm, a feed-forward block with GELU, Add & Norm,
#    an output layer and the cross-entropy over the positions that count.
# 4. **The fused forms**: whole chains in one line, as the kernels do them.
# 5. **The capstone**: train the block to sort with *your* backward
#    functions, and watch your loss curve lie on autograd's.
#
# Every step starts blank: it raises NotImplementedError with a hint that
# names the section of docs/backprop_through_attention.md to read. Run the
# file after each step you write: a table compares yours with autograd's
# (exact / approximate / max difference) and shows the hint of the next
# blank only (`--hints` shows all of them).
#
#     python examples/backprop_ninja_attention.py             # your steps
#     python examples/backprop_ninja_attention.py --hints     # every blank's hint
#     python examples/backprop_ninja_attention.py --solution  # the answers
#     python examples/backprop_ninja_attention.py --solution --plot loss.png  # and the capstone's curves
#
# The notebook examples/backprop_ninja_attention.ipynb holds the same cells
# (generated from this file by examples/make_notebooks.py): edit a step's
# cell, run it, then run the table's cell near the end. The answers live in
# another file, examples/backprop_ninja_solution.py, so you do not read them
# by accident; `--solution` (or BACKPROP_NINJA_SOLUTION=1, or SOLUTION = True
# below) uses them instead of your functions.

# %%
import argparse
import inspect
import math
import os
import sys
from pathlib import Path

import numpy as np

import tinygrad_attn as tg
import tinygrad_attn.functional as F
from tinygrad_attn.data import PAD, SortTask

SOLUTION = os.environ.get("BACKPROP_NINJA_SOLUTION") == "1"  # or: python ... --solution
ALL_HINTS = False                                             # or: python ... --hints

DOC = "docs/backprop_through_attention.md"
SECTIONS = {  # the sections of DOC the hints point to (their titles as they are in DOC)
    "0": "The rule of the game",
    "1": "Matrix multiplication and the Linear layer",
    "1a": "Sums and broadcasts: each is the other's backward",
    "2": "Softmax",
    "2a": "The max shift: why softmax subtracts the row's max, and why its gradient is zero",
    "3": "Scaling",
    "4": "Masking",
    "5": "Scaled dot-product attention as a whole",
    "6": "Multi-head: split and concatenate",
    "7": "Layer normalisation",
    "8": "Residual connections: post-norm and pre-norm",
    "9": "Cross-entropy with log-softmax",
    "10": "Positional encoding, fixed and learned",
    "11": "Embeddings: lookup, the sqrt(d_model) scale, tied weights",
    "11a": "Gather and scatter-add: the backward of indexing",
    "12": "The feed-forward block and dropout",
}


def blank(section, hint):
    """What every step does until you write it."""
    raise NotImplementedError(f"{hint} (see {DOC} §{section} {SECTIONS[section]})")


# %% [markdown]
# ## Warm-up 1: softmax, atomically
#
# One softmax over the rows of s (3 rows of 5 scores), taken apart as a
# framework would if it had no fused softmax. The loss is L = sum(G * p) for a
# fixed random G, so the gradient arriving at p is G itself (your first step).
#
# Each function below returns the gradient of the variable in its name:
# `d_ex_sum_inv` returns dL/dex_sum_inv, with the shape of `ex_sum_inv`. Its
# arguments are what it needs: a name starting with `d` is a gradient already
# known (of a variable later in the forward pass, nearer the loss), any
# other name a forward value or constant. You may add any forward variable
# or constant of the part's `forward`, or the gradient `d<name>` of a
# variable nearer the loss. When a variable feeds several ops, its gradient
# is the sum of what comes back from each (§0).

# %%
def softmax_example(seed=0):
    rng = np.random.default_rng(seed)
    return {"s": 2 * rng.normal(size=(3, 5))}, {"G": rng.normal(size=(3, 5))}


def softmax_forward(params, constants):
    s, G = params["s"], constants["G"]
    smax = s.amax(-1, keepdim=True)              # (3, 1) the row's max, subtracted so exp cannot overflow
    shifted = s - smax                           # (3, 5)
    ex = shifted.exp()                           # (3, 5)
    ex_sum = ex.sum(-1, keepdim=True)            # (3, 1)
    ex_sum_inv = ex_sum ** -1                    # (3, 1)
    p = ex * ex_sum_inv                          # (3, 5) each row sums to 1
    loss = (p * tg.Tensor(G)).sum()              # ()     so dL/dp = G
    return {name: value for name, value in locals().items() if isinstance(value, tg.Tensor)}


# %%
def d_p(dloss, G):
    blank("1a", "loss = (p * G).sum(): the backward of a sum is a broadcast, then the product")


def d_ex_sum_inv(dp, ex):
    blank("1a", "p = ex * ex_sum_inv with ex_sum_inv (3, 1) broadcast over the row: sum over the axis it "
                "was broadcast to")


def d_ex_sum(dex_sum_inv, ex_sum):
    blank("2", "ex_sum_inv = ex_sum ** -1, and d(1/u)/du = -1/u**2")


def d_ex(dp, dex_sum, ex_sum_inv):
    blank("1a", "ex feeds p = ex * ex_sum_inv directly and ex_sum = ex.sum(-1), whose backward is a "
                "broadcast: add both")


def d_shifted(dex, ex):
    blank("2", "ex = exp(shifted), and exp is its own derivative")


def d_smax(dshifted):
    blank("2a", "shifted = s - smax with smax (3, 1) broadcast over the row: minus the sum over the row. "
                "It is zero by construction, so it is checked on a random upstream gradient instead")


def d_s(dshifted, dsmax, s, smax):
    blank("2a", "s reaches shifted directly and smax = the row's max, whose gradient goes to the maximal "
                "entry of the row")


def fused_ds(dp, p):
    blank("2", "the whole softmax backward in one line, from p and dp (the max shift changes nothing)")


# %% [markdown]
# ## Warm-up 2: LayerNorm, atomically
#
# LayerNorm of 3 rows of 5 features, y = xhat * gamma + beta with
# xhat = (x - mean) / sqrt(var + eps), the biased variance as in PyTorch.
# The loss is again L = sum(G * y).

# %%
def layer_norm_example(seed=0):
    rng = np.random.default_rng(seed + 1)
    params = {"x": 1 + 2 * rng.normal(size=(3, 5)),
              "gamma": 1 + 0.3 * rng.normal(size=5),   # random, not 1 and 0, so that a step that
              "beta": 0.3 * rng.normal(size=5)}        # forgets one of them shows up in the table
    return params, {"G": rng.normal(size=(3, 5)), "eps": 1e-5}


def layer_norm_forward(params, constants):
    x, gamma, beta, G, eps = params["x"], params["gamma"], params["beta"], constants["G"], constants["eps"]
    mu = x.mean(-1, keepdim=True)                # (3, 1)
    xc = x - mu                                  # (3, 5) centred
    var = (xc ** 2).mean(-1, keepdim=True)       # (3, 1) biased variance
    rstd = (var + eps) ** -0.5                   # (3, 1) 1 / sigma
    xhat = xc * rstd                             # (3, 5)
    y = xhat * gamma + beta                      # (3, 5)
    loss = (y * tg.Tensor(G)).sum()              # ()     so dL/dy = G
    return {name: value for name, value in locals().items() if isinstance(value, tg.Tensor)}


# %%
def d_y(dloss, G):
    blank("1a", "loss = (y * G).sum(), as in warm-up 1")


def d_gamma(dy, xhat):
    blank("7", "y = xhat * gamma + beta: gamma (5,) multiplies every row, so sum over the rows")


def d_beta(dy):
    blank("7", "beta (5,) is added to every row")


def d_xhat(dy, gamma):
    blank("7", "y = xhat * gamma + beta, elementwise in xhat")


def d_rstd(dxhat, xc):
    blank("1a", "xhat = xc * rstd with rstd (3, 1) broadcast over the row")


def d_var(drstd, var, eps):
    blank("7", "rstd = (var + eps) ** -0.5: the power rule")


def d_xc(dxhat, dvar, rstd, xc):
    blank("7", "xc feeds xhat = xc * rstd and var = mean(xc ** 2) over the row of 5: add both")


def d_mu(dxc):
    blank("1a", "xc = x - mu, mu (3, 1) broadcast over the row")


def d_x(dxc, dmu, x):
    blank("1a", "x feeds xc directly and mu = mean(x) over the row of 5")


def fused_dx(dy, gamma, xhat, rstd):
    blank("7", "the whole LayerNorm backward in one line, from g = dy * gamma")


# %% [markdown]
# ## The block
#
# A whole encoder block (post-norm, as the paper's and
# `nn.TransformerEncoderLayer`'s default), with its input and its loss, on
# two sequences of the sort task (`tinygrad_attn.data.SortTask`): each
# position must predict the symbol that belongs there once the sequence is
# sorted. The second sequence is shorter, so it is padded: padding keys are
# masked in the attention and padding positions do not count in the loss.
#
# Sizes, all different so that a wrong transpose shows: batch B = 2,
# T = 5 positions, d = 8, 4 heads of d_k = 3 (concatenated: 12), a
# feed-forward width of 16 and V = 6 token ids (PAD, BOS, EOS and the
# symbols 0, 1, 2 as ids 3, 4, 5). The capstone trains the same block with
# a batch of 32: write your steps for any batch size.
#
# Softmax and LayerNorm are now the fused ops `F.softmax` and `F.layer_norm`
# (the warm-ups took them apart): their steps are the one-line forms. The
# row max of the log-softmax is taken with `.detach()`, as
# tinygrad_attn.reference does (§2a): its gradient is zero by construction,
# so it is a constant and has no step.

# %%
B, T, D, N_HEADS, D_K, D_FF, VOCAB, EPS = 2, 5, 8, 4, 3, 16, 6, 1e-5
TASK = SortTask(num_symbols=3, length=T, min_length=3)  # sequences of 3 to 5 symbols 0-2
BLOCK_PARAMS = ("Wemb", "WQ", "WK", "WV", "WO", "bo", "g1", "be1", "W1", "b1", "W2", "b2", "g2", "be2",
                "Wout", "bout")


def positional_encoding(n, d):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): a fixed table (§10)."""
    angle = np.arange(n)[:, None] / 10000 ** (np.arange(0, d, 2) / d)
    pe = np.zeros((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def block_params(seed=0):
    """The block's parameters (float64), scaled as a real initialisation would (1/sqrt(fan-in));
    LayerNorm's gains and the biases are random too, so that forgetting one shows."""
    rng = np.random.default_rng(seed)
    normal = lambda fan_in, *shape: rng.normal(size=shape) / math.sqrt(fan_in)
    return {
        "Wemb": normal(D, VOCAB, D),                                      # (6, 8) the embedding table
        "WQ": normal(D, N_HEADS, D, D_K), "WK": normal(D, N_HEADS, D, D_K),  # (4, 8, 3) per head, row form
        "WV": normal(D, N_HEADS, D, D_K),
        "WO": normal(N_HEADS * D_K, N_HEADS * D_K, D), "bo": 0.1 * rng.normal(size=D),   # (12, 8), (8,)
        "g1": 1 + 0.1 * rng.normal(size=D), "be1": 0.1 * rng.normal(size=D),          # LayerNorm 1
        "W1": normal(D, D, D_FF), "b1": 0.1 * rng.normal(size=D_FF),                   # (8, 16), (16,)
        "W2": normal(D_FF, D_FF, D), "b2": 0.1 * rng.normal(size=D),                   # (16, 8), (8,)
        "g2": 1 + 0.1 * rng.normal(size=D), "be2": 0.1 * rng.normal(size=D),          # LayerNorm 2
        "Wout": normal(D, D, VOCAB), "bout": 0.1 * rng.normal(size=VOCAB),             # (8, 6), (6,)
    }


def block_constants(sequences):
    """Token ids, targets and masks for source sequences of symbols (lists of 0, 1, 2)."""
    batch = TASK.make_batch(sequences)
    tokens = batch.src                                        # (B, T) ids, PAD after a short sequence
    pad = tokens == PAD                                       # (B, T) True at padding
    targets = np.where(pad, PAD, batch.tgt_out[:, :T])        # (B, T) the sorted sequence's ids
    bi, ti = np.nonzero(~pad)                                 # the positions that count in the loss
    return {"tokens": tokens, "pad": pad, "targets": targets, "bi": bi, "ti": ti,
            "PE": positional_encoding(tokens.shape[1], D), "d_model": D, "d_k": D_K, "eps": EPS}


def block_example(seed=0):
    return block_params(seed), block_constants([[2, 0, 1, 0, 2], [1, 2, 1]])


# %% [markdown]
# The forward pass, one op per line. The comments give each result's shape
# (2 = batch, 4 = heads, 5 = positions, 3 = d_k, 8 = d) and the section of
# the doc (§N) that derives its backward. In a notebook,
# `values, grads = reference("block")` gives every forward value and
# autograd's gradient as numpy arrays by name, to look around: `values["P"][0, 0]`.

# %%
def block_forward(params, constants):
    """The block, one op per line. Returns {name: Tensor} for every variable."""
    Wemb, WQ, WK, WV, WO, bo, g1, be1, W1, b1, W2, b2, g2, be2, Wout, bout = (params[k] for k in BLOCK_PARAMS)
    tokens, pad, targets, bi, ti = (constants[k] for k in ("tokens", "pad", "targets", "bi", "ti"))
    PE, d_model, d_k, eps = (constants[k] for k in ("PE", "d_model", "d_k", "eps"))
    n_batch, n_pos = tokens.shape

    # input: embedding lookup, scaled, plus positions (§11, §10)
    emb = Wemb[tokens]                           # (2, 5, 8)  a gather: tokens repeat (§11a)
    X = emb * math.sqrt(d_model) + tg.Tensor(PE)  # (2, 5, 8)
    # multi-head self-attention: X (2, 1, 5, 8) @ W (4, 8, 3) broadcasts X over the heads (§1a, §6)
    Q = X[:, None] @ WQ                          # (2, 4, 5, 3) queries
    K = X[:, None] @ WK                          # (2, 4, 5, 3) keys
    V = X[:, None] @ WV                          # (2, 4, 5, 3) values
    S = Q @ K.swapaxes(-1, -2)                   # (2, 4, 5, 5) S[b, h, i, j] = q_i . k_j
    scaled = S / math.sqrt(d_k)                  # (2, 4, 5, 5) (§3)
    masked = scaled.masked_fill(tg.Tensor(pad[:, None, None, :]), -math.inf)  # padding keys (§4)
    P = F.softmax(masked, dim=-1)                # (2, 4, 5, 5) attention weights (§2)
    Z = P @ V                                    # (2, 4, 5, 3) each head's output (§5)
    concat = Z.swapaxes(1, 2).reshape(n_batch, n_pos, -1)  # (2, 5, 12) the heads side by side (§6)
    A = concat @ WO + bo                         # (2, 5, 8)
    # Add & Norm (§8, §7)
    R1 = X + A                                   # (2, 5, 8)
    H1 = F.layer_norm(R1, (d_model,), g1, be1, eps)  # (2, 5, 8)
    # feed-forward block with GELU, position by position (§12)
    Fh = H1 @ W1 + b1                            # (2, 5, 16)
    Fa = F.gelu(Fh)                              # (2, 5, 16)
    FF = Fa @ W2 + b2                            # (2, 5, 8)
    # Add & Norm
    R2 = H1 + FF                                 # (2, 5, 8)
    H2 = F.layer_norm(R2, (d_model,), g2, be2, eps)  # (2, 5, 8) the block's output
    # output layer and cross-entropy over the positions that are not padding (§9)
    logits = H2 @ Wout + bout                    # (2, 5, 6)
    lmax = logits.amax(-1, keepdim=True).detach()  # (2, 5, 1) a constant: zero gradient by construction (§2a)
    lshift = logits - lmax                       # (2, 5, 6)
    lexp = lshift.exp()                          # (2, 5, 6)
    lsum = lexp.sum(-1, keepdim=True)            # (2, 5, 1)
    llog = lsum.log()                            # (2, 5, 1)
    logprobs = lshift - llog                     # (2, 5, 6) log-softmax of the logits
    picked = logprobs[bi, ti, targets[bi, ti]]   # (8,)  log-probability of each counted target (§11a)
    loss = -picked.mean()                        # ()
    return {name: value for name, value in locals().items() if isinstance(value, tg.Tensor)}


# %% [markdown]
# Two helpers for your steps: the fused LayerNorm keeps xhat and 1/sigma to
# itself, so `standardize` recomputes them from its input (you computed them
# atomically in warm-up 2), and `normal_cdf` is the Phi of GELU (numpy has
# no erf).

# %%
def standardize(x, eps):
    """(xhat, rstd) of LayerNorm over the last axis: xhat = (x - mean) * rstd, rstd = 1/sqrt(var + eps)."""
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps)
    return xc * rstd, rstd


def normal_cdf(x):
    """Phi(x), the standard normal CDF, elementwise: GELU(x) = x Phi(x)."""
    return 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-np.asarray(x) / math.sqrt(2))


# %% [markdown]
# ## Your turn: the block's backward, from the loss down

# %% cross-entropy, the log-softmax atomically (§9)
def d_picked(dloss, picked):
    blank("9", "loss = -picked.mean(): each of the counted log-probabilities gets the same share, with the sign")


def d_logprobs(dpicked, logprobs, bi, ti, targets):
    blank("11a", "picked = logprobs[bi, ti, targets[bi, ti]] is a gather: dpicked goes back to the places it "
                 "was picked from, zero elsewhere")


def d_llog(dlogprobs):
    blank("1a", "logprobs = lshift - llog with llog (B, T, 1) broadcast over the classes: sum over the axis "
                "it was broadcast to, with the sign")


def d_lsum(dllog, lsum):
    blank("9", "llog = log(lsum), and d log(u)/du = 1/u")


def d_lexp(dlsum, lexp):
    blank("1a", "lsum = lexp.sum(-1): the backward of a sum is a broadcast")


def d_lshift(dlogprobs, dlexp, lexp):
    blank("0", "lshift feeds logprobs directly and lexp = exp(lshift): add the two contributions")


def d_logits(dlshift):
    blank("2a", "lshift = logits - lmax, and lmax is detached (its gradient is zero by construction)")


# %% the output layer: logits = H2 @ Wout + bout (§1)
def d_H2(dlogits, Wout):
    blank("1", "H2 is the A side of the product H2 @ Wout")


def d_Wout(dlogits, H2):
    blank("1", "Wout is the B side, shared by all 2 x 5 positions: sum their contributions (flatten them to "
               "rows)")


def d_bout(dlogits):
    blank("1a", "bout (6,) was added at every position: sum over the batch and the positions")


# %% Add & Norm 2: H2 = layer_norm(R2), R2 = H1 + FF (§7, §8)
def d_R2(dH2, R2, g2, eps):
    blank("7", "the fused LayerNorm backward, from g = dH2 * g2 (standardize(R2, eps) gives xhat and rstd)")


def d_g2(dH2, R2, eps):
    blank("7", "H2 = xhat * g2 + be2: g2 multiplies every position, so sum over the batch and the positions")


def d_be2(dH2):
    blank("7", "be2 is added at every position")


def d_FF(dR2):
    blank("8", "R2 = H1 + FF: the addition hands its gradient to both inputs")


# %% the feed-forward block: FF = gelu(H1 @ W1 + b1) @ W2 + b2 (§12)
def d_Fa(dFF, W2):
    blank("1", "FF = Fa @ W2 + b2: Fa is the A side")


def d_W2(dFF, Fa):
    blank("1", "W2 is the B side, shared by every position")


def d_b2(dFF):
    blank("1a", "b2 is added at every position")


def d_Fh(dFa, Fh):
    blank("12", "Fa = gelu(Fh) = Fh * Phi(Fh) elementwise: gelu'(h) = Phi(h) + h phi(h), phi the normal "
                "density (normal_cdf gives Phi)")


def d_W1(dFh, H1):
    blank("1", "Fh = H1 @ W1 + b1: W1 is the B side, shared by every position")


def d_b1(dFh):
    blank("1a", "b1 is added at every position")


def d_H1(dR2, dFh, W1):
    blank("8", "H1 feeds the residual R2 = H1 + FF and the feed-forward block through Fh: add both")


# %% Add & Norm 1: H1 = layer_norm(R1), R1 = X + A (§7, §8)
def d_R1(dH1, R1, g1, eps):
    blank("7", "the fused LayerNorm backward again, from g = dH1 * g1")


def d_g1(dH1, R1, eps):
    blank("7", "as for g2")


def d_be1(dH1):
    blank("7", "as for be2")


def d_A(dR1):
    blank("8", "R1 = X + A")


# %% output projection and concatenation: A = concat @ WO + bo (§6)
def d_concat(dA, WO):
    blank("6", "A = concat @ WO + bo: concat is the A side")


def d_WO(dA, concat):
    blank("6", "WO is the B side, shared by every position")


def d_bo(dA):
    blank("1a", "bo is added at every position")


def d_Z(dconcat, Z):
    blank("6", "concat = Z.swapaxes(1, 2).reshape(B, T, H * d_k) only moves numbers: undo the moves, last "
                "first (take B, H, T, d_k from Z.shape: the capstone's batches are larger)")


# %% attention, every head at once: Z = P @ V, P = softmax(masked) (§5, §2, §4, §3)
def d_P(dZ, V):
    blank("5", "Z = P @ V for each batch and head: P is the A side (transpose the last two axes)")


def d_V(dZ, P):
    blank("5", "Z = P @ V: V is the B side")


def d_masked(dP, P):
    blank("2", "P = softmax(masked): the one-line softmax backward of warm-up 1")


def d_scaled(dmasked, pad):
    blank("4", "masked = scaled with -inf at the padding keys: no gradient passes there (and dmasked is 0 "
               "there already: why?)")


def d_S(dscaled, d_k):
    blank("3", "scaled = S / sqrt(d_k) is linear")


def d_Q(dS, K):
    blank("5", "S = Q @ K^T: Q is the A side")


def d_K(dS, Q):
    blank("5", "S = Q @ K^T: K^T is the B side, and you want dK, not dK^T")


# %% projections and input: Q = X[:, None] @ WQ, ..., X = emb * sqrt(d) + PE (§1, §1a, §6, §10, §11)
def d_WQ(dQ, X):
    blank("1a", "Q = X[:, None] @ WQ: WQ[h] is the B side for every sequence of the batch: sum over the batch")


def d_WK(dK, X):
    blank("1a", "as for WQ")


def d_WV(dV, X):
    blank("1a", "as for WQ")


def d_X(dQ, dK, dV, dR1, WQ, WK, WV):
    blank("1a", "X was broadcast over the 4 heads for Q, K and V (sum over the heads), and feeds the "
                "residual R1 = X + A: add all of these")


def d_emb(dX, d_model):
    blank("11", "X = emb * sqrt(d_model) + PE, and PE is a constant table (§10): no gradient flows into it")


def d_Wemb(demb, tokens, Wemb):
    blank("11a", "emb = Wemb[tokens] is a gather of rows: scatter-add demb back, and tokens repeat "
                 "(np.add.at, not +=)")


# %% [markdown]
# ## Then: the fused one-line forms
#
# Once the atomic steps agree with autograd, collapse whole chains into the
# one-line formulas of the doc, the ones the Numba kernels implement. Each
# is compared with autograd again.

# %%
def fused_dlogits(logits, bi, ti, targets):
    blank("9", "the whole cross-entropy backward, from the logits: softmax minus the one-hot targets at the "
               "counted positions, divided by their number, and 0 at padding")


def fused_attention(dZ, Q, K, V, P, pad, d_k):
    blank("5", "return (dQ, dK, dV) from dZ: five lines, the whole of attention's backward")


# %% [markdown]
# ## The checking machinery
#
# Each part: its example, its forward, its steps in the order of backward,
# its fused forms and what they return. `cmp` prints one row of the table:
# is your gradient exactly autograd's, equal up to TOL, and the largest
# difference. Every step is fed autograd's gradients as its `d...`
# arguments, not yours, so each step is checked on its own: a blank, or a
# mistake, in an earlier step does not stop the later ones from being
# checked. When every step of a part is written, the chain is run once more
# on your gradients alone, end to end.
#
# One step cannot be checked against autograd: `d_smax`, whose true value is
# zero by construction (§2a). Autograd gives rounding noise there (1e-17),
# and any formula that returns something that small would "match". So it
# is checked on a random upstream gradient instead (one that does not sum
# to zero over a row), against what autograd gives for that one op.

# %%
TOL = 1e-10


def smax_on_a_random_upstream(values, seed=0):
    """({"dshifted": R}, autograd's dsmax for it): the op shifted = s - smax,
    backpropagated from a random R that is not a softmax's input gradient."""
    R = np.random.default_rng(seed).normal(size=values["shifted"].shape)
    smax = tg.Tensor(values["smax"], requires_grad=True)
    (tg.Tensor(values["s"]) - smax).backward(tg.Tensor(R))
    return {"dshifted": R}, smax.grad.data


PARTS = {  # name: what the table needs to know of each part
    "softmax": dict(title="Warm-up 1: softmax", example=softmax_example, forward=softmax_forward,
                    steps=("d_p", "d_ex_sum_inv", "d_ex_sum", "d_ex", "d_shifted", "d_smax", "d_s"),
                    fused={"fused_ds": ("s",)}, params=("s",),
                    zero_by_construction={"smax": smax_on_a_random_upstream}),
    "layer_norm": dict(title="Warm-up 2: LayerNorm", example=layer_norm_example, forward=layer_norm_forward,
                       steps=("d_y", "d_gamma", "d_beta", "d_xhat", "d_rstd", "d_var", "d_xc", "d_mu", "d_x"),
                       fused={"fused_dx": ("x",)}, params=("x", "gamma", "beta")),
    "block": dict(title="The block", example=block_example, forward=block_forward,
                  steps=("d_picked", "d_logprobs", "d_llog", "d_lsum", "d_lexp", "d_lshift", "d_logits",
                         "d_H2", "d_Wout", "d_bout", "d_R2", "d_g2", "d_be2", "d_FF",
                         "d_Fa", "d_W2", "d_b2", "d_Fh", "d_W1", "d_b1", "d_H1",
                         "d_R1", "d_g1", "d_be1", "d_A", "d_concat", "d_WO", "d_bo", "d_Z",
                         "d_P", "d_V", "d_masked", "d_scaled", "d_S", "d_Q", "d_K",
                         "d_WQ", "d_WK", "d_WV", "d_X", "d_emb", "d_Wemb"),
                  fused={"fused_dlogits": ("logits",), "fused_attention": ("Q", "K", "V")}, params=BLOCK_PARAMS,
                  detached={"lmax": "d_logits"}),  # no step: printed after d_logits
}


def run(part, params, constants, backward=True):
    """Forward (and autograd's backward) of one part. Returns (values, grads), numpy arrays by name."""
    leaves = {k: tg.Tensor(v, requires_grad=backward) for k, v in params.items()}
    with tg.enable_grad() if backward else tg.no_grad():
        tensors = PARTS[part]["forward"](leaves, constants)
    if backward:
        for t in tensors.values():
            if not t.is_leaf:
                t.retain_grad()  # keep .grad on the intermediates too
        tensors["loss"].backward()
    values = {**constants, **{k: t.data for k, t in tensors.items()}}
    grads = {k: t.grad.data for k, t in tensors.items() if t.grad is not None}
    return values, grads


def reference(part="block", seed=0):
    """(values, grads) of one part's example: every forward value and autograd's gradient by name."""
    return run(part, *PARTS[part]["example"](seed))


def cmp(name, mine, autograd, show=True):
    """One row of the table; returns the max difference (inf if the shapes differ)."""
    mine = np.asarray(mine, dtype=np.float64)
    if mine.shape != autograd.shape:
        if show:
            print(f"{name:15s} | wrong shape: {mine.shape}, autograd's is {autograd.shape}")
        return math.inf
    exact = bool(np.array_equal(mine, autograd))
    maxdiff = float(np.abs(mine - autograd).max(initial=0))
    if show:
        print(f"{name:15s} | exact: {str(exact):5s} | approximate: {str(maxdiff <= TOL):5s} | maxdiff: {maxdiff:.1e}")
    return maxdiff


def arguments(fn, values, grads, override=None):
    """fn's arguments by name: `dfoo` is the gradient of foo, anything else a forward value."""
    given = {**values, **{"d" + k: g for k, g in grads.items()}, **(override or {})}
    return {a: given[a] for a in inspect.signature(fn).parameters}


def solution_module():
    """examples/backprop_ninja_solution.py, the answers."""
    here = Path(globals().get("__file__", "backprop_ninja_attention.py")).resolve().parent
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    import backprop_ninja_solution
    return backprop_ninja_solution


def functions(part, solution=False):
    """({step name: function}, {fused name: function}) of a part: yours, or the solution's."""
    source = vars(solution_module()) if solution else globals()
    spec = PARTS[part]
    return {n: source[n] for n in spec["steps"]}, {n: source[n] for n in spec["fused"]}


BLANK, FAILED = object(), object()  # what attempt returns instead of a gradient


class Table:
    """Prints the rows of every part. Shows the hint of the first blank only (all of them with
    all_hints), and a run of blanks without hints as one row."""

    def __init__(self, show=True, all_hints=False):
        self.show, self.all_hints, self.next_blank, self.blanks = show, all_hints, None, []

    def say(self, text):
        self.flush()
        if self.show:
            print(text)

    def flush(self):
        """Print the run of blanks held back, as one row."""
        run, self.blanks = self.blanks, []
        if run and self.show:
            label = run[0] if len(run) == 1 else f"{run[0]} .. {run[-1]}"
            print(f"{label:15s} | not written" + (f" ({len(run)} steps)" if len(run) > 1 else ""))

    def attempt(self, fn, name, label, args):
        """fn's result, or BLANK (hint printed for the next blank) or FAILED (error printed)."""
        try:
            return fn(**args)
        except NotImplementedError as e:
            if self.next_blank is None or self.all_hints:
                self.say(f"{label:15s} | not written: {e}")
            else:
                self.blanks.append(label)
            self.next_blank = self.next_blank or name
            return BLANK
        except Exception as e:  # a bug in a step: report it and go on with the others
            self.say(f"{label:15s} | {name} raised {type(e).__name__}: {e}")
            return FAILED

    def score(self, name, mine, autograd):
        """The table's value for one gradient: maxdiff, None if blank, inf if it raised."""
        if mine is BLANK:
            return None
        if mine is FAILED:
            return math.inf
        self.flush()
        return cmp(name, mine, autograd, self.show)


def check(part, steps, values, grads, table):
    """Run each step on autograd's gradients and compare. Returns {grad name: maxdiff, or None if blank}."""
    spec, results = PARTS[part], {}
    for name, fn in steps.items():
        var = name[2:]  # d_logits -> logits
        zero = spec.get("zero_by_construction", {}).get(var)
        override, expected = zero(values) if zero else ({}, grads[var])
        mine = table.attempt(fn, name, "d" + var, arguments(fn, values, grads, override))
        if zero and mine is not BLANK:
            table.say(f"{'d' + var:15s} | zero by construction (§2a): autograd's is rounding noise (max "
                      f"{np.abs(grads[var]).max():.0e}), not compared; on a random upstream gradient instead:")
        results["d" + var] = table.score("d" + var, mine, expected)
        for detached, after in spec.get("detached", {}).items():
            if after == name:
                table.say(f"{'d' + detached:15s} | detached: zero gradient by construction (§2a), no step")
    table.flush()
    return results


class StepError(Exception):
    """A step that raised, named, with the shape of the batch it ran on."""


def chain(steps, values):
    """Every step fed only the gradients the steps before it returned. {var: gradient}"""
    own = {"loss": np.ones(())}
    for name, fn in steps.items():
        try:
            own[name[2:]] = np.asarray(fn(**arguments(fn, values, own)), dtype=np.float64)
        except Exception as e:
            raise StepError(f"{name} raised {type(e).__name__} on a batch of tokens {values['tokens'].shape}"
                            f" (B, T): {e}") from e
    return own


def check_fused(part, fused, values, grads, table):
    """As check, for the fused forms (fused_attention gives three gradients)."""
    results = {}
    for name, fn in fused.items():
        outs = PARTS[part]["fused"][name]
        mine = table.attempt(fn, name, name, arguments(fn, values, grads))
        if mine is BLANK or mine is FAILED or len(outs) == 1:
            mine = [mine] * len(outs)
        for o, m in zip(outs, mine):
            results["d" + o] = table.score(f"d{o}, fused", m, grads[o])
    table.flush()
    return results


def check_part(part, table, solution=False, seed=0):
    """One part's table. Returns (step results, fused results, end-to-end maxdiff or None)."""
    spec = PARTS[part]
    values, grads = reference(part, seed)
    steps, fused = functions(part, solution)
    table.say(f"\n== {spec['title']} ({'the solution' if solution else 'your steps'}) ==")
    results = check(part, steps, values, grads, table)
    chained = None
    if all(diff is not None and diff < math.inf for diff in results.values()):
        own = chain(steps, values)
        chained = max(float(np.abs(own[p] - grads[p]).max()) for p in spec["params"])
        table.say(f"End to end, every step fed only your own gradients: the gradients of "
                  f"{', '.join(spec['params'])} differ from autograd's by at most {chained:.1e}.")
    table.say("The fused one-line forms, from the same autograd inputs:")
    return results, check_fused(part, fused, values, grads, table), chained


# %% [markdown]
# ## Run it: the table

# %%
def main(argv=None, verbose=True):
    """Print every part's table, then train with your steps once the block's
    are all written (the capstone). Returns {part: (step results, fused
    results, end-to-end maxdiff)} without the capstone when argv has --no-capstone."""
    parser = argparse.ArgumentParser(description="Write the backward pass of a whole encoder block by hand, "
                                     "step by step, compare every gradient with autograd's, then train "
                                     "with it.")
    parser.add_argument("--solution", action="store_true",
                        help="use the answers (examples/backprop_ninja_solution.py) instead of your steps")
    parser.add_argument("--hints", action="store_true", help="show the hint of every blank, not only the next")
    parser.add_argument("--seed", type=int, default=0, help="seed of the example's numbers (default 0)")
    parser.add_argument("--no-capstone", action="store_true", help="only the tables: do not train")
    parser.add_argument("--steps", type=int, default=None, help="training steps of the capstone (default "
                        f"{CAPSTONE_STEPS})")
    parser.add_argument("--plot", default=None, help="write the capstone's loss curves to this PNG file")
    args, _ = parser.parse_known_args(argv)  # known only: a Jupyter kernel passes its own arguments
    solution = args.solution or SOLUTION
    table = Table(verbose, args.hints or ALL_HINTS)

    outcome = {part: check_part(part, table, solution, args.seed) for part in PARTS}
    left = {part: (sum(d is None for d in r[0].values()),   # blank steps and blank fused forms
                   sum(r[1]["d" + outs[0]] is None for outs in PARTS[part]["fused"].values()))
            for part, r in outcome.items()}
    wrong = [f"{n}{', fused' if fused else ''} ({PARTS[part]['title']})" for part, r in outcome.items()
             for fused in (0, 1) for n, d in r[fused].items() if d is not None and not d <= TOL]
    if table.next_blank:
        counts = "; ".join(f"{PARTS[p]['title']}, {n} of {len(PARTS[p]['steps'])} steps and {f} of "
                           f"{len(PARTS[p]['fused'])} fused forms" for p, (n, f) in left.items() if n or f)
        table.say(f"\nNot written yet: {counts}.\nNext: {table.next_blank}. Replace its blank(...) and run "
                  "again; --solution (SOLUTION = True) shows the answers, --hints (ALL_HINTS = True) every hint.")
    else:
        table.say("\nEvery gradient matches autograd's." if not wrong else f"\nNot yet equal to autograd's: {wrong}")
    if not args.no_capstone:
        capstone(solution, args.steps, args.plot, verbose)
    return outcome


# %% [markdown]
# ## The capstone: train the block with your backward
#
# The block of the table, trained to sort sequences of 3 to 5 symbols
# (`SortTask`, 25% of all sequences held out) with batches of 32 and Adam.
# Two runs from the same initial weights on the same batches: one takes its
# gradients from autograd, the other from your steps alone (`chain`: no
# autograd anywhere in its backward). The optimizer is the same few lines
# of numpy for both. If your steps are right, the two loss curves are one.

# %%
CAPSTONE_STEPS = int(os.environ.get("BACKPROP_NINJA_STEPS", 300))


def sort_batch(rng, size):
    """Constants of the block for `size` training sequences of the sort task."""
    batch = TASK.train_batch(size, generator=rng)
    return block_constants([TASK.decode(row) for row in batch.src])


def adam(params, grads, state, lr=3e-2, betas=(0.9, 0.999), eps=1e-8):
    """One Adam step on numpy arrays, in place (the same for both runs)."""
    state["t"] = t = state.get("t", 0) + 1
    for k, g in grads.items():
        m = state[k + ".m"] = betas[0] * state.get(k + ".m", 0) + (1 - betas[0]) * g
        v = state[k + ".v"] = betas[1] * state.get(k + ".v", 0) + (1 - betas[1]) * g * g
        params[k] -= lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)


def train(steps=None, n_steps=CAPSTONE_STEPS, batch_size=32, seed=0):
    """Train the block; gradients from `steps` ({name: fn}, e.g. yours) or from autograd (None).
    Returns (the loss of every step, the trained parameters)."""
    params, state, rng, losses = block_params(seed), {}, np.random.default_rng(seed), []
    for _ in range(n_steps):
        constants = sort_batch(rng, batch_size)
        if steps is None:
            values, grads = run("block", params, constants)
        else:
            values, _ = run("block", params, constants, backward=False)
            grads = chain(steps, values)
        losses.append(float(values["loss"]))
        adam(params, {k: grads[k] for k in BLOCK_PARAMS}, state)
    return np.array(losses), params


def held_out_accuracy(params, n=200):
    """The share of n held-out sequences the trained block sorts exactly."""
    batch = TASK.held_out_batch(n)
    values, _ = run("block", params, block_constants([TASK.decode(row) for row in batch.src]), backward=False)
    right = (values["logits"].argmax(-1) == values["targets"]) | values["pad"]
    return float(right.all(-1).mean())


def capstone(solution=False, n_steps=None, plot=None, verbose=True):
    """Both runs, their losses side by side, and a plot. Returns (yours, autograd's) or None if not ready."""
    n_steps = n_steps or CAPSTONE_STEPS
    steps, _ = functions("block", solution)
    if not matches_autograd(steps, *reference("block")):
        if verbose:
            print("\nThe capstone trains the block with your steps once they all match autograd's.")
        return None
    # the table's batch is (2, 5); training's are (32, 3..5): a step that only works at (2, 5) shows here
    big = run("block", block_params(), sort_batch(np.random.default_rng(1), 32))
    wrong = [name for name, fn in steps.items() if not matches_autograd({name: fn}, *big)]
    if wrong:
        if verbose:
            print(f"\nYour steps match autograd's on the table's batch (2, 5) but not on a training batch "
                  f"{big[0]['tokens'].shape}: {', '.join(wrong)}. Write them for any B and T (take the "
                  "sizes from the arrays' shapes).")
        return None
    try:
        mine, trained = train(steps, n_steps)
    except StepError as e:  # a batch of another length than the checks'
        if verbose:
            print(f"\nThe capstone stopped: {e}. Write your steps for any B and T.")
        return None
    theirs, _ = train(None, n_steps)
    if verbose:
        print(f"\n== The capstone: {n_steps} steps of sorting, your backward against autograd's ==")
        print(f"{'step':>5s} {'your loss':>12s} {'autograd':>12s} {'difference':>11s}")
        for i in sorted({*range(0, n_steps, max(1, n_steps // 8)), n_steps - 1}):
            print(f"{i + 1:5d} {mine[i]:12.6f} {theirs[i]:12.6f} {abs(mine[i] - theirs[i]):11.1e}")
        print(f"Largest difference over the {n_steps} steps: {np.abs(mine - theirs).max():.1e}. "
              f"Held-out sequences sorted exactly: {held_out_accuracy(trained):.0%}.")
    if plot is None and verbose and "ipykernel" not in sys.modules:
        print("(--plot loss.png draws the two curves into loss.png)")
    draw(mine, theirs, plot)
    return mine, theirs


def matches_autograd(steps, values, grads):
    """Whether every step, given autograd's upstream gradients, returns autograd's gradient (to TOL)."""
    try:
        return all(np.abs(np.asarray(fn(**arguments(fn, values, grads))) - grads[name[2:]]).max() <= TOL
                   for name, fn in steps.items())
    except Exception:
        return False


def draw(mine, theirs, path=None):
    """The two loss curves, inline in a notebook, or into `path` (a PNG that must not exist yet)."""
    in_notebook = "ipykernel" in sys.modules
    if path is None and not in_notebook:
        return
    try:
        import matplotlib
        if not in_notebook:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: pip install matplotlib to see the curves)")
        return
    if path is not None and Path(path).exists():
        raise FileExistsError(f"--plot: {path} exists; give another path or delete it first")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(theirs, lw=4, alpha=0.4, label="autograd")
    ax.plot(mine, lw=1, color="black", label="your backward")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.set_title("The block learning to sort")
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"Wrote {path}")
    else:
        plt.show()


# %%
if __name__ == "__main__":
    main()
