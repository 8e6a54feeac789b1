"""Every formula in docs/backprop_through_attention.md, checked numerically.

Each test writes the document's formula in plain numpy (the fused ops'
backward as the package spells it out, tinygrad_attn.ops.numpy_backward,
where the document points), compares it with central differences of the
forward pass, and then with what tinygrad_attn's own backward computes. A
final test checks that every piece of code the document names still exists.
"""
import re
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as tg
import tinygrad_attn.functional as F
from tinygrad_attn import nn
from tinygrad_attn.ops import numpy_backward as nb

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


# 1. Matrix multiplication -------------------------------------------------

def test_matmul_gradients():
    A, B, G = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=(3, 5))
    GA, GB = G @ B.T, A.T @ G                      # the document's formulas
    L = lambda: np.sum(G * (A @ B))
    close(GA, numerical_grad(L, A))
    close(GB, numerical_grad(L, B))
    close([GA, GB], tg_grads(lambda a, b: a @ b, A, B, G))


def test_self_attention_input_used_three_times():
    X = rng.normal(size=(2, 4))
    WQ, WK, WV = (rng.normal(size=(4, 3)) for _ in range(3))
    GQ, GK, GV = (rng.normal(size=(2, 3)) for _ in range(3))
    L = lambda: np.sum(GQ * (X @ WQ)) + np.sum(GK * (X @ WK)) + np.sum(GV * (X @ WV))
    GX = GQ @ WQ.T + GK @ WK.T + GV @ WV.T
    close(GX, numerical_grad(L, X))
    close(X.T @ GQ, numerical_grad(L, WQ))


# 2. Softmax -----------------------------------------------------------------

def test_softmax_jacobian_and_fused_vjp():
    s, g = rng.normal(size=6), rng.normal(size=6)
    y = nb.softmax_forward(s)
    J = np.diag(y) - np.outer(y, y)
    J_num = np.stack([numerical_grad(lambda: nb.softmax_forward(s)[j], s) for j in range(6)])
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


def test_additive_mask_passes_gradient_unchanged():
    S, M, G = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    L = lambda: np.sum(G * nb.softmax_forward(S + M))
    P = nb.softmax_forward(S + M)
    close(P * (G - (G * P).sum(-1, keepdims=True)), numerical_grad(L, S))


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


# 7-8. LayerNorm, residual Add & Norm ----------------------------------------

def test_layer_norm_gradients():
    x, gamma, beta, G = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=5), rng.normal(size=(3, 5))
    Gx, Gg, Gb = nb.layer_norm_backward(x, gamma, G)
    L = lambda: np.sum(G * nb.layer_norm_forward(x, gamma, beta))
    close(Gx, numerical_grad(L, x))
    close(Gg, numerical_grad(L, gamma))
    close(Gb, numerical_grad(L, beta))
    assert abs(Gx.sum(-1)).max() < 1e-12       # orthogonal to shifts ...
    ours = tg_grads(lambda a, w, b: F.layer_norm(a, 5, w, b), x, gamma, beta, G)
    close([Gx, Gg, Gb], ours)


def test_residual_add_and_norm():
    x, W = rng.normal(size=(3, 4)), rng.normal(size=(4, 4))
    gamma, beta, G = np.ones(4), np.zeros(4), rng.normal(size=(3, 4))
    sub = lambda: np.tanh(x @ W)
    L = lambda: np.sum(G * nb.layer_norm_forward(x + sub(), gamma, beta))
    Gz, _, _ = nb.layer_norm_backward(x + sub(), gamma, G)
    Gx = Gz + (Gz * (1 - sub() ** 2)) @ W.T        # G_z + J_sublayer^T G_z
    close(Gx, numerical_grad(L, x))


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


# 10-11. Positional encoding, embedding ----------------------------------------

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


def test_embedding_backward_is_a_scatter_add():
    W, tokens, G = rng.normal(size=(5, 3)), np.array([2, 0, 2, 4]), rng.normal(size=(4, 3))
    GW = np.zeros_like(W)
    for p, r in enumerate(tokens):
        GW[r] += G[p]
    close(GW, numerical_grad(lambda: np.sum(G * W[tokens]), W))
    close(GW, tg_grads(lambda w: F.embedding(tg.Tensor(tokens), w), W, G)[0])
    close(GW, nb.embedding_backward(tokens, G, 5))


# The document names real code ---------------------------------------------------

def test_every_code_reference_in_the_document_exists():
    text = DOC.read_text()
    refs = re.findall(r"`(\w+)(?:\.(\w+))?` in\s+`(tinygrad_attn/[\w/]+\.py)`", text)
    assert len(refs) >= 8
    for name, method, path in refs:
        source = (ROOT / path).read_text()
        assert re.search(rf"^\s*(class|def) {name}\b", source, re.M), f"{name} not found in {path}"
        if method:
            assert f"def {method}" in source, f"{name}.{method} not found in {path}"
