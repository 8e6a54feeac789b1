"""RMSNorm, rotary embeddings and SiLU: the fused kernels against their
reference versions and PyTorch, in float32 and float64; determinism across
thread counts; PyTorch's eps=None rule; errors.

(The gradcheck cases are in tests/test_ops.py, the numpy twins' tests in
tests/test_numpy_backward.py.)"""
import numpy as np
import pytest
import torch

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import kernels, nn
from tinygrad_attn.reference import numpy_backward as nb

from .test_kernels import assert_same

rng = np.random.default_rng(21)


def randn(*shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------ RMSNorm

@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("norm_shape", [(7,), (5, 7)])
def test_rms_norm_matches_reference(weight, norm_shape):
    x = np.ascontiguousarray(randn(7, 5, 3).transpose(2, 1, 0)) * 2 + 1
    arrays = (x, randn(*norm_shape)) if weight else (x,)
    assert_same(lambda x, *w: F.rms_norm(x, norm_shape, *w, eps=1e-3), arrays)  # fused, then its twin


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-14)])
def test_rms_norm_matches_pytorch(dtype, tol):
    """F.rms_norm and nn.RMSNorm against torch's, values and gradients, with
    eps given and eps=None (the dtype's machine epsilon, PyTorch's rule)."""
    x, w, g = randn(12, 64, 128, dtype=dtype), randn(128, dtype=dtype), randn(12, 64, 128, dtype=dtype)
    for eps in (1e-5, None):
        xt, wt = tg.Tensor(x, requires_grad=True), tg.Tensor(w, requires_grad=True)
        y = F.rms_norm(xt, (128,), wt, eps=eps)
        y.backward(tg.Tensor(g))
        X, W = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        Y = torch.nn.functional.rms_norm(X, (128,), W, eps=eps)
        Y.backward(torch.tensor(g))
        assert y.dtype == dtype and xt.grad.dtype == dtype and wt.grad.dtype == dtype
        np.testing.assert_allclose(y.data, Y.detach().numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(xt.grad.data, X.grad.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(wt.grad.data, W.grad.numpy(), rtol=tol * 10, atol=tol * 100)
    ours, theirs = nn.RMSNorm((64, 128), dtype=dtype), torch.nn.RMSNorm((64, 128), dtype=getattr(torch, str(np.dtype(dtype))))
    assert repr(ours) == repr(theirs) and ours.eps is None and theirs.eps is None
    ours.weight.data[:] = theirs.weight.detach().numpy() + w  # a weight other than ones
    with torch.no_grad():
        theirs.weight += torch.tensor(w)
    np.testing.assert_allclose(ours(tg.Tensor(x)).data, theirs(torch.tensor(x)).detach().numpy(), rtol=tol, atol=tol)
    assert nn.RMSNorm(4, elementwise_affine=False).weight is None
    assert list(dict(nn.RMSNorm(4).named_parameters())) == list(dict(torch.nn.RMSNorm(4).named_parameters()))


def test_rms_norm_eps_none_is_the_dtypes_machine_epsilon():
    """A row of tiny values: eps decides the output, so the rule shows."""
    x = np.full((1, 4), 1e-9)
    for dtype in (np.float32, np.float64):
        got = F.rms_norm(tg.Tensor(x.astype(dtype)), 4).data
        expected = x / np.sqrt(x * x + np.finfo(dtype).eps)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert not np.allclose(got, x / np.sqrt(x * x + 1e-6), rtol=1e-2)  # another eps gives another answer


def test_rms_norm_overflow_gives_the_right_values_where_pytorch_gives_0():
    """A mean square that overflows float32: PyTorch returns x * 1/sqrt(inf) = 0;
    the normalised values are 1 and 1, and that is what we return (rows too
    large to square: tests/test_kernels.py)."""
    x = np.array([[3e38, 3e38], [1.0, 2.0]], np.float32)
    ours = F.rms_norm(tg.Tensor(x), 2).data
    theirs = torch.nn.functional.rms_norm(torch.tensor(x), (2,)).numpy()
    np.testing.assert_array_equal(theirs[0], [0.0, 0.0])
    np.testing.assert_allclose(ours[0], [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-6)


def test_rms_norm_backward_differs_from_layer_norm_by_the_mean_term():
    """Negative control of the formula: LayerNorm's mean(gw) term is not in RMSNorm's dx."""
    x, w, g = randn(3, 6), randn(6), randn(3, 6)
    dx, _ = nb.rms_norm_backward(x, w, g)
    rstd = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    with_mean_term = dx - rstd * (g * w).mean(-1, keepdims=True)
    assert np.abs(dx - with_mean_term).max() > 1e-3


# ------------------------------------------------------------------ rotary

def llama2c_freqs(dim, end, theta=10000.0):
    """llama2.c's precompute_freqs_cis, in torch (its model.py's arithmetic)."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    angles = torch.outer(torch.arange(end), freqs).float()
    return torch.cos(angles), torch.sin(angles)


def llama2c_rotary(x, cos, sin):
    """llama2.c's apply_rotary_emb for one tensor (B, T, H, hd), in torch, in x's dtype."""
    xr, xi = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).flatten(3)


def test_precompute_freqs_cis_is_llama2cs():
    cos, sin = nn.precompute_freqs_cis(64, 256)
    tcos, tsin = llama2c_freqs(64, 256)
    assert cos.dtype == np.float32 and cos.shape == (256, 32)
    np.testing.assert_allclose(cos.data, tcos.numpy(), rtol=0, atol=6e-8)  # one unit in the last place
    np.testing.assert_allclose(sin.data, tsin.numpy(), rtol=0, atol=6e-8)
    c5, s5 = nn.precompute_freqs_cis(4, 3, theta=5.0)  # f = 1, 1/sqrt(5)
    np.testing.assert_allclose(c5.data, np.cos(np.outer(np.arange(3), [1, 5 ** -0.5])), rtol=1e-6)
    with pytest.raises(ValueError, match="precompute_freqs_cis.*even"):
        nn.precompute_freqs_cis(5, 3)


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-15)])
def test_rotary_matches_llama2c_and_reference(dtype, tol):
    """Values and gradients against llama2.c's formula run by torch autograd,
    and the fused op against its composite."""
    cos, sin = nn.precompute_freqs_cis(32, 64)
    x, g = randn(12, 64, 4, 32, dtype=dtype), randn(12, 64, 4, 32, dtype=dtype)
    xt = tg.Tensor(x, requires_grad=True)
    y = F.apply_rotary_emb(xt, cos, sin)
    y.backward(tg.Tensor(g))
    X = torch.tensor(x, requires_grad=True)
    Y = llama2c_rotary(X, torch.tensor(cos.data), torch.tensor(sin.data))
    Y.backward(torch.tensor(g))
    assert y.dtype == dtype and xt.grad.dtype == dtype
    np.testing.assert_allclose(y.data, Y.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(xt.grad.data, X.grad.numpy(), rtol=tol, atol=tol)
    small = (randn(2, 5, 3, 8), randn(5, 4), randn(5, 4))
    assert_same(F.apply_rotary_emb, small)  # fused, then its composite twin


def test_rotary_keeps_norms_and_scores_depend_on_relative_position():
    """A rotation keeps each pair's length; q_t . k_s is the same for every
    (t, s) at the same distance t - s. (float64 tables: llama2.c's float32
    ones keep cos^2 + sin^2 = 1 to float32 rounding only.)"""
    angles = np.outer(np.arange(40), 10000.0 ** (-np.arange(0, 16, 2) / 16))
    cos, sin = tg.Tensor(np.cos(angles)), tg.Tensor(np.sin(angles))
    q, k = randn(1, 1, 1, 16), randn(1, 1, 1, 16)
    def at(x, t):
        return F.apply_rotary_emb(tg.Tensor(x), cos.data[t:t + 1], sin.data[t:t + 1]).data.reshape(-1)
    np.testing.assert_allclose(np.linalg.norm(at(q, 7)), np.linalg.norm(q), rtol=1e-12)
    scores = {(t, s): at(q, t) @ at(k, s) for t in range(0, 40, 3) for s in range(0, 40, 5)}
    for (t, s), score in scores.items():
        for (t2, s2), other in scores.items():
            if t - s == t2 - s2:
                assert score == pytest.approx(other, rel=1e-12, abs=1e-12)
    assert abs(scores[(3, 0)] - scores[(6, 0)]) > 1e-3  # not a constant: the distance matters


def test_rotary_embedding_module_continues_from_start_pos():
    rope = nn.RotaryEmbedding(8, 10)
    assert dict(rope.state_dict()) == {} and not list(rope.parameters())
    x = randn(2, 10, 3, 8)
    full = rope(tg.Tensor(x)).data
    np.testing.assert_array_equal(rope(tg.Tensor(x[:, 4:7]), start_pos=4).data, full[:, 4:7])
    with pytest.raises(tg.ShapeError, match="RotaryEmbedding"):
        rope(tg.Tensor(x[:, :5]), start_pos=6)
    assert rope.double().freqs_cos.dtype == np.float64


# ------------------------------------------------------------------ SiLU

@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-15)])
def test_silu_matches_pytorch(dtype, tol):
    x, g = randn(5, 7, dtype=dtype) * 4, randn(5, 7, dtype=dtype)
    for ours_fn, theirs_fn in ((F.silu, torch.nn.functional.silu), (nn.SiLU(), torch.nn.SiLU())):
        xt = tg.Tensor(x, requires_grad=True)
        y = ours_fn(xt)
        y.backward(tg.Tensor(g))
        X = torch.tensor(x, requires_grad=True)
        Y = theirs_fn(X)
        Y.backward(torch.tensor(g))
        assert y.dtype == dtype
        np.testing.assert_allclose(y.data, Y.detach().numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(xt.grad.data, X.grad.numpy(), rtol=tol, atol=tol)
    with pytest.raises(NotImplementedError, match="silu.*inplace"):
        F.silu(tg.Tensor(x), inplace=True)
    with pytest.raises(NotImplementedError, match="SiLU.*inplace"):
        nn.SiLU(inplace=True)


# ------------------------------------------------------------------ kernels

def _rms_and_rotary(threads_count):
    kernels.set_num_threads(threads_count)
    try:
        local = np.random.default_rng(5)
        x = local.standard_normal((12, 64, 4, 32)).astype(np.float32)
        cos, sin = nn.precompute_freqs_cis(32, 64)
        results = []
        for case in (lambda t: F.rms_norm(t, 32, t[0, 0, 0] * 0 + 1.5, eps=1e-5),
                     lambda t: F.rms_norm(t, (4, 32)),
                     lambda t: F.apply_rotary_emb(t, cos, sin)):
            t = tg.Tensor(x, requires_grad=True)
            out = case(t)
            out.backward(np.cos(np.arange(out.numel())).reshape(out.shape).astype(np.float32))
            results.append((out.data.copy(), t.grad.data.copy()))
        return results
    finally:
        kernels.set_num_threads(None)


def test_rms_norm_and_rotary_are_bit_identical_across_thread_counts():
    one, two, four = _rms_and_rotary(1), _rms_and_rotary(2), _rms_and_rotary(4)
    for a, b, c in zip(one, two, four):
        for x, y, z in zip(a, b, c):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, z)


def test_bad_inputs_name_the_op_and_shapes():
    t = lambda *shape: tg.Tensor(np.ones(shape, np.float32))
    with pytest.raises(tg.ShapeError, match=r"rms_norm.*\(2, 3\).*\(4,\)"):
        F.rms_norm(t(2, 3), (4,))
    with pytest.raises(tg.ShapeError, match=r"rms_norm.*\(2, 3\).*weight \(2,\)"):
        F.rms_norm(t(2, 3), (3,), t(2))
    with pytest.raises(TypeError, match="rms_norm.*int64"):
        F.rms_norm(tg.Tensor(np.ones((2, 3), np.int64)), 3, t(3))
    with pytest.raises(tg.ShapeError, match=r"apply_rotary_emb.*\(2, 5, 3, 8\).*\(4, 4\)"):
        F.apply_rotary_emb(t(2, 5, 3, 8), t(4, 4), t(4, 4))
    with pytest.raises(tg.ShapeError, match=r"apply_rotary_emb.*\(5, 3, 7\)"):
        F.apply_rotary_emb(t(5, 3, 7), t(5, 3), t(5, 3))
