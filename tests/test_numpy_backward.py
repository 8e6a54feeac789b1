"""tinygrad_attn.reference.numpy_backward, the fused ops' backward in plain numpy,
equals the backward the fused ops really run.

Each test calls the op through Tensor and backward() with a random upstream
gradient, in float64, on hypothesis-drawn shapes (broadcasting, masks,
non-contiguous inputs), and compares every input gradient with the numpy
function's to 1e-12. A negative control shows the comparison catches a
wrong formula; a last test that every fused op points to its numpy twin.
"""
import inspect
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn.autograd import Function
from tinygrad_attn.reference import numpy_backward as nb
from tinygrad_attn.ops.attention import PackedSelfAttention, ScaledDotProductAttention
from tinygrad_attn.ops.dropout import DropoutOp

from . import references as ref
from .strategies import arrays, attention_inputs, packed_attention_inputs, shapes

FUSED_OPS = ("LinearOp", "Softmax", "LogSoftmax", "LayerNormOp", "CrossEntropy", "DropoutOp",
             "ScaledDotProductAttention", "AttentionWeights", "PackedSelfAttention", "Gelu", "RMSNormOp",
             "RotaryOp")


def backward_of(fn, arrays, seed):
    """(output, upstream gradient G, input gradients) of fn(*tensors) with a
    random G of the output's shape: the gradients are those of sum(G * out)."""
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    grad = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(tg.Tensor(grad))
    return out.data, grad, [t.grad.data if t.grad is not None else np.zeros_like(a) for t, a in zip(tensors, arrays)]


def assert_close(ours, fused, tol=1e-12):
    """Each numpy gradient equals the op's, to tol on the scale of the array."""
    assert len(ours) == len(fused)
    for a, b in zip(ours, fused):
        assert np.shape(a) == np.shape(b)
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max(initial=0)))


seeds = st.integers(0, 2**32 - 1)


@given(lead=shapes(min_dims=0, max_dims=3, max_side=3), sizes=st.tuples(st.integers(1, 5), st.integers(1, 5)),
       data=st.data(), seed=seeds)
def test_linear_backward(lead, sizes, data, seed):
    n_in, n_out = sizes
    x, w, b = data.draw(arrays(lead + (n_in,))), data.draw(arrays((n_out, n_in))), data.draw(arrays((n_out,)))
    out, grad, fused = backward_of(F.linear, (x, w, b), seed)
    np.testing.assert_allclose(nb.linear_forward(x, w, b), out, rtol=1e-12, atol=1e-12)
    assert_close(nb.linear_backward(x, w, grad), fused)


@pytest.mark.parametrize("log", [False, True])
@given(shape=shapes(min_dims=1), data=st.data(), seed=seeds)
def test_softmax_and_log_softmax_backward(log, shape, data, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = data.draw(arrays(shape, low=-4.0, high=4.0))
    forward, backward = ((nb.log_softmax_forward, nb.log_softmax_backward) if log
                         else (nb.softmax_forward, nb.softmax_backward))
    out, grad, (fused,) = backward_of(lambda t: (F.log_softmax if log else F.softmax)(t, dim=axis), (x,), seed)
    np.testing.assert_allclose(forward(x, axis), out, rtol=1e-12, atol=1e-12)
    assert_close([backward(out, grad, axis)], [fused])


@pytest.mark.parametrize("dtype,big,rtol", [(np.float32, 1e30, 1e-5), (np.float64, 1e200, 1e-12)])
def test_layer_norm_forward_and_backward_on_rows_too_large_to_square(dtype, big, rtol):
    """Rows whose squares overflow: the numpy versions give the finite, right
    values (torch in float64 on the same rows), as the kernel does."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = ref.huge_rows(dtype, big)
    w, b, g = rng.standard_normal(16).astype(dtype), rng.standard_normal(16).astype(dtype), \
        rng.standard_normal(x.shape).astype(dtype)
    y_ref, *grads_ref = ref.torch_layer_norm(x, w, b, g)
    ref.assert_rows_close(nb.layer_norm_forward(x, w, b), y_ref, rtol)
    for ours, expected in zip(nb.layer_norm_backward(x, w, g), grads_ref):
        ref.assert_rows_close(ours, expected, rtol)


@given(shape=shapes(min_dims=1), data=st.data(), seed=seeds)
def test_layer_norm_backward(shape, data, seed):
    k = data.draw(st.integers(1, len(shape)))
    eps = data.draw(st.sampled_from([1e-5, 0.1]))
    norm_shape = shape[len(shape) - k:]
    x, w, b = data.draw(arrays(shape)), data.draw(arrays(norm_shape)), data.draw(arrays(norm_shape))
    out, grad, fused = backward_of(lambda x, w, b: F.layer_norm(x, norm_shape, w, b, eps=eps), (x, w, b), seed)
    np.testing.assert_allclose(nb.layer_norm_forward(x, w, b, k, eps), out, rtol=1e-12, atol=1e-12)
    assert_close(nb.layer_norm_backward(x, w, grad, k, eps), fused)


@given(layout=st.sampled_from(["C", "NC", "NCd"]), n=st.integers(1, 4), n_classes=st.integers(1, 5),
       extra=shapes(min_dims=1, max_dims=2, max_side=3), smoothing=st.sampled_from([0.0, 0.1, 0.3]),
       reduction=st.sampled_from(["mean", "sum", "none"]), ignore_index=st.sampled_from([-100, 0]),
       data=st.data(), seed=seeds)
def test_cross_entropy_backward(layout, n, n_classes, extra, smoothing, reduction, ignore_index, data, seed):
    extra = extra if layout == "NCd" else ()
    logits_shape = {"C": (n_classes,), "NC": (n, n_classes), "NCd": (n, n_classes) + extra}[layout]
    target_shape = {"C": (), "NC": (n,), "NCd": (n,) + extra}[layout]
    rng = np.random.default_rng(seed)
    target = np.where(rng.random(target_shape) < 0.3, ignore_index, rng.integers(0, n_classes, target_shape))
    target.flat[0] = n_classes - 1  # one target kept: a mean over none is NaN
    kwargs = dict(ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction)
    logits = data.draw(arrays(logits_shape, low=-4.0, high=4.0))
    out, grad, fused = backward_of(lambda t: F.cross_entropy(t, target, **kwargs), (logits,), seed)
    np.testing.assert_allclose(nb.cross_entropy_forward(logits, target, **kwargs), out, rtol=1e-12, atol=1e-12)
    assert_close([nb.cross_entropy_backward(logits, target, grad, **kwargs)], fused)


@given(shape=shapes(), p=st.sampled_from([0.0, 0.2, 0.5, 1.0]), key=seeds, data=st.data(), seed=seeds)
def test_dropout_backward(shape, p, key, data, seed):
    x = data.draw(arrays(shape))
    keep = ref.dropout_keep(shape, p, key)  # the kernel's mask for this key
    out, grad, fused = backward_of(lambda t: DropoutOp.apply(t, p=p, seed=key), (x,), seed)
    np.testing.assert_allclose(nb.dropout_forward(x, keep, p), out, rtol=1e-15, atol=0)
    assert_close([nb.dropout_backward(grad, keep, p)], fused)


@given(inputs=attention_inputs(), p=st.sampled_from([0.0, 0.0, 0.4]), key=seeds, seed=seeds)
def test_attention_backward(inputs, p, key, seed):
    """Broadcast batch axes, boolean and float masks (a float mask gets a
    gradient), causal with or without a mask, rows with no key, dropout."""
    q, k, v, mask, causal, scale = inputs
    keep = ref.attention_keep(q, k, v, mask, p, key)
    kwargs = dict(is_causal=causal, scale=scale, dropout_p=p, seed=key)
    differentiable_mask = mask is not None and mask.dtype != bool
    if differentiable_mask:
        fn, arrays_in = (lambda q, k, v, m: ScaledDotProductAttention.apply(q, k, v, m, **kwargs)), (q, k, v, mask)
    else:
        extra = () if mask is None else (tg.Tensor(mask),)
        fn, arrays_in = (lambda q, k, v: ScaledDotProductAttention.apply(q, k, v, *extra, **kwargs)), (q, k, v)
    out, grad, fused = backward_of(fn, arrays_in, seed)
    np.testing.assert_allclose(nb.attention_forward(q, k, v, mask, causal, scale, keep, p)[0], out,
                               rtol=1e-12, atol=1e-12)
    dq, dk, dv, dmask = nb.attention_backward(q, k, v, grad, mask, causal, scale, keep, p)
    assert_close([dq, dk, dv] + ([dmask] if differentiable_mask else []), fused)
    assert (dmask is None) == (not differentiable_mask)


@given(inputs=attention_inputs(), seed=seeds)
def test_attention_backward_through_the_weights(inputs, seed):
    """need_weights=True: the gradient reaching P itself (AttentionWeights) adds into dP."""
    q, k, v, mask, causal, scale = inputs
    causal = causal and mask is None  # F, as PyTorch, refuses an attn_mask with is_causal
    tensors = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
    out, weights = F.scaled_dot_product_attention(*tensors, mask, is_causal=causal, scale=scale, need_weights=True)
    rng = np.random.default_rng(seed)
    grad_out, grad_weights = rng.standard_normal(out.shape), rng.standard_normal(weights.shape)
    ((out * tg.Tensor(grad_out)).sum() + (weights * tg.Tensor(grad_weights)).sum()).backward()
    ours = nb.attention_backward(q, k, v, grad_out, mask, causal, scale, grad_weights=grad_weights)
    assert_close(ours[:3], [t.grad.data for t in tensors])


@given(inputs=packed_attention_inputs(), p=st.sampled_from([0.0, 0.0, 0.4]), key=seeds, seed=seeds)
def test_packed_self_attention_backward(inputs, p, key, seed):
    qkv, H, mask, causal, scale = inputs
    B, T = qkv.shape[:2]
    keep = ref.dropout_keep((B, H, T, T), p, key)  # the weights' shape
    kwargs = dict(num_heads=H, is_causal=causal, scale=scale, dropout_p=p, seed=key)
    differentiable_mask = mask is not None and mask.dtype != bool
    if differentiable_mask:
        fn, arrays_in = (lambda qkv, m: PackedSelfAttention.apply(qkv, m, **kwargs)), (qkv, mask)
    else:
        extra = () if mask is None else (tg.Tensor(mask),)
        fn, arrays_in = (lambda qkv: PackedSelfAttention.apply(qkv, *extra, **kwargs)), (qkv,)
    out, grad, fused = backward_of(fn, arrays_in, seed)
    np.testing.assert_allclose(nb.packed_self_attention_forward(qkv, H, mask, causal, scale, keep, p)[0], out,
                               rtol=1e-12, atol=1e-12)
    dqkv, dmask = nb.packed_self_attention_backward(qkv, H, grad, mask, causal, scale, keep, p)
    assert_close([dqkv] + ([dmask] if differentiable_mask else []), fused)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@given(shape=shapes(), data=st.data(), seed=seeds)
def test_gelu_backward(approximate, shape, data, seed):
    x = data.draw(arrays(shape, low=-4.0, high=4.0))
    out, grad, fused = backward_of(lambda t: F.gelu(t, approximate=approximate), (x,), seed)
    np.testing.assert_allclose(nb.gelu_forward(x, approximate), out, rtol=1e-12, atol=1e-15)
    assert_close([nb.gelu_backward(x, grad, approximate)], fused)


@given(index_shape=shapes(min_dims=0, max_dims=3), n=st.integers(1, 5), dim=st.integers(1, 4),
       padding=st.booleans(), data=st.data(), seed=seeds)
def test_embedding_backward(index_shape, n, dim, padding, data, seed):
    indices = np.random.default_rng(seed).integers(0, n, index_shape)  # rows picked more than once, too
    padding_idx = int(indices.flat[0]) if padding and indices.size else None
    weight = data.draw(arrays((n, dim)))
    out, grad, fused = backward_of(lambda w: F.embedding(tg.Tensor(indices), w, padding_idx), (weight,), seed)
    np.testing.assert_allclose(nb.embedding_forward(weight, indices), out, rtol=0, atol=0)
    assert_close([nb.embedding_backward(indices, grad, n, padding_idx)], fused)


def test_the_comparison_catches_a_wrong_formula():
    """Negative control: the same comparison rejects a backward with one
    term dropped (layer norm without the variance term) or one transpose
    missing (attention's dK = scale dS Q instead of scale dS^T Q)."""
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((3, 5)), rng.standard_normal(5), rng.standard_normal(5)
    _, grad, fused = backward_of(lambda x, w, b: F.layer_norm(x, 5, w, b), (x, w, b), 1)
    xhat, rstd, axes = nb._normalized(x, 1, 1e-5)
    gw = grad * w
    no_variance_term = rstd * (gw - gw.mean(axis=-1, keepdims=True))
    assert_close([nb.layer_norm_backward(x, w, grad)[0]], fused[:1])
    with pytest.raises(AssertionError):
        assert_close([no_variance_term], fused[:1])

    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    _, grad, fused = backward_of(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), 2)
    P, scale = nb._attention_weights(q, k, None, False, None)
    dS = nb.softmax_backward(P, grad @ np.swapaxes(v, -1, -2))
    assert_close([scale * (np.swapaxes(dS, -1, -2) @ q)], fused[1:2])
    with pytest.raises(AssertionError):
        assert_close([scale * (dS @ q)], fused[1:2])


def test_every_fused_op_points_to_its_numpy_twin():
    """Each fused op's docstring names a function of numpy_backward that
    exists; every backward there explains its derivative in a docstring."""
    for name in FUSED_OPS:
        doc = Function.registry[name].__doc__
        pointed = re.findall(r"tinygrad_attn\.reference\.numpy_backward\.(\w+)", doc)
        assert pointed, f"{name}'s docstring does not point to tinygrad_attn.reference.numpy_backward"
        for function in pointed:
            assert callable(getattr(nb, function, None)), f"{name} points to a missing {function}"
    public = [f for n, f in inspect.getmembers(nb, inspect.isfunction) if not n.startswith("_")
              and f.__module__ == nb.__name__]
    for function in public:
        assert (function.__doc__ or "").strip(), function.__name__
        if function.__name__.endswith("_backward"):
            assert "dL/d" in function.__doc__, f"{function.__name__} does not write out its derivative"
    assert {f.__name__ for f in public if f.__name__.endswith("_backward")} == {
        "linear_backward", "softmax_backward", "log_softmax_backward", "layer_norm_backward",
        "cross_entropy_backward", "dropout_backward", "attention_backward", "packed_self_attention_backward",
        "gelu_backward", "embedding_backward", "rms_norm_backward", "rotary_backward"}


@given(shape=shapes(min_dims=1), data=st.data(), seed=seeds)
def test_rms_norm_backward(shape, data, seed):
    k = data.draw(st.integers(1, len(shape)))
    eps = data.draw(st.sampled_from([1e-6, 0.1]))
    norm_shape = shape[len(shape) - k:]
    x, w = data.draw(arrays(shape)), data.draw(arrays(norm_shape))
    out, grad, fused = backward_of(lambda x, w: F.rms_norm(x, norm_shape, w, eps=eps), (x, w), seed)
    np.testing.assert_allclose(nb.rms_norm_forward(x, w, k, eps), out, rtol=1e-12, atol=1e-12)
    assert_close(nb.rms_norm_backward(x, w, grad, k, eps), fused)


@given(lead=shapes(min_dims=0, max_dims=2, max_side=3), sizes=st.tuples(*(st.integers(1, 4),) * 3),
       data=st.data(), seed=seeds)
def test_rotary_backward(lead, sizes, data, seed):
    T, H, half = sizes
    x = data.draw(arrays(lead + (T, H, 2 * half)))
    cos, sin = data.draw(arrays((T, half))), data.draw(arrays((T, half)))
    out, grad, fused = backward_of(F.apply_rotary_emb, (x, cos, sin), seed)
    np.testing.assert_allclose(nb.rotary_forward(x, cos, sin), out, rtol=1e-12, atol=1e-12)
    assert_close(nb.rotary_backward(x, cos, sin, grad), fused)
