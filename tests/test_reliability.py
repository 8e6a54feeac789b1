"""Reliability: right answers on hard inputs, clear errors on bad ones.

Grouped as the issue lists them: wrong answers (1-9), edge cases that work
as in PyTorch, errors that name the problem, checkpoints. Where PyTorch is
the reference, the test compares with it (skipped without PyTorch).
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from scipy.special import expit

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn

INF = np.inf


def _torch():
    return pytest.importorskip("torch")


def _grad_of(fn, x, weights):
    """d sum(fn(x) * weights) / dx over the finite outputs, with x a fresh leaf."""
    t = tg.tensor(x, requires_grad=True)
    y = fn(t)
    (y.masked_fill(tg.tensor(np.isinf(y.data)), 0.0) * tg.tensor(weights)).sum().backward()
    return y.data, t.grad.data


# --------------------------------------------- 1. -inf logits (masked classes)

LOGITS = np.array([[-INF, 0.0, 1.0, 2.0], [0.5, -INF, -INF, 3.0], [1.0, 2.0, 3.0, 4.0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("target", [[2, 0, 1], [0, 3, 1]])  # the second hits a -inf class
def test_cross_entropy_with_minus_inf_logits_matches_torch(dtype, label_smoothing, target):
    torch = _torch()
    x = LOGITS.astype(dtype)
    t = tg.tensor(x, requires_grad=True)
    loss = F.cross_entropy(t, np.array(target), label_smoothing=label_smoothing)
    loss.backward()
    tt = torch.tensor(x, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(tt, torch.tensor(target), label_smoothing=label_smoothing)
    expected.backward()
    # finite without smoothing when the target is a live class; +inf when it is masked or
    # when smoothing spreads weight onto a masked class (PyTorch gives the same)
    assert np.isinf(loss.item()) == np.isinf(expected.item())
    if np.isfinite(expected.item()):
        np.testing.assert_allclose(loss.item(), expected.item(), rtol=1e-6)
    assert np.isfinite(t.grad.data).all()
    np.testing.assert_allclose(t.grad.data, tt.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_cross_entropy_from_the_issue_is_finite():
    loss = F.cross_entropy(tg.tensor([[-INF, 0., 1., 2.]]), np.array([2]))
    # -log softmax_2 = logsumexp(0, 1, 2) - 1 = 1.4076 (the -inf class adds e^-inf = 0)
    np.testing.assert_allclose(loss.item(), np.log(1 + np.e + np.e ** 2) - 1.0, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_and_log_softmax_with_minus_inf_entries_match_torch(dtype, log):
    torch = _torch()
    x = LOGITS.astype(dtype)
    weights = np.arange(1.0, 13.0).reshape(3, 4).astype(dtype)
    fn = F.log_softmax if log else F.softmax
    y, grad = _grad_of(lambda t: fn(t, dim=-1), x, weights)
    tt = torch.tensor(x, requires_grad=True)
    ty = (torch.log_softmax if log else torch.softmax)(tt, -1)
    (ty.masked_fill(torch.isinf(ty), 0.0) * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6)
    assert np.isfinite(grad).all()
    np.testing.assert_allclose(grad, tt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_a_row_of_only_minus_inf_is_nan_as_in_torch(fn):
    # Documented: softmax over no finite logit is undefined; NaN, as PyTorch
    # (attention is different: a query that may attend to nothing gets zeros).
    torch = _torch()
    x = np.array([[-INF, -INF], [0.0, 1.0]], np.float32)
    y = fn(tg.tensor(x), dim=-1).data
    expected = getattr(torch, fn.__name__)(torch.tensor(x), -1).numpy()
    assert np.isnan(y[0]).all() and np.isnan(expected[0]).all()
    np.testing.assert_allclose(y[1], expected[1], rtol=1e-6)
    assert np.isnan(F.cross_entropy(tg.tensor(x[:1]), np.array([0])).item())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_with_minus_inf_in_a_float_mask_matches_torch(dtype):
    torch = _torch()
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, 4)).astype(dtype) for _ in range(3))
    mask = np.zeros((3, 3), dtype)
    mask[0, 1:] = -INF  # query 0 sees key 0 only
    mask[2, 0] = -INF
    g = rng.normal(size=(2, 3, 4)).astype(dtype)
    ts = [tg.tensor(a, requires_grad=True) for a in (q, k, v)]
    out, w = F.scaled_dot_product_attention(*ts, attn_mask=mask, need_weights=True)
    (out * tg.tensor(g)).sum().backward()
    tts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*tts, attn_mask=torch.tensor(mask))
    (expected * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert (w.data[:, 0, 1:] == 0).all() and (w.data[:, 2, 0] == 0).all()
    for mine, theirs in zip(ts, tts):
        assert np.isfinite(mine.grad.data).all()
        np.testing.assert_allclose(mine.grad.data, theirs.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_attention_query_with_every_key_masked_gets_zeros_and_finite_gradients():
    # Documented difference: PyTorch gives NaN here; we give zero attention.
    rng = np.random.default_rng(1)
    q, k, v = (tg.tensor(rng.normal(size=(3, 4)), requires_grad=True) for _ in range(3))
    mask = np.zeros((3, 3))
    mask[1] = -INF
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    assert (out.data[1] == 0).all() and (w.data[1] == 0).all()
    (out.sum() + (w * w).sum()).backward()
    assert all(np.isfinite(t.grad.data).all() for t in (q, k, v))


# ------------------------------- 2. attention weights with aliased q, k, v

def test_attention_weights_keep_their_graph_when_query_key_value_are_one_tensor():
    x = tg.randn(2, 3, 4, requires_grad=True)
    _, w = F.scaled_dot_product_attention(x, x, x, need_weights=True)
    assert w.requires_grad
    _, w = F.scaled_dot_product_attention(x, tg.randn(2, 3, 4), x, need_weights=True)  # query is value
    assert w.requires_grad
    _, w = F.scaled_dot_product_attention(tg.randn(2, 3, 4), x, x, need_weights=True)  # key is value
    assert w.requires_grad


@pytest.mark.parametrize("alias", ["qkv", "q=v", "k=v", "q=k"])
def test_gradcheck_of_attention_weights_with_aliased_inputs(alias):
    rng = np.random.default_rng(2)
    cw, co = rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 3, 4))

    def loss(a, b):
        q, k, v = {"qkv": (a, a, a), "q=v": (a, b, a), "k=v": (b, a, a), "q=k": (a, a, b)}[alias]
        out, w = F.scaled_dot_product_attention(q, k, v, need_weights=True)
        return (w * tg.tensor(cw)).sum() + (out * tg.tensor(co)).sum()
    inputs = [tg.tensor(rng.normal(size=(2, 3, 4)), requires_grad=True) for _ in range(2)]
    assert tg.gradcheck(loss, inputs)


# -------------------------------------------- 3. boolean index of wrong length

@pytest.mark.parametrize("index", [
    np.array([True, False]),
    [True, False, True],
    (slice(None), np.array([True, False])),
    (Ellipsis, np.array([True, True, False, False])),
    np.ones((4, 2), bool),
])
def test_boolean_index_of_the_wrong_shape_raises_like_numpy(index):
    x = tg.randn(4, 3)
    with pytest.raises(IndexError):
        x.data[tuple(index) if isinstance(index, tuple) else np.asarray(index)]  # numpy agrees
    with pytest.raises(IndexError, match=r"getitem: a boolean index of shape .* does not match .* "
                                         r"tensor of shape \(4, 3\)"):
        x[index]


def test_boolean_indices_of_the_right_shape_still_work():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 3))
    rows, cols = np.array([True, False, True, True]), np.array([False, True, True])
    for index in [rows, (slice(None), cols), (Ellipsis, cols), (None, rows), (1, cols), a > 0, (rows, 0)]:
        x = tg.tensor(a, requires_grad=True)
        y = x[index]
        np.testing.assert_array_equal(y.data, a[index])
        y.sum().backward()
        expected = np.zeros_like(a)
        np.add.at(expected, index, 1)
        np.testing.assert_array_equal(x.grad.data, expected)


# ------------------------------------------ 4. finite gradients where torch has them

def test_std_gradient_at_zero_variance_is_zero_as_in_torch():
    torch = _torch()
    a = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]])
    for kwargs in [dict(dim=1), dict(dim=1, correction=0), dict(), dict(dim=(0, 1), keepdim=True)]:
        x = tg.tensor(a if kwargs else a[:1], requires_grad=True)
        x.std(**kwargs).sum().backward()
        tx = torch.tensor(a if kwargs else a[:1], requires_grad=True)
        tx.std(**kwargs).sum().backward()
        np.testing.assert_allclose(x.grad.data, tx.grad.numpy(), rtol=1e-12, err_msg=str(kwargs))
        assert np.isfinite(x.grad.data).all()


def test_std_is_gradchecked_away_from_zero_variance():
    a = np.random.default_rng(4).normal(size=(3, 5))
    assert tg.gradcheck(lambda t: t.std(axis=1), [tg.tensor(a, requires_grad=True)])


def test_pow_gradients_at_zero_match_torch():
    torch = _torch()
    base = np.array([0.0, 0.0, 0.0, 1.0, 2.0, -2.0])
    exponent = np.array([0.0, 0.5, 2.0, 0.0, 0.0, 2.0])
    x, y = tg.tensor(base, requires_grad=True), tg.tensor(exponent, requires_grad=True)
    (x ** y).sum().backward()
    tx, ty = torch.tensor(base, requires_grad=True), torch.tensor(exponent, requires_grad=True)
    (tx ** ty).sum().backward()
    np.testing.assert_allclose(x.grad.data, tx.grad.numpy())
    np.testing.assert_allclose(y.grad.data, ty.grad.numpy(), equal_nan=True)
    x = tg.tensor([0.0, 1.0, -3.0], requires_grad=True)
    (x ** 0).sum().backward()  # the issue's case: x ** 0 at x = 0
    np.testing.assert_array_equal(x.grad.data, [0.0, 0.0, 0.0])


# ------------------------------------------------ 5. sigmoid over the whole range

@pytest.mark.parametrize("dtype,low", [(np.float32, -87.0), (np.float64, -708.0)])
def test_sigmoid_keeps_relative_precision_on_both_tails(dtype, low):
    # down to the smallest normal number of the dtype: sigmoid(x) ~ e^x there
    x = np.concatenate([np.linspace(low, -low, 4001), [-20.0, -38.0, -50.0, 0.0]]).astype(dtype)
    reference = expit(x.astype(np.float64))  # scipy's float64 logistic
    t = tg.tensor(x, requires_grad=True)
    z = t.sigmoid()
    ulp = np.finfo(dtype).eps
    np.testing.assert_allclose(z.data, reference.astype(dtype), rtol=4 * ulp, atol=0)
    z.backward(np.ones_like(x))
    slope = reference * expit(-x.astype(np.float64))  # sigmoid'(x) = sigmoid(x) sigmoid(-x)
    np.testing.assert_allclose(t.grad.data, slope.astype(dtype), rtol=8 * ulp, atol=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_of_sigmoid_is_finite_with_a_gradient_of_one_far_left(dtype):
    x = tg.tensor(np.array([-20.0, -38.0, -60.0, -80.0], dtype), requires_grad=True)
    y = x.sigmoid().log()
    np.testing.assert_allclose(y.data, x.data, rtol=1e-6)  # log sigmoid(x) = x - log(1 + e^x) ~ x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.data, 1.0, rtol=1e-6)


def test_sigmoid_of_extremes():
    z = tg.tensor([-INF, INF, np.nan, -1e4, 1e4]).sigmoid().data
    np.testing.assert_array_equal(z[[0, 1, 3, 4]], [0.0, 1.0, 0.0, 1.0])
    assert np.isnan(z[2])


# ------------------------------------------------------ 6. integer attention masks

@pytest.mark.parametrize("call", ["sdpa", "mha"])
def test_an_integer_attention_mask_is_refused_naming_argument_and_dtype(call):
    q = tg.randn(1, 2, 4)
    mask = np.ones((2, 2), np.int64)
    with pytest.raises(TypeError, match="attn_mask must be boolean or floating point, got int64"):
        if call == "sdpa":
            F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        else:
            nn.MultiHeadAttention(4, 2)(q, q, q, attn_mask=mask)


def test_packed_self_attention_refuses_an_integer_mask_too():
    with pytest.raises(TypeError, match="attn_mask must be boolean or floating point, got int32"):
        F.packed_self_attention(tg.randn(1, 2, 12), 2, attn_mask=np.ones((2, 2), np.int32))


# --------------------------------------------- 7. integers meeting floats in @ and linear

def test_integer_at_float_promotes_to_the_float_dtype_not_float64():
    ints = tg.tensor([[1, 2]])
    for w_dtype in (np.float32, np.float64):
        w = tg.randn(2, 2, dtype=w_dtype, requires_grad=True)
        for y in (ints @ w, tg.matmul(ints, w), np.array([[1, 2]]) @ w, w @ tg.tensor([[1], [2]]),
                  tg.tensor(np.ones((3, 2, 2), np.int64)) @ w):
            assert y.dtype == w_dtype
        y = ints @ w
        y.sum().backward()
        np.testing.assert_allclose(y.data, np.array([[1, 2]], w_dtype) @ w.data)
        assert w.grad.dtype == w_dtype
    assert (ints @ tg.tensor([[3], [4]])).dtype == np.int64  # integers with integers stay integers


def test_linear_with_integer_input_takes_the_weight_dtype():
    layer = nn.Linear(2, 3)
    x = tg.tensor([[1, 2], [3, 4]])
    y = layer(x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.data, x.data.astype(np.float32) @ layer.weight.data.T + layer.bias.data,
                               rtol=1e-6)
    assert F.linear(x, tg.randn(3, 2)).dtype == np.float32
    assert F.linear(x, tg.randn(3, 2, dtype=np.float64), tg.tensor([1, 2, 3])).dtype == np.float64


# ------------------------------------------------------------- 8. uint64 overflow

@pytest.mark.parametrize("data", [np.array([2 ** 63], np.uint64), np.array([1, 2 ** 64 - 1], np.uint64),
                                  2 ** 63, [2 ** 63, 1], [1, 2 ** 70], -2 ** 63 - 1])
def test_integers_beyond_int64_raise_instead_of_wrapping(data):
    with pytest.raises(OverflowError, match=r"does not fit in int64.*\[-2\*\*63, 2\*\*63 - 1\]"):
        tg.tensor(data)


def test_integers_within_int64_still_convert():
    assert tg.tensor(np.array([2 ** 63 - 1], np.uint64)).tolist() == [2 ** 63 - 1]
    assert tg.tensor(2 ** 63 - 1).item() == 2 ** 63 - 1
    assert tg.tensor([-2 ** 63]).item() == -2 ** 63
    assert tg.tensor([1e19, 1.0]).dtype == np.float32  # large floats are floats
    assert tg.tensor(np.array([2 ** 63], np.uint64), dtype="float64").item() == 2.0 ** 63
    assert tg.tensor([2 ** 63, 1], dtype="float64").tolist() == [2.0 ** 63, 1.0]  # asked for as floats
    assert tg.tensor(2 ** 70, dtype="float32").item() == np.float32(2.0 ** 70)


# ---------------------------------------------------------- 9. hooks changing size

def test_a_hook_returning_a_wrong_shape_on_a_leaf_raises():
    x = tg.randn(3, requires_grad=True)

    def shrink(g):
        return tg.zeros(2)
    x.register_hook(shrink)
    with pytest.raises(RuntimeError, match=r"hook '.*shrink' has changed the size of the gradient: "
                                           r"it returned shape \(2,\) for a tensor of shape \(3,\)"):
        x.sum().backward()
    assert x.grad is None


def test_a_hook_returning_a_wrong_shape_on_a_non_leaf_names_the_hook():
    x = tg.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: np.zeros(1))  # broadcastable, still refused (as PyTorch)
    with pytest.raises(RuntimeError, match=r"hook '.*<lambda>' has changed the size") as info:
        y.sum().backward()
    assert "unbroadcast" not in str(info.value)


def test_a_hook_returning_the_right_shape_still_replaces_the_gradient():
    x = tg.randn(3, requires_grad=True)
    x.register_hook(lambda g: g * 3)
    (x * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [6.0, 6.0, 6.0])


# ============================================ edge cases that work as in PyTorch

@pytest.mark.parametrize("method", ["sum", "mean", "amax", "amin", "logsumexp", "argmax", "argmin"])
@pytest.mark.parametrize("dim", [0, -1, (0,)])
def test_dim_0_and_minus_1_on_a_0d_tensor(method, dim):
    torch = _torch()
    if method.startswith("arg") and isinstance(dim, tuple):
        dim = dim[0]  # torch's argmax takes one dim
    x = tg.tensor(3.0, requires_grad=not method.startswith("arg"))
    y = getattr(x, method)(dim=dim)
    expected = getattr(torch.tensor(3.0), method)(dim=dim)
    assert y.shape == () and y.item() == expected.item()
    assert getattr(x, method)(dim=dim, keepdim=True).shape == ()
    if x.requires_grad:
        y.backward()
        assert x.grad.item() == 1.0
    with pytest.raises(IndexError, match=f"{method}: axis 1 is out of range for a tensor with ndim 0"):
        getattr(x, method)(dim=1)


def test_var_std_softmax_of_a_0d_tensor_as_torch():
    x = tg.tensor(3.0)
    assert np.isnan(x.var(dim=0).item()) and x.var(dim=0, correction=0).item() == 0.0
    assert np.isnan(x.std(dim=-1).item())
    assert F.softmax(x, dim=0).item() == 1.0 and F.log_softmax(x, dim=-1).item() == 0.0


def test_linear_with_zero_input_features_gives_the_bias():
    x = tg.randn(2, 0, requires_grad=True)
    w, b = tg.randn(3, 0, requires_grad=True), tg.randn(3, requires_grad=True)
    y = F.linear(x, w, b)
    np.testing.assert_array_equal(y.data, np.broadcast_to(b.data, (2, 3)))
    y.sum().backward()
    assert x.grad.shape == (2, 0) and w.grad.shape == (3, 0)
    np.testing.assert_array_equal(b.grad.data, [2.0, 2.0, 2.0])
    assert (tg.randn(4, 5, 0) @ tg.randn(0, 3)).shape == (4, 5, 3)
    assert nn.Linear(0, 3)(tg.randn(5, 0)).shape == (5, 3)


def test_max_and_min_of_an_empty_tensor_over_a_non_empty_axis():
    x = tg.zeros(0, 3, requires_grad=True)
    y = x.max(axis=1)
    assert y.shape == (0,) and x.min(axis=-1, keepdims=True).shape == (0, 1)
    y.sum().backward()
    assert x.grad.shape == (0, 3)
    for axis in (0, None):
        with pytest.raises(ValueError, match=r"max: cannot reduce over axis 0 of size 0 \(tensor of shape"):
            x.max(axis=axis)


def test_chunk_and_split_of_a_zero_length_axis_as_torch():
    torch = _torch()
    x, tx = tg.zeros(0, 3), torch.zeros(0, 3)
    for mine, theirs in [(x.chunk(2), tx.chunk(2)), (x.split(2), tx.split(2)), (x.split(0), tx.split(0)),
                         (x.chunk(3, dim=0), tx.chunk(3, dim=0)), (x.split([0, 0]), tx.split([0, 0]))]:
        assert [p.shape for p in mine] == [tuple(p.shape) for p in theirs]
    t = tg.zeros(6)
    assert [p.shape for p in t.chunk(4)] == [tuple(p.shape) for p in torch.zeros(6).chunk(4)]


@pytest.mark.parametrize("mask_dtype", [bool, np.float32])
def test_attention_with_an_empty_query_and_a_mask(mask_dtype):
    q, k, v = tg.randn(2, 0, 4, requires_grad=True), tg.randn(2, 3, 4, requires_grad=True), \
        tg.randn(2, 3, 5, requires_grad=True)
    mask = np.ones((0, 3), mask_dtype)
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    assert out.shape == (2, 0, 5) and w.shape == (2, 0, 3)
    (out.sum() + w.sum()).backward()
    assert q.grad.shape == (2, 0, 4)
    assert (k.grad.data == 0).all() and (v.grad.data == 0).all()


@pytest.mark.parametrize("dtype,big", [(np.float32, 3e38), (np.float64, 1e308)])
def test_layer_norm_of_a_row_whose_variance_overflows_is_normalised_not_the_bias(dtype, big):
    x = tg.tensor(np.array([[big, -big, 0.0], [1.0, 2.0, 3.0]], dtype), requires_grad=True)
    bias = tg.tensor(np.full(3, 5.0, dtype))
    y = F.layer_norm(x, 3, bias=bias)
    np.testing.assert_allclose(y.data, np.array([[1.2247, -1.2247, 0.0], [-1.2247, 0.0, 1.2247]]) + 5.0,
                               atol=1e-4)
    (y * tg.tensor(np.array([1.0, 2.0, 4.0], dtype))).sum().backward()
    assert np.isfinite(x.grad.data).all() and (x.grad.data[0] != 0).any()


# ================================================= errors that name the problem

@pytest.mark.parametrize("call,error,message", [
    (lambda: tg.zeros(-1), ValueError, r"zeros: size must not be negative, got \(-1,\)"),
    (lambda: tg.ones(2, 2.5), TypeError, r"ones: size must be an int or a tuple of ints, got \(2, 2.5\)"),
    (lambda: tg.randn((3, -2)), ValueError, r"randn: size must not be negative"),
    (lambda: tg.rand(-1), ValueError, r"rand: size must not be negative"),
    (lambda: tg.full((2, -1), 1.0), ValueError, r"full: size must not be negative"),
    (lambda: nn.Linear(-1, 3), ValueError, r"Linear: in_features must be a non-negative integer, got -1"),
    (lambda: nn.Linear(2, 3.0), TypeError, r"Linear: out_features must be an integer, got 3.0"),
    (lambda: nn.Embedding(-5, 4), ValueError, r"Embedding: num_embeddings must be a non-negative"),
    (lambda: nn.LayerNorm((4, -1)), ValueError, r"LayerNorm: normalized_shape\[1\] must be a non-negative"),
    (lambda: tg.arange(0, 10, 0), ValueError, r"arange: step must be nonzero"),
    (lambda: tg.arange("a"), TypeError, r"arange: end must be a number, got 'a'"),
    (lambda: tg.randn(4).chunk(0), ValueError, r"chunk: chunks must be a positive integer, got 0"),
    (lambda: tg.randn(4).split(0), ValueError, r"split: split_size must be positive"),
    (lambda: tg.randn(4).split([5, -1]), ValueError, r"split: sizes must be non-negative integers"),
    (lambda: tg.full((2,), "a"), TypeError, r"full: fill_value must be a number, got 'a'"),
    (lambda: tg.randint(5, 2, (3,)), ValueError, r"randint: low must be less than high, got low=5, high=2"),
    (lambda: tg.randint(0, 2.5, (3,)), TypeError, r"randint: low and high must be integers"),
    (lambda: tg.randint(0, 5, (-3,)), ValueError, r"randint: size must not be negative"),
    (lambda: tg.randn(5).reshape(2.5, 2), TypeError, r"reshape: the shape must be integers, got \(2.5, 2\)"),
    (lambda: tg.randn(5).expand(2.5, 5), TypeError, r"expand: the shape must be integers"),
    (lambda: tg.randn(2, 3).sum(axis=1.0), TypeError, r"sum: axis must be an int, got 1.0"),
    (lambda: tg.randn(2, 3).mean(dim=(0, 1.5)), TypeError, r"mean: axis must be an int, got 1.5"),
    (lambda: F.cross_entropy(tg.randn(2, 3), np.array([0, 1]), ignore_index=2 ** 70), ValueError,
     r"cross_entropy: ignore_index 1180591620717411303424 is outside the int64 range"),
    (lambda: F.cross_entropy(tg.randn(2, 3), np.array([0, 1]), ignore_index=1.5), TypeError,
     r"cross_entropy: ignore_index must be an integer, got 1.5"),
])
def test_bad_arguments_get_a_message_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("entry,message", [
    ({"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}, r"tensor 'w' has data_offsets \['0', '8'\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, r"tensor 'w' has data_offsets \[0\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, r"tensor 'w' has data_offsets \[8, 0\]"),
    ({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}, r"tensor 'w' has shape \['2'\]"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, r"tensor 'w' of dtype F32 and shape \[3\] "
                                                             r"needs 12 bytes, its data_offsets give 8"),
    ({"dtype": "F32", "shape": [2]}, r"the entry of tensor 'w' needs dtype, shape and data_offsets"),
    ({"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}, r"tensor 'w' has dtype 'F8_E4M3', which "
                                                                 r"load cannot read"),
])
def test_a_malformed_safetensors_header_is_named(tmp_path, entry, message):
    header = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(tg.CheckpointError, match=message):
        tg.load(path)


# ============================================================== checkpoints

def _dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_leftover_temp_files_of_earlier_saves_of_the_same_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    dead = _dead_pid()
    leftovers = [f".ckpt.safetensors.{dead}-0123abcd.tmp", ".ckpt.safetensors.89abcdef.tmp"]  # + old naming
    kept = [
        f".other.safetensors.{dead}-0123abcd.tmp",       # another file's leftover
        f".ckpt.safetensors.x.{dead}-0123abcd.tmp",      # the leftover of ckpt.safetensors.x
        f".ckpt.safetensors.{os.getpid()}-00000000.tmp",  # a save in progress in a live process
        "ckpt.safetensors.tmp", "notes.txt",
    ]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"partial checkpoint bytes")
    tg.save({"w": np.ones(3)}, path)
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["ckpt.safetensors"])
    np.testing.assert_array_equal(tg.load(path)["w"], np.ones(3))


@pytest.mark.skipif(os.name != "posix", reason="the live-writer test uses POSIX locks")
def test_a_temp_file_locked_by_a_live_writer_survives_and_a_killed_save_is_cleaned_up(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               TINYGRAD_ATTN_PRECOMPILE="0")
    # A save that is killed (SIGKILL) between writing its temp file and renaming it.
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal, numpy as np, tinygrad_attn as tg\n"
        "os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"tg.save({{'w': np.zeros(1000)}}, {str(path)!r})\n")], env=env)
    assert killed.returncode == -signal.SIGKILL
    leftover, = os.listdir(tmp_path)
    assert leftover.startswith(".ckpt.safetensors.") and os.path.getsize(tmp_path / leftover) > 8000
    # Another machine's writer: a pid that is not alive here, but the file is locked.
    dead = _dead_pid()
    locked = tmp_path / f".ckpt.safetensors.{dead}-feedbeef.tmp"
    locked.write_bytes(b"being written")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys\n"
        f"f = open({str(locked)!r}, 'rb')\n"
        "fcntl.flock(f.fileno(), fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        tg.save({"w": np.ones(2)}, path)
        assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.safetensors", locked.name])
    finally:
        holder.stdin.close()
        holder.wait()
    tg.save({"w": np.ones(2)}, path)  # the lock is gone with its process: now it is a leftover
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_saving_into_a_missing_directory_names_the_target(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "ckpt.safetensors"
    with pytest.raises(FileNotFoundError, match="save: cannot write .*ckpt.safetensors: the directory "
                                                ".*dir does not exist") as info:
        tg.save({"w": np.ones(2)}, target)
    assert ".tmp" not in str(info.value)


@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16"])
def test_half_precision_files_written_by_torch_load_as_float32(tmp_path, torch_dtype):
    torch = _torch()
    from safetensors.torch import save_file
    torch.manual_seed(0)
    dtype = getattr(torch, torch_dtype)
    state = {"w": (torch.randn(4, 5) * 100).to(dtype), "b": torch.tensor([-0.0, 1e-3, 65504.0]).to(dtype),
             "scalar": torch.tensor(3.140625, dtype=dtype), "ids": torch.arange(3)}
    path = tmp_path / "half.safetensors"
    save_file(state, str(path))
    loaded = tg.load(path)
    for name, value in state.items():
        expected = value.float().numpy() if value.is_floating_point() else value.numpy()
        assert loaded[name].dtype == expected.dtype and loaded[name].shape == expected.shape, name
        np.testing.assert_array_equal(loaded[name], expected)  # exact: every half value is a float32
        assert loaded[name].flags.writeable
    model = nn.Linear(5, 4)
    model.load_state_dict({"weight": loaded["w"], "bias": loaded["b"][:1].repeat(4)})
    np.testing.assert_array_equal(model.weight.data, state["w"].float().numpy())
