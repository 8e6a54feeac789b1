"""Layers: forward against numpy references written from the formulas, and
backward (inputs and every parameter) against finite differences in float64.

Dropout is off in the gradchecks unless a test reseeds the generator before
each forward so that every evaluation draws the same mask.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn

from tinygrad_attn.reference import numpy_backward as nb

from .nn_helpers import attention_cases, mha_reference, module_gradcheck
from .strategies import arrays, shapes


def t64(a, requires_grad=True):
    return tg.Tensor(np.asarray(a, dtype=np.float64), requires_grad=requires_grad)


# ------------------------------------------------------------------- Linear

@given(lead=shapes(min_dims=0, max_dims=2, max_side=3), n_in=st.integers(1, 3),
       n_out=st.integers(1, 3), bias=st.booleans(), data=st.data())
def test_linear_forward_and_gradcheck(lead, n_in, n_out, bias, data):
    layer = nn.Linear(n_in, n_out, bias=bias).double()
    x = data.draw(arrays(tuple(lead) + (n_in,)))
    expected = x @ layer.weight.data.T + (layer.bias.data if bias else 0)
    np.testing.assert_allclose(layer(t64(x)).data, expected, rtol=1e-12, atol=1e-12)
    assert module_gradcheck(layer, [t64(x)])


def test_linear_rejects_wrong_input_width():
    with pytest.raises(tg.ShapeError, match=r"linear.*\(2, 5\)"):
        nn.Linear(4, 3)(tg.zeros(2, 5))


# ---------------------------------------------------------------- Embedding

@given(num=st.integers(2, 5), dim=st.integers(1, 3), idx_shape=shapes(min_dims=1, max_dims=2, max_side=3),
       seed=st.integers(0, 1000))
def test_embedding_picks_rows_and_gradchecks(num, dim, idx_shape, seed):
    layer = nn.Embedding(num, dim).double()
    idx = np.random.default_rng(seed).integers(0, num, size=idx_shape)
    np.testing.assert_array_equal(layer(tg.Tensor(idx)).data, layer.weight.data[idx])
    assert module_gradcheck(layer, [], forward=lambda m: m(idx))


def test_embedding_padding_row_starts_at_zero_and_gets_no_gradient():
    tg.manual_seed(0)
    layer = nn.Embedding(5, 3, padding_idx=-1)  # -1 means the last row, as in PyTorch
    assert layer.padding_idx == 4
    np.testing.assert_array_equal(layer.weight.data[4], 0)
    layer.weight.data[4] = 7.0  # a non-zero padding row is still looked up as is
    idx = np.array([[0, 4, 4], [2, 0, 4]])
    out = layer(idx)
    np.testing.assert_array_equal(out.data, layer.weight.data[idx])
    (out * out).sum().backward()
    grad = layer.weight.grad.data
    np.testing.assert_array_equal(grad[4], 0)
    # Other rows get the usual gradient: sum of 2 * row over their uses.
    np.testing.assert_allclose(grad[0], 2 * 2 * layer.weight.data[0], rtol=1e-6)
    np.testing.assert_allclose(grad[2], 2 * layer.weight.data[2], rtol=1e-6)
    np.testing.assert_array_equal(grad[[1, 3]], 0)


def test_embedding_errors():
    with pytest.raises(ValueError, match="padding_idx 5"):
        nn.Embedding(5, 2, padding_idx=5)
    with pytest.raises(IndexError, match="embedding"):
        nn.Embedding(5, 2)(np.array([5]))


# ---------------------------------------------------------------- LayerNorm

@given(lead=shapes(min_dims=1, max_dims=2, max_side=3),
       norm_shape=shapes(min_dims=1, max_dims=2, min_side=2, max_side=3),
       affine=st.booleans(), bias=st.booleans(), data=st.data())
def test_layer_norm_forward_and_gradcheck(lead, norm_shape, affine, bias, data):
    layer = nn.LayerNorm(norm_shape, eps=1e-5, elementwise_affine=affine, bias=bias).double()
    if affine:  # move away from the ones/zeros init so the parameters matter
        layer.weight.data[...] = data.draw(arrays(norm_shape, low=0.5, high=1.5))
        if bias:
            layer.bias.data[...] = data.draw(arrays(norm_shape))
    x = data.draw(arrays(tuple(lead) + tuple(norm_shape)))
    flat = x.reshape(x.shape[:len(lead)] + (-1,))
    w = layer.weight.data.reshape(-1) if affine else 1.0
    b = layer.bias.data.reshape(-1) if affine and bias else 0.0
    expected = nb.layer_norm_forward(flat, w, b).reshape(x.shape)
    np.testing.assert_allclose(layer(t64(x)).data, expected, rtol=1e-10, atol=1e-10)
    assert module_gradcheck(layer, [t64(x)])


# ------------------------------------------------------ Dropout, activations

def test_dropout_statistics_train_and_eval():
    tg.manual_seed(1)
    layer = nn.Dropout(0.25)
    y = layer(tg.ones(200, 200)).data
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    layer.eval()
    x = tg.randn(3, 4)
    assert layer(x) is x  # the identity in eval mode
    assert nn.Dropout(0.0)(x) is x
    np.testing.assert_array_equal(nn.Dropout(1.0)(x).data, 0)
    with pytest.raises(ValueError, match="Dropout: p must be in"):
        nn.Dropout(1.5)


def test_dropout_gradcheck_with_a_fixed_mask():
    layer = nn.Dropout(0.5)
    x = t64(np.random.default_rng(0).normal(size=(3, 4)))

    def forward(m, x):
        tg.manual_seed(7)  # the same mask at every evaluation
        return m(x)
    assert module_gradcheck(layer, [x], forward=forward)


@pytest.mark.parametrize("layer, ref", [
    (nn.ReLU(), lambda x: np.maximum(x, 0)),
    (nn.GELU(), lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    (nn.GELU("tanh"), lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    (nn.Identity(), lambda x: x),
])
def test_activations(layer, ref):
    x = np.array([[-1.5, -0.3, 0.2], [0.7, 1.1, 2.5]])
    np.testing.assert_allclose(layer(t64(x)).data, ref(x), rtol=1e-12)
    assert module_gradcheck(layer, [t64(x)])


# ------------------------------------------------------ MultiHeadAttention

def _run_attention(mha, case, tensors):
    q, k, v = tensors
    return mha(q, k, v, key_padding_mask=case.key_padding_mask, attn_mask=case.attn_mask,
               need_weights=case.need_weights, average_attn_weights=case.average_attn_weights,
               is_causal=case.is_causal)


def _attention_inputs(case):
    q = t64(case.query)
    if case.self_attention:
        return [q]
    return [q, t64(case.key), t64(case.value)]


def _forward_for(case):
    """forward(module, *inputs) passing one tensor three times for self-attention."""
    def forward(mha, *xs):
        out, weights = _run_attention(mha, case, xs * 3 if case.self_attention else xs)
        return (out, weights) if weights is not None else out
    return forward


@given(case=attention_cases())
def test_attention_matches_the_per_head_reference_and_gradchecks(case):
    mha = nn.MultiHeadAttention(**case.kwargs).double()
    out, weights = _forward_for(case)(mha, *_attention_inputs(case)), None
    if case.need_weights:
        out, weights = out
    ref_out, ref_w, _ = mha_reference(mha, case.query, case.key, case.value, case.key_padding_mask,
                                      case.attn_mask, case.is_causal)
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-12)
    if case.need_weights:
        expected = ref_w.mean(axis=-3) if case.average_attn_weights else ref_w
        np.testing.assert_allclose(weights.data, expected, rtol=1e-10, atol=1e-12)
    assert module_gradcheck(mha, _attention_inputs(case), forward=_forward_for(case))


def test_seeds_example_eight_heads_of_three_on_two_tokens():
    """The seed notes' example (README.md, "Learn"): 2 tokens with embeddings of size 4; 8 heads, each with its
    own W_Q^i, W_K^i, W_V^i of (4, 3), give Z_i of (2, 3); concat(Z_0..Z_7)
    is (2, 24); W_O (24, 4) projects it back to (2, 4)."""
    tg.manual_seed(0)
    mha = nn.MultiHeadAttention(embed_dim=4, num_heads=8, head_dim=3).double()
    for p in mha.parameters():  # non-zero biases too, so every term is exercised
        p.data[...] = np.random.default_rng(p.numel()).normal(size=p.shape)
    x = np.random.default_rng(1).normal(size=(2, 4))
    assert mha.in_proj_weight.shape == (72, 4) and mha.out_proj.weight.shape == (4, 24)

    captured = []  # the input of W_O is the concatenation of the heads
    project = mha.out_proj.forward
    mha.out_proj.forward = lambda z: captured.append(z.data.copy()) or project(z)
    out, _ = mha(t64(x), t64(x), t64(x))
    assert out.shape == (2, 4)

    w, b = mha.in_proj_weight.data, mha.in_proj_bias.data
    heads = []
    for i in range(8):
        W_Q, W_K, W_V = (w[part * 24 + 3 * i: part * 24 + 3 * i + 3].T for part in range(3))
        b_Q, b_K, b_V = (b[part * 24 + 3 * i: part * 24 + 3 * i + 3] for part in range(3))
        assert W_Q.shape == (4, 3)
        for mine, theirs in zip(mha.head_weights(i)[:3], (W_Q, W_K, W_V)):
            np.testing.assert_array_equal(mine, theirs)
        Q, K, V = x @ W_Q + b_Q, x @ W_K + b_K, x @ W_V + b_V
        scores = Q @ K.T  # entry [i][j]: how much token j matters to token i
        assert scores.shape == (2, 2)
        Z = nb.softmax_forward(scores / math.sqrt(3)) @ V
        assert Z.shape == (2, 3)
        heads.append(Z)
    concat = np.concatenate(heads, axis=1)
    assert concat.shape == (2, 24)
    np.testing.assert_allclose(captured[0].reshape(2, 24), concat, rtol=1e-12)  # (1, 2, 24): one batch
    W_O = mha.out_proj.weight.data.T
    assert W_O.shape == (24, 4)
    np.testing.assert_allclose(out.data, concat @ W_O + mha.out_proj.bias.data, rtol=1e-12)
    np.testing.assert_array_equal(np.concatenate([mha.head_weights(i)[3] for i in range(8)]), W_O)

    del mha.out_proj.forward
    assert module_gradcheck(mha, [t64(x)], forward=lambda m, x: m(x, x, x)[0])


def test_attention_weights_sum_to_one_and_respect_masks():
    tg.manual_seed(0)
    mha = nn.MultiHeadAttention(6, 3, batch_first=True)
    x = tg.randn(2, 4, 6)
    kpm = np.array([[False, False, False, True], [False, True, True, True]])
    _, w = mha(x, x, x, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)
    assert w.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(w.data.sum(-1), 1, rtol=1e-6)
    assert (w.data[0, :, :, 3] == 0).all() and (w.data[1, :, :, 1:] == 0).all()
    causal = nn.Transformer.generate_square_subsequent_mask(4)
    _, w = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=True)
    assert w.shape == (2, 4, 4)
    np.testing.assert_array_equal(w.data[np.broadcast_to(np.triu(np.ones((4, 4), bool), 1), w.shape)], 0)
    # The causal attn_mask, bool or float, gives the same result with or without the hint,
    # and the hint alone (with need_weights=False) builds the same causal mask.
    out, _ = mha(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)
    for mask in (causal, np.isinf(causal.data)):
        out2, w2 = mha(x, x, x, attn_mask=mask, need_weights=True)
        np.testing.assert_allclose(w2.data, w.data, rtol=1e-6)
        np.testing.assert_allclose(out2.data, out.data, rtol=1e-5, atol=1e-6)


def test_is_causal_is_a_hint_that_needs_attn_mask_as_in_pytorch():
    mha = nn.MultiheadAttention(4, 2)
    x = tg.randn(3, 2, 4)
    with pytest.raises(RuntimeError, match="is_causal=True .* needs attn_mask"):
        mha(x, x, x, is_causal=True)
    layer = nn.TransformerEncoderLayer(4, 2, 8)
    with pytest.raises(RuntimeError, match="needs attn_mask"):
        layer(x, is_causal=True)


def test_record_weights_keeps_the_last_per_head_weights():
    tg.manual_seed(0)
    mha = nn.MultiHeadAttention(4, 2, batch_first=True)
    x = tg.randn(1, 3, 4)
    mha(x, x, x)
    assert mha.last_attn_weights is None  # off by default
    mha.record_weights = True
    out, w = mha(x, x, x, need_weights=False)
    assert w is None  # recording does not change what forward returns
    _, per_head = mha(x, x, x, need_weights=True, average_attn_weights=False)
    assert isinstance(mha.last_attn_weights, np.ndarray) and mha.last_attn_weights.shape == (1, 2, 3, 3)
    np.testing.assert_array_equal(mha.last_attn_weights, per_head.data)
    mha(x[0], x[0], x[0])  # unbatched: (heads, L, S)
    assert mha.last_attn_weights.shape == (2, 3, 3)


def test_attention_dropout_gradcheck_with_a_fixed_mask():
    mha = nn.MultiHeadAttention(4, 2, dropout=0.3)
    x = t64(np.random.default_rng(0).normal(size=(1, 3, 4)))

    def forward(m, x):
        tg.manual_seed(3)
        return m(x, x, x)[0]
    assert module_gradcheck(mha, [x], forward=forward)


@pytest.mark.parametrize("masks,dropout,layout", [
    ("none", 0.0, "batch_first"), ("padding+causal", 0.0, "seq_first"),
    ("float attn_mask", 0.3, "batch_first"), ("per-head bool attn_mask", 0.3, "unbatched")])
def test_self_attention_packed_and_unpacked_paths_agree(monkeypatch, masks, dropout, layout):
    """Self-attention (query is key is value) projects once and runs the packed
    op; the same input passed as separate tensors takes the three projections.
    Outputs, every gradient and the recorded weights must agree."""
    rng = np.random.default_rng(0)
    B, T, E, H = 2, 5, 6, 3
    mha = nn.MultiHeadAttention(E, H, dropout=dropout, batch_first=layout != "seq_first").double()
    for p in mha.parameters():  # non-zero biases too
        p.data[...] = rng.normal(size=p.shape)
    mha.record_weights = True
    shape = {"batch_first": (B, T, E), "seq_first": (T, B, E), "unbatched": (T, E)}[layout]
    x_data, g = rng.normal(size=shape), rng.normal(size=shape)
    kwargs = {
        "none": {},
        "padding+causal": dict(key_padding_mask=np.arange(T) >= np.array([[T], [T - 2]]),
                               attn_mask=np.triu(np.ones((T, T), bool), 1), is_causal=True),
        "float attn_mask": dict(attn_mask=rng.normal(size=(T, T))),
        "per-head bool attn_mask": dict(attn_mask=rng.random((H, T, T)) > 0.7),
    }[masks]
    packed_calls = []
    packed_op = tg.functional.packed_self_attention
    monkeypatch.setattr(tg.functional, "packed_self_attention",
                        lambda *a, **k: packed_calls.append(1) or packed_op(*a, **k))

    def run(packed):
        mha.zero_grad()
        x = t64(x_data)
        tg.manual_seed(1)  # the same dropout mask on both paths
        if packed:
            out, _ = mha(x, x, x, need_weights=False, **kwargs)
        else:
            y = x + 0  # the same values, another tensor: three projections
            out, _ = mha(x, y, y, need_weights=False, **kwargs)
        out.backward(g)
        return [out.data, x.grad.data, mha.last_attn_weights] + [p.grad.data for p in mha.parameters()]

    packed, unpacked = run(packed=True), run(packed=False)
    assert len(packed_calls) == 1
    for a, b in zip(packed, unpacked):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_attention_errors_name_the_layer_and_shapes():
    mha = nn.MultiHeadAttention(4, 2, batch_first=True)
    x = tg.zeros(2, 3, 4)
    with pytest.raises(tg.ShapeError, match=r"MultiheadAttention.*\(2, 3, 5\)"):
        mha(tg.zeros(2, 3, 5), x, x)
    with pytest.raises(tg.ShapeError, match="MultiheadAttention: key and value"):
        mha(x, x, tg.zeros(2, 2, 4))
    with pytest.raises(tg.ShapeError, match="batch sizes"):
        mha(x, tg.zeros(1, 3, 4), tg.zeros(1, 3, 4))
    with pytest.raises(tg.ShapeError, match=r"key_padding_mask must have shape \(batch, S\) = \(2, 3\)"):
        mha(x, x, x, key_padding_mask=np.zeros((2, 4), bool))
    with pytest.raises(tg.ShapeError, match=r"attn_mask must have shape \(L, S\) = \(3, 3\)"):
        mha(x, x, x, attn_mask=np.zeros((3, 4), bool))
    with pytest.raises(TypeError, match="attn_mask must be boolean or floating"):
        mha(x, x, x, attn_mask=np.zeros((3, 3), np.int64))
    with pytest.raises(ValueError, match="embed_dim 5 is not divisible by num_heads 2"):
        nn.MultiHeadAttention(5, 2)


# ---------------------------------------------------- positional encodings

@pytest.mark.parametrize("d_model", [4, 5])
def test_sinusoidal_table_follows_the_seeds_formula(d_model):
    pe = nn.PositionalEncoding(d_model, max_len=7)
    table = pe.pe.data
    for pos in range(7):
        for j in range(d_model):
            i2 = j - j % 2  # the "2i" of PE(pos, 2i) and PE(pos, 2i + 1)
            angle = pos / 10000 ** (i2 / d_model)
            assert table[pos, j] == pytest.approx(math.sin(angle) if j % 2 == 0 else math.cos(angle), abs=1e-7)
    assert list(pe.parameters()) == [] and "pe" not in pe.state_dict()


def test_positional_encoding_adds_the_table_and_follows_dtype():
    pe = nn.PositionalEncoding(6, max_len=10)
    x = np.random.default_rng(0).normal(size=(2, 4, 6)).astype(np.float32)
    np.testing.assert_allclose(pe(tg.Tensor(x)).data, x + pe.pe.data[:4], rtol=1e-6)
    assert pe(tg.Tensor(x[0])).shape == (4, 6)  # one unbatched sequence
    pe.double()
    assert pe.pe.dtype == np.float64 and pe(t64(x)).dtype == np.float64
    assert module_gradcheck(pe, [t64(x[:, :2, :3].repeat(2, axis=2))])
    with pytest.raises(tg.ShapeError, match=r"PositionalEncoding.*max_len 10.*\(1, 11, 6\)"):
        pe(tg.zeros(1, 11, 6))


def test_learned_positional_embedding():
    tg.manual_seed(0)
    lpe = nn.LearnedPositionalEmbedding(3, max_len=5)
    x = np.random.default_rng(0).normal(size=(2, 4, 3))
    lpe.double()
    np.testing.assert_allclose(lpe(t64(x)).data, x + lpe.weight.data[:4])
    assert module_gradcheck(lpe, [t64(x[:, :2])])
    out = lpe(t64(x[:, :2]))
    out.sum().backward()
    np.testing.assert_array_equal(lpe.weight.grad.data[2:], 0)  # unused positions get nothing
    np.testing.assert_array_equal(lpe.weight.grad.data[:2], 2)  # each used by 2 sequences


# ------------------------------------------------- Transformer layers, stacks

def _encoder_layer_reference(layer, x, kpm):
    """Post-norm or pre-norm encoder layer in numpy, built on the attention reference."""
    def sa(y):
        return mha_reference(layer.self_attn, y, y, y, key_padding_mask=kpm)[0]

    def ff(y):
        h = y @ layer.linear1.weight.data.T + layer.linear1.bias.data
        return np.maximum(h, 0) @ layer.linear2.weight.data.T + layer.linear2.bias.data

    def norm(n, y):
        return nb.layer_norm_forward(y, n.weight.data, n.bias.data)
    if layer.norm_first:
        x = x + sa(norm(layer.norm1, x))
        return x + ff(norm(layer.norm2, x))
    x = norm(layer.norm1, x + sa(x))
    return norm(layer.norm2, x + ff(x))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_the_reference(norm_first):
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(6, 2, dim_feedforward=8, dropout=0.0, batch_first=True,
                                       norm_first=norm_first).double()
    for p in layer.parameters():
        p.data[...] += np.random.default_rng(p.numel()).normal(scale=0.3, size=p.shape)
    x = np.random.default_rng(0).normal(size=(2, 3, 6))
    kpm = np.array([[False, False, True], [False, False, False]])
    out = layer(t64(x), src_key_padding_mask=kpm)
    np.testing.assert_allclose(out.data, _encoder_layer_reference(layer, x, kpm), rtol=1e-10, atol=1e-12)


def _small_masks(L, S):
    return (np.array([[False] * (S - 1) + [True], [False] * S]),  # key padding (2, S)
            np.triu(np.ones((L, L), bool), 1))                   # causal (L, L)


@pytest.mark.parametrize("activation, norm_first, masked", [
    ("relu", False, True), ("gelu", True, True), ("gelu", False, False), (nn.GELU("tanh"), True, False)])
def test_encoder_layer_gradcheck(activation, norm_first, masked):
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    x = t64(np.random.default_rng(0).normal(size=(2, 3, 4)))
    kpm, causal = _small_masks(3, 3)
    kwargs = dict(src_mask=causal, src_key_padding_mask=kpm) if masked else {}
    assert module_gradcheck(layer, [x], forward=lambda m, x: m(x, **kwargs))


@pytest.mark.parametrize("activation, norm_first, masked", [("relu", False, True), ("gelu", True, True),
                                                            ("relu", True, False)])
def test_decoder_layer_gradcheck(activation, norm_first, masked):
    tg.manual_seed(0)
    layer = nn.TransformerDecoderLayer(4, 2, dim_feedforward=6, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first)
    rng = np.random.default_rng(0)
    tgt, memory = t64(rng.normal(size=(2, 3, 4))), t64(rng.normal(size=(2, 2, 4)))
    kpm, causal = _small_masks(3, 2)
    kwargs = dict(tgt_mask=causal, tgt_is_causal=True, memory_key_padding_mask=kpm,
                  memory_mask=np.array([[0.0, -1.0]] * 3)) if masked else {}
    assert module_gradcheck(layer, [tgt, memory], forward=lambda m, t, mem: m(t, mem, **kwargs))


def test_encoder_and_decoder_stacks_gradcheck():
    tg.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(2, 2, 3, dropout=0.0), 2, nn.LayerNorm(2))
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(2, 2, 3, dropout=0.0), 2)
    rng = np.random.default_rng(1)
    src, tgt = rng.normal(size=(3, 1, 2)), rng.normal(size=(2, 1, 2))  # (T, B, d_model)
    causal = nn.Transformer.generate_square_subsequent_mask
    assert module_gradcheck(encoder, [t64(src)], forward=lambda m, x: m(x, mask=causal(3), is_causal=True))
    assert module_gradcheck(decoder, [t64(tgt), t64(src)],
                            forward=lambda m, t, mem: m(t, mem, tgt_mask=causal(2), tgt_is_causal=True))


def test_stacks_deep_copy_the_layer():
    layer = nn.TransformerEncoderLayer(4, 2, 6)
    stack = nn.TransformerEncoder(layer, 3)
    layers = list(stack.layers)
    assert len(layers) == 3 and all(lyr is not layer for lyr in layers)
    w = [lyr.linear1.weight for lyr in layers]
    assert len({id(p) for p in w}) == 3  # independent parameters ...
    np.testing.assert_array_equal(w[0].data, w[2].data)  # ... starting from the same values
    w[0].data[...] = 0
    assert not (w[1].data == 0).all()
    assert stack.num_parameters() == 3 * layer.num_parameters()


def test_transformer_gradcheck_and_shapes():
    tg.manual_seed(0)
    model = nn.Transformer(d_model=2, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=3, dropout=0.0, batch_first=True)
    rng = np.random.default_rng(2)
    src, tgt = t64(rng.normal(size=(1, 3, 2))), t64(rng.normal(size=(1, 2, 2)))
    tgt_mask = nn.Transformer.generate_square_subsequent_mask(2, dtype=np.float64)
    kpm = np.array([[False, False, True]])

    def forward(m, s, t):
        return m(s, t, tgt_mask=tgt_mask, src_key_padding_mask=kpm, memory_key_padding_mask=kpm)
    assert forward(model.double(), src, tgt).shape == (1, 2, 2)
    assert module_gradcheck(model, [src, tgt], forward=forward)
    with pytest.raises(tg.ShapeError, match="batch sizes"):
        model(tg.zeros(2, 3, 2), tg.zeros(1, 2, 2))
    with pytest.raises(tg.ShapeError, match="d_model = 2"):
        model(tg.zeros(1, 3, 2), tg.zeros(1, 2, 5))


def test_transformer_defaults_are_the_papers():
    model = nn.Transformer()
    assert len(model.encoder.layers) == 6 and len(model.decoder.layers) == 6
    layer = model.encoder.layers[0]
    assert layer.self_attn.embed_dim == 512 and layer.self_attn.num_heads == 8
    assert layer.linear1.weight.shape == (2048, 512) and layer.dropout.p == 0.1
    assert isinstance(model.encoder.norm, nn.LayerNorm) and isinstance(model.decoder.norm, nn.LayerNorm)
    assert not model.batch_first and not layer.self_attn.batch_first  # (T, B, d_model), as PyTorch
    assert layer.activation is F.relu and layer.norm1.eps == 1e-5 and not layer.norm_first
    mask = nn.Transformer.generate_square_subsequent_mask(3).data
    np.testing.assert_array_equal(mask, [[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]])


def test_batch_first_false_and_unbatched_inputs_agree():
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, batch_first=True)
    x = tg.randn(2, 3, 4)
    out = layer(x)
    layer_tb = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0)  # batch_first=False by default
    layer_tb.load_state_dict(layer.state_dict())
    out_tb = layer_tb(x.swapaxes(0, 1)).swapaxes(0, 1)
    np.testing.assert_allclose(out_tb.data, out.data, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer(x[1]).data, out.data[1], rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------- Integer inputs


def test_linear_with_integer_input_takes_the_weight_dtype():
    layer = nn.Linear(2, 3)
    x = tg.tensor([[1, 2], [3, 4]])
    y = layer(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.data, x.data.astype(np.float32) @ layer.weight.data.T + layer.bias.data,
                               rtol=1e-6)
    assert F.linear(x, tg.randn(3, 2)).dtype == np.float32
    assert F.linear(x, tg.randn(3, 2, dtype=np.float64), tg.tensor([1, 2, 3])).dtype == np.float64


# ------------------------------------------------- Bad arguments of the layers

@pytest.mark.parametrize("call,error,message", [
    (lambda: nn.Linear(-1, 3), ValueError, r"Linear: in_features must be a non-negative integer, got -1"),
    (lambda: nn.Linear(2, 3.0), TypeError, r"Linear: out_features must be an integer, got 3.0"),
    (lambda: nn.Embedding(-5, 4), ValueError, r"Embedding: num_embeddings must be a non-negative"),
    (lambda: nn.LayerNorm((4, -1)), ValueError, r"LayerNorm: normalized_shape\[1\] must be a non-negative"),
])
def test_bad_arguments_get_a_message_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
