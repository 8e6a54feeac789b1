"""The fused ops and their Numba kernels.

tests/test_ops.py gradchecks every op against finite differences and a
numpy reference on small shapes. Here: the fused functions against the
reference versions in `tinygrad_attn.reference` (values and gradients),
larger inputs in float32, numerical edge cases (huge logits, -inf, NaN,
queries with no key), the dropout mask, determinism, errors, and the Numba
set-up (cache directory, threads).
"""
import contextlib
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn
from tinygrad_attn import kernels
from tinygrad_attn.reference import numpy_backward as nb
from tinygrad_attn.kernels import fastmath, numba_cache, random_bits, threads

from . import references as ref

rng = np.random.default_rng(1234)


def randn(*shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def run_both(fn, arrays, seed=0):
    """Values and input gradients of fn(*tensors) with the fused ops and
    inside reference_ops() (their composite twins), each run after
    manual_seed(seed) (so dropout draws the same key)."""
    results = []
    for reference in (False, True):
        ts = [tg.Tensor(a.copy(), requires_grad=True) for a in arrays]
        tg.manual_seed(seed)
        with tg.reference_ops(reference):
            out = fn(*ts)
        outs = out if isinstance(out, tuple) else (out,)
        total = sum((o * tg.Tensor(np.cos(np.arange(o.numel())).reshape(o.shape))).sum() for o in outs)
        total.backward()
        results.append(([o.data for o in outs], [t.grad.data if t.grad is not None else None for t in ts]))
    return results


def assert_same(fn, arrays, rtol=1e-10, atol=1e-12, seed=0):
    (out_f, grad_f), (out_c, grad_c) = run_both(fn, arrays, seed)
    for a, b in zip(out_f, out_c):
        np.testing.assert_allclose(a, np.broadcast_to(b, a.shape), rtol=rtol, atol=atol)
    for a, b in zip(grad_f, grad_c):
        if b is None:
            assert a is None or not a.any()
        else:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ------------------------------------------------ fused against reference

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_matches_reference(axis, log):
    x = np.ascontiguousarray(randn(6, 5, 7).transpose(2, 0, 1))[:, ::2]  # strided input
    fn = F.log_softmax if log else F.softmax
    assert_same(lambda t: fn(t, dim=axis), (x,))


@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("norm_shape", [(7,), (5, 7)])
def test_layer_norm_matches_reference(affine, norm_shape):
    x = randn(3, 5, 7) * 2 + 1
    w, b = randn(*norm_shape), randn(*norm_shape)
    use_w, use_b = affine in ("both", "weight"), affine in ("both", "bias")
    arrays = (x,) + ((w,) if use_w else ()) + ((b,) if use_b else ())

    def f(x, *wb):
        wb = list(wb)
        weight = wb.pop(0) if use_w else None
        bias = wb.pop(0) if use_b else None
        return F.layer_norm(x, norm_shape, weight, bias, eps=1e-3)
    assert_same(f, arrays)


@pytest.mark.parametrize("x_shape", [(5,), (4, 5), (2, 3, 5)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_reference(x_shape, bias):
    arrays = (randn(*x_shape), randn(6, 5)) + ((randn(6),) if bias else ())
    assert_same(F.linear, arrays)


@pytest.mark.parametrize("layout", [(6, 5), (5,), (3, 5, 4), (2, 5, 3, 2)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_matches_reference(layout, reduction, smoothing):
    x = randn(*layout, scale=3)
    target_shape = layout[:1] + layout[2:] if len(layout) > 1 else ()
    target = rng.integers(0, 5, target_shape)
    if target.ndim:
        target.flat[::3] = -1  # ignored
        target.flat[1] = 2
    kw = dict(ignore_index=-1, label_smoothing=smoothing, reduction=reduction)
    assert_same(lambda t: F.cross_entropy(t, target, **kw), (x,))


def test_cross_entropy_mean_over_no_targets_is_nan_as_in_pytorch():
    x = tg.Tensor(randn(3, 4), requires_grad=True)
    loss = F.cross_entropy(x, np.full(3, -100))
    assert np.isnan(loss.item())
    loss.backward()
    assert not x.grad.data.any()


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "bool-broadcast"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_attention_matches_reference(mask_kind, causal, dropout_p):
    q, k, v = randn(2, 3, 5, 4), randn(2, 3, 6, 4), randn(2, 3, 6, 3)
    mask = {"none": None, "bool": rng.random((5, 6)) > 0.3, "float": randn(3, 5, 6),
            "bool-broadcast": rng.random((2, 1, 1, 6)) > 0.3}[mask_kind]
    kw = dict(attn_mask=mask, is_causal=causal, dropout_p=dropout_p, need_weights=True)
    if causal and mask is not None:
        # PyTorch (and F) refuse attn_mask with is_causal: give F the causal mask folded in.
        with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal=True"):
            F.scaled_dot_product_attention(tg.Tensor(q), tg.Tensor(k), tg.Tensor(v), **kw)
        below = np.tril(np.ones((5, 6), bool))
        folded = mask & below if mask.dtype == bool else np.where(below, mask, -np.inf)
        kw = dict(kw, attn_mask=folded, is_causal=False)
    assert_same(lambda *a: F.scaled_dot_product_attention(*a, **kw), (q, k, v), seed=7)


def test_attention_gradient_reaches_a_float_mask():
    q, k, v, m = randn(2, 4, 3), randn(2, 5, 3), randn(2, 5, 2), randn(4, 5)
    assert_same(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (q, k, v, m))


def test_attention_broadcasts_key_and_value_over_heads():
    q, k, v = randn(2, 4, 5, 3), randn(2, 1, 6, 3), randn(1, 1, 6, 2)
    assert_same(F.scaled_dot_product_attention, (q, k, v))


def test_dropout_matches_reference_with_the_same_seed():
    x = randn(3, 40, 7)
    assert_same(lambda t: F.dropout(t, 0.25), (x,), seed=3)


def test_batched_matmul_reads_transposed_views_in_place():
    from tinygrad_attn.ops.array_views import as_matrices
    b = randn(3, 4, 7, 6)
    buffer, offsets, ld, transposed = as_matrices(np.swapaxes(b, -1, -2), (2, 3, 4), allow_transposed=True)
    assert transposed and np.shares_memory(buffer, b)  # BLAS reads it transposed: no copy
    assert ld == 6 and offsets.tolist() == list(range(0, 12 * 42, 42)) * 2  # broadcast: offsets repeat
    heads = randn(2, 5, 3, 4).transpose(0, 2, 1, 3)  # (B, T, H, E) seen as (B, H, T, E)
    buffer, offsets, ld, transposed = as_matrices(heads, (2, 3))
    assert not transposed and np.shares_memory(buffer, heads) and ld == 12
    for a_shape, b_shape, swap_a in [((3, 4, 5, 6), (3, 4, 7, 6), False), ((2, 1, 6, 5), (3, 6, 4), True)]:
        a, b = randn(*a_shape), randn(*b_shape)
        ta, tb = tg.Tensor(a, requires_grad=True), tg.Tensor(b, requires_grad=True)
        if swap_a:  # a^T @ b with a broadcast batch axis
            out, expected = ta.swapaxes(-1, -2) @ tb, np.swapaxes(a, -1, -2) @ b
        else:  # a @ b^T
            out, expected = ta @ tb.swapaxes(-1, -2), a @ np.swapaxes(b, -1, -2)
        g = randn(*out.shape)
        out.backward(g)
        np.testing.assert_allclose(out.data, expected, rtol=1e-12)
        if swap_a:  # dA^T = G B^T summed over the broadcast axis; dB = A^T G = a G summed over axis 0
            ga = np.swapaxes((g @ np.swapaxes(b, -1, -2)).sum(axis=1, keepdims=True), -1, -2)
            gb = (a @ g).sum(axis=0)
        else:
            ga, gb = g @ b, np.swapaxes(g, -1, -2) @ a
        np.testing.assert_allclose(ta.grad.data, ga, rtol=1e-10)
        np.testing.assert_allclose(tb.grad.data, gb, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gemm_works_on_every_blas_route(dtype, monkeypatch):
    """numpy's OpenBLAS (64-bit integers), scipy's (32-bit) and the loops (no
    BLAS), on products that are a stack, transposed, large enough to be cut
    by rows, and cut along the sum (few rows, a long sum: a narrow layer's
    weight gradient), with and without a bias."""
    from tinygrad_attn.kernels import blas, matmul
    assert blas.library_name() == "numpy's"  # found on this machine: the fallbacks are not what runs
    assert [blas.library_name(route) for route in blas.ROUTES] == list(blas.ROUTES)  # each one is there
    assert not np.array_equal(blas.library(), blas.library("scipy's"))
    assert blas.library("loops") is None  # no addresses: the loops
    assert matmul.pieces(64, 300, 9000) == (64, 2250)  # few rows, a long sum: four slices of the sum
    assert matmul.pieces(700, 33, 9000) == (175, 9000)  # enough rows: four blocks of rows, even when k > m
    assert matmul.pieces(2000, 300, 128) == (500, 128)  # m >= k: four blocks of rows
    assert matmul.pieces(30, 20, 10) == (30, 10)  # small: one piece
    assert matmul.pieces(192, 64, 640) == (96, 640)  # work for three pieces: two (a power of two)
    cases = [((3, 4, 5), (3, 6, 5), True), ((1, 700, 9), (1, 9, 33), False), ((1, 700, 9000), (1, 9000, 3), False),
             ((1, 64, 9000), (1, 9000, 300), False),
             ((2, 300, 2000), (2, 2000, 40), False)]
    for a_shape, b_shape, trans_b in cases:
        a, b = randn(*a_shape, dtype=dtype), randn(*b_shape, dtype=dtype)
        count, m, k = a.shape
        n = b.shape[1] if trans_b else b.shape[2]
        bias = randn(n, dtype=dtype)
        expected = a @ (b.swapaxes(1, 2) if trans_b else b) + bias
        for route in blas.ROUTES:
            monkeypatch.setattr(matmul, "library", lambda route=route: blas.library(route))
            out = np.empty((count, m, n), dtype)
            offsets = lambda x: np.arange(count, dtype=np.int64) * x[0].size
            matmul.batched_matmul((a.reshape(-1), offsets(a), k), False, (b.reshape(-1), offsets(b), b.shape[2]),
                                  trans_b, m, n, k, out, bias)
            tol = 1e-5 if dtype == np.float32 else 1e-12  # float32 sums of 9000 terms round
            np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * np.abs(expected).max())
    from tinygrad_attn.kernels import attention  # its head products call gemm in place, strided
    q, k, v = (randn(2, 3, 5, 4, dtype=dtype) for _ in range(3))
    results = []
    for route in blas.ROUTES:
        monkeypatch.setattr(attention, "library", lambda route=route: blas.library(route))
        ts = [tg.Tensor(x, requires_grad=True) for x in (q, k, v)]
        out = F.scaled_dot_product_attention(*ts, is_causal=True)
        (out * out).sum().backward()
        results.append([out.data] + [t.grad.data for t in ts])
    for other in results[1:]:
        for x, y in zip(results[0], other):
            np.testing.assert_allclose(x, y, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_gemm_outside_numba_overwrites_c_when_beta_is_0():
    """The plain-numpy body of gemm (what NUMBA_DISABLE_JIT=1 runs) does not
    read C when beta = 0, as BLAS: an output from np.empty may hold NaN."""
    from tinygrad_attn.kernels import blas
    a, b = randn(2, 3), randn(3, 4)
    c = np.full(8, np.nan)
    blas.gemm(None, False, False, 2, 4, 3, 1.0, a.reshape(-1), 3, b.reshape(-1), 4, 0.0, c, 4)
    np.testing.assert_allclose(c.reshape(2, 4), a @ b, rtol=1e-15)


def test_blas_candidates_are_checked_before_use(monkeypatch):
    """A BLAS whose sgemm does not multiply correctly (another integer width)
    is not used: the next candidate, then scipy's, then (without scipy) the
    loops are."""
    import builtins

    from tinygrad_attn.kernels import blas
    monkeypatch.setattr(blas, "_multiplies_correctly", lambda address, ilp64: False)
    assert blas._numpy_blas() is None
    blas._choose.cache_clear()
    try:
        assert blas.library_name() == "scipy's"
        blas._choose.cache_clear()
        real_import = builtins.__import__

        def no_scipy(name, *args, **kwargs):
            if name.split(".")[0] == "scipy":
                raise ImportError(f"no module named {name!r} (hidden by the test)")
            return real_import(name, *args, **kwargs)
        monkeypatch.setattr(builtins, "__import__", no_scipy)
        assert blas.library_name() == "loops" and blas.library() is None
        with pytest.raises(ValueError, match="blas.library: route must be one of"):
            blas.library("mkl")
    finally:
        blas._choose.cache_clear()


# --------------------------------------------- kernels on larger inputs, float32

def test_float32_kernels_match_numpy_at_transformer_sizes():
    x = randn(2048, 128, dtype=np.float32, scale=3)
    np.testing.assert_allclose(F.softmax(tg.Tensor(x), dim=-1).data, nb.softmax_forward(x.astype(np.float64)),
                               rtol=2e-6, atol=1e-7)
    w, b = randn(128, dtype=np.float32), randn(128, dtype=np.float32)
    np.testing.assert_allclose(F.layer_norm(tg.Tensor(x), 128, tg.Tensor(w), tg.Tensor(b)).data,
                               nb.layer_norm_forward(x.astype(np.float64), w, b, 1), rtol=1e-4, atol=1e-5)
    t = rng.integers(0, 128, 2048)
    np.testing.assert_allclose(F.cross_entropy(tg.Tensor(x), t).item(),
                               nb.cross_entropy_forward(x.astype(np.float64), t), rtol=1e-5)
    q, k, v = (randn(8, 4, 64, 32, dtype=np.float32) for _ in range(3))
    out = F.scaled_dot_product_attention(tg.Tensor(q), tg.Tensor(k), tg.Tensor(v), is_causal=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.data, nb.attention_forward(*(a.astype(np.float64) for a in (q, k, v)),
                                                              is_causal=True)[0], rtol=1e-4, atol=1e-5)


@njit(cache=True)
def _exp_all(x, out):
    for i in range(x.shape[0]):
        out[i] = fastmath.exp(x[i])


@pytest.mark.parametrize("dtype,ulps", [(np.float32, 2), (np.float64, 2)])
def test_polynomial_exp_is_accurate_to_a_few_ulps(dtype, ulps):
    x = np.concatenate([np.linspace(-80, 80, 20001), randn(1000)]).astype(dtype)
    out = np.empty_like(x)
    _exp_all(x, out)
    expected = np.exp(x.astype(np.float64))
    assert np.all(np.abs(out - expected) <= ulps * np.finfo(dtype).eps * expected)
    specials = np.array([-np.inf, -1e4, -800.0, 0.0, np.nan], dtype)
    _exp_all(specials, out[:5])
    assert out[:3].tolist() == [0.0, 0.0, 0.0] and out[3] == 1.0 and np.isnan(out[4])


def test_softmax_is_stable_for_huge_logits_and_keeps_nan():
    x = np.array([[1e4, -1e4, 0.0, 1e4], [-np.inf, 0.0, -np.inf, 1.0], [1.0, np.nan, 2.0, 0.0]],
                 np.float32)
    y = F.softmax(tg.Tensor(x), dim=-1).data
    np.testing.assert_allclose(y[0], [0.5, 0, 0, 0.5])
    assert y[1, 0] == 0 and y[1, 2] == 0  # -inf gives an exact 0
    np.testing.assert_allclose(y[1, [1, 3]], nb.softmax_forward(np.array([0.0, 1.0])), rtol=1e-6)
    assert np.isnan(y[2]).all()
    logp = F.log_softmax(tg.Tensor(x[:1]), dim=-1).data
    np.testing.assert_allclose(logp, [[-np.log(2), -2e4 - np.log(2), -1e4 - np.log(2), -np.log(2)]],
                               rtol=1e-6)
    loss = F.cross_entropy(tg.Tensor(x[:1]), np.array([1]))
    np.testing.assert_allclose(loss.item(), 2e4 + np.log(2), rtol=1e-6)


# ------------------------------------------------ attention: no key to attend

def test_query_with_no_allowed_key_gets_zero_output_and_zero_gradient():
    q, k, v = (tg.Tensor(randn(1, 2, 3, 4), requires_grad=True) for _ in range(3))
    mask = np.ones((3, 3), bool)
    mask[1] = False  # query 1 may attend to nothing
    out, w = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    assert not out.data[..., 1, :].any() and not w.data[..., 1, :].any()
    np.testing.assert_allclose(w.data[..., [0, 2], :].sum(-1), 1.0)
    (out * out).sum().backward()
    assert not q.grad.data[..., 1, :].any()
    assert np.isfinite(k.grad.data).all() and np.isfinite(v.grad.data).all()


def test_multihead_attention_query_with_every_key_blocked_gives_the_output_bias():
    from tinygrad_attn import nn
    tg.manual_seed(0)
    mha = nn.MultiHeadAttention(8, 2, batch_first=True)
    mha.out_proj.bias.data[:] = np.arange(8, dtype=np.float32)
    blocked = np.zeros((3, 3), bool)
    blocked[1] = True  # nn's convention: True = may NOT attend
    out, _ = mha(tg.randn(2, 3, 8), tg.randn(2, 3, 8), tg.randn(2, 3, 8), attn_mask=blocked)
    np.testing.assert_allclose(out.data[:, 1], np.broadcast_to(np.arange(8.0), (2, 8)))


def test_attention_matches_pytorch():
    torch = pytest.importorskip("torch")
    q, k, v = randn(2, 3, 5, 4), randn(2, 3, 7, 4), randn(2, 3, 7, 6)
    mask = rng.random((5, 7)) > 0.3
    mask[:, 0] = True
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=torch.tensor(mask), scale=0.3)
    expected.sum().backward()
    ours = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, attn_mask=mask, scale=0.3)
    out.sum().backward()
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, ts):
        np.testing.assert_allclose(a.grad.data, b.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("heads", [(4, 2, 2), (6, 3, 3), (4, 1, 1), (2, 2, 2),
                                   (4, 2, 4), (4, 4, 2), (6, 3, 2), (4, 1, 2), (6, 1, 3)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_grouped_query_attention_matches_pytorch(heads, mask_kind, dtype):
    """enable_gqa=True: output and gradients of Q, K, V as torch's, K and V
    with fewer heads (one shared by each group of query heads), and, as in
    torch, key and value with head counts of their own (each dividing the
    query's)."""
    torch = pytest.importorskip("torch")
    hq, hk, hv = heads
    q, k, v = randn(2, hq, 5, 4, dtype=dtype), randn(2, hk, 6, 4, dtype=dtype), randn(2, hv, 6, 3, dtype=dtype)
    mask = {"none": None, "causal": None, "bool": rng.random((2, hq, 5, 6)) > 0.3,
            "float": randn(hq, 5, 6, dtype=dtype)}[mask_kind]
    kw = dict(is_causal=mask_kind == "causal", enable_gqa=True)
    g = randn(2, hq, 5, 3, dtype=dtype)
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        *ts, attn_mask=None if mask is None else torch.tensor(mask), **kw)
    expected.backward(torch.tensor(g))
    ours = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, attn_mask=mask, **kw)
    out.backward(g)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=1e-6)
    assert out.dtype == dtype and out.shape == (2, hq, 5, 3)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), **tol)
    for a, b in zip(ours, ts):
        assert a.grad.dtype == dtype and a.grad.shape == a.shape
        np.testing.assert_allclose(a.grad.data, b.grad.numpy(), **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_query_attention_reads_the_shared_heads_in_place(dtype):
    """The kernel's grouped-query attention is the repeat of the key/value heads
    followed by ordinary attention (the path before it, and the composite
    twin's): the same output, dropout mask and gradients, to rounding (the
    sums over a group add in another order); K and V are read where they lie,
    not copied, and dK, dV come back with Hkv heads."""
    from tinygrad_attn.ops.movement import repeat_kv_heads
    q, k, v = randn(2, 6, 7, 4, dtype=dtype), randn(2, 2, 9, 4, dtype=dtype), randn(2, 3, 9, 5, dtype=dtype)
    g = randn(2, 6, 7, 5, dtype=dtype)
    results = []
    for in_kernel in (True, False):
        ts = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
        tg.manual_seed(4)
        if in_kernel:
            out, ctx = tg.ops.attention.ScaledDotProductAttention.apply_with_ctx(
                *ts, is_causal=True, dropout_p=0.3, enable_gqa=True)
            assert ctx.plan.groups == (3, 2, 6)  # 3 query heads per key head, 2 per value head
            assert all(np.shares_memory(a, t.data) for a, t in zip(ctx.plan.inputs, ts))
        else:
            out = F.scaled_dot_product_attention(ts[0], repeat_kv_heads(ts[0], ts[1]), repeat_kv_heads(ts[0], ts[2]),
                                                 is_causal=True, dropout_p=0.3)
        out.backward(g)
        results.append([out.data] + [t.grad.data for t in ts])
    assert results[0][2].shape == k.shape and results[0][3].shape == v.shape
    tol = 1e-5 if dtype == np.float32 else 1e-13
    for a, b in zip(*results):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("kv_heads", [(2, 2), (2, 4), (4, 1)])
def test_grouped_query_attention_weights_fused_and_through_the_twins(kv_heads):
    """need_weights=True with enable_gqa: the weights, one (L, S) matrix per
    query head, and every gradient through output and weights, fused and
    inside reference_ops() (the composite twins), key and value with the
    same or different head counts."""
    def fn(q, k, v):
        out, weights = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, need_weights=True)
        assert weights.shape == (2, 4, 5, 6)
        return out, weights
    hk, hv = kv_heads
    assert_same(fn, (randn(2, 4, 5, 3), randn(2, hk, 6, 3), randn(2, hv, 6, 2)))


def test_grouped_query_attention_sums_bit_identically_on_any_thread_count():
    """Key and value groups of different sizes (3 and 2 query heads): each
    thread takes whole blocks of lcm(3, 2) = 6 query heads, so dK and dV add
    in the same order on 1 thread and on many."""
    q, k, v = randn(64, 6, 32, 16, dtype=np.float32), randn(64, 2, 32, 16, dtype=np.float32), \
        randn(64, 3, 32, 16, dtype=np.float32)
    g = randn(64, 6, 32, 16, dtype=np.float32)

    def run(count):
        kernels.set_num_threads(count)
        try:
            ts = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
            out = F.scaled_dot_product_attention(*ts, is_causal=True, dropout_p=0.2, enable_gqa=True)
            out.backward(g)
            return [out.data] + [t.grad.data for t in ts]
        finally:
            kernels.set_num_threads(None)
    for count in (max(3, threads.get_num_threads()), 2):
        tg.manual_seed(5)
        many = run(count)
        tg.manual_seed(5)
        for a, b in zip(many, run(1)):
            np.testing.assert_array_equal(a, b)


def test_grouped_query_attention_refuses_heads_that_do_not_divide():
    """Refused as torch refuses them ("Number of heads in key and value must
    divide the number of heads in"), naming the op, the arguments and the shapes."""
    t = lambda *shape: tg.Tensor(np.ones(shape))
    for hk, hv in ((3, 3), (3, 2), (2, 3), (8, 4), (0, 2)):
        with pytest.raises(tg.ShapeError, match=rf"scaled_dot_product_attention: with enable_gqa the number of "
                                                rf"heads \(axis -3\) of key \({hk}\) and of value \({hv}\) must "
                                                rf"each divide the number of query heads 4 \(query \(2, 4, 3, 2\), "
                                                rf"key \(2, {hk}, 5, 2\), value \(2, {hv}, 5, 2\)\)"):
            F.scaled_dot_product_attention(t(2, 4, 3, 2), t(2, hk, 5, 2), t(2, hv, 5, 2), enable_gqa=True)
    with pytest.raises(tg.ShapeError, match="enable_gqa needs heads on axis -3"):
        F.scaled_dot_product_attention(t(3, 2), t(5, 2), t(5, 2), enable_gqa=True)


def test_cross_entropy_and_layer_norm_match_pytorch():
    torch = pytest.importorskip("torch")
    x, t = randn(4, 6, 3), rng.integers(0, 6, (4, 3))
    t[0, 0] = 5
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.cross_entropy(tx, torch.tensor(t), ignore_index=5, label_smoothing=0.1).backward()
    ox = tg.Tensor(x, requires_grad=True)
    loss = F.cross_entropy(ox, t, ignore_index=5, label_smoothing=0.1)
    loss.backward()
    np.testing.assert_allclose(ox.grad.data, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    y = F.layer_norm(tg.Tensor(x), (6, 3), tg.Tensor(np.full((6, 3), 2.0)), None)
    weight = torch.full((6, 3), 2.0, dtype=torch.float64)
    expected = torch.nn.functional.layer_norm(torch.tensor(x), (6, 3), weight)
    np.testing.assert_allclose(y.data, expected.numpy(), rtol=1e-10, atol=1e-10)


# HUGE[dtype]: magnitudes whose squares overflow dtype (float32 from ~1.8e19, float64 from ~1.3e154)
HUGE = [(np.float32, 1e20), (np.float32, 1e30), (np.float32, 1e38), (np.float64, 1e200), (np.float64, 1e300)]


@pytest.mark.parametrize("dtype,big", HUGE)
def test_layer_norm_of_rows_too_large_to_square_matches_pytorch(dtype, big):
    """Rows of 1e30 in float32 have representable normalised values: the
    output and every gradient are finite and right (torch in float64 on the
    same rows; torch in float32 gives NaN there), and an ordinary row in the
    same call is untouched."""
    pytest.importorskip("torch")
    x = ref.huge_rows(dtype, big)
    w, b = randn(x.shape[1]).astype(dtype), randn(x.shape[1]).astype(dtype)
    g = randn(*x.shape).astype(dtype)
    y_ref, dx_ref, dw_ref, db_ref = ref.torch_layer_norm(x, w, b, g)
    xt, wt, bt = (tg.Tensor(a, requires_grad=True) for a in (x, w, b))
    y = F.layer_norm(xt, x.shape[1], wt, bt)
    y.backward(tg.Tensor(g))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    ref.assert_rows_close(y.data, y_ref, rtol)
    ref.assert_rows_close(xt.grad.data, dx_ref, rtol)
    ref.assert_rows_close(wt.grad.data, dw_ref, rtol)
    ref.assert_rows_close(bt.grad.data, db_ref, rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm_of_a_row_holding_inf_or_nan_is_nan_as_in_pytorch(dtype):
    x = tg.tensor(np.array([[np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0]], dtype), requires_grad=True)
    y = F.layer_norm(x, 3)
    assert np.isnan(y.data[:2]).all() and np.isfinite(y.data[2]).all()
    y.sum().backward()
    assert np.isnan(x.grad.data[:2]).all() and np.isfinite(x.grad.data[2]).all()


@pytest.mark.parametrize("path", ["fused", "composite", "numpy"])
@pytest.mark.parametrize("dtype,big", HUGE)
def test_rms_norm_of_rows_too_large_to_square_matches_pytorch(dtype, big, path):
    """RMSNorm of rows of 1e20..1e38 in float32: the right values and
    gradients (PyTorch's float32 rms_norm gives 0 there, the mean square
    overflowing), in the fused op, its composite and its numpy twin."""
    pytest.importorskip("torch")
    from tinygrad_attn.reference import numpy_backward as nb
    x = ref.huge_rows(dtype, big)
    w, g = randn(x.shape[1]).astype(dtype), randn(*x.shape).astype(dtype)
    y_ref, dx_ref, dw_ref = ref.torch_rms_norm(x, w, g)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    if path == "numpy":
        y, (dx, dw) = nb.rms_norm_forward(x, w), nb.rms_norm_backward(x, w, g)
    else:
        xt, wt = tg.Tensor(x, requires_grad=True), tg.Tensor(w, requires_grad=True)
        with tg.reference_ops() if path == "composite" else contextlib.nullcontext():
            out = F.rms_norm(xt, (x.shape[1],), wt, eps=1e-6)
            out.backward(tg.Tensor(g))
        y, dx, dw = out.data, xt.grad.data, wt.grad.data
    ref.assert_rows_close(y, y_ref, rtol)
    ref.assert_rows_close(dx, dx_ref, rtol)
    ref.assert_rows_close(dw, dw_ref, rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_of_a_row_holding_inf_or_nan_is_what_pytorch_and_the_twins_give(dtype):
    """inf: x * 1/sqrt(inf) = [NaN, 0, 0]; NaN: NaN; the gradients of both rows NaN."""
    pytest.importorskip("torch")
    import torch
    from tinygrad_attn.reference import numpy_backward as nb
    x = np.array([[np.inf, 1.0, 2.0], [np.nan, 1.0, 2.0], [1.0, 2.0, 3.0]], dtype)
    xt = tg.tensor(x, requires_grad=True)
    y = F.rms_norm(xt, (3,))
    expected = torch.nn.functional.rms_norm(torch.tensor(x), (3,)).numpy()
    np.testing.assert_allclose(y.data, expected, rtol=1e-6)  # NaN where NaN
    np.testing.assert_allclose(nb.rms_norm_forward(x, np.ones(3, dtype), eps=np.finfo(dtype).eps), expected,
                               rtol=1e-6)
    y.sum().backward()
    assert np.isnan(xt.grad.data[:2]).all() and np.isfinite(xt.grad.data[2]).all()


# ------------------------------------------------------------------ dropout

def test_dropout_mask_rate_scale_and_backward():
    x = tg.Tensor(np.ones((200, 500), np.float32), requires_grad=True)
    y = F.dropout(x, 0.3)
    kept = y.data != 0
    assert abs(kept.mean() - 0.7) < 0.005  # 100k Bernoulli(0.7): sd 0.0015
    np.testing.assert_allclose(y.data[kept], 1 / 0.7, rtol=1e-6)
    y.backward(np.full(y.shape, 2.0, np.float32))
    np.testing.assert_array_equal(x.grad.data != 0, kept)  # the same mask in backward
    # neighbouring elements and rows are not correlated
    u = kept.astype(float)
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.02


def test_dropout_follows_manual_seed_and_the_special_cases():
    x = tg.Tensor(randn(50, 50, dtype=np.float32))
    tg.manual_seed(11)
    a = F.dropout(x, 0.5).data
    b = F.dropout(x, 0.5).data
    tg.manual_seed(11)
    np.testing.assert_array_equal(F.dropout(x, 0.5).data, a)
    assert (a != b).any()
    assert F.dropout(x, 0.0) is x and F.dropout(x, 0.5, training=False) is x
    assert not F.dropout(x, 1.0).data.any()
    with pytest.raises(ValueError, match="dropout"):
        F.dropout(x, 1.5)
    with pytest.raises(ValueError, match="dropout"):
        F.scaled_dot_product_attention(x, x, x, dropout_p=-0.1)


def test_dropout_mask_is_the_documented_hash():
    key, p = 12345, 0.4
    x = np.ones(1000, np.float32)
    out = np.empty_like(x)
    threshold = np.uint32(round(p * 2**32))
    kernels.dropout.dropout_apply(x, np.uint32(key), threshold, np.float32(1 / (1 - p)), out)
    np.testing.assert_array_equal(out != 0, ref.dropout_keep(x.shape, p, key))
    indices = np.arange(1000)
    np.testing.assert_array_equal(random_bits.uniform_bits_numpy(key, indices), ref.random_bits(key, indices))


# -------------------------------------------------------------- determinism

LARGE = 1 << 20  # elements in an example's main input: enough that every kernel shares its work out


def _every_kernel(threads_count):
    """Outputs and gradients of every op's `example`, and the results of every
    @kernel_example (optimizer, clipping), at size LARGE, with `threads_count` threads."""
    from tinygrad_attn import warmup
    kernels.set_num_threads(threads_count)
    try:
        results = []
        for op in warmup.ops_with_kernels():
            out, tensors = warmup.run_example(op, np.float32, LARGE)
            results.append((op.__name__, [out.data.copy()] + [t.grad.data.copy() for t in tensors
                                                              if t.grad is not None]))
        for example, arrays in zip(kernels.EXAMPLES, warmup.non_op_examples(np.float32, LARGE)):
            results.append((example.__module__, [np.array(a, copy=True) for a in arrays]))
        return results
    finally:
        kernels.set_num_threads(None)


def test_results_are_bit_identical_run_to_run_and_across_thread_counts():
    many = max(3, threads.get_num_threads())  # more threads than cores is fine here
    first, second, single = _every_kernel(many), _every_kernel(many), _every_kernel(1)
    assert len(first) >= 13
    for (name, a), (_, b), (_, c) in zip(first, second, single):
        for x, y, z in zip(a, b, c):
            np.testing.assert_array_equal(x, y, err_msg=name)
            np.testing.assert_array_equal(x, z, err_msg=name)


# ------------------------------------------------- float32 stays float32

def _float64_variables(func, signature):
    """Named (or loop-carried) variables that Numba types float64 in func(signature).

    Type inference only, no code generation: cheap. In a float32 kernel a
    float64 variable means a Python float literal or an int/float mix
    promoted the arithmetic, which halves SIMD width (and, in a loop, speed).
    """
    from numba.core import compiler, typed_passes
    from numba.core.registry import cpu_target
    interp = compiler.run_frontend(func)
    result = typed_passes.type_inference_stage(cpu_target.typing_context, cpu_target.target_context,
                                               interp, signature, None)
    return sorted(name for name, ty in result.typemap.items()
                  if "float64" in str(ty) and (not name.startswith("$") or name.startswith("$phi")))


def test_float32_kernels_compute_in_float32():
    from numba import types

    from tinygrad_attn.kernels import cross_entropy
    from tinygrad_attn import warmup
    _every_kernel(threads.get_num_threads())  # compiles kernels first: Numba's typing is then set up
    f32 = types.float32
    rows, vector = types.Array(f32, 2, "C"), types.Array(f32, 1, "C")
    helpers = {fastmath._exp32: (f32,), cross_entropy.row_sums: (vector,),
               # not in KERNELS (only rows too large to square run it)
               kernels.layer_norm._layer_norm_rescaled: (rows, vector, vector, f32, rows, vector, vector)}
    checked = [(getattr(f, "py_func", f), sig) for f, sig in helpers.items()]
    calls = warmup.kernel_signatures((np.float32,))  # each kernel's float32 argument types, nothing compiled
    assert {kernel for kernel, _ in calls} == set(kernels.KERNELS)
    from tinygrad_attn.kernels import clip
    # The norm sums squares in float64 on purpose (clip_grad_norm_'s accuracy); its float32 input stays float32.
    checked += [(kernel.py_func, sig) for kernel, sig in calls if kernel is not clip._sum_of_squares]
    assert _float64_variables(clip._sum_of_squares.py_func, next(sig for k, sig in calls if k is clip._sum_of_squares)) \
        == ["arg.partial", "partial", "s", "v"]
    for func, sig in checked:
        assert _float64_variables(func, sig) == [], func.__name__


# ------------------------------------------------------------------- errors

def test_bad_inputs_raise_errors_naming_the_op_and_shapes():
    t = lambda *shape: tg.Tensor(np.ones(shape, np.float32))
    with pytest.raises(tg.ShapeError, match=r"scaled_dot_product_attention.*\(2, 3, 4\).*\(2, 5, 3\)"):
        F.scaled_dot_product_attention(t(2, 3, 4), t(2, 5, 3), t(2, 5, 3))
    with pytest.raises(tg.ShapeError, match=r"attn_mask.*\(4, 4\)"):
        F.scaled_dot_product_attention(t(2, 3, 4), t(2, 5, 4), t(2, 5, 3), attn_mask=np.ones((4, 4), bool))
    with pytest.raises(tg.ShapeError, match=r"layer_norm.*\(2, 3\).*\(4,\)"):
        F.layer_norm(t(2, 3), (4,))
    with pytest.raises(tg.ShapeError, match=r"layer_norm.*\(2, 3\).*weight \(2,\)"):
        F.layer_norm(t(2, 3), (3,), t(2), None)
    with pytest.raises(tg.ShapeError, match=r"cross_entropy.*\(3,\).*\(2, 5\)"):
        F.cross_entropy(t(2, 5), np.zeros(3, int))
    with pytest.raises(IndexError, match=r"cross_entropy.*\[0, 5\)"):
        F.cross_entropy(t(2, 5), np.array([0, 5]))
    with pytest.raises(TypeError, match="cross_entropy.*integer"):
        F.cross_entropy(t(2, 5), np.zeros(2))
    with pytest.raises(ValueError, match="cross_entropy.*reduction"):
        F.cross_entropy(t(2, 5), np.zeros(2, int), reduction="avg")
    with pytest.raises(tg.ShapeError, match=r"linear.*\(2, 3\).*\(4, 5\)"):
        F.linear(t(2, 3), t(4, 5))
    with pytest.raises(TypeError, match="softmax.*int64"):
        F.softmax(tg.Tensor(np.arange(3)), dim=-1)
    with pytest.raises(IndexError, match="softmax"):
        F.softmax(t(2, 3), dim=2)


# ------------------------------------------------------------ numba set-up

def test_cache_goes_elsewhere_when_the_package_directory_is_read_only(monkeypatch, tmp_path):
    package = str(tmp_path / "kernels")
    assert numba_cache.choose_cache_dir(package) is None  # writable: numba's own __pycache__
    writable = {str(tmp_path / "home" / ".cache" / "tinygrad_attn" / "numba")}
    monkeypatch.setattr(numba_cache, "_is_writable", lambda d: d in writable)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert numba_cache.choose_cache_dir(package) == next(iter(writable))
    monkeypatch.setattr(numba_cache, "_is_writable", lambda d: False)
    assert numba_cache.choose_cache_dir(package) is None


def test_parallel_for_covers_every_item_once_and_reraises_errors():
    seen = np.zeros(1000, int)

    def kernel(out, start, stop):
        out[start:stop] += 1
    threads.parallel_for(kernel, 1000, seen, item_size=threads.GRAIN)
    assert (seen == 1).all()
    calls = []
    threads.parallel_for(lambda start, stop: calls.append((start, stop)), 50, item_size=100)
    assert calls == [(0, 50)]  # too little work to wake a thread
    calls.clear()
    threads.parallel_for(lambda start, stop: calls.append((start, stop)), 50, item_size=threads.GRAIN)
    assert sorted(calls) == [(50 * t // len(calls), 50 * (t + 1) // len(calls)) for t in range(len(calls))]
    assert len(calls) == min(50, 4 * threads.get_num_threads())  # at most four ranges per thread
    calls.clear()
    tg.set_num_threads(2)
    try:  # 3 items' worth of work on 2 threads: 2 ranges, not 3
        threads.parallel_for(lambda start, stop: calls.append((start, stop)), 3, item_size=threads.GRAIN)
    finally:
        tg.set_num_threads(None)
    assert sorted(calls) == [(0, 1), (1, 3)]

    def failing(start, stop):
        if start > 0:
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        threads.parallel_for(failing, 1000, item_size=threads.GRAIN)


@given(st.integers(0, 300), st.sampled_from([1, 1000, threads.GRAIN]))
def test_parallel_for_splits_any_size(n, item_size):
    seen = np.zeros(n, int)

    def kernel(out, start, stop):
        out[start:stop] += 1
    threads.parallel_for(kernel, n, seen, item_size=item_size)
    assert (seen == 1).all()


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_kernel_matches_the_formula_in_float32_and_float64(approximate):
    from scipy.special import erf
    x = np.concatenate([np.linspace(-12, 12, 4001), randn(20000, scale=3)])
    if approximate == "tanh":
        y = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
        t = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))
        dy = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x * x)
    else:
        y = 0.5 * x * (1 + erf(x / np.sqrt(2)))
        dy = 0.5 * (1 + erf(x / np.sqrt(2))) + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
    for dtype, tol in ((np.float64, 1e-14), (np.float32, 4e-7)):
        t = tg.Tensor(x.astype(dtype), requires_grad=True)
        out = t.gelu(approximate=approximate)
        out.backward(np.ones(x.shape, dtype))
        assert out.dtype == dtype and t.grad.dtype == dtype
        # absolute error relative to the scale of y (GELU is ~x for large x)
        np.testing.assert_allclose(out.data, y, rtol=tol, atol=tol * 4)
        np.testing.assert_allclose(t.grad.data, dy, rtol=tol, atol=tol * 4)


def test_relu_kernel_matches_numpy_and_torch_in_float32_and_float64():
    """Forward max(x, 0) with NaN kept and -0.0 left as torch leaves it;
    backward gives 0 where the output is <= 0 (also where grad is NaN there)
    and grad elsewhere (also at a NaN input), as torch's threshold_backward."""
    import torch
    x = np.concatenate([[-0.0, 0.0, np.nan, -np.inf, np.inf, 1e-30, -1e-30], randn(300000, scale=3)])
    g = randn(x.size)
    g[:3] = np.nan
    for dtype in (np.float32, np.float64):
        t = tg.Tensor(x.astype(dtype), requires_grad=True)
        out = t.relu()
        out.backward(g.astype(dtype))
        tt = torch.tensor(x.astype(dtype), requires_grad=True)
        ref = torch.relu(tt)
        ref.backward(torch.tensor(g.astype(dtype)))
        assert out.dtype == dtype and t.grad.dtype == dtype
        np.testing.assert_array_equal(out.data, ref.detach().numpy())
        np.testing.assert_array_equal(np.signbit(out.data), np.signbit(ref.detach().numpy()))
        np.testing.assert_array_equal(t.grad.data, tt.grad.numpy())
    ints = tg.Tensor(np.array([-2, 0, 3])).relu()  # other dtypes: numpy's maximum
    assert ints.data.tolist() == [0, 0, 3]


def test_silu_kernel_matches_torch_in_float32_and_float64():
    """Forward x * sigmoid(x) and backward s + x s (1 - s) as torch's silu,
    over both tails (sigmoid from exp(-|x|): nothing overflows, tiny values
    keep their digits) and at -0.0, NaN and +-inf (NaN where torch gives NaN)."""
    import torch
    x = np.concatenate([[-0.0, 0.0, np.nan, -np.inf, np.inf, 1e-30, -1e-30, -90.0, -700.0, 90.0, 700.0],
                        np.linspace(-30, 30, 6001), randn(100000, scale=4)])
    g = randn(x.size)
    for dtype, rtol in ((np.float32, 3e-6), (np.float64, 1e-13)):
        t = tg.Tensor(x.astype(dtype), requires_grad=True)
        out = F.silu(t)
        out.backward(g.astype(dtype))
        tt = torch.tensor(x.astype(dtype), requires_grad=True)
        expected = torch.nn.functional.silu(tt)
        expected.backward(torch.tensor(g.astype(dtype)))
        assert out.dtype == dtype and t.grad.dtype == dtype
        tiny = np.finfo(dtype).tiny  # torch flushes what falls below it (float32's exp of -90)
        np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=rtol, atol=tiny)
        # near x = -1.28, where silu' = 0, s + x s (1 - s) cancels: a few ulps of g there
        np.testing.assert_allclose(t.grad.data, tt.grad.numpy(), rtol=rtol,
                                   atol=4 * np.finfo(dtype).eps * np.abs(g).max())
    with pytest.raises(TypeError, match="silu: expected float32 or float64"):
        F.silu(tg.Tensor(np.arange(3)))


def test_swiglu_kernel_matches_torch_silu_times_the_other_half():
    """swiglu(h) = silu(a) * b for h = [a | b] against torch's silu(a) * b,
    forward and both halves' gradients, float32 and float64, over both tails
    and at -0.0, NaN and +-inf; a row of odd length is refused naming the op."""
    import torch
    a = np.concatenate([[-0.0, 0.0, np.nan, -np.inf, np.inf, 1e-30, -90.0, 90.0, 700.0],
                        np.linspace(-30, 30, 3001), randn(4000, scale=4)])
    h = np.concatenate([a[:7010], randn(7010)]).reshape(1, -1).repeat(3, axis=0)
    g = randn(3, 7010)
    for dtype, rtol in ((np.float32, 3e-6), (np.float64, 1e-13)):
        t = tg.Tensor(h.astype(dtype), requires_grad=True)
        out = F.swiglu(t)
        out.backward(g.astype(dtype))
        tt = torch.tensor(h.astype(dtype), requires_grad=True)
        ta, tb = tt.chunk(2, dim=-1)
        expected = torch.nn.functional.silu(ta) * tb
        expected.backward(torch.tensor(g.astype(dtype)))
        assert out.dtype == dtype and t.grad.dtype == dtype and out.shape == (3, 7010)
        tiny = np.finfo(dtype).tiny
        np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=rtol, atol=tiny)
        np.testing.assert_allclose(t.grad.data, tt.grad.numpy(), rtol=rtol,
                                   atol=4 * np.finfo(dtype).eps * np.abs(g).max() * np.abs(h[:, 7010:]).max())
    with pytest.raises(tg.ShapeError, match=r"swiglu: .* even; got shape \(2, 5\)"):
        F.swiglu(tg.Tensor(np.ones((2, 5))))
    with pytest.raises(TypeError, match="swiglu: expected float32 or float64"):
        F.swiglu(tg.Tensor(np.arange(4)))


def test_erfc_kernel_matches_scipy_in_float32_and_float64():
    """libm's erfc: float32 rounded once from float64, bit-equal to scipy's
    float32 erfc; float64 within a few ulps of scipy's (cephes), tails and
    special values included. Other dtypes go through math.erfc to float64."""
    from scipy.special import erfc
    x = np.concatenate([[-0.0, 0.0, np.nan, -np.inf, np.inf, 1e-30, 9.0, 26.0, -6.0], randn(200000, scale=4)])
    for dtype, rtol in ((np.float32, 0), (np.float64, 1e-13)):
        got = tg.Tensor(x.astype(dtype)).erfc().data
        assert got.dtype == dtype
        np.testing.assert_allclose(got, erfc(x.astype(dtype)), rtol=rtol, atol=0)
    ints = tg.Tensor(np.array([-1, 0, 2])).erfc().data
    assert ints.dtype == np.float64 and np.allclose(ints, erfc(np.array([-1.0, 0.0, 2.0])), rtol=1e-15)


def test_scatter_add_kernel_matches_np_add_at():
    """An embedding's gradient: rows repeated, negative, unused; float32 and
    float64 (the kernel) and int (numpy's reduceat) against np.add.at."""
    from tinygrad_attn.ops.movement import _scatter_add_rows
    from tinygrad_attn.reference.numpy_backward import embedding_backward
    local = np.random.default_rng(3)
    rows = local.integers(-50, 70, (32, 64))  # 70 + 50 possible rows of a 70-row table, some never hit
    for dtype in (np.float32, np.float64, np.int64):
        g = (local.standard_normal((32, 64, 3, 5)) * 10).astype(dtype)
        got = _scatter_add_rows((70, 3, 5), rows, g)
        expected = embedding_backward(np.where(rows < 0, rows + 70, rows), g, 70)
        assert got.dtype == dtype and got.shape == (70, 3, 5)
        np.testing.assert_array_equal(got, expected)  # the same additions in the same order
    assert not _scatter_add_rows((4, 2), np.zeros(0, np.int64), np.zeros((0, 2))).any()


def test_training_needs_no_scipy():
    """scipy is not a dependency. With it hidden from imports: a GELU encoder
    layer trains a step, fused and in its reference twin (whose GELU is
    erfc), the loops route multiplies, numpy_backward's GELU runs, and
    nothing imported scipy (Numba tries, at its first compile, and does without)."""
    script = """
import importlib.abc, sys
class NoScipy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "scipy":
            raise ImportError(f"{name} is hidden by the test")
sys.meta_path.insert(0, NoScipy())
import numpy as np
import tinygrad_attn as tg
from tinygrad_attn import nn, optim
from tinygrad_attn.reference import numpy_backward
from tinygrad_attn.kernels import blas, matmul
layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation="gelu", batch_first=True)
x = np.random.default_rng(0).standard_normal((2, 5, 16)).astype(np.float32)
opt = optim.AdamW(layer.parameters())
losses = []
for reference in (False, True):
    tg.set_reference_ops(reference)
    opt.zero_grad()
    loss = (layer(tg.Tensor(x)) ** 2).mean()
    loss.backward()
    losses.append(float(loss.data))
opt.step()
assert abs(losses[0] - losses[1]) < 1e-5, losses
a, b = np.ones(6 * 4, np.float32), np.ones(4 * 3, np.float32)
out, off = np.empty((1, 6, 3), np.float32), np.zeros(1, np.int64)
matmul._matmul(blas.library("loops"), (a, off, 4), False, (b, off, 3), False, 6, 3, 4, 6, 4, np.zeros(0, np.float32),
               out, 0, 1)
assert np.all(out == 4) and blas.library_name("scipy's") == "loops"
assert numpy_backward.gelu_forward(np.array([-1.0, 0.0, 2.0])).shape == (3,)
assert not any(m.split(".")[0] == "scipy" for m in sys.modules), [m for m in sys.modules if "scipy" in m]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_fallback_blas_follows_the_thread_policy(tmp_path):
    """scipy's BLAS (the fallback) is loaded only when it is chosen, after the
    thread policy listed the libraries: it is listed then, gets the count an
    earlier set_num_threads asked for, and runs on one thread inside our jobs
    (the calling thread's and the workers')."""
    script = """
import numpy as np, threadpoolctl
import tinygrad_attn as tg
from tinygrad_attn.kernels import blas, matmul, threads
tg.set_num_threads(2)
before = {c.filepath for c in threads._blas.controllers()}
fallback = blas.library("scipy's")
after = {c.filepath: c for c in threads._blas.controllers()}
new = [after[p] for p in after if p not in before]
assert len(new) == 1 and new[0].get_num_threads() == 2, (before, list(after))
local = threads._blas.local_setters()
assert local is not None and len(local) == len(after)  # a per-thread setter for each library
seen = []
def spy(*args):
    seen.append(tuple(fn(1) for fn in local))  # each setter returns what this thread had
    return kernel(*args)
kernel = matmul._matmul
a, b = np.ones(600 * 700, np.float32), np.ones(700 * 700, np.float32)
out = np.empty((1, 600, 700), np.float32)
off = np.zeros(1, np.int64)
threads.parallel_for(spy, 4, fallback, (a, off, 700), False, (b, off, 700), False, 600, 700, 700, 150, 700,
                     np.zeros(0, np.float32), out, item_size=1 << 20, blas=True)
assert len(seen) == 4 and set(seen) == {(1,) * len(local)}, seen
assert np.allclose(out, 700)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# --- Softmax, cross-entropy and attention with -inf entries (masked classes, masked keys)


INF = np.inf
LOGITS = np.array([[-INF, 0.0, 1.0, 2.0], [0.5, -INF, -INF, 3.0], [1.0, 2.0, 3.0, 4.0]])


def _grad_of(fn, x, weights):
    """d sum(fn(x) * weights) / dx over the finite outputs, with x a fresh leaf."""
    t = tg.tensor(x, requires_grad=True)
    y = fn(t)
    (y.masked_fill(tg.tensor(np.isinf(y.data)), 0.0) * tg.tensor(weights)).sum().backward()
    return y.data, t.grad.data


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("target", [[2, 0, 1], [0, 3, 1]])  # the second hits a -inf class
def test_cross_entropy_with_minus_inf_logits_matches_torch(dtype, label_smoothing, target):
    torch = pytest.importorskip("torch")
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
    torch = pytest.importorskip("torch")
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
    torch = pytest.importorskip("torch")
    x = np.array([[-INF, -INF], [0.0, 1.0]], np.float32)
    y = fn(tg.tensor(x), dim=-1).data
    expected = getattr(torch, fn.__name__)(torch.tensor(x), -1).numpy()
    assert np.isnan(y[0]).all() and np.isnan(expected[0]).all()
    np.testing.assert_allclose(y[1], expected[1], rtol=1e-6)
    assert np.isnan(F.cross_entropy(tg.tensor(x[:1]), np.array([0])).item())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_with_minus_inf_in_a_float_mask_matches_torch(dtype):
    torch = pytest.importorskip("torch")
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


# ------------------------- Attention weights with aliased query, key and value


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


# ----------------------------------- Empty and integer inputs of the fused ops


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


# ---------------------------------------------- Bad arguments of cross_entropy

@pytest.mark.parametrize("call,error,message", [
    (lambda: F.cross_entropy(tg.randn(2, 3), np.array([0, 1]), ignore_index=2 ** 70), ValueError,
     r"cross_entropy: ignore_index 1180591620717411303424 is outside the int64 range"),
    (lambda: F.cross_entropy(tg.randn(2, 3), np.array([0, 1]), ignore_index=1.5), TypeError,
     r"cross_entropy: ignore_index must be an integer, got 1.5"),
])
def test_bad_arguments_get_a_message_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_plain_python_gemm_overwrites_c_when_beta_is_zero():
    """The body NUMBA_DISABLE_JIT runs: C's old contents (fresh memory may hold
    NaN) must not leak into C = A B, as in BLAS and the compiled loops."""
    from tinygrad_attn.kernels import blas
    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    c = np.full(8, np.nan)
    blas.gemm(None, False, False, 2, 4, 3, 1.0, a.reshape(-1), 3, b.reshape(-1), 4, 0.0, c, 4)
    np.testing.assert_array_equal(c.reshape(2, 4), a @ b)
