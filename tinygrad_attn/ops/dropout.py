"""Dropout with a mask computed, not stored: one pass in forward, one in backward.

Why fused: the reference version (`tinygrad_attn.reference.dropout`) draws
a float per element from numpy's generator, compares, converts and
multiplies, four passes with temporaries; the kernel hashes each element's
index (see kernels/random_bits.py) and multiplies in one vectorized pass. The
mask is a function of (key, index), so backward regenerates it instead of
keeping it in memory.
"""
import numpy as np

from ..autograd import Function
from ..random import get_generator
from ..kernels.dropout import dropout_apply
from .array_views import float_dtype, random_array


def draw_key():
    """A fresh 32-bit key for a dropout mask, from the framework's generator
    (so `manual_seed` makes masks reproducible)."""
    return np.uint32(get_generator().integers(0, 2**32))


def keep_rule(p, dtype):
    """(threshold, scale): keep element i when its 32 random bits are >= threshold,
    and scale kept elements by 1 / (1 - p). p = 1 drops everything."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if p == 1:
        return np.uint32(0), dtype.type(0)  # every element "kept" with scale 0
    return np.uint32(min(round(p * 2**32), 2**32 - 1)), dtype.type(1 / (1 - p))


def apply_mask(x, key, threshold, scale):
    """x * mask * scale for an array of any shape (the mask follows C order)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    dropout_apply(flat, key, threshold, scale, out)
    return out.reshape(x.shape)


class DropoutOp(Function):
    """y = x * m / (1 - p), m_i = 0 with probability p, else 1 (the same m in backward).

    dL/dx = g * m / (1 - p)

    `seed` fixes the mask (a 32-bit key); by default a key is drawn from
    the framework's generator at each call.
    Readable version: tinygrad_attn.reference.numpy_backward.dropout_backward.
    """

    @staticmethod
    def forward(ctx, x, p=0.5, seed=None):
        dtype = float_dtype("dropout", x)
        ctx.rule = keep_rule(p, dtype)
        ctx.key = draw_key() if seed is None else np.uint32(seed)
        return apply_mask(x, ctx.key, *ctx.rule)

    @staticmethod
    def backward(ctx, grad):
        return apply_mask(grad, ctx.key, *ctx.rule)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, size),), dict(p=0.2, seed=7)
