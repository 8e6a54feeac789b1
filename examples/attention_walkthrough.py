"""The seed notes' attention example, every number printed, every gradient checked.

Two words with embeddings of dimension 4 (the rows of X). One head first:
Q = X W^Q, K = X W^K, V = X W^V, the 2x2 score matrix Q K^T whose entry [i][j]
is the influence of word j on word i, scaled by sqrt(d_k), turned into weights
by softmax, and the weighted sum of values. Then 8 heads, each giving a (2, 3)
result Z_i, concatenated to (2, 24) and projected back to (2, 4) by W^O.

Backward runs from the simple loss L = 1/2 * sum(Y^2) (so dL/dY = Y). Every
intermediate's gradient and the gradients of W^Q, W^K, W^V, W^O are printed
and compared with finite differences. Read it side by side with
docs/backprop_through_attention.md.

    python examples/attention_walkthrough.py
"""
import math

import numpy as np

import tinygrad_attn as tg
import tinygrad_attn.functional as F

N_WORDS, D_MODEL, N_HEADS, D_K = 2, 4, 8, 3


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_WORDS, D_MODEL))
    # Per-head projections W^Q_i, W^K_i, W^V_i of (4, 3), and W^O of (24, 4).
    W = {name: rng.normal(scale=0.5, size=(N_HEADS, D_MODEL, D_K)) for name in ("WQ", "WK", "WV")}
    W["WO"] = rng.normal(scale=0.3, size=(N_HEADS * D_K, D_MODEL))
    return X, W


def forward(X, W, replace=None):
    """The whole computation; returns (loss, intermediates).

    `replace` maps an intermediate's name to an array used in its place:
    finite differences with respect to an intermediate perturb that array.
    """
    replace = replace or {}
    seen = {}

    def stage(name, value):
        if name in replace:
            value = replace[name]
        seen[name] = value
        return value

    X = stage("X", X)
    heads = []
    for i in range(N_HEADS):
        Q = stage(f"Q[{i}]", X @ W["WQ"][i])                 # (2, 3) queries
        K = stage(f"K[{i}]", X @ W["WK"][i])                 # (2, 3) keys
        V = stage(f"V[{i}]", X @ W["WV"][i])                 # (2, 3) values
        scores = stage(f"scores[{i}]", Q @ K.swapaxes(0, 1))  # (2, 2): [i][j] = q_i . k_j
        scaled = stage(f"scaled[{i}]", scores / math.sqrt(D_K))
        weights = stage(f"weights[{i}]", F.softmax(scaled, dim=-1))
        heads.append(stage(f"Z[{i}]", weights @ V))          # (2, 3)
    concat = stage("concat", tg.cat(heads, dim=1))           # (2, 24)
    Y = stage("Y", concat @ W["WO"])                         # (2, 4)
    loss = (Y * Y).sum() * 0.5
    return loss, seen


def as_tensors(X, W, requires_grad):
    return (tg.Tensor(X, requires_grad=requires_grad),
            {k: tg.Tensor(v, requires_grad=requires_grad) for k, v in W.items()})


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


def show(name, array, indent="  "):
    body = np.array2string(np.asarray(array), precision=4, suppress_small=True,
                           separator=", ", prefix=indent + " " * 4)
    print(f"{indent}{name} {tuple(np.shape(array))}:\n{indent}    {body}")


def main(seed=0, verbose=True):
    X_np, W_np = make_inputs(seed)
    X, W = as_tensors(X_np, W_np, requires_grad=True)

    loss, inter = forward(X, W)
    for t in inter.values():
        if not t.is_leaf:
            t.retain_grad()  # keep .grad on intermediates so we can print them

    if verbose:
        print("== Forward, head 0 (the single-head story) ==")
        for name in ("X", "Q[0]", "K[0]", "V[0]", "scores[0]", "scaled[0]", "weights[0]", "Z[0]"):
            show(name, inter[name].data)
        print("  scores[0][i][j] = q_i . k_j: the influence of word j on word i;")
        print(f"  scaled by 1/sqrt(d_k) = 1/sqrt({D_K}); each row of weights sums to 1:",
              np.round(inter["weights[0]"].data.sum(axis=1), 6))
        print(f"\n== Multi-head: {N_HEADS} heads, each Z_i is {inter['Z[0]'].shape} ==")
        show("concat(Z_0..Z_7)", inter["concat"].data)
        show("W^O", W["WO"].data)
        show("Y = concat @ W^O", inter["Y"].data)
        print(f"\n  loss = 1/2 * sum(Y^2) = {loss.item():.6f}")

    loss.backward()

    # Finite differences: perturb an input, a weight, or an intermediate
    # (through `replace`) and recompute the loss without a graph.
    def loss_with(X_arr=X_np, W_arr=W_np, replace=None):
        with tg.no_grad():
            Xt, Wt = as_tensors(X_arr, W_arr, requires_grad=False)
            rep = {k: tg.Tensor(v) for k, v in (replace or {}).items()}
            return forward(Xt, Wt, rep)[0].item()

    errors = {}
    if verbose:
        print("\n== Backward from L = 1/2 sum(Y^2), checked against finite differences ==")
    for name in ("Y", "concat", "Z[0]", "weights[0]", "scaled[0]", "scores[0]", "V[0]", "K[0]", "Q[0]"):
        analytic = inter[name].grad.data
        value = inter[name].data.copy()
        numeric = numerical_gradient(lambda: loss_with(replace={name: value}), value)
        errors[name] = float(np.abs(analytic - numeric).max())
        if verbose:
            show(f"dL/d{name}", analytic)
            print(f"      max |analytic - finite difference| = {errors[name]:.2e}")
    for name in ("WQ", "WK", "WV", "WO"):
        analytic = W[name].grad.data
        numeric = numerical_gradient(lambda: loss_with(W_arr=W_np), W_np[name])
        errors[name] = float(np.abs(analytic - numeric).max())
        if verbose:
            shown = analytic[0] if name != "WO" else analytic
            label = f"dL/d{name}" + ("[head 0]" if name != "WO" else "")
            show(label, shown)
            print(f"      max |analytic - finite difference| over all heads = {errors[name]:.2e}")
    numeric_x = numerical_gradient(lambda: loss_with(X_arr=X_np), X_np)
    errors["X"] = float(np.abs(X.grad.data - numeric_x).max())
    if verbose:
        show("dL/dX", X.grad.data)
        print(f"      max |analytic - finite difference| = {errors['X']:.2e}")
        worst = max(errors.values())
        print(f"\nAll {len(errors)} gradients agree with finite differences "
              f"(worst difference {worst:.1e})." if worst < 1e-6 else
              f"\nMISMATCH: worst difference {worst:.1e}")
    return errors, inter


if __name__ == "__main__":
    main()
