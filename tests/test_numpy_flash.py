"""tinygrad_attn.reference.numpy_flash, attention the FlashAttention way (an
online softmax over blocks of keys, a backward that recomputes P from the
saved log-sum-exp), gives the fused attention's output and gradients.

Each test runs F.scaled_dot_product_attention (the fused Numba op) forward
and backward on hypothesis-drawn inputs in float64 (broadcast batch axes,
boolean and float masks, causal, queries with no key, block sizes that do
and do not divide the number of keys) and compares with the numpy version
to 1e-12. A negative control: a backward that takes the softmax's row sum
over each block of keys alone, instead of D = rowsum(dO * O) over all of
them, is rejected.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn.reference import numpy_backward as nb
from tinygrad_attn.reference import numpy_flash as nf

from .strategies import attention_inputs
from .test_numpy_backward import assert_close

seeds = st.integers(0, 2**32 - 1)


def fused(q, k, v, mask, causal, scale, seed):
    """Output and input gradients of F.scaled_dot_product_attention for a random upstream G."""
    tensors = [tg.Tensor(a, requires_grad=True) for a in (q, k, v)]
    differentiable = mask is not None and mask.dtype != bool
    m = tg.Tensor(mask, requires_grad=True) if differentiable else mask
    causal = causal and mask is None  # F, as PyTorch, refuses an attn_mask with is_causal
    out = F.scaled_dot_product_attention(*tensors, m, is_causal=causal, scale=scale)
    grad = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(tg.Tensor(grad))
    grads = [t.grad.data for t in tensors] + ([m.grad.data] if differentiable else [])
    return out.data, grad, grads, causal


def scores(q, k, mask, causal, scale):
    """S = scale * Q K^T with the mask applied (-inf where a query may not attend), broadcast."""
    S = (1 / np.sqrt(q.shape[-1]) if scale is None else scale) * (q @ np.swapaxes(k, -1, -2))
    if causal:
        S = np.where(np.triu(np.ones(S.shape[-2:], bool), k=1), -np.inf, S)
    if mask is not None:
        S = np.where(mask, S, -np.inf) if mask.dtype == bool else S + mask
    return S


@given(inputs=attention_inputs(), block_size=st.integers(1, 5), seed=seeds)
def test_flash_forward_and_backward_equal_the_fused_attention(inputs, block_size, seed):
    q, k, v, mask, causal, scale = inputs
    out, grad, grads, causal = fused(q, k, v, mask, causal, scale, seed)
    o, lse = nf.flash_attention_forward(q, k, v, mask, causal, scale, block_size)
    np.testing.assert_allclose(o, out, rtol=1e-12, atol=1e-12)
    # lse is log sum_j e^{S_ij} (-inf for a query with no key), and e^{S - lse} gives P back
    S = scores(q, k, mask, causal, scale)
    with np.errstate(divide="ignore"):
        expected = np.log(np.exp(S).sum(-1))
    shape = np.broadcast_shapes(lse.shape, expected.shape)  # V's batch axes are in lse's too
    lse_full, expected = np.broadcast_to(lse, shape), np.broadcast_to(expected, shape)
    has_key = np.isfinite(expected)
    np.testing.assert_array_equal(np.isfinite(lse_full), has_key)
    np.testing.assert_allclose(lse_full[has_key], expected[has_key], rtol=1e-12, atol=1e-12)
    S, P = np.broadcast_to(S, shape + S.shape[-1:]), nb.attention_forward(q, k, v, mask, causal, scale)[1]
    P = np.broadcast_to(P, S.shape)
    np.testing.assert_allclose(np.exp(S - lse_full[..., None])[has_key], P[has_key], rtol=1e-12, atol=1e-12)
    dq, dk, dv, dm = nf.flash_attention_backward(q, k, v, o, lse, grad, mask, causal, scale, block_size)
    assert_close([dq, dk, dv] + ([dm] if dm is not None else []), grads)
    assert (dm is None) == (mask is None or mask.dtype == bool)


def test_flash_backward_needs_the_whole_rowsum_not_one_blocks():
    """Negative control: D from dP * P of each block alone (rowsum over the block, not over
    all keys) is not the softmax backward; the comparison rejects it."""
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    out, grad, grads, _ = fused(q, k, v, None, False, None, 1)
    o, lse = nf.flash_attention_forward(q, k, v, block_size=2)
    assert_close(list(nf.flash_attention_backward(q, k, v, o, lse, grad, block_size=2)[:3]), grads)
    scale = 1 / np.sqrt(4)
    dq = np.zeros_like(q)
    for blk in nf._blocks(5, 2):
        p = np.exp(scale * q @ np.swapaxes(k[:, blk], -1, -2) - lse[..., None])
        dp = grad @ np.swapaxes(v[:, blk], -1, -2)
        dq += scale * (p * (dp - (dp * p).sum(-1, keepdims=True))) @ k[:, blk]
    with pytest.raises(AssertionError):
        assert_close([dq], grads[:1])
