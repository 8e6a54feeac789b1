# %% [markdown]
# # Becoming a backprop ninja, through one encoder block
#
# In the spirit of Andrej Karpathy's "Building makemore Part 4: Becoming a
# Backprop Ninja", but for the seed notes' attention example: 2 words of
# dimension d = 4, 8 heads of (2, 3) concatenated to (2, 24), W^O back to
# (2, 4), Add & Norm, and a small classifier with a cross-entropy loss.
#
# The forward pass is cut into atomic steps, one op per line. Autograd gives
# the gradient of every intermediate; you write each one by hand, in reverse
# order, one small function per variable. Every function starts blank: it
# raises NotImplementedError with a hint that names the section of
# docs/backprop_through_attention.md to read. Run the file after each step
# you write; a table compares yours with autograd's (exact / approximate /
# max difference), with "not written" rows for the blanks still left.
#
#     python examples/backprop_ninja_attention.py             # your steps
#     python examples/backprop_ninja_attention.py --solution  # the answers
#
# It is written in `# %%` cells: VS Code runs it cell by cell, and Jupyter
# opens it as a notebook with jupytext. Edit a step's cell, run it again,
# then run the last cell. The answers live in another file,
# examples/backprop_ninja_solution.py, so you do not read them by accident;
# `--solution` (or BACKPROP_NINJA_SOLUTION=1, or SOLUTION = True below) uses
# them instead of your functions.

# %%
import argparse
import inspect
import math
import os
import sys
from pathlib import Path

import numpy as np

import tinygrad_attn as tg

SOLUTION = os.environ.get("BACKPROP_NINJA_SOLUTION") == "1"  # or: python ... --solution

DOC = "docs/backprop_through_attention.md"
SECTIONS = {  # the sections of DOC the hints point to (their titles as they are in DOC)
    0: "The rule of the game",
    1: "Matrix multiplication and the Linear layer",
    2: "Softmax",
    3: "Scaling",
    5: "Scaled dot-product attention as a whole",
    6: "Multi-head: split and concatenate",
    7: "Layer normalisation",
    8: "Residual connections: post-norm and pre-norm",
    9: "Cross-entropy with log-softmax",
    10: "Positional encoding, fixed and learned",
    11: "Embeddings: lookup, the sqrt(d_model) scale, tied weights",
}


def blank(section, hint):
    """What every step does until you write it."""
    raise NotImplementedError(f"{hint} (see {DOC} §{section} {SECTIONS[section]})")


# %% [markdown]
# ## The example
#
# The two words of the figure the seed notes reproduce ("Thinking Machines"),
# each an embedding of d = 4. Each word gets a tag from 3 classes: that tag
# is what the small classifier on top of the block must predict.

# %%
WORDS = ("Thinking", "Machines")
CLASSES = ("noun", "verb", "adjective")
N, D, N_HEADS, D_K, EPS = 2, 4, 8, 3, 1e-5  # words, d_model, heads, d_k = d_v, LayerNorm's eps
PARAMS = ("E", "WQ", "WK", "WV", "WO", "gamma", "beta", "Wc", "bc")


def positional_encoding(n, d):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): a fixed table."""
    pos = np.arange(n)[:, None]
    angle = pos / 10000 ** (np.arange(0, d, 2) / d)
    pe = np.zeros((n, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def make_example(seed=0):
    """Every number of the exercise: parameters (float64 arrays) and constants."""
    rng = np.random.default_rng(seed)
    params = {
        "E": rng.normal(size=(N, D)),                          # (2, 4) the two words' embeddings
        "WQ": rng.normal(size=(N_HEADS, D, D_K)),              # (8, 4, 3) W^Q_i of each head
        "WK": rng.normal(size=(N_HEADS, D, D_K)),              # (8, 4, 3)
        "WV": rng.normal(scale=0.5, size=(N_HEADS, D, D_K)),   # (8, 4, 3)
        "WO": rng.normal(scale=0.3, size=(N_HEADS * D_K, D)),  # (24, 4)
        # LayerNorm's gamma and beta start at 1 and 0 in a real model; random
        # here, so that a step that forgets one of them shows up in the table.
        "gamma": 1 + 0.2 * rng.normal(size=D),                 # (4,)
        "beta": 0.2 * rng.normal(size=D),                      # (4,)
        "Wc": rng.normal(scale=0.5, size=(D, len(CLASSES))),   # (4, 3) the classifier
        "bc": 0.1 * rng.normal(size=len(CLASSES)),             # (3,)
    }
    constants = {"PE": positional_encoding(N, D), "targets": np.array([2, 0]),  # adjective, noun
                 "d_k": D_K, "eps": EPS}
    return params, constants


# %% [markdown]
# ## The forward pass, one op per line
#
# Everything is a Tensor op, so autograd can give the gradient of every line.
# The comments give each result's shape (8 = heads, 2 = words, 3 = d_k) and
# the section of the doc (§N) that derives its backward. In a notebook,
# `values, grads = reference()` gives every forward value and autograd's
# gradient as numpy arrays by name, to look around: `values["P"][0]`.

# %%
def forward(params, constants):
    """The block, atomically. Returns {name: Tensor} for every variable."""
    E, WQ, WK, WV, WO, gamma, beta, Wc, bc = (params[k] for k in PARAMS)
    PE, targets, d_k, eps = (constants[k] for k in ("PE", "targets", "d_k", "eps"))
    rows = np.arange(len(targets))

    # input: word embeddings plus positions (§10)
    X = E + tg.Tensor(PE)                        # (2, 4)
    # 8 heads at once: X (2, 4) @ W (8, 4, 3) broadcasts X over the heads (§1, §6)
    Q = X @ WQ                                   # (8, 2, 3) queries
    K = X @ WK                                   # (8, 2, 3) keys
    V = X @ WV                                   # (8, 2, 3) values
    S = Q @ K.swapaxes(-1, -2)                   # (8, 2, 2) S[h][i][j] = q_i . k_j
    scaled = S / math.sqrt(d_k)                  # (8, 2, 2) divided by sqrt(d_k) (§3)
    # softmax over each row, atomically (§2)
    smax = scaled.amax(-1, keepdim=True)         # (8, 2, 1) the row's max, for stability
    shifted = scaled - smax                      # (8, 2, 2)
    ex = shifted.exp()                           # (8, 2, 2)
    ex_sum = ex.sum(-1, keepdim=True)            # (8, 2, 1)
    ex_sum_inv = ex_sum ** -1                    # (8, 2, 1)
    P = ex * ex_sum_inv                          # (8, 2, 2) attention weights, rows sum to 1
    Z = P @ V                                    # (8, 2, 3) Z_0 ... Z_7
    concat = Z.swapaxes(0, 1).reshape(N, -1)     # (2, 24) concat(Z_0, ..., Z_7) (§6)
    Y = concat @ WO                              # (2, 4)
    # Add & Norm (§8, §7)
    R = X + Y                                    # (2, 4) the residual connection
    mu = R.mean(-1, keepdim=True)                # (2, 1)
    xc = R - mu                                  # (2, 4) centred
    var = (xc ** 2).mean(-1, keepdim=True)       # (2, 1) biased variance
    rstd = (var + eps) ** -0.5                   # (2, 1) 1 / sigma
    xhat = xc * rstd                             # (2, 4)
    H = xhat * gamma + beta                      # (2, 4) the block's output
    # classifier and cross-entropy, the log-softmax atomically (§9)
    logits = H @ Wc + bc                         # (2, 3)
    lmax = logits.amax(-1, keepdim=True)         # (2, 1)
    lshift = logits - lmax                       # (2, 3)
    lexp = lshift.exp()                          # (2, 3)
    lsum = lexp.sum(-1, keepdim=True)            # (2, 1)
    llog = lsum.log()                            # (2, 1)
    logprobs = lshift - llog                     # (2, 3) log-softmax of the logits
    picked = logprobs[rows, targets]             # (2,)   log-probability of each word's tag
    loss = -picked.mean()                        # ()
    return {name: value for name, value in locals().items() if isinstance(value, tg.Tensor)}


def reference(seed=0):
    """Run forward and autograd's backward. Returns (values, grads), numpy
    arrays by name: the forward values (and constants) and autograd's gradients."""
    params, constants = make_example(seed)
    tensors = forward({k: tg.Tensor(v, requires_grad=True) for k, v in params.items()}, constants)
    for t in tensors.values():
        if not t.is_leaf:
            t.retain_grad()  # keep .grad on the intermediates too
    tensors["loss"].backward()
    values = {**constants, **{k: t.data for k, t in tensors.items()}}
    grads = {k: t.grad.data for k, t in tensors.items() if t.grad is not None}
    return values, grads


# %% [markdown]
# ## Your turn: the backward pass, from the loss down
#
# Each function below returns the gradient of the variable in its name,
# `d_logits` returns dL/dlogits, with the shape of `logits`. Its arguments
# are what it needs: a name starting with `d` is a gradient already known
# (of a variable later in the forward pass, so nearer the loss: `dloss` is
# 1), any other name a forward value or constant. When a variable feeds
# several ops, its gradient is the sum of what comes back from each (§0).
#
# Replace each `blank(...)` by numpy code that returns the gradient, and
# start at the top. The arguments are numpy arrays, passed by name: you may
# add any forward variable or constant of `forward` (`Wc`, `d_k`, ...), or
# the gradient `d<name>` of a variable nearer the loss.

# %% cross-entropy (§9): loss = -mean(picked), log-softmax taken atomically
def d_picked(dloss, picked):
    blank(9, "loss = -picked.mean(): each of the N picked log-probabilities gets the same share, with the sign")


def d_logprobs(dpicked, logprobs, targets):
    blank(11, "picked = logprobs[rows, targets] only moves numbers: dpicked goes back to [row, target], "
              "zero elsewhere")


def d_llog(dlogprobs):
    blank(0, "logprobs = lshift - llog with llog (2, 1) broadcast over 3 columns: sum over the columns it "
             "was broadcast to, with the sign")


def d_lsum(dllog, lsum):
    blank(9, "llog = log(lsum), and d log(u)/du = 1/u")


def d_lexp(dlsum, lexp):
    blank(0, "lsum = lexp.sum(-1): every entry of a row receives that row's dlsum")


def d_lshift(dlogprobs, dlexp, lexp):
    blank(0, "lshift feeds logprobs directly and lexp = exp(lshift): add the two contributions")


def d_lmax(dlshift):
    blank(9, "lshift = logits - lmax, lmax (2, 1) broadcast over the row")


def d_logits(dlshift, dlmax, logits, lmax):
    blank(9, "logits reach lshift directly and lmax = the row's max, whose gradient goes to the maximal entry")


# %% classifier: logits = H @ Wc + bc (§1)
def d_H(dlogits, Wc):
    blank(1, "H is the A side of the product H @ Wc")


def d_Wc(dlogits, H):
    blank(1, "Wc is the B side of the product H @ Wc")


def d_bc(dlogits):
    blank(1, "bc (3,) was added to each of the 2 rows: sum over the rows")


# %% LayerNorm (§7): H = xhat * gamma + beta, xhat = (R - mu) / sqrt(var + eps)
def d_gamma(dH, xhat):
    blank(7, "H = xhat * gamma + beta: gamma (4,) multiplies every row")


def d_beta(dH):
    blank(7, "beta (4,) is added to every row")


def d_xhat(dH, gamma):
    blank(7, "H = xhat * gamma + beta, elementwise in xhat")


def d_rstd(dxhat, xc):
    blank(7, "xhat = xc * rstd with rstd (2, 1) broadcast over the row")


def d_var(drstd, var, eps):
    blank(7, "rstd = (var + eps) ** -0.5: the power rule")


def d_xc(dxhat, dvar, rstd, xc):
    blank(7, "xc feeds xhat = xc * rstd and var = mean(xc ** 2) over the row of 4: add both")


def d_mu(dxc):
    blank(7, "xc = R - mu, mu (2, 1) broadcast over the row")


def d_R(dxc, dmu, R):
    blank(7, "R feeds xc directly and mu = mean(R) over the row of 4")


# %% residual and output projection: R = X + Y, Y = concat @ WO (§8, §6)
def d_Y(dR):
    blank(8, "R = X + Y: the addition hands its gradient to both inputs")


def d_WO(dY, concat):
    blank(6, "Y = concat @ WO: WO is the B side")


def d_concat(dY, WO):
    blank(6, "Y = concat @ WO: concat is the A side")


def d_Z(dconcat, Z):
    blank(6, "concat = Z.swapaxes(0, 1).reshape(2, 24) only moves numbers: undo the moves, last first")


# %% attention, per head: Z = P @ V, P = softmax(S / sqrt(d_k)) atomically (§5, §2, §3)
def d_P(dZ, V):
    blank(5, "Z = P @ V for each head: P is the A side (transpose the last two axes)")


def d_V(dZ, P):
    blank(5, "Z = P @ V for each head: V is the B side")


def d_ex_sum_inv(dP, ex):
    blank(2, "P = ex * ex_sum_inv, ex_sum_inv (8, 2, 1) broadcast over the row")


def d_ex_sum(dex_sum_inv, ex_sum):
    blank(2, "ex_sum_inv = ex_sum ** -1, and d(1/u)/du = -1/u**2")


def d_ex(dP, dex_sum, ex_sum_inv):
    blank(2, "ex feeds P = ex * ex_sum_inv directly and ex_sum = ex.sum(-1): add both")


def d_shifted(dex, ex):
    blank(2, "ex = exp(shifted), and exp is its own derivative")


def d_smax(dshifted):
    blank(2, "shifted = scaled - smax, smax (8, 2, 1) broadcast over the row")


def d_scaled(dshifted, dsmax, scaled, smax):
    blank(2, "scaled reaches shifted directly and smax = the row's max (gradient to the maximal entry)")


def d_S(dscaled, d_k):
    blank(3, "scaled = S / sqrt(d_k) is linear")


def d_Q(dS, K):
    blank(5, "S = Q @ K^T for each head: Q is the A side")


def d_K(dS, Q):
    blank(5, "S = Q @ K^T for each head: K^T is the B side, and you want dK, not dK^T")


# %% projections and input: Q = X @ WQ, ..., X = E + PE (§1, §6, §8, §10)
def d_WQ(dQ, X):
    blank(6, "Q = X @ WQ for each head: WQ[h] is the B side, the same X for every head")


def d_WK(dK, X):
    blank(6, "K = X @ WK for each head: as for WQ")


def d_WV(dV, X):
    blank(6, "V = X @ WV for each head: as for WQ")


def d_X(dQ, dK, dV, dR, WQ, WK, WV):
    blank(1, "X is used by Q, K and V of all 8 heads and by the residual R = X + Y: add all of these")


def d_E(dX):
    blank(10, "X = E + PE, and PE is a constant table")


# %% [markdown]
# ## Then: the fused one-line forms
#
# Once the atomic steps agree with autograd, collapse whole chains into the
# one-line formulas of the doc, the ones a real framework implements (here
# as the fused Numba kernels). Each is compared with autograd again.

# %%
def fused_dlogits(logits, targets):
    blank(9, "the whole cross-entropy backward, from the logits and the targets, in one line (or two)")


def fused_dR(dH, gamma, xhat, rstd):
    blank(7, "the whole LayerNorm backward in one line, from g = dH * gamma")


def fused_dscaled(dP, P):
    blank(2, "the whole softmax backward in one line (the max shift changes nothing)")


def fused_attention(dZ, Q, K, V, P, d_k):
    blank(5, "return (dQ, dK, dV) from dZ: five lines, the whole of attention's backward")


FUSED = {"fused_dlogits": ("logits",), "fused_dR": ("R",), "fused_dscaled": ("scaled",),
         "fused_attention": ("Q", "K", "V")}  # each one's results: the gradients of these


# %% [markdown]
# ## The checking machinery
#
# `cmp` prints one row of the table: is your gradient exactly autograd's,
# equal up to TOL, and the largest difference. Every step is fed autograd's
# gradients as its `d...` arguments, not yours, so each step is checked on
# its own: a blank, or a mistake, in an earlier step does not stop the later
# ones from being checked. When every step is written, the chain is run
# once more on your gradients alone, end to end.

# %%
TOL = 1e-10


def cmp(name, mine, autograd, show=True):
    """One row of the table; returns the max difference (inf if the shapes differ)."""
    mine = np.asarray(mine, dtype=np.float64)
    if mine.shape != autograd.shape:
        if show:
            print(f"{name:15s} | wrong shape: {mine.shape}, autograd's is {autograd.shape}")
        return math.inf
    exact = bool(np.array_equal(mine, autograd))
    maxdiff = float(np.abs(mine - autograd).max())
    if show:
        print(f"{name:15s} | exact: {str(exact):5s} | approximate: {str(maxdiff <= TOL):5s} | maxdiff: {maxdiff:.1e}")
    return maxdiff


def arguments(fn, values, grads):
    """fn's arguments by name: `dfoo` is the gradient of foo, anything else a forward value."""
    names = inspect.signature(fn).parameters
    return {a: grads[a[1:]] if a.startswith("d") and a[1:] in grads else values[a] for a in names}


def learner_steps():
    """{name: function} of your steps, in the order they are defined above: the order of backward."""
    return {name: fn for name, fn in globals().items() if name.startswith("d_") and callable(fn)}


def solution_steps():
    """The same steps from examples/backprop_ninja_solution.py."""
    here = Path(globals().get("__file__", "backprop_ninja_attention.py")).resolve().parent
    if str(here) not in sys.path:
        sys.path.insert(0, str(here))
    import backprop_ninja_solution as solution
    return {name: getattr(solution, name) for name in learner_steps()}, solution


BLANK, FAILED = object(), object()  # what attempt returns instead of a gradient


def attempt(fn, name, label, values, grads, show):
    """fn's result on autograd's gradients, or BLANK (hint printed) or FAILED (error printed)."""
    try:
        return fn(**arguments(fn, values, grads))
    except NotImplementedError as e:
        if show:
            print(f"{label:15s} | not written: {e}")
        return BLANK
    except Exception as e:  # a bug in a step: report it and go on with the others
        if show:
            print(f"{label:15s} | {name} raised {type(e).__name__}: {e}")
        return FAILED


def score(name, mine, autograd, show):
    """The table's value for one gradient: maxdiff, None if blank, inf if it raised."""
    if mine is BLANK:
        return None
    return math.inf if mine is FAILED else cmp(name, mine, autograd, show)


def check(steps, values, grads, show=True):
    """Run each step on autograd's gradients and compare. Returns {grad name: maxdiff, or None if blank}."""
    results = {}
    for name, fn in steps.items():
        var = name[2:]  # d_logits -> logits
        results["d" + var] = score("d" + var, attempt(fn, name, "d" + var, values, grads, show), grads[var], show)
    return results


def chain(steps, values):
    """Every step fed only the gradients the steps before it returned. {var: gradient}"""
    own = {"loss": np.ones(())}
    for name, fn in steps.items():
        own[name[2:]] = np.asarray(fn(**arguments(fn, values, own)), dtype=np.float64)
    return own


def check_fused(fused, values, grads, show=True):
    """As check, for the fused forms (fused_attention gives three gradients)."""
    results = {}
    for name, fn in fused.items():
        outs = FUSED[name]
        mine = attempt(fn, name, name, values, grads, show)
        if mine is BLANK or mine is FAILED or len(outs) == 1:
            mine = [mine] * len(outs)
        for o, m in zip(outs, mine):
            results["d" + o] = score(f"d{o}, fused", m, grads[o], show)
    return results


# %% [markdown]
# ## Run it: the table

# %%
def main(argv=None, verbose=True):
    """Print the table; returns ({grad: maxdiff or None}, the same for the fused forms,
    the end-to-end maxdiff or None)."""
    parser = argparse.ArgumentParser(description="Write the backward pass of one encoder block by hand, "
                                     "step by step, and compare every gradient with autograd's.")
    parser.add_argument("--solution", action="store_true",
                        help="use the answers (examples/backprop_ninja_solution.py) instead of your steps")
    parser.add_argument("--seed", type=int, default=0, help="seed of the example's numbers (default 0)")
    args, _ = parser.parse_known_args(argv)  # known only: a Jupyter kernel passes its own arguments
    solution = args.solution or SOLUTION
    say = print if verbose else (lambda *a, **k: None)

    values, grads = reference(args.seed)
    if solution:
        steps, module = solution_steps()
        fused = {name: getattr(module, name) for name in FUSED}
    else:
        steps, fused = learner_steps(), {name: globals()[name] for name in FUSED}

    say(f"Words {WORDS} tagged {tuple(CLASSES[t] for t in values['targets'])}: "
        f"loss = {values['loss'].item():.6f}")
    say(f"Attention weights P of head 0 (row i: how much word i attends to each word):\n{values['P'][0].round(3)}")
    say(f"\nBackward, step by step ({'the solution' if solution else 'your steps'}). Each step is given "
        f"autograd's gradients as its d... arguments,\nso each is checked on its own, whatever the steps "
        f"above it do. approximate: within {TOL:g}.")
    results = check(steps, values, grads, verbose)
    left = [name for name, diff in results.items() if diff is None]

    chained = None
    if all(diff is not None and diff < math.inf for diff in results.values()):
        own = chain(steps, values)
        chained = max(float(np.abs(own[p] - grads[p]).max()) for p in PARAMS)
        say(f"\nEnd to end, every step fed only your own gradients: the gradients of the {len(PARAMS)} "
            f"parameters ({', '.join(PARAMS)})\ndiffer from autograd's by at most {chained:.1e}.")

    say("\nThe fused one-line forms, from the same autograd inputs:")
    fused_results = check_fused(fused, values, grads, verbose)
    fused_left = [name for name, outs in FUSED.items() if fused_results["d" + outs[0]] is None]

    if left or fused_left:
        first = "d_" + left[0][1:] if left else fused_left[0]
        say(f"\nNot written yet: {len(left)} of {len(results)} steps, {len(fused_left)} of {len(FUSED)} fused "
            f"forms. Next: {first}. Replace its blank(...)\nin examples/backprop_ninja_attention.py and run "
            f"again; --solution shows the answers.")
    else:
        wrong = ([name for name, diff in results.items() if not diff <= TOL]
                 + [f"{name}, fused" for name, diff in fused_results.items() if not diff <= TOL])
        say("\nEvery gradient matches autograd's." if not wrong else f"\nNot yet equal to autograd's: {wrong}")
    return results, fused_results, chained


if __name__ == "__main__":
    main()
