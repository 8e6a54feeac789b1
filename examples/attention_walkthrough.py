# %% [markdown]
# # The seed notes' attention example, every number printed, every gradient checked
#
# Two words, "Thinking" and "Machines" (the figure the seed notes reproduce),
# with embeddings of dimension 4: the rows of X. One head first:
# Q = X W^Q, K = X W^K, V = X W^V, the 2x2 score matrix Q K^T whose entry
# [i][j] is the influence of word j on word i, divided by sqrt(d_k), turned
# into weights by softmax, and the weighted sum of values. Then 8 heads, each
# giving a (2, 3) result Z_i, concatenated to (2, 24) and projected back to
# (2, 4) by W^O.
#
# Backward runs from the simple loss L = 1/2 * sum(Y^2) (so dL/dY = Y). Every
# intermediate's gradient and the gradients of W^Q, W^K, W^V, W^O and X are
# printed and compared with finite differences. Then:
#
# - dL/dX split into its three paths, through the queries, the keys and the
#   values of all heads, which sum to X.grad;
# - why each row of the softmax's input gradient, and the gradients of the
#   keys, sum to zero (the queries' do not);
# - the worked numbers of head 0: section 5's G_S = P * (G_P - rowsum(G_P * P)),
#   then G_Q, G_K and G_V, computed by hand next to autograd's;
# - a causal variant ("Thinking" may not look at "Machines");
# - a cross-entropy loss on a small classifier instead of 1/2 sum(Y^2).
#
# Read it side by side with docs/backprop_through_attention.md.
#
#     python examples/attention_walkthrough.py
#
# The notebook examples/attention_walkthrough.ipynb holds the same cells
# (generated from this file by examples/make_notebooks.py).

# %%
import argparse
import math

import numpy as np

import tinygrad_attn as tg
import tinygrad_attn.functional as F

WORDS = ("Thinking", "Machines")
CLASSES = ("noun", "verb", "adjective")
TARGETS = np.array([2, 0])  # "Thinking" is used as an adjective here, "Machines" is a noun
N_WORDS, D_MODEL, N_HEADS, D_K = 2, 4, 8, 3
SEED = 10  # chosen so that head 0's attention is clearly not uniform


def make_inputs(seed=SEED):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_WORDS, D_MODEL))                   # (2, 4) one row per word
    # Per-head projections W^Q_i, W^K_i, W^V_i of (4, 3), and W^O of (24, 4).
    W = {name: rng.normal(scale=scale, size=(N_HEADS, D_MODEL, D_K))
         for name, scale in (("WQ", 0.8), ("WK", 0.8), ("WV", 0.5))}
    W["WO"] = rng.normal(scale=0.3, size=(N_HEADS * D_K, D_MODEL))
    W["Wc"] = rng.normal(scale=0.5, size=(D_MODEL, len(CLASSES)))  # (4, 3) the classifier
    return X, W


def forward(X, W, replace=None, causal=False, loss="squares"):
    """The whole computation; returns (loss, intermediates).

    X is one tensor, or a tuple of three (the X the queries, the keys and
    the values are computed from: the same numbers, three leaves, to see
    the three paths' gradients apart). `replace` maps an intermediate's
    name to an array used in its place: finite differences with respect to
    an intermediate perturb that array. causal: word i may not look at the
    words after it. loss: "squares" (1/2 sum(Y^2)) or "cross_entropy" (of a
    classifier on Y, targets TARGETS).
    """
    replace = replace or {}
    seen = {}

    def stage(name, value):
        if name in replace:
            value = replace[name]
        seen[name] = value
        return value

    Xq, Xk, Xv = X if isinstance(X, tuple) else (stage("X", X),) * 3
    future = np.triu(np.ones((N_WORDS, N_WORDS), dtype=bool), k=1)  # [i][j]: j comes after i
    heads = []
    for i in range(N_HEADS):
        Q = stage(f"Q[{i}]", Xq @ W["WQ"][i])                # (2, 3) queries
        K = stage(f"K[{i}]", Xk @ W["WK"][i])                # (2, 3) keys
        V = stage(f"V[{i}]", Xv @ W["WV"][i])                # (2, 3) values
        scores = stage(f"scores[{i}]", Q @ K.swapaxes(0, 1))  # (2, 2): [i][j] = q_i . k_j
        scaled = stage(f"scaled[{i}]", scores / math.sqrt(D_K))
        if causal:
            scaled = scaled.masked_fill(future, -math.inf)   # softmax gives these weight 0
        weights = stage(f"weights[{i}]", F.softmax(scaled, dim=-1))
        heads.append(stage(f"Z[{i}]", weights @ V))          # (2, 3)
    concat = stage("concat", tg.cat(heads, dim=1))           # (2, 24)
    Y = stage("Y", concat @ W["WO"])                         # (2, 4)
    if loss == "squares":
        return (Y * Y).sum() * 0.5, seen
    logits = stage("logits", Y @ W["Wc"])                    # (2, 3)
    return F.cross_entropy(logits, TARGETS), seen


def as_tensors(X, W, requires_grad):
    return (tg.Tensor(X, requires_grad=requires_grad),
            {k: tg.Tensor(v, requires_grad=requires_grad) for k, v in W.items()})


def run(seed=SEED, causal=False, loss="squares", split=False):
    """Forward and backward; returns (X, W, intermediates, loss) as Tensors, with
    .grad kept on every intermediate. split: X as three leaves (see forward)."""
    X_np, W_np = make_inputs(seed)
    X, W = as_tensors(X_np, W_np, requires_grad=True)
    if split:
        X = tuple(tg.Tensor(X_np.copy(), requires_grad=True) for _ in "QKV")
    L, inter = forward(X, W, causal=causal, loss=loss)
    for t in inter.values():
        if not t.is_leaf:
            t.retain_grad()  # keep .grad on intermediates so we can print them
    L.backward()
    return X, W, inter, L


def numerical_gradient(f, array, eps=1e-6):
    """Central differences of the scalar f() with respect to `array` (perturbed in place)."""
    grad = np.zeros_like(array)
    for idx in np.ndindex(array.shape):
        orig = array[idx]
        array[idx] = orig + eps
        plus = f()
        array[idx] = orig - eps
        minus = f()
        array[idx] = orig
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def loss_with(X_arr, W_arr, replace=None, **options):
    """The loss without a graph, for finite differences."""
    with tg.no_grad():
        Xt, Wt = as_tensors(X_arr, W_arr, requires_grad=False)
        rep = {k: tg.Tensor(v) for k, v in (replace or {}).items()}
        return forward(Xt, Wt, rep, **options)[0].item()


def show(name, array, indent="  "):
    body = np.array2string(np.asarray(array), precision=4, suppress_small=True,
                           separator=", ", prefix=indent + " " * 4)
    print(f"{indent}{name} {tuple(np.shape(array))}:\n{indent}    {body}")


def show_weights(weights, indent="  "):
    for i, word in enumerate(WORDS):
        parts = ", ".join(f"{weights[i][j]:.3f} to {WORDS[j]!r}" for j in range(N_WORDS))
        print(f"{indent}{word!r} attends {parts}")


def options(argv=None):
    """The command line: --seed. Unknown arguments are ignored (a Jupyter kernel passes its own)."""
    parser = argparse.ArgumentParser(description="The seed notes' attention example (2 words, 8 heads): "
                                     "every number printed, every gradient checked.")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of the example's numbers (default {SEED})")
    return parser.parse_known_args(argv)[0]


# %% [markdown]
# ## Forward, head by head, and every gradient against finite differences

# %%
def walkthrough(seed=SEED, verbose=True):
    """The forward story and every gradient against finite differences.
    Returns ({name: max |analytic - numeric|}, intermediates)."""
    X, W, inter, loss = run(seed)
    X_np, W_np = make_inputs(seed)

    if verbose:
        print(f"== Forward, head 0 (the single-head story), words {WORDS} ==")
        for name in ("X", "Q[0]", "K[0]", "V[0]", "scores[0]", "scaled[0]", "weights[0]", "Z[0]"):
            show(name, inter[name].data)
        print("  scores[0][i][j] = q_i . k_j: the influence of word j on word i;")
        print(f"  divided by sqrt(d_k) = sqrt({D_K}); each row of weights sums to 1:",
              np.round(inter["weights[0]"].data.sum(axis=1), 6))
        show_weights(inter["weights[0]"].data)
        print(f"\n== Multi-head: {N_HEADS} heads, each Z_i is {inter['Z[0]'].shape} ==")
        show("concat(Z_0..Z_7)", inter["concat"].data)
        show("W^O", W["WO"].data)
        show("Y = concat @ W^O", inter["Y"].data)
        print(f"\n  loss = 1/2 * sum(Y^2) = {loss.item():.6f}")

    # Finite differences: perturb an input, a weight, or an intermediate
    # (through `replace`) and recompute the loss without a graph.
    errors = {}
    if verbose:
        print("\n== Backward from L = 1/2 sum(Y^2), checked against finite differences ==")
    for name in ("Y", "concat", "Z[0]", "weights[0]", "scaled[0]", "scores[0]", "V[0]", "K[0]", "Q[0]"):
        analytic = inter[name].grad.data
        value = inter[name].data.copy()
        numeric = numerical_gradient(lambda name=name, value=value: loss_with(X_np, W_np, replace={name: value}),
                                     value)
        errors[name] = float(np.abs(analytic - numeric).max())
        if verbose:
            show(f"dL/d{name}", analytic)
            print(f"      max |analytic - finite difference| = {errors[name]:.2e}")
    for name in ("WQ", "WK", "WV", "WO"):
        analytic = W[name].grad.data
        numeric = numerical_gradient(lambda: loss_with(X_np, W_np), W_np[name])
        errors[name] = float(np.abs(analytic - numeric).max())
        if verbose:
            shown = analytic[0] if name != "WO" else analytic
            label = f"dL/d{name}" + ("[head 0]" if name != "WO" else "")
            show(label, shown)
            print(f"      max |analytic - finite difference| over all heads = {errors[name]:.2e}")
    numeric_x = numerical_gradient(lambda: loss_with(X_np, W_np), X_np)
    errors["X"] = float(np.abs(X.grad.data - numeric_x).max())
    if verbose:
        show("dL/dX", X.grad.data)
        print(f"      max |analytic - finite difference| = {errors['X']:.2e}")
        worst = max(errors.values())
        print(f"\nAll {len(errors)} gradients agree with finite differences "
              f"(worst difference {worst:.1e})." if worst < 1e-6 else
              f"\nMISMATCH: worst difference {worst:.1e}")
    return errors, inter


# %%
if __name__ == "__main__":  # in the notebook and as a script; importing the file runs nothing
    seed = options().seed
    errors, inter = walkthrough(seed)


# %% [markdown]
# ## dL/dX along its three paths

# %%
def three_paths(seed=SEED, verbose=True):
    """dL/dX = (through the queries) + (through the keys) + (through the values).

    Returns {"Q", "K", "V": each path's gradient, "X.grad": the whole,
    "formula": max difference of each path from its formula}."""
    X, W, inter, _ = run(seed)
    (Xq, Xk, Xv), _, _, _ = run(seed, split=True)  # the same numbers as three leaves
    paths = {"Q": Xq.grad.data, "K": Xk.grad.data, "V": Xv.grad.data}
    # The same paths by the formula of §1: G_X = sum over heads of G_Q (W^Q)^T + ...
    formula = {p: sum(inter[f"{p}[{i}]"].grad.data @ W[f"W{p}"].data[i].T for i in range(N_HEADS))
               for p in "QKV"}
    result = {**paths, "X.grad": X.grad.data,
              "formula": max(float(np.abs(formula[p] - paths[p]).max()) for p in "QKV")}
    if verbose:
        print("\n== dL/dX along its three paths ==")
        print("  X is used three times in every head, for the queries, the keys and the values:")
        print("  G_X = sum_i G_Q_i (W^Q_i)^T + G_K_i (W^K_i)^T + G_V_i (W^V_i)^T (doc §1). Feeding three")
        print("  copies of X, one per path, gives each term on its own:")
        for p, word in (("Q", "queries"), ("K", "keys"), ("V", "values")):
            show(f"through the {word}", paths[p])
        total = paths["Q"] + paths["K"] + paths["V"]
        print(f"  their sum minus X.grad: max {np.abs(total - X.grad.data).max():.1e}; each path minus its "
              f"formula: max {result['formula']:.1e}")
        print("  The keys' path sums to zero over the words (largest |column sum| "
              f"{np.abs(paths['K'].sum(axis=0)).max():.1e}): the next section says why.")
    return result


# %%
if __name__ == "__main__":
    paths = three_paths(seed)


# %% [markdown]
# ## Why softmax rows and key gradients sum to zero

# %%
def zero_sums(inter, verbose=True, label=""):
    """Per head: the row sums of dL/dscaled, the sum over keys of dL/dK and,
    for contrast, over queries of dL/dQ. Returns the largest absolute of each."""
    rows = max(float(np.abs(inter[f"scaled[{i}]"].grad.data.sum(axis=1)).max()) for i in range(N_HEADS))
    keys = max(float(np.abs(inter[f"K[{i}]"].grad.data.sum(axis=0)).max()) for i in range(N_HEADS))
    queries = max(float(np.abs(inter[f"Q[{i}]"].grad.data.sum(axis=0)).max()) for i in range(N_HEADS))
    if verbose:
        print(f"\n== Why gradients sum to zero{label} ==")
        print("  softmax is shift-invariant: adding c to a whole row of scores changes no weight, so the")
        print("  loss cannot change either: the row's gradient is orthogonal to (1, 1). From the formula")
        print("  G_s = y * (G_y - G_y . y) (doc §2): sum_k G_s[k] = G_y . y - (G_y . y) * sum_k y_k = 0.")
        show("dL/dscaled[0]", inter["scaled[0]"].grad.data)
        print(f"    largest |row sum| over all heads: {rows:.1e}")
        print("  The keys: adding one vector c to every key adds q_i . c to every score of row i, a shift")
        print("  again. So per head the keys' gradients sum to zero: G_K = G_S^T Q / sqrt(d_k) (doc §5),")
        print("  and sum_j G_K[j] = sum_i (sum_j G_S[i][j]) q_i / sqrt(d_k) = 0.")
        show("dL/dK[0]", inter["K[0]"].grad.data)
        print(f"    largest |sum over the keys| over all heads: {keys:.1e}")
        print(f"  The queries' gradients need not: largest |sum over the queries|: {queries:.2f}")
    return {"rows": rows, "keys": keys, "queries": queries}


# %%
if __name__ == "__main__":
    sums = zero_sums(inter)


# %% [markdown]
# ## Worked numbers: section 5 by hand for head 0
#
# The four lines of section 5's backward, on head 0's 2 x 2 numbers, one
# entry at a time, next to what autograd gave: G_P = G_Z V^T (from above,
# through Z = P V), the row sums r_i = sum_j G_P[i, j] P[i, j],
# G_S = P * (G_P - r), and from it G_Q, G_K and G_V.

# %%
def worked_numbers(inter, verbose=True):
    """Section 5 by hand for head 0. Returns {name: (by hand, autograd's)} for G_P, G_S, G_Q, G_K, G_V."""
    P, G_P = inter["weights[0]"].data, inter["weights[0]"].grad.data
    Q, K, V, G_Z = inter["Q[0]"].data, inter["K[0]"].data, inter["V[0]"].data, inter["Z[0]"].grad.data
    r = [sum(G_P[i, j] * P[i, j] for j in range(N_WORDS)) for i in range(N_WORDS)]   # rowsum(G_P * P)
    G_S = np.array([[P[i, j] * (G_P[i, j] - r[i]) for j in range(N_WORDS)] for i in range(N_WORDS)])
    G_Q = G_S @ K / math.sqrt(D_K)
    G_K = G_S.T @ Q / math.sqrt(D_K)
    G_V = P.T @ G_Z
    result = {"G_P": (G_Z @ V.T, G_P), "G_S": (G_S, inter["scaled[0]"].grad.data),
              "G_Q": (G_Q, inter["Q[0]"].grad.data),
              "G_K": (G_K, inter["K[0]"].grad.data), "G_V": (G_V, inter["V[0]"].grad.data)}
    if verbose:
        print("\n== Worked numbers: section 5 by hand, head 0 ==")
        show("P = weights[0]", P)
        show("G_P = dL/dweights[0], autograd's (it comes from above: G_P = G_Z V^T)", G_P)
        for i in range(N_WORDS):
            terms = " + ".join(f"({G_P[i, j]:.4f})({P[i, j]:.4f})" for j in range(N_WORDS))
            print(f"  r_{i} = sum_j G_P[{i}, j] P[{i}, j] = {terms} = {r[i]:.4f}")
        for i in range(N_WORDS):
            for j in range(N_WORDS):
                print(f"  G_S[{i}, {j}] = P[{i}, {j}] (G_P[{i}, {j}] - r_{i}) = {P[i, j]:.4f} "
                      f"({G_P[i, j]:.4f} - {r[i]:.4f}) = {G_S[i, j]:.4f}")
        for name, (mine, theirs) in result.items():
            show(f"{name} by hand", mine)
            show(f"{name} autograd's", theirs)
            print(f"      max |by hand - autograd| = {np.abs(mine - theirs).max():.1e}")
        print("  G_P = G_Z V^T, G_Q = G_S K / sqrt(d_k), G_K = G_S^T Q / sqrt(d_k), G_V = P^T G_Z. With two "
              f"keys each row of G_S is (a, -a): it sums to 0 ({np.abs(G_S.sum(1)).max():.1e}).")
    return result


# %%
if __name__ == "__main__":
    worked = worked_numbers(inter)


# %% [markdown]
# ## A causal variant

# %%
def causal_variant(seed=SEED, verbose=True):
    """The same example with a causal mask. Returns the numbers the claims rest on."""
    X, W, inter, _ = run(seed, causal=True)
    X_np, W_np = make_inputs(seed)
    weights = inter["weights[0]"].data
    numeric = numerical_gradient(lambda: loss_with(X_np, W_np, causal=True), X_np)
    first_query = max(float(np.abs(inter[f"Q[{i}]"].grad.data[0]).max()) for i in range(N_HEADS))
    masked = max(float(abs(inter[f"scaled[{i}]"].grad.data[0, 1])) for i in range(N_HEADS))
    result = {"weights": weights, "masked_grad": masked, "first_query_grad": first_query,
              "X": float(np.abs(X.grad.data - numeric).max())}
    if verbose:
        print(f"\n== Causal variant: {WORDS[0]!r} may not look at {WORDS[1]!r}, which comes after it ==")
        show("weights[0]", weights)
        show_weights(weights)
        print(f"  The masked score gets no gradient (doc §4): largest |dL/dscaled[i][0][1]| = {masked:.1e}.")
        print(f"  More: the row of {WORDS[0]!r} has one key left, whose weight is 1 whatever the score,")
        print("  so that whole row of scores gets no gradient, and neither does its query, in any head:")
        print(f"  largest |dL/dQ_i[0]| = {first_query:.1e}.")
        show("dL/dX", X.grad.data)
        print(f"      max |analytic - finite difference| = {result['X']:.2e}")
        result.update(zero_sums(inter, verbose=False))
        print(f"  The zero sums still hold: rows {result['rows']:.1e}, keys {result['keys']:.1e}.")
    else:
        result.update(zero_sums(inter, verbose=False))
    return result


# %%
if __name__ == "__main__":
    causal = causal_variant(seed)


# %% [markdown]
# ## Cross-entropy on a small classifier

# %%
def cross_entropy_variant(seed=SEED, verbose=True):
    """A classifier on Y and a cross-entropy loss. Returns the numbers the claims rest on."""
    X, W, inter, loss = run(seed, loss="cross_entropy")
    X_np, W_np = make_inputs(seed)
    logits = inter["logits"].data
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    onehot = np.eye(len(CLASSES))[TARGETS]
    formula = (p - onehot) / N_WORDS  # doc §9, with the mean over the 2 words
    numeric = numerical_gradient(lambda: loss_with(X_np, W_np, loss="cross_entropy"), X_np)
    result = {"loss": loss.item(), "dlogits": float(np.abs(inter["logits"].grad.data - formula).max()),
              "rows": float(np.abs(inter["logits"].grad.data.sum(axis=1)).max()),
              "X": float(np.abs(X.grad.data - numeric).max())}
    if verbose:
        print("\n== Cross-entropy: a classifier logits = Y W_c (W_c of (4, 3)) tags each word ==")
        print(f"  targets {dict(zip(WORDS, (CLASSES[t] for t in TARGETS)))}; "
              f"loss = mean over the words of -log p(target) = {result['loss']:.6f}")
        show("softmax(logits)", p)
        show("dL/dlogits", inter["logits"].grad.data)
        print(f"  = (softmax(logits) - one-hot(targets)) / 2 (doc §9): max difference {result['dlogits']:.1e};")
        print(f"  each row sums to zero, as softmax's does: largest |row sum| {result['rows']:.1e}.")
        show("dL/dX", X.grad.data)
        print(f"      max |analytic - finite difference| = {result['X']:.2e}")
    return result


# %%
if __name__ == "__main__":
    ce = cross_entropy_variant(seed)


# %% [markdown]
# ## Everything at once
#
# `main()` runs every part above and returns their numbers (the tests use it).

# %%
def main(argv=None, verbose=True):
    """Every part, for the seed of --seed in argv; returns their results by part."""
    seed = options(argv if argv is not None else []).seed
    errors, inter = walkthrough(seed, verbose)
    paths = three_paths(seed, verbose)
    sums = zero_sums(inter, verbose)
    worked = worked_numbers(inter, verbose)
    causal = causal_variant(seed, verbose)
    ce = cross_entropy_variant(seed, verbose)
    return {"errors": errors, "inter": inter, "paths": paths, "zero_sums": sums, "worked": worked,
            "causal": causal, "cross_entropy": ce}
