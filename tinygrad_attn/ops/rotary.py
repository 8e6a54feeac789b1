"""Rotary position embedding (RoPE) as one fused op, in llama2.c's convention.

Why fused: composed from primitive ops, the rotation is a reshape into
pairs, two slices, four products, a sum and a difference, and a stack back
(llama2.c's `apply_rotary_emb`), each a temporary the size of q or k, and
as many again in backward; the kernel reads each pair once and writes its
rotation. The reference version, in primitive ops, is
`tinygrad_attn.reference.apply_rotary_emb`.
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError
from ..kernels.rotary import rotary_backward, rotary_forward
from .array_views import float_dtype, random_array


class RotaryOp(Function):
    """Rotate each pair (x[2i], x[2i+1]) of every head vector of x (..., T, H, hd)
    by the angle theta = t * f_i of its position t, with cos, sin (T, hd/2):

        y[2i]   = x[2i] cos - x[2i+1] sin
        y[2i+1] = x[2i] sin + x[2i+1] cos

    y = R x with R orthogonal (block-diagonal 2x2 rotations), so

        dL/dx = R^T g: each pair of g = dL/dy rotated back by -theta
        dL/dcos = sum over rows and heads of g[2i] x[2i] + g[2i+1] x[2i+1]
        dL/dsin = sum over rows and heads of g[2i+1] x[2i] - g[2i] x[2i+1]

    (the tables are usually constants; their gradient is computed only when asked).
    Readable version: tinygrad_attn.reference.numpy_backward.rotary_backward.
    """

    @staticmethod
    def forward(ctx, x, cos, sin):
        dtype = float_dtype("apply_rotary_emb", x)
        if x.ndim < 3 or x.shape[-1] % 2 or cos.shape != (x.shape[-3], x.shape[-1] // 2) \
                or sin.shape != cos.shape:
            raise ShapeError(f"apply_rotary_emb: input of shape {x.shape} with freqs_cos {cos.shape} and "
                             f"freqs_sin {sin.shape}: expected x (..., T, n_heads, head_dim) with an even "
                             f"head_dim and tables of shape (T, head_dim // 2)")
        H, hd = x.shape[-2:]
        rows = math.prod(x.shape[:-2])
        x3 = np.ascontiguousarray(x).reshape(rows, H, hd)
        c = np.ascontiguousarray(cos, dtype=dtype)
        s = np.ascontiguousarray(sin, dtype=dtype)
        y = np.empty_like(x3)
        if y.size:
            rotary_forward(x3, c, s, y)
        ctx.save_for_backward(x3 if ctx.needs_input_grad[1] or ctx.needs_input_grad[2] else None, c, s)
        ctx.x_shape = x.shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x3, c, s = ctx.saved_tensors
        rows, H, hd = math.prod(ctx.x_shape[:-2]), ctx.x_shape[-2], ctx.x_shape[-1]
        g3 = np.ascontiguousarray(grad, dtype=c.dtype).reshape(rows, H, hd)
        dx = np.empty(ctx.x_shape, c.dtype)  # the kernel writes it as (rows, H, hd)
        if dx.size:
            rotary_backward(g3, c, s, dx.reshape(rows, H, hd))
        dcos = dsin = None
        if x3 is not None:  # the tables' gradient: sums over every row at the same position, and the heads
            T = c.shape[0]
            xa, xb = (x3.reshape(-1, T, H, hd // 2, 2)[..., i] for i in (0, 1))
            ga, gb = (g3.reshape(-1, T, H, hd // 2, 2)[..., i] for i in (0, 1))
            dcos = (ga * xa + gb * xb).sum(axis=(0, 2)) if ctx.needs_input_grad[1] else None
            dsin = (gb * xa - ga * xb).sum(axis=(0, 2)) if ctx.needs_input_grad[2] else None
        return dx, dcos, dsin

    @staticmethod
    def example(dtype, size):
        x = random_array(dtype, max(1, size // 512), 8, 4, 16)  # (B, T, H, hd)
        angles = np.outer(np.arange(8), 10000.0 ** (-np.arange(0, 16, 2) / 16))
        return (x, np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)), {}
