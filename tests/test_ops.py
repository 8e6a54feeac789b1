"""Every registered op: forward against numpy, backward against finite differences.

CASES maps each op name in `Function.registry` to one or more cases. A case
is a hypothesis strategy that draws a `Case(fn, ref, arrays)`: `fn` runs on
Tensors, `ref` on numpy arrays, `arrays` are the float64 inputs (all
differentiated). `test_every_registered_op_has_a_case` fails when an op is
added without one. A fused op's cases also give `backward(*arrays, grad)`,
its numpy twin's input gradients (reference/numpy_backward.py), which
tests/test_numpy_backward.py compares with the op's; and
tests/test_reference_ops.py runs every fused op's cases through its
composite twin too.
"""
import pkgutil
import sys
from typing import Callable, NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import erf, expit

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn.autograd import Function
from tinygrad_attn.ops.dropout import DropoutOp

from tinygrad_attn.reference import numpy_backward as nb

from . import references as ref
from .strategies import (arrays, attention_inputs, broadcast_shapes, gqa_attention_inputs,
                         packed_attention_inputs, shapes)


class Case(NamedTuple):
    fn: Callable
    ref: Callable
    arrays: tuple
    gradcheck_kwargs: dict = {}
    backward: Callable = None  # fused ops: (*arrays, grad) -> [dL/d each array], from numpy_backward


def unary(fn, ref, backward=None, **array_kwargs):
    @st.composite
    def case(draw):
        return Case(fn, ref, (draw(arrays(draw(shapes()), **array_kwargs)),), backward=backward)
    return case()


@st.composite
def swiglu_case(draw):
    """F.swiglu on a last axis of even size (its two halves), any leading shape."""
    shape = draw(shapes(min_dims=1))
    shape = shape[:-1] + (2 * shape[-1],)
    ref = lambda h: (lambda a, b: a / (1 + np.exp(-a)) * b)(*np.split(h, 2, axis=-1))  # noqa: E731
    return Case(lambda t: F.swiglu(t), ref, (draw(arrays(shape, low=-4.0, high=4.0)),),
                backward=lambda h, g: [nb.swiglu_backward(h, g)])


def binary(fn, ref, a_kwargs=None, b_kwargs=None):
    @st.composite
    def case(draw):
        sa, sb = draw(broadcast_shapes(2))
        return Case(fn, ref, (draw(arrays(sa, **(a_kwargs or {}))), draw(arrays(sb, **(b_kwargs or {})))))
    return case()


@st.composite
def reduction(draw, method, ref, keep_kwarg=True, min_side=1, **kwargs):
    """x.method(axis, keepdims) for axis None, one axis, or several axes."""
    shape = draw(shapes(min_dims=1, min_side=min_side))
    x = draw(arrays(shape))
    kind = draw(st.sampled_from(["all", "one", "several"]))
    if kind == "all":
        axis = None
    elif kind == "one":
        axis = draw(st.integers(-len(shape), len(shape) - 1))
    else:
        axis = tuple(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
    keepdims = draw(st.booleans())
    fn = lambda t: getattr(t, method)(axis=axis, keepdims=keepdims, **kwargs)
    return Case(fn, lambda a: ref(a, axis=axis, keepdims=keepdims), (x,))


@st.composite
def maximum_case(draw, fn, ref):
    sa, sb = draw(broadcast_shapes(2))
    # a on multiples of 0.5, b a quarter off them: the two never come closer
    # than 0.25, so finite differences never cross a tie.
    a = np.round(draw(arrays(sa)) * 2) / 2
    b = np.round(draw(arrays(sb)) * 2) / 2 + 0.25
    return Case(fn, ref, (a, b))


@st.composite
def where_case(draw):
    sc, sa, sb = draw(broadcast_shapes(3))
    cond = np.random.default_rng(draw(st.integers(0, 1000))).random(sc) > 0.5
    a, b = draw(arrays(sa)), draw(arrays(sb))
    return Case(lambda x, y: tg.where(tg.Tensor(cond), x, y), lambda x, y: np.where(cond, x, y), (a, b))


@st.composite
def masked_fill_case(draw):
    sx, sm = draw(broadcast_shapes(2))
    full = np.broadcast_shapes(sx, sm)
    x = draw(arrays(full))
    mask = np.random.default_rng(draw(st.integers(0, 1000))).random(sm) > 0.5
    value = draw(st.floats(-3, 3))
    return Case(lambda t: t.masked_fill(tg.Tensor(mask), value), lambda a: np.where(mask, value, a), (x,))


@st.composite
def clip_case(draw):
    lo, hi = sorted(draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=2,
                                  max_size=2, unique=True)))
    bounds = draw(st.sampled_from([(lo, hi), (lo, None), (None, hi)]))
    x = draw(arrays(draw(shapes()), away_from=[b for b in bounds if b is not None]))
    return Case(lambda t: t.clip(*bounds), lambda a: np.clip(a, *bounds), (x,))


@st.composite
def pow_case(draw):
    sa, sb = draw(broadcast_shapes(2))
    base = draw(arrays(sa, low=0.5, high=2.0))
    exponent = draw(arrays(sb, low=-2.0, high=2.0))
    return Case(lambda a, b: a ** b, np.power, (base, exponent))


@st.composite
def pow_scalar_case(draw):
    x = draw(arrays(draw(shapes()), low=0.5, high=2.0))
    k = draw(st.sampled_from([2, 3, 0.5, -1.5]))
    if draw(st.booleans()):
        return Case(lambda t: t ** k, lambda a: a ** k, (x,))
    return Case(lambda t: k ** t, lambda a: np.power(float(abs(k)), a), (x,)) if k > 0 else \
        Case(lambda t: t ** k, lambda a: a ** k, (x,))


@st.composite
def matmul_case(draw):
    kind = draw(st.sampled_from(["2d", "batched", "broadcast", "vec-mat", "mat-vec", "dot",
                                 "transposed-view"]))
    n, k, m = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(shapes(min_dims=1, max_dims=2, max_side=3))
    a_shape, b_shape = {
        "2d": ((n, k), (k, m)),
        "batched": (batch + (n, k), batch + (k, m)),
        "broadcast": (batch + (n, k), (k, m)) if draw(st.booleans()) else ((n, k), batch + (k, m)),
        "vec-mat": ((k,), batch + (k, m)),
        "mat-vec": (batch + (n, k), (k,)),
        "dot": ((k,), (k,)),
        "transposed-view": (batch + (n, k), batch + (m, k)),  # b is passed as b.swapaxes(-1, -2)
    }[kind]
    a, b = draw(arrays(a_shape)), draw(arrays(b_shape))
    if kind == "transposed-view":  # a view BLAS reads transposed (K^T in attention), no copy
        b = np.swapaxes(np.ascontiguousarray(b), -1, -2)
    return Case(lambda a, b: a @ b, np.matmul, (a, b))


@st.composite
def reshape_case(draw):
    shape = draw(shapes())
    size = int(np.prod(shape))
    divisors = [d for d in range(1, size + 1) if size % d == 0]
    d = draw(st.sampled_from(divisors))
    new = draw(st.sampled_from([(size,), (d, -1), (-1, d, 1), (1, size // d, d)]))
    return Case(lambda t: t.reshape(new), lambda a: a.reshape(new), (draw(arrays(shape)),))


@st.composite
def permute_case(draw):
    shape = draw(shapes(min_dims=1))
    axes = tuple(draw(st.permutations(range(len(shape)))))
    return Case(lambda t: t.permute(axes), lambda a: a.transpose(axes), (draw(arrays(shape)),))


@st.composite
def expand_case(draw):
    target = draw(shapes(min_dims=1))
    # An input that broadcasts to target: drop some leading axes, set others to 1.
    start = draw(st.integers(0, len(target)))
    in_shape = tuple(1 if draw(st.booleans()) else s for s in target[start:])
    return Case(lambda t: t.expand(target), lambda a: np.broadcast_to(a, target), (draw(arrays(in_shape)),))


@st.composite
def getitem_case(draw):
    shape = draw(shapes(min_dims=1, min_side=2))
    x = draw(arrays(shape))
    n0 = shape[0]
    kind = draw(st.sampled_from(["int", "slice", "none-ellipsis", "int-array-repeats", "int-array-2d",
                                 "bool-mask", "mixed"]))
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    index = {
        "int": -1,
        "slice": slice(None, None, 2),
        "none-ellipsis": (None, Ellipsis, 0),
        "int-array-repeats": np.array([0, 1, 0, n0 - 1]),  # repeated indices must accumulate
        "int-array-2d": np.array([[0, -1, 1], [-1, 0, 0]]),  # an embedding lookup of (B, T) ids
        "bool-mask": rng.random(shape) > 0.4,
        "mixed": (slice(1, None), [0, 0]) if len(shape) >= 2 else [1, 1],
    }[kind]
    return Case(lambda t: t[index], lambda a: a[index], (x,))


@st.composite
def cat_case(draw):
    shape = draw(shapes(min_dims=1))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        s = list(shape)
        s[axis] = draw(st.integers(1, 3))
        parts.append(draw(arrays(tuple(s))))
    return Case(lambda *ts: tg.cat(ts, dim=axis), lambda *a: np.concatenate(a, axis=axis), tuple(parts))


@st.composite
def stack_case(draw):
    shape = draw(shapes(max_dims=3))
    axis = draw(st.integers(-len(shape) - 1, len(shape)))
    parts = tuple(draw(arrays(shape)) for _ in range(draw(st.integers(1, 3))))
    return Case(lambda *ts: tg.stack(ts, dim=axis), lambda *a: np.stack(a, axis=axis), parts)


@st.composite
def cast_case(draw):
    x = draw(arrays(draw(shapes())))
    # For float64 inputs both casts (to float32 and back) are in the graph. The
    # float32 step rounds, so the finite differences need a larger eps.
    return Case(lambda t: (t.float() * 2).to(t.dtype),
                lambda a: (a.astype(np.float32) * 2).astype(a.dtype), (x,),
                dict(eps=1e-2, atol=1e-4))


# ------------------------------------------------------------- fused ops

@st.composite
def softmax_case(draw, log):
    shape = draw(shapes(min_dims=0))
    axis = draw(st.integers(-max(len(shape), 1), max(len(shape), 1) - 1))
    x = draw(arrays(shape, low=-4.0, high=4.0))
    if log:
        return Case(lambda t: F.log_softmax(t, dim=axis), lambda a: nb.log_softmax_forward(a, axis), (x,),
                    backward=lambda a, g: [nb.log_softmax_backward(nb.log_softmax_forward(a, axis), g, axis)])
    return Case(lambda t: F.softmax(t, dim=axis), lambda a: nb.softmax_forward(a, axis), (x,),
                backward=lambda a, g: [nb.softmax_backward(nb.softmax_forward(a, axis), g, axis)])


@st.composite
def layer_norm_case(draw):
    shape = draw(shapes(min_dims=1))
    k = draw(st.integers(1, len(shape)))
    eps = draw(st.sampled_from([1e-5, 0.1]))
    norm_shape = shape[len(shape) - k:]
    x, w, b = draw(arrays(shape)), draw(arrays(norm_shape)), draw(arrays(norm_shape))
    return Case(lambda x, w, b: F.layer_norm(x, norm_shape, w, b, eps=eps),
                lambda x, w, b: nb.layer_norm_forward(x, w, b, k, eps), (x, w, b),
                backward=lambda x, w, b, g: nb.layer_norm_backward(x, w, g, k, eps))


@st.composite
def linear_case(draw):
    lead = draw(shapes(min_dims=0, max_dims=2, max_side=3))
    n_in, n_out = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    x, w = draw(arrays(lead + (n_in,))), draw(arrays((n_out, n_in)))
    if draw(st.booleans()):
        return Case(lambda x, w, b: F.linear(x, w, b), nb.linear_forward, (x, w, draw(arrays((n_out,)))),
                    backward=lambda x, w, b, g: nb.linear_backward(x, w, g))
    return Case(lambda x, w: F.linear(x, w), nb.linear_forward, (x, w),
                backward=lambda x, w, g: nb.linear_backward(x, w, g)[:2])


@st.composite
def dropout_case(draw):
    x = draw(arrays(draw(shapes())))
    p = draw(st.sampled_from([0.2, 0.5, 0.9, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(lambda t: DropoutOp.apply(t, p=p, seed=seed),
                lambda a: nb.dropout_forward(a, ref.dropout_keep(a.shape, p, seed), p), (x,),
                backward=lambda a, g: [nb.dropout_backward(g, ref.dropout_keep(a.shape, p, seed), p)])


@st.composite
def cross_entropy_case(draw):
    n_classes = draw(st.integers(1, 5))
    layout = draw(st.sampled_from(["NC", "C", "NCd"]))
    n = draw(st.integers(1, 4))
    extra = draw(shapes(min_dims=1, max_dims=2, max_side=3)) if layout == "NCd" else ()
    logits_shape = {"NC": (n, n_classes), "C": (n_classes,), "NCd": (n, n_classes) + extra}[layout]
    target_shape = {"NC": (n,), "C": (), "NCd": (n,) + extra}[layout]
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    target = rng.integers(0, n_classes, size=target_shape)
    ignore_index = draw(st.sampled_from([-100, 0])) if n_classes > 1 else -100
    if draw(st.booleans()):
        target = np.where(rng.random(target_shape) < 0.3, ignore_index, target)
    smoothing = draw(st.sampled_from([0.0, 0.1]))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    if reduction == "mean":  # keep one target: a mean over no targets is NaN, with no gradient to check
        target = np.array(target)
        target.flat[0] = n_classes - 1
    kwargs = dict(ignore_index=ignore_index, label_smoothing=smoothing, reduction=reduction)
    return Case(lambda t: F.cross_entropy(t, target, **kwargs),
                lambda a: nb.cross_entropy_forward(a, target, **kwargs), (draw(arrays(logits_shape)),),
                backward=lambda a, g: [nb.cross_entropy_backward(a, target, g, **kwargs)])


@st.composite
def attention_case(draw):
    q, k, v, mask, causal, scale = draw(attention_inputs())
    p = draw(st.sampled_from([0.0, 0.0, 0.4]))
    seed = draw(st.integers(0, 2**32 - 1))
    op = tg.ops.attention.ScaledDotProductAttention

    def reference(*a):
        m = a[3] if len(a) > 3 else mask
        keep = ref.attention_keep(a[0], a[1], a[2], m, p, seed)
        return nb.attention_forward(a[0], a[1], a[2], m, causal, scale, keep, p)[0]

    def backward(*a):
        q, k, v, g = a[0], a[1], a[2], a[-1]
        m = a[3] if len(a) > 4 else mask
        dq, dk, dv, dm = nb.attention_backward(q, k, v, g, m, causal, scale, ref.attention_keep(q, k, v, m, p, seed), p)
        return [dq, dk, dv] + ([dm] if len(a) > 4 else [])
    if mask is not None and mask.dtype != bool:  # a float mask gets a gradient too
        return Case(lambda q, k, v, m: op.apply(q, k, v, m, is_causal=causal, scale=scale, dropout_p=p,
                                                seed=seed), reference, (q, k, v, mask), backward=backward)
    extra = () if mask is None else (tg.Tensor(mask),)
    return Case(lambda q, k, v: op.apply(q, k, v, *extra, is_causal=causal, scale=scale, dropout_p=p,
                                         seed=seed), reference, (q, k, v), backward=backward)


@st.composite
def gqa_attention_case(draw):
    """Grouped-query attention: each key head and each value head shared by a group of
    query heads (the groups of key and value of the same size or not)."""
    q, k, v, mask, causal, scale = draw(gqa_attention_inputs())
    p = draw(st.sampled_from([0.0, 0.0, 0.4]))
    seed = draw(st.integers(0, 2**32 - 1))
    op = tg.ops.attention.ScaledDotProductAttention
    kw = dict(is_causal=causal, scale=scale, dropout_p=p, seed=seed, enable_gqa=True)

    def keep(q, k, v, m):  # the weights' dropout mask: one per query head
        hq = q.shape[-3]
        return ref.attention_keep(q, np.repeat(k, hq // k.shape[-3], -3), np.repeat(v, hq // v.shape[-3], -3),
                                  m, p, seed)

    def reference(q, k, v, m=mask):
        return nb.attention_forward(q, k, v, m, causal, scale, keep(q, k, v, m), p, enable_gqa=True)[0]

    def backward(q, k, v, *rest):
        m, g = (rest[0], rest[1]) if len(rest) > 1 else (mask, rest[0])
        dq, dk, dv, dm = nb.attention_backward(q, k, v, g, m, causal, scale, keep(q, k, v, m), p, enable_gqa=True)
        return [dq, dk, dv] + ([dm] if len(rest) > 1 else [])
    if mask is not None and mask.dtype != bool:  # a float mask gets a gradient too
        return Case(lambda q, k, v, m: op.apply(q, k, v, m, **kw), reference, (q, k, v, mask), backward=backward)
    extra = () if mask is None else (tg.Tensor(mask),)
    return Case(lambda q, k, v: op.apply(q, k, v, *extra, **kw), reference, (q, k, v), backward=backward)


@st.composite
def attention_weights_case(draw):
    q, k, v, mask, causal, scale = draw(attention_inputs())
    causal = causal and mask is None  # F, as PyTorch, refuses an attn_mask with is_causal

    def fn(q, k):
        value = tg.Tensor(v.astype(q.dtype))
        return F.scaled_dot_product_attention(q, k, value, mask, is_causal=causal, scale=scale,
                                              need_weights=True)[1]
    def backward(q, k, g):  # the gradient reaching P alone: grad_weights, nothing from the output
        no_output_grad = np.zeros(np.broadcast_shapes(g.shape[:-1], v.shape[:-2] + (1,)) + v.shape[-1:])
        return nb.attention_backward(q, k, v, no_output_grad, mask, causal, scale, grad_weights=g)[:2]
    return Case(fn, lambda q, k: nb.attention_forward(q, k, v, mask, causal, scale)[1], (q, k), backward=backward)


@st.composite
def packed_self_attention_case(draw):
    qkv, H, mask, causal, scale = draw(packed_attention_inputs())
    p = draw(st.sampled_from([0.0, 0.0, 0.4]))
    seed = draw(st.integers(0, 2**32 - 1))
    op = tg.ops.attention.PackedSelfAttention

    def keep(qkv):
        B, T = qkv.shape[:2]
        return ref.dropout_keep((B, H, T, T), p, seed)  # the weights' shape

    def reference(qkv, m=mask):
        return nb.packed_self_attention_forward(qkv, H, m, causal, scale, keep(qkv), p)[0]

    def backward(qkv, *rest):
        m, g = (rest[0], rest[1]) if len(rest) > 1 else (mask, rest[0])
        dqkv, dm = nb.packed_self_attention_backward(qkv, H, g, m, causal, scale, keep(qkv), p)
        return [dqkv] + ([dm] if len(rest) > 1 else [])
    kwargs = dict(num_heads=H, is_causal=causal, scale=scale, dropout_p=p, seed=seed)
    if mask is not None and mask.dtype != bool:  # a float mask gets a gradient too
        return Case(lambda qkv, m: op.apply(qkv, m, **kwargs), reference, (qkv, mask), backward=backward)
    extra = () if mask is None else (tg.Tensor(mask),)
    return Case(lambda qkv: op.apply(qkv, *extra, **kwargs), reference, (qkv,), backward=backward)


def _gelu_tanh(a):
    return 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))


def _np_var(a, axis=None, keepdims=False):
    count = a.size if axis is None else int(np.prod([a.shape[i] for i in np.atleast_1d(axis)]))
    return np.var(a, axis=axis, keepdims=keepdims, ddof=1) if count > 1 else \
        np.full(np.var(a, axis=axis, keepdims=keepdims).shape, np.nan)


def _np_std(a, axis=None, keepdims=False):
    return np.sqrt(_np_var(a, axis=axis, keepdims=keepdims))


def _np_logsumexp(a, axis=None, keepdims=False):
    from scipy.special import logsumexp
    return logsumexp(a, axis=axis, keepdims=keepdims)


@st.composite
def rms_norm_case(draw):
    shape = draw(shapes(min_dims=1))
    k = draw(st.integers(1, len(shape)))
    eps = draw(st.sampled_from([1e-5, 0.1]))
    norm_shape = shape[len(shape) - k:]
    x, w = draw(arrays(shape)), draw(arrays(norm_shape))
    return Case(lambda x, w: F.rms_norm(x, norm_shape, w, eps=eps),
                lambda x, w: nb.rms_norm_forward(x, w, k, eps), (x, w),
                backward=lambda x, w, g: nb.rms_norm_backward(x, w, g, k, eps))


@st.composite
def rotary_case(draw):
    """x (..., T, H, hd) with any leading axes; the tables (T, hd/2) broadcast
    over them and the heads, and are differentiated too."""
    lead = draw(shapes(min_dims=0, max_dims=2, max_side=3))
    T, H, half = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    x = draw(arrays(lead + (T, H, 2 * half)))
    cos, sin = draw(arrays((T, half))), draw(arrays((T, half)))
    return Case(F.apply_rotary_emb, nb.rotary_forward, (x, cos, sin), backward=nb.rotary_backward)


CASES = {
    "Add": [binary(lambda a, b: a + b, np.add), unary(lambda t: 2.5 + t, lambda a: 2.5 + a)],
    "Sub": [binary(lambda a, b: a - b, np.subtract), unary(lambda t: 1 - t, lambda a: 1 - a)],
    "Mul": [binary(lambda a, b: a * b, np.multiply), unary(lambda t: t * 3, lambda a: a * 3)],
    "Div": [binary(lambda a, b: a / b, np.divide, b_kwargs=dict(away_from=[0], margin=0.3)),
            unary(lambda t: 1 / t, lambda a: 1 / a, away_from=[0], margin=0.3)],
    "Pow": [pow_case(), pow_scalar_case()],
    "Neg": [unary(lambda t: -t, np.negative)],
    "Cast": [cast_case()],
    "Exp": [unary(lambda t: t.exp(), np.exp)],
    "Log": [unary(lambda t: t.log(), np.log, low=0.1, high=3.0)],
    "Sqrt": [unary(lambda t: t.sqrt(), np.sqrt, low=0.1, high=3.0)],
    "Tanh": [unary(lambda t: t.tanh(), np.tanh)],
    "Erfc": [unary(lambda t: t.erfc(), lambda a: 1 - erf(a))],
    "Sigmoid": [unary(lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)))],
    "Relu": [unary(lambda t: t.relu(), lambda a: np.maximum(a, 0), away_from=[0])],
    "Gelu": [unary(lambda t: t.gelu(), lambda a: 0.5 * a * (1 + erf(a / np.sqrt(2))),
                   backward=lambda a, g: [nb.gelu_backward(a, g)], low=-4.0, high=4.0),
             unary(lambda t: t.gelu(approximate="tanh"), _gelu_tanh,
                   backward=lambda a, g: [nb.gelu_backward(a, g, "tanh")], low=-4.0, high=4.0)],
    "Silu": [unary(lambda t: F.silu(t), lambda a: a / (1 + np.exp(-a)),
                   backward=lambda a, g: [nb.silu_backward(a, g)], low=-4.0, high=4.0)],
    "Swiglu": [swiglu_case()],
    "Abs": [unary(lambda t: t.abs(), np.abs, away_from=[0])],
    "Clip": [clip_case()],
    "Maximum": [maximum_case(lambda a, b: a.maximum(b), np.maximum)],
    "Minimum": [maximum_case(lambda a, b: tg.minimum(a, b), np.minimum)],
    "Where": [where_case()],
    "MaskedFill": [masked_fill_case()],
    "Sum": [reduction("sum", np.sum)],
    "Mean": [reduction("mean", np.mean)],
    "Max": [reduction("max", np.max)],
    "Min": [reduction("min", np.min)],
    "Var": [reduction("var", _np_var, min_side=2)],
    "Std": [reduction("std", _np_std, min_side=2)],
    "LogSumExp": [reduction("logsumexp", _np_logsumexp)],
    "Reshape": [reshape_case()],
    "Permute": [permute_case()],
    "Expand": [expand_case()],
    "GetItem": [getitem_case()],
    "Cat": [cat_case()],
    "Stack": [stack_case()],
    "MatMul": [matmul_case()],
    "LinearOp": [linear_case()],
    "Softmax": [softmax_case(log=False)],
    "LogSoftmax": [softmax_case(log=True)],
    "LayerNormOp": [layer_norm_case()],
    "DropoutOp": [dropout_case()],
    "CrossEntropy": [cross_entropy_case()],
    "ScaledDotProductAttention": [attention_case(), gqa_attention_case()],
    "AttentionWeights": [attention_weights_case()],
    "PackedSelfAttention": [packed_self_attention_case()],
    "RMSNormOp": [rms_norm_case()],
    "RotaryOp": [rotary_case()],
}

CASE_IDS = [(name, i) for name, cases in CASES.items() for i in range(len(cases))]


def test_every_registered_op_has_a_case():
    """Every module of tinygrad_attn/ops is imported with the package (ops/__init__.py), so every op is here."""
    modules = {m.name for m in pkgutil.iter_modules(tg.ops.__path__)}
    assert modules <= {name.rsplit(".", 1)[-1] for name in sys.modules if name.startswith("tinygrad_attn.ops.")}
    missing = sorted(set(Function.registry) - set(CASES))
    assert not missing, f"ops without a gradcheck case in tests/test_ops.py: {missing}"


def test_every_op_has_its_own_forward_backward_and_docstring():
    for name, op in Function.registry.items():
        assert op.forward is not Function.forward and op.backward is not Function.backward, name
        assert (op.__doc__ or "").strip(), f"{name} has no docstring (the math of forward and backward)"


@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
@given(data=st.data())
def test_forward_matches_numpy(name, i, data):
    case = data.draw(CASES[name][i])
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        tensors = [tg.Tensor(a.astype(dtype)) for a in case.arrays]
        out = case.fn(*tensors)
        expected = case.ref(*[a.astype(dtype) for a in case.arrays])
        assert out.shape == np.shape(expected)
        assert out.dtype == dtype, f"{name} changed dtype {dtype} to {out.dtype}"
        np.testing.assert_allclose(out.data, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
@given(data=st.data())
def test_gradcheck(name, i, data):
    case = data.draw(CASES[name][i])
    tensors = [tg.Tensor(a, requires_grad=True) for a in case.arrays]
    assert tg.gradcheck(case.fn, tensors, **case.gradcheck_kwargs)


# ------- Finite gradients where PyTorch has them; sigmoid over its whole range


def test_std_gradient_at_zero_variance_is_zero_as_in_torch():
    torch = pytest.importorskip("torch")
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
    torch = pytest.importorskip("torch")
    base = np.array([0.0, 0.0, 0.0, 1.0, 2.0, -2.0])
    exponent = np.array([0.0, 0.5, 2.0, 0.0, 0.0, 2.0])
    x, y = tg.tensor(base, requires_grad=True), tg.tensor(exponent, requires_grad=True)
    (x ** y).sum().backward()
    tx, ty = torch.tensor(base, requires_grad=True), torch.tensor(exponent, requires_grad=True)
    (tx ** ty).sum().backward()
    np.testing.assert_allclose(x.grad.data, tx.grad.numpy())
    np.testing.assert_allclose(y.grad.data, ty.grad.numpy(), equal_nan=True)
    x = tg.tensor([0.0, 1.0, -3.0], requires_grad=True)
    (x ** 0).sum().backward()  # the case: x ** 0 at x = 0
    np.testing.assert_array_equal(x.grad.data, [0.0, 0.0, 0.0])


INF = np.inf


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
