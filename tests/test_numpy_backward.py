"""tinygrad_attn.reference.numpy_backward, the fused ops' backward in plain numpy,
equals the backward the fused ops really run.

Each fused op (every op with a composite twin, from the registry) runs on
its gradcheck cases of tests/test_ops.py, through Tensor and backward()
with a random upstream gradient, in float64, and every input gradient is
compared with the numpy twin's (the case's `backward=`) to 1e-12. A
negative control shows the comparison catches a wrong formula; a last
test that every fused op points to its numpy twin.
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

from . import references as ref
from .strategies import arrays, attention_inputs, shapes
from .test_ops import CASES

FUSED_OPS = sorted(name for name, op in Function.registry.items() if op.composite is not None)
FUSED_CASE_IDS = [(name, i) for name in FUSED_OPS for i in range(len(CASES.get(name, ())))]


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


@pytest.mark.parametrize("name,i", FUSED_CASE_IDS, ids=[f"{n}-{i}" for n, i in FUSED_CASE_IDS])
@given(data=st.data(), seed=seeds)
def test_each_fused_ops_backward_is_its_numpy_twin(name, i, data, seed):
    """Every fused op (one with a composite twin) on its gradcheck cases of
    tests/test_ops.py, which give the numpy twin's gradients (`backward=`):
    broadcasting, masks, non-contiguous inputs, dropout."""
    case = data.draw(CASES[name][i])
    assert case.backward is not None, f"{name}: its case in tests/test_ops.py gives no numpy backward (backward=)"
    out, grad, fused = backward_of(case.fn, case.arrays, seed)
    assert_close(case.backward(*case.arrays, grad), fused)


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
    named = {f for op in Function.registry.values()
             for f in re.findall(r"tinygrad_attn\.reference\.numpy_backward\.(\w+)", op.__doc__ or "")}
    named.add("embedding_backward")  # GetItem's, named by functional.embedding
    assert {f.__name__ for f in public if f.__name__.endswith("_backward")} <= named
