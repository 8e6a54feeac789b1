"""Hypothesis strategies shared by the tests: shapes, broadcast pairs, arrays.

Arrays are filled from a numpy generator seeded by hypothesis (fast, and
shrinkable through the seed); with `noncontiguous` they are transposed views,
so ops see permuted strides as well as plain C order.
"""
import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes


def shapes(min_dims=0, max_dims=4, min_side=1, max_side=4):
    return array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcast_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4):
    """Tuples of shapes that broadcast together (size-1 and missing axes included)."""
    return mutually_broadcastable_shapes(num_shapes=num_shapes, min_dims=min_dims,
                                         max_dims=max_dims, max_side=max_side).map(lambda s: s.input_shapes)


@st.composite
def arrays(draw, shape, dtype=np.float64, low=-2.0, high=2.0, away_from=None, margin=0.05):
    """A float array of `shape` with values in [low, high].

    `away_from`: values closer than `margin` to any of these points (kinks
    such as 0 for relu/abs) are pushed away, so finite differences are valid.
    Half of the arrays of 2+ dims are non-contiguous transposed views.
    """
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = rng.uniform(low, high, size=shape)
    for point in away_from or ():
        near = np.abs(a - point) < margin
        a = np.where(near, point + np.where(a >= point, margin, -margin) * 2, a)
    a = a.astype(dtype)
    if len(shape) >= 2 and draw(st.booleans()):
        a = np.ascontiguousarray(a.T).T  # same values, reversed strides
    return a


@st.composite
def float_arrays(draw, min_dims=0, max_dims=4, **kwargs):
    return draw(arrays(draw(shapes(min_dims, max_dims)), **kwargs))


def _mask(draw, kind, shape):
    """None, a boolean mask (True = may attend; some rows may be fully masked) or a float one."""
    if kind == "bool":
        return np.random.default_rng(draw(st.integers(0, 1000))).random(shape) > 0.3
    return draw(arrays(shape)) if kind == "float" else None


@st.composite
def attention_inputs(draw):
    """q, k, v with broadcast batch axes, a mask (None, boolean or float) that
    broadcasts, is_causal and scale (None: 1/sqrt(E))."""
    L, S, E, Ev = (draw(st.integers(1, 4)) for _ in range(4))
    bq, bk, bv, bm = draw(broadcast_shapes(4, max_dims=2, max_side=3))
    q, k, v = draw(arrays(bq + (L, E))), draw(arrays(bk + (S, E))), draw(arrays(bv + (S, Ev)))
    mask_shape = bm + (draw(st.sampled_from([1, L])), S)
    mask = _mask(draw, draw(st.sampled_from(["none", "bool", "float"])), mask_shape)
    return q, k, v, mask, draw(st.booleans()), draw(st.sampled_from([None, 0.7]))


@st.composite
def packed_attention_inputs(draw):
    """qkv (B, T, 3*H*hd), H, a mask (None, boolean or float) that broadcasts
    to (B, H, T, T), is_causal and scale."""
    B, T, H, hd = (draw(st.integers(1, 3)) for _ in range(4))
    qkv = draw(arrays((B, T, 3 * H * hd)))
    mask_shape = draw(st.sampled_from([(), (B, 1), (1, H), (B, H)])) + (draw(st.sampled_from([1, T])), T)
    mask = _mask(draw, draw(st.sampled_from(["none", "bool", "float"])), mask_shape)
    return qkv, H, mask, draw(st.booleans()), draw(st.sampled_from([None, 0.7]))


@st.composite
def gqa_attention_inputs(draw):
    """Grouped-query attention: q (B, Hq, L, E), k (B or 1, Hk, S, E) and v (B or 1,
    Hv, S, Ev) with Hq a multiple of Hk and of Hv (the same or not), a mask (None,
    boolean or float) that broadcasts to (B, Hq, L, S), is_causal and scale."""
    B, k_heads, v_heads = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    L, S, E, Ev = (draw(st.integers(1, 3)) for _ in range(4))
    heads = math.lcm(k_heads, v_heads) * draw(st.integers(1, 2))
    kv_batch = draw(st.sampled_from([B, 1]))
    q = draw(arrays((B, heads, L, E)))
    k, v = draw(arrays((kv_batch, k_heads, S, E))), draw(arrays((kv_batch, v_heads, S, Ev)))
    mask_shape = draw(st.sampled_from([(), (heads,), (B, 1), (B, heads)])) + (draw(st.sampled_from([1, L])), S)
    mask = _mask(draw, draw(st.sampled_from(["none", "bool", "float"])), mask_shape)
    return q, k, v, mask, draw(st.booleans()), draw(st.sampled_from([None, 0.7]))
