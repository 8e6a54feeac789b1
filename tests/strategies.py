"""Hypothesis strategies shared by the tests: shapes, broadcast pairs, arrays.

Arrays are filled from a numpy generator seeded by hypothesis (fast, and
shrinkable through the seed); with `noncontiguous` they are transposed views,
so ops see permuted strides as well as plain C order.
"""
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
