"""Every formula in docs/backprop_through_attention.md, checked numerically.

Each test writes the document's formula in plain numpy (float64; the fused
ops' backward as the package spells it out, tinygrad_attn.reference.numpy_backward,
where the document points), compares
it with central differences of the forward pass, and where the framework
computes the same gradient, with what tinygrad_attn's own backward gives.
Each section of the document ends with a "Tests:" line naming the tests
here that check it; the last tests check those lines and every piece of
code the document names.

A negative control, to see that these tests can fail: change a sign in one
of the document's formulas below, e.g. `G_x = G_z - J^T G_z` in
`test_residual_add_and_norm`, and that test fails.
"""
import math
import operator
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.special import ndtr

import tinygrad_attn as tg
import tinygrad_attn.functional as F
from tinygrad_attn import nn
from tinygrad_attn.models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from tinygrad_attn.ops.cross_entropy import CrossEntropy
from tinygrad_attn.reference import numpy_backward as nb

from .nn_helpers import ops_in_graph

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backprop_through_attention.md"
rng = np.random.default_rng(1234)


def numerical_grad(f, x, eps=1e-6):
    """Central differences of the scalar f at x (x is perturbed in place and restored)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + eps
        plus = f()
        x[idx] = orig - eps
        minus = f()
        x[idx] = orig
        g[idx] = (plus - minus) / (2 * eps)
    return g


def tg_grads(fn, *arrays):
    """Gradients of sum(G * fn(...)) computed by tinygrad_attn, with G = the last array."""
    *inputs, G = arrays
    ts = [tg.Tensor(a.copy(), requires_grad=True) for a in inputs]
    (fn(*ts) * tg.Tensor(G)).sum().backward()
    return [t.grad.data for t in ts]


def close(a, b, tol=1e-7):
    """assert a == b to tol; lists of arrays are compared pairwise."""
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            close(x, y, tol)
        return
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


# Notation: the seed notes' symbols --------------------------------------------
# (the seed notes: the lecture notes this project's math comes from, README.md "Learn";
# docs/backprop_through_attention.md maps their symbols to the code's)

def test_seed_notation_context_vector_is_a_row_of_the_output():
    """alpha_ij = exp(q^<i>.k^<j> / sqrt d_k) / sum_j' exp(...), C^<i> = sum_j alpha_ij v^<j> = O[i]."""
    n, d, d_k = 3, 4, 2
    X = rng.normal(size=(n, d))
    WQ, WK, WV = (rng.normal(size=(d_k, d)) for _ in range(3))      # column form: q = W^Q x
    x = [X[i] for i in range(n)]
    q, k, v = ([W @ xi for xi in x] for W in (WQ, WK, WV))
    out = attention_forward(X @ WQ.T, X @ WK.T, X @ WV.T)
    for i in range(n):
        e = np.array([np.exp(q[i] @ k[j] / np.sqrt(d_k)) for j in range(n)])
        alpha = e / e.sum()
        C = sum(alpha[j] * v[j] for j in range(n))
        close(C, out[i], 1e-12)


# 1. Matrix multiplication -------------------------------------------------

def test_matmul_gradients():
    A, B, G = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    GA, GB = G @ B.T, A.T @ G                      # the document's formulas
    L = lambda: np.sum(G * (A @ B))
    close(GA, numerical_grad(L, A))
    close(GB, numerical_grad(L, B))
    close([GA, GB], tg_grads(lambda a, b: a @ b, A, B, G))


@pytest.mark.parametrize("b_shape", [(4, 5), (1, 4, 5)])
def test_a_broadcast_batch_axis_gets_the_sum_over_the_batch(b_shape):
    """Y_b = A_b B for every b with one B: G_B = sum_b A_b^T G_{Y_b}; G_{A_b} = G_{Y_b} B^T."""
    A, B, G = rng.normal(size=(3, 2, 4)), rng.normal(size=b_shape), rng.normal(size=(3, 2, 5))
    B2 = B.reshape(4, 5)
    GB = sum(A[b].T @ G[b] for b in range(3)).reshape(b_shape)
    GA = G @ B2.T
    L = lambda: np.sum(G * (A @ B))
    close(GB, numerical_grad(L, B))
    close(GA, numerical_grad(L, A))
    close([GA, GB], tg_grads(lambda a, b: a @ b, A, B, G))


def test_column_form_and_row_form_of_the_projection():
    """q^<i> = W x^<i> with W (d_k, d) is Q = X W^T: the row form's matrix is W^T (d, d_k).
    G_W = G_Q^T X (column form), G_{W^T} = X^T G_Q (row form), G_X = G_Q W."""
    n, d, d_k = 3, 4, 2
    X, W, GQ = rng.normal(size=(n, d)), rng.normal(size=(d_k, d)), rng.normal(size=(n, d_k))
    Q = X @ W.T
    for i in range(n):
        close(W @ X[i], Q[i], 1e-12)               # row i of Q is the column q^<i>
    L = lambda: np.sum(GQ * (X @ W.T))
    close(GQ.T @ X, numerical_grad(L, W))
    close(GQ @ W, numerical_grad(L, X))
    W_row = W.T.copy()
    close(X.T @ GQ, numerical_grad(lambda: np.sum(GQ * (X @ W_row)), W_row))
    # F.linear(x, W) takes the column form, like torch: x W^T
    GX, GW = tg_grads(F.linear, X, W, GQ)
    close([GX, GW], [GQ @ W, GQ.T @ X])
    # nn.MultiheadAttention: the rows of in_proj_weight are the column form,
    # head_weights() gives the row form.
    mha = nn.MultiHeadAttention(d, 2, bias=False).double()
    inner = mha.num_heads * mha.head_dim
    WQ_col = mha.in_proj_weight.data[:inner]                   # (h * d_h, d)
    WQ_row_head1 = mha.head_weights(1)[0]                       # (d, d_h)
    close(WQ_row_head1, WQ_col[mha.head_dim:2 * mha.head_dim].T, 0)
    close(X @ WQ_row_head1, (X @ WQ_col.T)[:, mha.head_dim:2 * mha.head_dim], 1e-12)


def test_self_attention_input_used_three_times():
    X = rng.normal(size=(2, 4))
    WQ, WK, WV = (rng.normal(size=(4, 3)) for _ in range(3))
    GQ, GK, GV = (rng.normal(size=(2, 3)) for _ in range(3))
    L = lambda: np.sum(GQ * (X @ WQ)) + np.sum(GK * (X @ WK)) + np.sum(GV * (X @ WV))
    GX = GQ @ WQ.T + GK @ WK.T + GV @ WV.T
    close(GX, numerical_grad(L, X))
    close(X.T @ GQ, numerical_grad(L, WQ))


def test_linear_layer_gradients_and_the_bias_sum():
    """y = x W^T + b on x (B, T, in): G_x = G_y W, G_W = sum_{B,T} G_y^T x, G_b = sum_{B,T} G_y."""
    x, W, b, G = rng.normal(size=(2, 3, 4)), rng.normal(size=(5, 4)), rng.normal(size=5), rng.normal(size=(2, 3, 5))
    Gx, GW, Gb = G @ W, np.einsum("bto,bti->oi", G, x), G.sum(axis=(0, 1))
    L = lambda: np.sum(G * (x @ W.T + b))
    close(Gx, numerical_grad(L, x))
    close(GW, numerical_grad(L, W))
    close(Gb, numerical_grad(L, b))
    layer = nn.Linear(4, 5).double()
    layer.load_state_dict({"weight": W, "bias": b})
    xt = tg.Tensor(x.copy(), requires_grad=True)
    (layer(xt) * tg.Tensor(G)).sum().backward()
    close([xt.grad.data, layer.weight.grad.data, layer.bias.grad.data], [Gx, GW, Gb])


# 1a. Sums and broadcasts -----------------------------------------------------

def test_a_sum_backward_is_a_broadcast_and_a_broadcast_backward_is_a_sum():
    """y = x.sum(-1, keepdims): G_x[r, j] = G_y[r]. y = x (n, 1) broadcast against z (n, m):
    G_x[r] = sum_j G_y[r, j]; the same over a leading axis (heads) that broadcasting adds."""
    x, G = rng.normal(size=(3, 4)), rng.normal(size=(3, 1))
    close(np.broadcast_to(G, (3, 4)), numerical_grad(lambda: np.sum(G * x.sum(-1, keepdims=True)), x))
    close(np.broadcast_to(G, (3, 4)), tg_grads(lambda a: a.sum(-1, keepdim=True), x, G)[0], 1e-12)
    c, z, Gy = rng.normal(size=(3, 1)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    for op in (operator.add, operator.mul):
        Gc = (Gy * (z if op is operator.mul else 1)).sum(-1, keepdims=True)
        close(Gc, numerical_grad(lambda op=op: np.sum(Gy * op(c, z)), c))
        close(Gc, tg_grads(lambda a, op=op: op(a, tg.Tensor(z)), c, Gy)[0], 1e-12)
    X, W, GQ = rng.normal(size=(2, 1, 3, 4)), rng.normal(size=(5, 4, 2)), rng.normal(size=(2, 5, 3, 2))
    GX = (GQ @ W.swapaxes(-1, -2)).sum(1, keepdims=True)    # summed over the 5 heads it was copied to
    close(GX, numerical_grad(lambda: np.sum(GQ * (X @ W)), X))
    close(GX, tg_grads(lambda a: a @ tg.Tensor(W), X, GQ)[0], 1e-12)


# 2. Softmax -----------------------------------------------------------------

def test_softmax_jacobian_and_fused_vjp():
    s, g = rng.normal(size=6), rng.normal(size=6)
    y = nb.softmax_forward(s)
    J = np.diag(y) - np.outer(y, y)
    J_num = np.stack([numerical_grad(lambda j=j: nb.softmax_forward(s)[j], s) for j in range(6)])
    close(J, J_num)
    fused = y * (g - g @ y)
    close(fused, J.T @ g)
    close(nb.softmax_backward(y, g), fused)
    S, Gy = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    P = nb.softmax_forward(S)
    close(P * (Gy - (Gy * P).sum(-1, keepdims=True)), tg_grads(lambda t: F.softmax(t, dim=-1), S, Gy)[0])


def test_log_softmax_vjp():
    S, G = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    logsm = lambda: S - np.log(np.exp(S).sum(-1, keepdims=True))
    formula = G - nb.softmax_forward(S) * G.sum(-1, keepdims=True)
    close(formula, numerical_grad(lambda: np.sum(G * logsm()), S))
    close(nb.log_softmax_backward(logsm(), G), formula)
    close(formula, tg_grads(lambda t: F.log_softmax(t, dim=-1), S, G)[0])


# 2a. The max shift ----------------------------------------------------------

@pytest.mark.parametrize("log", [False, True])
def test_the_max_shift_changes_no_value_and_gets_no_gradient(log):
    """softmax(s - c) = softmax(s); with m = max s left in the graph its gradient
    G_m = -sum_j G_shifted[j] is 0 exactly (rounding in floats), as G_shifted sums to 0 per row;
    for an upstream gradient that is not a softmax's it is not 0, so only such a check can fail."""
    s, G = rng.normal(size=(3, 5)) * 3, rng.normal(size=(3, 5))
    fn = nb.log_softmax_forward if log else nb.softmax_forward
    close(fn(s - 7.5), fn(s), 1e-12)
    close(nb.softmax_forward(np.array([[1000.0, 0.0]])), [[1.0, 0.0]], 0)     # no overflow
    st = tg.Tensor(s.copy(), requires_grad=True)
    m = st.amax(-1, keepdim=True)
    m.retain_grad()
    shifted = st - m
    shifted.retain_grad()
    y = shifted.log_softmax(-1) if log else shifted.softmax(-1)
    (y * tg.Tensor(G)).sum().backward()
    close(m.grad.data, -shifted.grad.data.sum(-1, keepdims=True), 1e-15)   # G_m = -sum_j G_shifted[j] ...
    assert np.abs(m.grad.data).max() < 1e-15                                # ... = 0 up to rounding
    back = nb.log_softmax_backward if log else nb.softmax_backward
    close(st.grad.data, back(y.data, G), 1e-12)              # so G_s is the softmax's own gradient
    R = rng.normal(size=(3, 5))                              # not a softmax's input gradient
    mt = tg.Tensor(s.max(-1, keepdims=True), requires_grad=True)
    (tg.Tensor(s) - mt).backward(tg.Tensor(R))
    close(mt.grad.data, -R.sum(-1, keepdims=True), 1e-12)
    assert np.abs(mt.grad.data).min() > 1e-3


# 3-5. Scaling, masking, attention as a whole ----------------------------------

def attention_forward(Q, K, V, mask=None):
    return nb.attention_forward(Q, K, V, mask)[0]


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients(causal):
    """The document's five lines: nb.attention_backward."""
    n, d_k = 4, 3
    Q, K, V, GO = (rng.normal(size=(n, d_k)) for _ in range(4))
    blocked = np.triu(np.ones((n, n), dtype=bool), k=1)
    mask = np.where(blocked, -np.inf, 0.0) if causal else None  # added to the scores: dL/dmask = G_S
    GQ, GK, GV, GS = nb.attention_backward(Q, K, V, GO, mask)
    L = lambda: np.sum(GO * attention_forward(Q, K, V, mask))
    for formula, x in ((GQ, Q), (GK, K), (GV, V)):
        close(formula, numerical_grad(L, x))
    if causal:
        assert np.all(GS[blocked] == 0)  # masked scores receive no gradient
    ours = tg_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal), Q, K, V, GO)
    close([GQ, GK, GV], ours)


def test_scaling_multiplies_the_gradient():
    S, G, c = rng.normal(size=(3, 3)), rng.normal(size=(3, 3)), 1 / np.sqrt(3)
    close(c * G, numerical_grad(lambda: np.sum(G * (c * S)), S))


def test_a_dot_product_of_unit_variance_entries_has_variance_d_k():
    """q.k = sum of d_k products q_i k_i, each of mean 0 and variance E[q_i^2] E[k_i^2] = 1,
    so Var(q.k) = d_k; divided by sqrt(d_k) it is 1. Unscaled, the softmax saturates and
    its Jacobian diag(y) - y y^T shrinks."""
    draw = np.random.default_rng(0)
    for d_k in (16, 64):
        q, k = draw.normal(size=(2, 20000, d_k))
        dots = (q * k).sum(-1)
        assert dots.var() == pytest.approx(d_k, rel=0.05)
        assert (dots / np.sqrt(d_k)).var() == pytest.approx(1, rel=0.05)
    # rows of 8 scores, each a dot product of length 64: the Jacobian's size per row
    q, k = draw.normal(size=(2, 500, 8, 64))
    scores = np.einsum("rd,rjd->rj", q[:, 0], k)              # (500, 8), variance 64

    def jacobian_norm(s):
        y = nb.softmax_forward(s)
        J = y[:, :, None] * np.eye(8) - y[:, :, None] * y[:, None, :]
        return np.linalg.norm(J, axis=(1, 2)).mean()
    assert jacobian_norm(scores) < 0.5 * jacobian_norm(scores / 8)


def test_additive_mask_passes_gradient_unchanged():
    """S' = S + M: G_S = G_{S'}, and a float mask that requires grad gets the same."""
    S, M, G = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    L = lambda: np.sum(G * nb.softmax_forward(S + M))
    P = nb.softmax_forward(S + M)
    G_S = P * (G - (G * P).sum(-1, keepdims=True))
    close(G_S, numerical_grad(L, S))
    close(G_S, numerical_grad(L, M))
    # in attention, S = Q K^T / sqrt(d_k): the mask's gradient is G_{S'} there
    Q, K, V, GO = (rng.normal(size=(3, 2)) for _ in range(4))
    Mt = tg.Tensor(M[:, :3].copy(), requires_grad=True)
    q, k, v = (tg.Tensor(a) for a in (Q, K, V))
    (F.scaled_dot_product_attention(q, k, v, attn_mask=Mt) * tg.Tensor(GO)).sum().backward()
    P = nb.softmax_forward(Q @ K.T / np.sqrt(2) + M[:, :3])
    GP = GO @ V.T
    close(Mt.grad.data, P * (GP - (GP * P).sum(-1, keepdims=True)))


def test_attention_with_dropout_gradients():
    """O = (P * D) V: G_V = (P * D)^T G_O, G_P = (G_O V^T) * D, the rest unchanged."""
    n, d_k, p = 4, 3, 0.5
    Q, K, V, GO = (rng.normal(size=(n, d_k)) for _ in range(4))
    P = nb.softmax_forward(Q @ K.T / np.sqrt(d_k))
    # The kernel draws D from the framework's generator: the same seed gives the same D,
    # and with V = identity the output is P * D itself.
    tg.manual_seed(7)
    D = F.scaled_dot_product_attention(tg.Tensor(Q), tg.Tensor(K), tg.Tensor(np.eye(n)), dropout_p=p).data / P
    assert set(np.round(D, 12).ravel()) == {0.0, 1 / (1 - p)}

    GV = (P * D).T @ GO
    GP = (GO @ V.T) * D
    GS = P * (GP - (GP * P).sum(-1, keepdims=True))
    GQ, GK = GS @ K / np.sqrt(d_k), GS.T @ Q / np.sqrt(d_k)
    L = lambda: np.sum(GO * ((nb.softmax_forward(Q @ K.T / np.sqrt(d_k)) * D) @ V))
    for formula, x in ((GQ, Q), (GK, K), (GV, V)):
        close(formula, numerical_grad(L, x))
    tg.manual_seed(7)
    ours = tg_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=p), Q, K, V, GO)
    close([GQ, GK, GV], ours)
    close([GQ, GK, GV], list(nb.attention_backward(Q, K, V, GO, keep=D > 0, dropout_p=p)[:3]))


def test_a_query_with_every_key_masked_gets_zero_output_and_sends_no_gradient():
    Q, K, V, GO = (rng.normal(size=(3, 2)) for _ in range(4))
    may_attend = np.array([[True, False, True], [False, False, False], [True, True, True]])
    q, k, v = (tg.Tensor(a, requires_grad=True) for a in (Q, K, V))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=tg.Tensor(may_attend))
    (out * tg.Tensor(GO)).sum().backward()
    assert np.all(out.data[1] == 0) and np.all(q.grad.data[1] == 0)
    # the other rows are plain masked attention, and row 1 adds nothing to dK, dV
    GQ, GK, GV, _ = nb.attention_backward(Q[[0, 2]], K, V, GO[[0, 2]], attn_mask=may_attend[[0, 2]])
    close([GQ, GK, GV], [q.grad.data[[0, 2]], k.grad.data, v.grad.data])


def test_what_pytorch_gives_for_a_query_with_every_key_masked():
    """torch 2.13: F.scaled_dot_product_attention gives 0 (and no gradient) there, like
    ours; nn.MultiheadAttention gives NaN when it computes the weights (need_weights=True,
    its default) or takes its inference fast path (batch_first, eval, no grad), and
    out_proj.bias otherwise; ours gives out_proj.bias in every case."""
    torch = pytest.importorskip("torch")
    Q, K, V = (rng.normal(size=(1, 1, 3, 2)) for _ in range(3))
    may_attend = np.array([[True, False, True], [False, False, False], [True, True, True]])
    additive = np.where(may_attend, 0.0, -np.inf)
    for mask in (may_attend, additive):
        q, k, v = (torch.tensor(a, requires_grad=True) for a in (Q, K, V))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor(mask))
        out.sum().backward()
        assert torch.all(out[0, 0, 1] == 0) and torch.all(q.grad[0, 0, 1] == 0)
        assert not any(torch.isnan(t.grad).any() for t in (q, k, v))
        ours = F.scaled_dot_product_attention(tg.Tensor(Q), tg.Tensor(K), tg.Tensor(V), attn_mask=tg.Tensor(mask))
        close(ours.data, out.detach().numpy(), 1e-12)

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(4, 2, dtype=torch.float64)
    with torch.no_grad():
        mha.out_proj.bias.normal_()
    x = torch.tensor(rng.normal(size=(3, 1, 4)))
    blocked = torch.zeros(3, 3, dtype=torch.bool)
    blocked[1] = True                                          # query 1 may attend to no key
    with_weights, _ = mha(x, x, x, attn_mask=blocked)
    without, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    assert torch.isnan(with_weights[1]).all() and not torch.isnan(with_weights[[0, 2]]).any()
    close(without[1, 0].detach().numpy(), mha.out_proj.bias.detach().numpy(), 1e-12)
    fast = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    fast.load_state_dict(mha.state_dict())
    xb = x.transpose(0, 1)                                     # the same tensor as query, key and value
    with torch.no_grad():
        fast_out, _ = fast.eval()(xb, xb, xb, attn_mask=blocked, need_weights=False)
    assert torch.isnan(fast_out[0, 1]).all()
    ours = nn.MultiHeadAttention(4, 2).double()
    ours.load_state_dict({name: p.detach().numpy() for name, p in mha.state_dict().items()})
    for need_weights in (True, False):
        out, _ = ours(tg.Tensor(x.numpy()), tg.Tensor(x.numpy()), tg.Tensor(x.numpy()),
                      attn_mask=blocked.numpy(), need_weights=need_weights)
        close(out.data[1, 0], mha.out_proj.bias.detach().numpy(), 1e-12)
        close(out.data[[0, 2]], without[[0, 2]].detach().numpy(), 1e-10)


# 5a. Worked numbers -----------------------------------------------------------

def test_the_worked_numbers_of_section_5a_are_the_walkthroughs(capsys):
    """The numbers in section 5a are what examples/attention_walkthrough.py prints, and its
    by-hand G_S = P * (G_P - rowsum(G_P * P)) (and G_P, G_Q, G_K, G_V) are autograd's."""
    import importlib.util
    path = ROOT / "examples" / "attention_walkthrough.py"
    spec = importlib.util.spec_from_file_location("attention_walkthrough", path)
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    _, _, inter, _ = walk.run()
    capsys.readouterr()
    worked = walk.worked_numbers(inter)
    printed = capsys.readouterr().out
    block = DOC.read_text().split("## 5a. ")[1].split("```")[1].strip("\n")
    assert block.count("\n") >= 10 and block in printed
    for by_hand, autograd in worked.values():
        close(by_hand, autograd, 1e-15)
    P, G_P = inter["weights[0]"].data, inter["weights[0]"].grad.data
    close(worked["G_S"][0], nb.softmax_backward(P, G_P), 1e-15)
    factor = P[:, 0] * (1 - P[:, 0])                         # two keys: G_S[i, 0] = p(1-p)(G_P[i,0] - G_P[i,1])
    close(worked["G_S"][0][:, 0], factor * (G_P[:, 0] - G_P[:, 1]), 1e-15)
    text = " ".join(DOC.read_text().split("## 5a. ")[1].split())
    assert f"is {factor[0]:.3f} for 'Thinking'" in text and f"against {factor[1]:.3f} for 'Machines'" in text
    assert float(re.search(r"at most (\S+)\)", DOC.read_text().split("## 5a. ")[1]).group(1)) >= max(
        np.abs(a - b).max() for a, b in worked.values())


# 5b. Flash-style attention ---------------------------------------------------

def test_the_online_softmax_gives_the_softmax_and_the_log_sum_exp():
    """The recurrences m, l, o over blocks of keys end at O_i = sum_k P_ik v_k and
    m + log l = log sum_k e^{S_ik}, whatever the blocks (l is `total` here)."""
    s, v = rng.normal(size=7) * 4, rng.normal(size=(7, 3))
    for cuts in ([0, 7], [0, 1, 4, 7], [0, 2, 3, 5, 6, 7]):
        m, total, o = -np.inf, 0.0, np.zeros(3)
        for a, b in zip(cuts, cuts[1:]):
            m_new = max(m, s[a:b].max())
            total = np.exp(m - m_new) * total + np.exp(s[a:b] - m_new).sum()
            o = np.exp(m - m_new) * o + np.exp(s[a:b] - m_new) @ v[a:b]
            m = m_new
            seen = s[:b]
            close([total, o], [np.exp(seen - m).sum(), np.exp(seen - m) @ v[:b]], 1e-12)   # the invariant
        close(o / total, nb.softmax_forward(s) @ v, 1e-12)
        close(m + np.log(total), np.log(np.exp(s).sum()), 1e-12)
        close(np.exp(s - (m + np.log(total))), nb.softmax_forward(s), 1e-12)             # P from lse alone


@pytest.mark.parametrize("dropout", [False, True])
def test_rowsum_of_gp_times_p_is_rowsum_of_go_times_o(dropout):
    """With G_P = (G_O V^T) * M and O = (P * M) V: rowsum(G_P * P) = rowsum(G_O * O)."""
    n, S, d_v = 3, 5, 4
    P = nb.softmax_forward(rng.normal(size=(n, S)))
    V, GO = rng.normal(size=(S, d_v)), rng.normal(size=(n, d_v))
    M = (rng.random((n, S)) > 0.3) / 0.7 if dropout else np.ones((n, S))
    out, GP = (P * M) @ V, (GO @ V.T) * M
    close((GP * P).sum(-1), (GO * out).sum(-1), 1e-12)
    assert np.abs((GP * P).sum(-1)).min() > 1e-3                  # not trivially zero


def test_the_flash_backward_from_o_and_lse_matches_finite_differences():
    """numpy_flash's backward, which sees only Q, K, V, O, lse and G_O, against central differences."""
    from tinygrad_attn.reference import numpy_flash as nf
    Q, K, V, GO = rng.normal(size=(4, 3)), rng.normal(size=(6, 3)), rng.normal(size=(6, 2)), rng.normal(size=(4, 2))
    causal = np.tril(np.ones((4, 6), bool), k=2)                  # a boolean mask: True = may attend
    L = lambda: np.sum(GO * nf.flash_attention_forward(Q, K, V, causal, block_size=4)[0])
    out, lse = nf.flash_attention_forward(Q, K, V, causal, block_size=4)
    close(out, attention_forward(Q, K, V, causal), 1e-12)
    GQ, GK, GV, _ = nf.flash_attention_backward(Q, K, V, out, lse, GO, causal, block_size=4)
    close([GQ, GK, GV], [numerical_grad(L, Q), numerical_grad(L, K), numerical_grad(L, V)])


# 6. Multi-head: the seeds' example -------------------------------------------

def test_multi_head_split_concat_and_output_projection():
    n, d, h, d_h = 2, 4, 8, 3                     # 2 words of dim 4, 8 heads of size 3
    X = rng.normal(size=(n, d))
    WQ, WK, WV = (rng.normal(size=(d, h * d_h)) for _ in range(3))
    WO = rng.normal(size=(h * d_h, d))            # (24, 4)
    GY = rng.normal(size=(n, d))

    def heads(W):
        return [W[:, i * d_h:(i + 1) * d_h] for i in range(h)]   # per-head W^Q_i: (4, 3)

    def forward():
        Z = [attention_forward(X @ q, X @ k, X @ v) for q, k, v in zip(heads(WQ), heads(WK), heads(WV))]
        assert all(z.shape == (2, 3) for z in Z)
        Zc = np.concatenate(Z, axis=1)
        assert Zc.shape == (2, 24)
        return Zc, Zc @ WO

    Zc, Y = forward()
    assert Y.shape == (2, 4)
    L = lambda: np.sum(GY * forward()[1])
    close(Zc.T @ GY, numerical_grad(L, WO))        # G_{W^O} = Z^T G_Y
    GZ = GY @ WO.T                                 # then split into the 8 heads
    GWQ_heads = []
    for i, (q, k, v) in enumerate(zip(heads(WQ), heads(WK), heads(WV))):
        GQi, _, _, _ = nb.attention_backward(X @ q, X @ k, X @ v, GZ[:, i * d_h:(i + 1) * d_h])
        GWQ_heads.append(X.T @ GQi)
    close(np.concatenate(GWQ_heads, axis=1), numerical_grad(L, WQ))   # concat of per-head grads

    # nn.MultiHeadAttention with these weights (PyTorch's (out, in) layout, no biases)
    # computes the same output and the same gradients.
    mha = nn.MultiHeadAttention(d, h, head_dim=d_h, bias=False).double()
    mha.load_state_dict({"in_proj_weight": np.concatenate([WQ.T, WK.T, WV.T]), "out_proj.weight": WO.T})
    x = tg.Tensor(X.copy(), requires_grad=True)
    out, _ = mha(x, x, x)
    close(out.data, Y)
    (out * tg.Tensor(GY)).sum().backward()
    close(mha.out_proj.weight.grad.data, (Zc.T @ GY).T)
    close(mha.in_proj_weight.grad.data[:h * d_h], np.concatenate(GWQ_heads, axis=1).T)
    close(x.grad.data, numerical_grad(lambda: np.sum(GY * forward()[1]), X))


def test_packed_projection_backward_is_one_product():
    """[Q | K | V] = X W_in^T, its last axis laid out (3, h, d_h); the heads' G_Q, G_K, G_V
    written into one G_qkv of that layout; then G_X = G_qkv W_in (the sum of the three
    terms of section 1) and G_{W_in} = G_qkv^T X."""
    T, d, h, d_h = 3, 4, 2, 2
    X, W_in, GZ = rng.normal(size=(T, d)), rng.normal(size=(3 * h * d_h, d)), rng.normal(size=(T, h * d_h))

    def forward():
        qkv = (X @ W_in.T).reshape(T, 3, h, d_h)
        return np.concatenate([attention_forward(qkv[:, 0, i], qkv[:, 1, i], qkv[:, 2, i]) for i in range(h)],
                              axis=1)

    qkv = (X @ W_in.T).reshape(T, 3, h, d_h)
    G_qkv = np.zeros_like(qkv)
    for i in range(h):
        G_qkv[:, 0, i], G_qkv[:, 1, i], G_qkv[:, 2, i], _ = nb.attention_backward(
            qkv[:, 0, i], qkv[:, 1, i], qkv[:, 2, i], GZ[:, i * d_h:(i + 1) * d_h])
    G_qkv = G_qkv.reshape(T, 3 * h * d_h)
    GX, GW = G_qkv @ W_in, G_qkv.T @ X
    thirds = [slice(j * h * d_h, (j + 1) * h * d_h) for j in range(3)]
    close(GX, sum(G_qkv[:, s] @ W_in[s] for s in thirds), 1e-12)   # G_Q W_Q + G_K W_K + G_V W_V
    L = lambda: np.sum(GZ * forward())
    close(GX, numerical_grad(L, X))
    close(GW, numerical_grad(L, W_in))
    # The framework's packed op gives the same G_qkv; MultiheadAttention takes that
    # path for self-attention when it need not return the weights (as every
    # Transformer layer calls it), and the separate-projection path otherwise.
    qkv_t = tg.Tensor(qkv.reshape(1, T, -1).copy(), requires_grad=True)
    z = F.packed_self_attention(qkv_t, h)
    (z * tg.Tensor(GZ[None])).sum().backward()
    close(qkv_t.grad.data[0], G_qkv)
    mha = nn.MultiHeadAttention(d, h, bias=False, batch_first=True).double()
    WO = rng.normal(size=(d, h * d_h))
    mha.load_state_dict({"in_proj_weight": W_in, "out_proj.weight": WO})
    GY = rng.normal(size=(1, T, d))
    for need_weights, op in ((False, "PackedSelfAttention"), (True, "ScaledDotProductAttention")):
        x = tg.Tensor(X[None].copy(), requires_grad=True)
        mha.zero_grad()
        out, _ = mha(x, x, x, need_weights=need_weights)
        assert op in ops_in_graph(out)
        (out * tg.Tensor(GY)).sum().backward()
        GZ_mha = GY[0] @ WO                        # G_Z = G_Y (W^O)^T in the row form
        G = np.zeros((T, 3, h, d_h))
        for i in range(h):
            G[:, 0, i], G[:, 1, i], G[:, 2, i], _ = nb.attention_backward(
                qkv[:, 0, i], qkv[:, 1, i], qkv[:, 2, i], GZ_mha[:, i * d_h:(i + 1) * d_h])
        G = G.reshape(T, -1)
        close([x.grad.data[0], mha.in_proj_weight.grad.data], [G @ W_in, G.T @ X])
    layer = nn.TransformerEncoderLayer(d, h, 8, dropout=0.0, batch_first=True).double()
    assert "PackedSelfAttention" in ops_in_graph(layer(tg.Tensor(X[None], requires_grad=True)))


# 7. LayerNorm ------------------------------------------------------------

def test_layer_norm_gradients():
    x, gamma, beta, G = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=5), rng.normal(size=(3, 5))
    Gx, Gg, Gb = nb.layer_norm_backward(x, gamma, G)
    L = lambda: np.sum(G * nb.layer_norm_forward(x, gamma, beta))
    close(Gx, numerical_grad(L, x))
    close(Gg, numerical_grad(L, gamma))
    close(Gb, numerical_grad(L, beta))
    ours = tg_grads(lambda a, w, b: F.layer_norm(a, 5, w, b), x, gamma, beta, G)
    close([Gx, Gg, Gb], ours)
    # the Jacobian of one row: d xhat_j / d x_k = (delta_jk - 1/d - xhat_j xhat_k / d) / sigma
    row, d, eps = x[0].copy(), 5, 1e-5
    sigma = np.sqrt(row.var() + eps)
    xhat = (row - row.mean()) / sigma
    J = (np.eye(d) - 1 / d - np.outer(xhat, xhat) / d) / sigma
    J_num = np.stack([numerical_grad(lambda j=j: nb.layer_norm_forward(row, 1.0, 0.0)[j], row) for j in range(d)])
    close(J, J_num)


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5])
def test_layer_norm_input_gradient_is_orthogonal_to_ones_and_to_xhat_only_without_eps(eps):
    """sum_j G_x[j] = 0 exactly; G_x . xhat = eps (g . xhat) / sigma^3, zero only for eps = 0."""
    x, gamma, G = rng.normal(size=(4, 6)) * 0.7, rng.normal(size=6), rng.normal(size=(4, 6))
    Gx, _, _ = nb.layer_norm_backward(x, gamma, G, eps=eps)
    close(Gx, numerical_grad(lambda: np.sum(G * nb.layer_norm_forward(x, gamma, 0.0, eps=eps)), x), 1e-6)
    mu = x.mean(-1, keepdims=True)
    sigma = np.sqrt(((x - mu) ** 2).mean(-1) + eps)
    xhat = (x - mu) / sigma[:, None]
    g = G * gamma
    assert np.abs(Gx.sum(-1)).max() < 1e-12                       # orthogonal to shifts
    close((xhat ** 2).sum(-1), 6 * (1 - eps / sigma ** 2), 1e-12)   # sum xhat^2 = d (1 - eps / sigma^2)
    predicted = eps * (g * xhat).sum(-1) / sigma ** 3
    close((Gx * xhat).sum(-1), predicted, 1e-12)
    if eps == 0.5:
        assert np.abs(predicted).min() > 1e-2                      # clearly not orthogonal to xhat
    ours = tg_grads(lambda a: F.layer_norm(a, 6, tg.Tensor(gamma), eps=eps), x, G)[0]
    close((ours * xhat).sum(-1), predicted, 1e-10)


# 8. Residual connections: post-norm and pre-norm -------------------------------

def test_residual_add_and_norm():
    """post-norm y = LN(x + Sub(x)): G_z from LayerNorm, then G_x = G_z + J_Sub^T G_z."""
    x, W = rng.normal(size=(3, 4)), rng.normal(size=(4, 4))
    gamma, beta, G = rng.normal(size=4), rng.normal(size=4), rng.normal(size=(3, 4))
    sub = lambda: np.tanh(x @ W)
    L = lambda: np.sum(G * nb.layer_norm_forward(x + sub(), gamma, beta))
    Gz, _, _ = nb.layer_norm_backward(x + sub(), gamma, G)
    Gx = Gz + (Gz * (1 - sub() ** 2)) @ W.T        # G_z + J_Sub^T G_z
    close(Gx, numerical_grad(L, x))


def test_pre_norm_residual():
    """pre-norm y = x + Sub(LN(x)): G_x = G_y + J_LN^T (J_Sub^T G_y)."""
    x, W = rng.normal(size=(3, 4)), rng.normal(size=(4, 4))
    gamma, beta, G = rng.normal(size=4), rng.normal(size=4), rng.normal(size=(3, 4))
    u = nb.layer_norm_forward(x, gamma, beta)
    L = lambda: np.sum(G * (x + np.tanh(nb.layer_norm_forward(x, gamma, beta) @ W)))
    G_u = (G * (1 - np.tanh(u @ W) ** 2)) @ W.T   # J_Sub^T G_y, at u = LN(x)
    Gx = G + nb.layer_norm_backward(x, gamma, G_u)[0]
    close(Gx, numerical_grad(L, x))


@pytest.mark.parametrize("norm_first", [True, False])
def test_residual_path_is_the_identity_in_pre_norm_and_crosses_every_layer_norm_in_post_norm(norm_first):
    """Six encoder layers whose sub-layers output 0 (their Jacobians vanish), so only the
    residual path carries the gradient. Pre-norm: G_x = G_y exactly. Post-norm: G_x is
    G_y through the twelve LayerNorm Jacobians (norm2 of layer 6 first), and every row of
    it sums to 0 whatever G_y: it is not G_y."""
    d, T = 8, 3
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, batch_first=True,
                                                             norm_first=norm_first), 6).double()
    for layer in stack.layers:
        for p in (layer.self_attn.out_proj.weight, layer.self_attn.out_proj.bias,
                  layer.linear2.weight, layer.linear2.bias):
            p.data[...] = 0
        for norm in (layer.norm1, layer.norm2):
            norm.weight.data[...] = rng.uniform(0.5, 2.0, size=d)
            norm.bias.data[...] = rng.normal(size=d)
    X, G = rng.normal(size=(1, T, d)), rng.normal(size=(1, T, d))
    x = tg.Tensor(X.copy(), requires_grad=True)
    (stack(x) * tg.Tensor(G)).sum().backward()
    if norm_first:
        close(x.grad.data, G, 0)
        return
    inputs, h = [], X[0]                            # the input of each LayerNorm, bottom up
    norms = [n for layer in stack.layers for n in (layer.norm1, layer.norm2)]
    for norm in norms:
        inputs.append(h)
        h = nb.layer_norm_forward(h, norm.weight.data, norm.bias.data)
    g = G[0]
    for norm, h_in in zip(reversed(norms), reversed(inputs)):
        g = nb.layer_norm_backward(h_in, norm.weight.data, g)[0]
    close(x.grad.data[0], g)
    assert np.abs(x.grad.data.sum(-1)).max() < 1e-12 and np.abs(G.sum(-1)).min() > 1e-3


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_the_transposed_layer_norm_jacobian_applies_gamma_first_and_projects_only_without_eps(eps):
    """J_LN^T = (1/sigma) (I - 1 1^T/d - xhat xhat^T/d) diag(gamma): gamma first, then the
    bracket B. B is a projection (B B = B) only at eps = 0."""
    d = 5
    x, gamma, G = rng.normal(size=d), rng.uniform(0.3, 3.0, size=d), rng.normal(size=d)
    sigma = np.sqrt(x.var() + eps)
    xhat = (x - x.mean()) / sigma
    B = np.eye(d) - np.ones((d, d)) / d - np.outer(xhat, xhat) / d
    JT = B @ np.diag(gamma) / sigma
    J_num = np.stack([numerical_grad(lambda j=j: nb.layer_norm_forward(x, gamma, 0.0, eps=eps)[j], x)
                      for j in range(d)])                   # J[j, k] = d y_j / d x_k
    close(JT, J_num.T, 1e-6)
    close(JT @ G, nb.layer_norm_backward(x, gamma, G, eps=eps)[0], 1e-12)
    assert np.abs(np.diag(gamma) @ B / sigma @ G - JT @ G).max() > 1e-2   # the other order is wrong
    if eps == 0:
        close(B @ B, B, 1e-12)
    else:
        assert np.abs(B @ B - B).max() > 1e-3


def test_pre_norm_gradient_grows_toward_the_bottom_and_post_norm_barely_changes():
    """Section 8's table is what examples/gradient_flow.py measures: the norm of the gradient
    entering each of 6 layers, top to bottom, and at the input, for the same top gradient."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gradient_flow", ROOT / "examples" / "gradient_flow.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    section = DOC.read_text().split("## 8. ")[1].split("\n## ")[0]
    for name, norm_first in (("pre-norm", True), ("post-norm", False)):
        r = example.stack_gradients(norm_first)
        row = re.search(rf"^\| {name} \| ([\d., ]+) \| ([\d.]+) \|$", section, re.M)
        assert row, name
        stated = [float(v) for v in row.group(1).split(", ")]
        close(stated, np.round(r["entering"][::-1], 1), 0)
        close(float(row.group(2)), round(r["bottom_norm"], 1), 0)
        assert f"norm {r['top_norm']:.1f} at the top" in " ".join(section.split())
        growth = np.diff(r["entering"][::-1])               # entering the layers, top to bottom
        if norm_first:
            assert (growth > 0).all()                       # grows at every layer on the way down
        else:
            assert 0.8 < r["bottom_norm"] / r["top_norm"] < 1.25    # barely changes: no vanishing
    alone = example.stack_gradients(False, sublayer_grad=False)
    assert f"arrives as {alone['bottom_norm']:.1f}, turned to cos {alone['cos']:.2f}" in " ".join(section.split())


# 9. Cross-entropy -----------------------------------------------------------

@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_gradient_is_p_minus_target(smoothing):
    N, C = 4, 5
    z = rng.normal(size=(N, C))
    t = np.array([1, 0, 4, -100])                 # the last row is ignored
    valid = t != -100

    def loss():
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        rows = [(1 - smoothing) * -logp[i, t[i]] + smoothing * -logp[i].mean() for i in range(N) if valid[i]]
        return np.mean(rows)

    q = np.zeros((N, C))
    q[valid, t[valid]] = 1
    q = (1 - smoothing) * q + smoothing / C
    formula = (nb.softmax_forward(z) - q) * valid[:, None] / valid.sum()
    close(formula, numerical_grad(loss, z))
    zt = tg.Tensor(z.copy(), requires_grad=True)
    F.cross_entropy(zt, tg.Tensor(t), label_smoothing=smoothing).backward()
    close(formula, zt.grad.data)
    close(formula, nb.cross_entropy_backward(z, t, 1.0, label_smoothing=smoothing))


def test_cross_entropy_saves_logits_targets_and_two_numbers_per_row():
    """What the fused op keeps for backward: the logits, the targets, and per row m = max z
    and log sum e^(z - m); p = exp(z - m - log sum e^(z - m)) is recomputed from them."""
    z, t = rng.normal(size=(3, 5)), np.array([1, 0, 4])
    _, ctx = CrossEntropy.apply_with_ctx(tg.Tensor(z), target=t)
    logits, targets, row_max, log_sum = ctx.saved_tensors
    close(logits, z, 0)
    assert np.array_equal(targets, t)
    close(row_max, z.max(-1), 0)
    close(log_sum, np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)), 1e-12)
    close(np.exp(z - row_max[:, None] - log_sum[:, None]), nb.softmax_forward(z), 1e-12)


# 10. Positional encoding, fixed and learned ------------------------------------

def test_positional_encoding_adds_no_parameters_and_passes_gradient():
    T, d = 5, 6
    pos = np.arange(T)[:, None]
    i2 = np.arange(0, d, 2)[None, :]
    PE = np.zeros((T, d))
    PE[:, 0::2] = np.sin(pos / 10000 ** (i2 / d))
    PE[:, 1::2] = np.cos(pos / 10000 ** (i2 / d))
    E, G = rng.normal(size=(T, d)), rng.normal(size=(T, d))
    close(G, numerical_grad(lambda: np.sum(G * (E + PE)), E))   # G_E = G_H
    layer = nn.PositionalEncoding(d, max_len=16)
    assert list(layer.parameters()) == [] and list(layer.state_dict()) == []
    close(layer(tg.Tensor(E)).data, E + PE)
    close(G, tg_grads(layer, E, G)[0])


def test_learned_positional_embedding_gradient_sums_over_the_batch():
    """H[b, pos] = E[b, pos] + P[pos]: G_P[pos] = sum_b G_H[b, pos] for pos < T, 0 beyond."""
    B, T, d, max_len = 3, 4, 5, 6
    E, P, G = rng.normal(size=(B, T, d)), rng.normal(size=(max_len, d)), rng.normal(size=(B, T, d))
    GP = np.zeros_like(P)
    GP[:T] = G.sum(0)
    close(GP, numerical_grad(lambda: np.sum(G * (E + P[:T])), P))
    layer = nn.LearnedPositionalEmbedding(d, max_len=max_len).double()
    layer.load_state_dict({"weight": P})
    e = tg.Tensor(E.copy(), requires_grad=True)
    (layer(e) * tg.Tensor(G)).sum().backward()
    close([layer.weight.grad.data, e.grad.data], [GP, G])


def test_the_sinusoidal_table_stops_at_max_len():
    """The formula holds at every position, the table only up to max_len: a longer input is refused."""
    layer = nn.PositionalEncoding(6, max_len=8)
    close(layer.pe.data, nn.positional.sinusoidal_table(12, 6)[:8], 1e-7)
    layer(tg.Tensor(np.zeros((2, 8, 6))))                  # max_len positions: fine
    with pytest.raises(tg.ShapeError, match="max_len 8"):
        layer(tg.Tensor(np.zeros((2, 9, 6))))


# 11. Embedding lookup, its sqrt(d_model) scale, tied embeddings ----------------

def scatter_add(shape, tokens, G):
    out = np.zeros(shape)
    for p, r in enumerate(tokens.ravel()):
        out[r] += G.reshape(tokens.size, -1)[p]
    return out


def test_embedding_backward_is_a_scatter_add():
    W, tokens, G = rng.normal(size=(5, 3)), np.array([2, 0, 2, 4]), rng.normal(size=(4, 3))
    GW = scatter_add(W.shape, tokens, G)
    close(GW, numerical_grad(lambda: np.sum(G * W[tokens]), W))
    close(GW, tg_grads(lambda w: F.embedding(tg.Tensor(tokens), w), W, G)[0])
    close(GW, nb.embedding_backward(tokens, G, 5))


def test_embedding_scaled_by_sqrt_d_model():
    """x = PE + W[tokens] * sqrt(d): G_W[r] = sqrt(d) * sum of G_x over the positions holding r."""
    V, d = 7, 8
    W, tokens, G = rng.normal(size=(V, d)), np.array([[3, 1, 3], [0, 3, 6]]), rng.normal(size=(2, 3, d))
    GW = math.sqrt(d) * scatter_add(W.shape, tokens, G)
    PE = nn.PositionalEncoding(d).pe.data[:3].astype(np.float64)
    close(GW, numerical_grad(lambda: np.sum(G * (W[tokens] * math.sqrt(d) + PE)), W))
    model = Seq2SeqTransformer(Seq2SeqConfig(vocab_size=V, d_model=d, nhead=2, num_encoder_layers=1,
                                             num_decoder_layers=1, dim_feedforward=16)).double()
    model.src_embed.weight.data[...] = W
    x = model._embed(model.src_embed, tokens)       # what the encoder receives
    close(x.data, W[tokens] * math.sqrt(d) + PE, 1e-12)
    (x * tg.Tensor(G)).sum().backward()
    close(model.src_embed.weight.grad.data, GW)


def test_tied_embeddings_collect_the_gradient_of_both_uses():
    """W is the embedding table and the output layer: logits = h W^T with h = f(W[tokens]).
    G_W = G_logits^T h (output layer) + scatter_add(G_E) (lookup), G_E = J_f^T (G_logits W)."""
    V, d = 5, 3
    W, tokens, G = rng.normal(size=(V, d)), np.array([4, 1, 4]), rng.normal(size=(3, V))
    h = np.tanh(W[tokens])
    GE = (G @ W) * (1 - h ** 2)
    GW = G.T @ h + scatter_add(W.shape, tokens, GE)
    close(GW, numerical_grad(lambda: np.sum(G * (np.tanh(W[tokens]) @ W.T)), W))
    # GPT with tie_weights: the one Parameter's gradient is the sum of the two an
    # untied copy (the same numbers in two Parameters) gives its table and its head.
    config = dict(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8)
    tg.manual_seed(0)
    tied = GPT(GPTConfig(**config)).double()
    untied = GPT(GPTConfig(**config, tie_weights=False)).double()
    untied.load_state_dict({**tied.state_dict(), "lm_head.weight": tied.tok_emb.weight.data.copy()})
    assert tied.lm_head.weight is tied.tok_emb.weight
    idx, Glog = np.array([[1, 5, 5, 2]]), rng.normal(size=(1, 4, 11))
    for model in (tied, untied):
        (model(idx) * tg.Tensor(Glog)).sum().backward()
    both = untied.tok_emb.weight.grad.data + untied.lm_head.weight.grad.data
    close(tied.tok_emb.weight.grad.data, both, 1e-12)
    assert np.abs(untied.lm_head.weight.grad.data).max() > 1e-3 and np.abs(untied.tok_emb.weight.grad.data).max() > 1e-3


# 11a. Gather and scatter-add -------------------------------------------------

def test_a_gather_backward_is_a_scatter_add_and_plain_assignment_loses_repeats():
    """y[p] = x[idx[p]]: G_x[r] = sum over the p with idx[p] = r of G_y[p] (np.add.at);
    G_x[idx] += G_y keeps one of the repeats. picked[i] = x[i, t_i]: one place per row."""
    x, idx, G = rng.normal(size=6), np.array([4, 1, 4, 4, 0]), rng.normal(size=5)
    Gx = np.zeros(6)
    np.add.at(Gx, idx, G)
    close(Gx, numerical_grad(lambda: np.sum(G * x[idx]), x))
    close(Gx, tg_grads(lambda a: a[idx], x, G)[0], 1e-12)
    wrong = np.zeros(6)
    wrong[idx] += G
    assert abs(wrong[4] - Gx[4]) > 1e-3
    logp, t, Gp = rng.normal(size=(3, 4)), np.array([2, 0, 2]), rng.normal(size=3)
    rows = np.arange(3)
    Glogp = np.zeros((3, 4))
    Glogp[rows, t] = Gp                                       # distinct places: a plain scatter
    close(Glogp, numerical_grad(lambda: np.sum(Gp * logp[rows, t]), logp))
    close(Glogp, tg_grads(lambda a: a[rows, t], logp, Gp)[0], 1e-12)
    mask = rng.random((3, 4)) < 0.5
    a, b, Gy = (rng.normal(size=(3, 4)) for _ in range(3))
    close(tg_grads(lambda a, b: tg.where(tg.Tensor(mask), a, b), a, b, Gy), [Gy * mask, Gy * ~mask], 0)


# 12. Feed-forward block and dropout -----------------------------------------

def gelu_derivative(x, approximate):
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        u = c * (x + 0.044715 * x ** 3)
        return 0.5 * (1 + np.tanh(u)) + 0.5 * x * (1 - np.tanh(u) ** 2) * c * (1 + 3 * 0.044715 * x ** 2)
    return ndtr(x) + x * np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi)   # Phi(x) + x phi(x)


ACTIVATIONS = {
    "relu": (lambda h: np.maximum(h, 0), lambda h: (h > 0).astype(h.dtype), F.relu),
    "gelu": (lambda h: h * ndtr(h), lambda h: gelu_derivative(h, "none"), F.gelu),
    "gelu_tanh": (lambda h: 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))),
                  lambda h: gelu_derivative(h, "tanh"), lambda t: F.gelu(t, approximate="tanh")),
}


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_feed_forward_gradients(activation):
    """FF(x) = act(x W1^T + b1) W2^T + b2: G_a = G_y W2, G_h = G_a * act'(h), then Linear twice."""
    act, act_prime, tg_act = ACTIVATIONS[activation]
    x, G = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    W1, b1, W2, b2 = rng.normal(size=(6, 4)), rng.normal(size=6), rng.normal(size=(4, 6)), rng.normal(size=4)
    h = x @ W1.T + b1
    a = act(h)
    Ga = G @ W2
    Gh = Ga * act_prime(h)
    grads = {"x": Gh @ W1, "W1": np.einsum("bto,bti->oi", Gh, x), "b1": Gh.sum((0, 1)),
             "W2": np.einsum("bto,bti->oi", G, a), "b2": G.sum((0, 1))}
    params = {"x": x, "W1": W1, "b1": b1, "W2": W2, "b2": b2}
    L = lambda: np.sum(G * (act(x @ W1.T + b1) @ W2.T + b2))
    for name, value in params.items():
        close(grads[name], numerical_grad(L, value), 1e-6)
    ours = tg_grads(lambda x, w1, b1, w2, b2: F.linear(tg_act(F.linear(x, w1, b1)), w2, b2),
                    x, W1, b1, W2, b2, G)
    close(ours, [grads[n] for n in params], 1e-10)


def test_dropout_gradient_is_the_same_mask():
    """y = x * m / (1 - p): G_x = G_y * m / (1 - p), with the forward's m."""
    p = 0.3
    x, G = rng.normal(size=(4, 50)), rng.normal(size=(4, 50))
    tg.manual_seed(3)
    xt = tg.Tensor(x.copy(), requires_grad=True)
    y = F.dropout(xt, p)
    scale = y.data / x                              # m / (1 - p): 0 or 1 / (1 - p)
    assert set(np.round(scale, 12).ravel()) == {0.0, round(1 / (1 - p), 12)}
    (y * tg.Tensor(G)).sum().backward()
    close(xt.grad.data, G * scale, 1e-12)
    close(G * scale, numerical_grad(lambda: np.sum(G * (x * scale)), x))


# 13. Decoder cross-attention: the encoder output collects gradient from every layer

def test_cross_attention_sends_the_memory_gradient_of_every_decoder_layer():
    """x_{l+1} = x_l + CA_l(x_l, M), CA_l = attention(x_l Wq_l, M Wk_l, M Wv_l) Wo_l:
    G_M = sum_l (G_{K_l} Wk_l^T + G_{V_l} Wv_l^T)."""
    T, S, d, n_layers = 3, 4, 4, 2
    X, M, G = rng.normal(size=(T, d)), rng.normal(size=(S, d)), rng.normal(size=(T, d))
    Ws = [[rng.normal(size=(d, d)) * 0.5 for _ in range(4)] for _ in range(n_layers)]   # Wq, Wk, Wv, Wo

    def forward():
        x, xs = X, []
        for Wq, Wk, Wv, Wo in Ws:
            xs.append(x)
            x = x + attention_forward(x @ Wq, M @ Wk, M @ Wv) @ Wo
        return x, xs

    _, xs = forward()
    Gx, GM = G, np.zeros_like(M)
    for (Wq, Wk, Wv, Wo), x in zip(reversed(Ws), reversed(xs)):
        GQ, GK, GV, _ = nb.attention_backward(x @ Wq, M @ Wk, M @ Wv, Gx @ Wo.T)
        GM += GK @ Wk.T + GV @ Wv.T                 # this layer's share of G_M
        Gx = Gx + GQ @ Wq.T                         # residual + the query path
    close(GM, numerical_grad(lambda: np.sum(G * forward()[0]), M))
    # nn.TransformerDecoder: memory's gradient is the sum of what each layer sends it
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
                                    3).double()
    tgt, memory, Gy = rng.normal(size=(1, 3, 8)), rng.normal(size=(1, 4, 8)), rng.normal(size=(1, 3, 8))
    m = tg.Tensor(memory.copy(), requires_grad=True)
    (decoder(tg.Tensor(tgt), m) * tg.Tensor(Gy)).sum().backward()
    x, copies = tg.Tensor(tgt), []
    for layer in decoder.layers:                    # the same layers, each with its own copy of memory
        copies.append(tg.Tensor(memory.copy(), requires_grad=True))
        x = layer(x, copies[-1])
    (x * tg.Tensor(Gy)).sum().backward()
    assert all(np.abs(c.grad.data).max() > 1e-4 for c in copies)
    close(m.grad.data, sum(c.grad.data for c in copies), 1e-12)


# 13a. The KV cache -----------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_a_causal_stack_never_changes_a_past_position_so_its_keys_and_values_can_be_cached(causal):
    """h_t at every layer depends on x_1..x_t only, with the causal mask: appending x_{t+1}
    leaves every past layer input (so every past key and value) as it was. Without the mask
    every past position changes."""
    d, T = 8, 5
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 2, 16, dropout=0.0, batch_first=True), 3).double()
    stack.eval()
    X = rng.normal(size=(1, T + 1, d))

    def layer_inputs(x):
        """Each layer's input and the keys it computes, for the positions of x."""
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1]).astype(bool) if causal else None
        h, seen = tg.Tensor(x), []
        for layer in stack.layers:
            W_k = layer.self_attn.in_proj_weight.data[d:2 * d]
            seen.append((h.data, h.data @ W_k.T))           # the layer's input and its keys
            h = layer(h, src_mask=mask, is_causal=causal)
        return seen

    with tg.no_grad():
        before, after = layer_inputs(X[:, :T]), layer_inputs(X)
    for i, ((h0, k0), (h1, k1)) in enumerate(zip(before, after)):
        if causal or i == 0:                                # layer 0's input is the embedded data itself
            close([h1[:, :T], k1[:, :T]], [h0, k0], 1e-12)  # the past is unchanged: cache it
        else:
            assert np.abs(h1[:, :T] - h0).max() > 1e-3      # every past position moved


# 14. Stepping through the code ------------------------------------------------

def test_the_reference_graph_holds_primitive_ops_and_no_max():
    """Section 14's list: an encoder layer, a Linear head and cross-entropy under reference_ops()
    give exactly these ops; no LogSumExp and no Max (the max shift is detached), and backward
    gives the fused path's gradients."""
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    head = nn.Linear(8, 5).double()
    x, y = rng.normal(size=(2, 3, 8)), np.array([[1, 2, 3], [0, 4, 1]])
    grads = []
    for reference in (True, False):
        xt = tg.Tensor(x.copy(), requires_grad=True)
        with tg.reference_ops(reference):
            loss = F.cross_entropy(head(layer(xt)).transpose(1, 2), y)
        if reference:
            stated = re.search(r"the graph holds\s+exactly ([\w,\s]+?)\. There is no LogSumExp",
                               DOC.read_text()).group(1)
            assert ops_in_graph(loss) == set(re.split(r",\s+|\s+and\s+", stated))
        loss.backward()
        grads.append(xt.grad.data)
    close(grads[0], grads[1], 1e-12)


# The document names real code and real tests ----------------------------------------

NUMPY_BACKWARD = ROOT / "tinygrad_attn" / "reference" / "numpy_backward.py"
FUSED_OPS = ("LinearOp", "Softmax", "LogSoftmax", "LayerNormOp", "CrossEntropy", "DropoutOp",
             "ScaledDotProductAttention", "PackedSelfAttention", "Gelu", "GetItem")
REF = r"`(\w+)(?:\.(\w+))?` in\s+`(tinygrad_attn/[\w/]+\.py)`"


def _code_paragraphs():
    """The text of each 'Code:' paragraph of the document."""
    return [p for p in re.split(r"\n\s*\n", DOC.read_text()) if p.lstrip().startswith("Code:")]


def _check_refs(refs):
    for name, method, path in refs:
        source = (ROOT / path).read_text()
        assert re.search(rf"^\s*(class|def) {name}\b", source, re.M), f"{name} not found in {path}"
        if method:
            assert f"def {method}" in source, f"{name}.{method} not found in {path}"


def test_every_code_reference_in_the_document_exists():
    refs = re.findall(REF, DOC.read_text())
    assert len(refs) >= 30
    _check_refs([r for r in refs if not r[2].endswith("numpy_backward.py")])


def test_the_readable_numpy_backwards_the_document_names_exist():
    refs = [r for r in re.findall(REF, DOC.read_text()) if r[2].endswith("numpy_backward.py")]
    assert {r[0] for r in refs} >= {"linear_backward", "softmax_backward", "log_softmax_backward",
                                    "layer_norm_backward", "cross_entropy_backward", "dropout_backward",
                                    "attention_backward", "packed_self_attention_backward", "gelu_backward",
                                    "embedding_backward"}
    _check_refs(refs)


def test_each_code_line_of_a_fused_op_names_the_readable_numpy_backward_first():
    checked = 0
    for paragraph in _code_paragraphs():
        refs = re.findall(REF, paragraph)
        if any(name in FUSED_OPS for name, _, _ in refs):
            assert refs[0][2] == "tinygrad_attn/reference/numpy_backward.py", paragraph
            checked += 1
    assert checked >= 9


def test_every_section_names_its_tests_and_every_test_is_named():
    sections = re.split(r"^## ", DOC.read_text(), flags=re.M)[1:]
    named = set()
    for section in sections:
        title = section.splitlines()[0]
        lines = re.findall(r"^Tests?:(.*?)(?:\n\s*\n|\Z)", section, re.M | re.S)
        assert lines, f"section {title!r} names no test"
        named |= set(re.findall(r"`(test_\w+)`", " ".join(lines)))
        for path, test in re.findall(r"`(tests/\w+\.py)(?:::(\w+))?`", " ".join(lines)):
            assert (ROOT / path).exists(), (title, path)     # a test file of its own, or one test in it
            assert not test or re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), (title, test)
    here = {name for name in globals() if name.startswith("test_")}
    meta = {name for name in here if name.startswith(("test_every", "test_each", "test_the_readable"))}
    assert named <= here, sorted(named - here)
    assert here - meta <= named, sorted(here - meta - named)


# 15. RMSNorm ------------------------------------------------------------------

def test_rms_norm_gradients():
    """G_x = (g - xhat mean(g xhat)) / r, G_gamma = sum_rows G_y xhat; the Jacobian
    d xhat_j / d x_k = (delta_jk - xhat_j xhat_k / d) / r."""
    x, gamma, G = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=(3, 5))
    Gx, Gg = nb.rms_norm_backward(x, gamma, G, eps=1e-5)
    L = lambda: np.sum(G * nb.rms_norm_forward(x, gamma, eps=1e-5))
    close(Gx, numerical_grad(L, x))
    close(Gg, numerical_grad(L, gamma))
    close([Gx, Gg], tg_grads(lambda a, w: F.rms_norm(a, 5, w, eps=1e-5), x, gamma, G))
    row, d, eps = x[0].copy(), 5, 1e-5
    r = np.sqrt((row ** 2).mean() + eps)
    xhat = row / r
    J = (np.eye(d) - np.outer(xhat, xhat) / d) / r
    close(J, np.stack([numerical_grad(lambda j=j: nb.rms_norm_forward(row, 1.0, eps=eps)[j], row) for j in range(d)]))
    g = G[0] * gamma
    layer_norm_like = (g - g.mean() - xhat * (g * xhat).mean()) / r  # section 7's formula, with the mean term
    assert np.abs(Gx[0] - layer_norm_like).max() > 1e-3


@pytest.mark.parametrize("eps", [0.0, 1e-5, 0.5])
def test_rms_norm_input_gradient_is_not_orthogonal_to_ones_but_to_xhat_without_eps(eps):
    """sum_j G_x[j] != 0 (no mean removed); G_x . xhat = eps (g . xhat) / r^3."""
    x, gamma, G = rng.normal(size=(4, 6)) * 0.7 + 0.3, rng.normal(size=6), rng.normal(size=(4, 6))
    Gx, _ = nb.rms_norm_backward(x, gamma, G, eps=eps)
    close(Gx, numerical_grad(lambda: np.sum(G * nb.rms_norm_forward(x, gamma, eps=eps)), x), 1e-6)
    m = (x ** 2).mean(-1)
    r = np.sqrt(m + eps)
    xhat = x / r[:, None]
    g = G * gamma
    assert np.abs(Gx.sum(-1)).min() > 1e-3                      # a shift of the row changes the loss
    close((xhat ** 2).sum(-1), 6 * m / (m + eps), 1e-12)
    close((Gx * xhat).sum(-1), eps * (g * xhat).sum(-1) / r ** 3, 1e-9)


# 16. Rotary position embeddings ---------------------------------------------------

def _rotary_tables(T, d_h, base=10000.0):
    angles = np.outer(np.arange(T), base ** (-np.arange(0, d_h, 2) / d_h))  # theta = t f_i
    return np.cos(angles), np.sin(angles)


def test_rotary_backward_is_the_inverse_rotation():
    """G_x = R_t^T G_y = R_{-t} G_y; |G_x| = |G_y| per row; R_t^T R_t = I."""
    T, H, d_h = 5, 2, 6
    cos, sin = _rotary_tables(T, d_h)
    x, G = rng.normal(size=(2, T, H, d_h)), rng.normal(size=(2, T, H, d_h))
    Gx = nb.rotary_forward(G, cos, -sin)  # the rotation by minus the angles
    close(Gx, numerical_grad(lambda: np.sum(G * nb.rotary_forward(x, cos, sin)), x))
    close(Gx, nb.rotary_backward(x, cos, sin, G)[0], 1e-12)
    close(Gx, tg_grads(lambda a: F.apply_rotary_emb(a, cos, sin), x, G)[0], 1e-12)
    close(np.linalg.norm(Gx, axis=-1), np.linalg.norm(G, axis=-1), 1e-12)
    t = 3  # the matrix of one position: orthogonal, its transpose the rotation by -theta
    R = np.stack([nb.rotary_forward(e.reshape(1, 1, d_h), cos[t:t + 1], sin[t:t + 1]).reshape(d_h)
                  for e in np.eye(d_h)], axis=1)
    close(R.T @ R, np.eye(d_h), 1e-12)
    R_back = np.stack([nb.rotary_forward(e.reshape(1, 1, d_h), cos[t:t + 1], -sin[t:t + 1]).reshape(d_h)
                       for e in np.eye(d_h)], axis=1)
    close(R.T, R_back, 1e-12)


def test_rotary_scores_depend_on_relative_position_only():
    """(R_t q) . (R_s k) = q^T R_{s-t} k: equal for equal s - t; and the score's gradient
    in q is R_t^T (R_s k)."""
    T, d_h = 12, 8
    cos, sin = _rotary_tables(T, d_h)
    q, k = rng.normal(size=d_h), rng.normal(size=d_h)

    def rot(v, t):
        return nb.rotary_forward(v.reshape(1, 1, d_h), cos[t:t + 1], sin[t:t + 1]).reshape(d_h)

    def score(t, s):
        return rot(q, t) @ rot(k, s)
    for delta in (-3, 0, 2, 5):
        pairs = [(t, t + delta) for t in range(T) if 0 <= t + delta < T]
        close(np.array([score(t, s) for t, s in pairs]), np.full(len(pairs), score(*pairs[0])), 1e-12)
    assert abs(score(0, 2) - score(0, 5)) > 1e-3
    t, s = 4, 9
    Gq = nb.rotary_forward(rot(k, s).reshape(1, 1, d_h), cos[t:t + 1], -sin[t:t + 1]).reshape(d_h)  # R_t^T R_s k
    close(Gq, numerical_grad(lambda: rot(q, t) @ rot(k, s), q))


# 17. SwiGLU ------------------------------------------------------------------

def test_swiglu_gradients():
    """y = (silu(x W1^T) * x W3^T) W2^T: the document's seven gradients, against
    finite differences, their stacked form ([W1; W3] as one product), and the
    framework's FeedForward (which computes the stacked form)."""
    from tinygrad_attn.models import FeedForward
    n, d, hidden = 4, 5, 6
    x, W1, W2, W3 = rng.normal(size=(n, d)), rng.normal(size=(hidden, d)), rng.normal(size=(d, hidden)), \
        rng.normal(size=(hidden, d))
    G = rng.normal(size=(n, d))
    sig = lambda z: 1 / (1 + np.exp(-z))

    def forward():
        a, b = x @ W1.T, x @ W3.T
        return (a * sig(a) * b) @ W2.T
    a, b = x @ W1.T, x @ W3.T
    silu, dsilu = a * sig(a), sig(a) * (1 + a * (1 - sig(a)))
    h = silu * b
    Gh = G @ W2
    Gb, Ga = Gh * silu, Gh * b * dsilu
    grads = dict(x=Ga @ W1 + Gb @ W3, W1=Ga.T @ x, W2=G.T @ h, W3=Gb.T @ x)
    L = lambda: np.sum(G * forward())
    for name, array in (("x", x), ("W1", W1), ("W2", W2), ("W3", W3)):
        close(grads[name], numerical_grad(L, array))
    # stacked: [a | b] = x [W1; W3]^T, G_x = [Ga | Gb] [W1; W3], G_[W1;W3] = [Ga | Gb]^T x
    Gab, W13 = np.concatenate([Ga, Gb], axis=1), np.concatenate([W1, W3])
    close(Gab @ W13, grads["x"])
    close(Gab.T @ x, np.concatenate([grads["W1"], grads["W3"]]))
    ff = FeedForward(d, hidden, 1, 0.0).double()
    for layer, W in ((ff.w1, W1), (ff.w2, W2), (ff.w3, W3)):
        layer.weight.data[:] = W
    xt = tg.Tensor(x.copy(), requires_grad=True)
    (ff(xt) * tg.Tensor(G)).sum().backward()
    close([xt.grad.data, ff.w1.weight.grad.data, ff.w2.weight.grad.data, ff.w3.weight.grad.data],
          [grads["x"], grads["W1"], grads["W2"], grads["W3"]])


# 18. Grouped-query attention --------------------------------------------------

def test_gqa_key_value_gradients_sum_over_the_group():
    """With K, V repeated for their g query heads, G_K_j and G_V_j are the sums of
    the per-query-head gradients over the group (section 5's formulas per head)."""
    B, n_h, n_kv, T, d_h = 2, 6, 2, 4, 3
    g = n_h // n_kv
    Q, K, V = rng.normal(size=(B, n_h, T, d_h)), rng.normal(size=(B, n_kv, T, d_h)), rng.normal(size=(B, n_kv, T, d_h))
    G = rng.normal(size=(B, n_h, T, d_h))
    K_rep, V_rep = np.repeat(K, g, axis=1), np.repeat(V, g, axis=1)  # head h reads kv head h // g
    GQ, GK_rep, GV_rep = nb.attention_backward(Q, K_rep, V_rep, G, is_causal=True)[:3]
    GK = GK_rep.reshape(B, n_kv, g, T, d_h).sum(axis=2)
    GV = GV_rep.reshape(B, n_kv, g, T, d_h).sum(axis=2)

    def L():
        return np.sum(G * nb.attention_forward(Q, np.repeat(K, g, axis=1), np.repeat(V, g, axis=1), is_causal=True)[0])
    close(GK, numerical_grad(L, K))
    close(GV, numerical_grad(L, V))
    close([GQ, GK, GV], tg_grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                 enable_gqa=True), Q, K, V, G))
    assert np.abs(GK - GK_rep[:, ::g]).max() > 1e-3  # one head's gradient alone is not the shared head's
