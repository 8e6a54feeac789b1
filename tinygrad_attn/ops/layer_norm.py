"""LayerNorm as one fused op.

Why fused: composed from primitive ops, LayerNorm is ten ops with a full
temporary each (mean, subtract, square, mean, add eps, sqrt, divide,
scale, shift) and twice as many in backward; the kernel does each row in
one cache-resident pass and saves two numbers per row (mean, 1/std) for
backward instead of the temporaries. The reference version, in primitive
ops, is `tinygrad_attn.reference.layer_norm`.
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError
from ..kernels.layer_norm import layer_norm_backward, layer_norm_forward
from .array_views import as_rows, float_dtype, random_array


class LayerNormOp(Function):
    """y = (x - mu) / sqrt(var + eps) * w + b over the last `normalized_ndim` axes.

    mu and var (biased) are per row; with xhat = (x - mu) * rstd,
    rstd = 1 / sqrt(var + eps), g = dL/dy and gw = g * w (n values per row):

        dL/dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
        dL/dw = sum over rows of g * xhat,     dL/db = sum over rows of g

    Readable version: tinygrad_attn.reference.numpy_backward.layer_norm_backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, normalized_ndim=1, eps=1e-5):
        dtype = float_dtype("layer_norm", x)
        norm_shape = x.shape[x.ndim - normalized_ndim:]
        if normalized_ndim < 1 or x.ndim < normalized_ndim or weight.shape != norm_shape \
                or bias.shape != norm_shape:
            raise ShapeError(f"layer_norm: input of shape {x.shape} with weight {weight.shape} and "
                             f"bias {bias.shape}: weight and bias must have the shape of the last "
                             f"{normalized_ndim} input axes")
        n = math.prod(norm_shape)
        x2 = np.ascontiguousarray(x).reshape(-1, n)
        w, b = as_rows(weight, dtype).reshape(n), as_rows(bias, dtype).reshape(n)
        y = np.empty_like(x2)
        mean = np.empty(x2.shape[0], dtype)
        rstd = np.empty(x2.shape[0], dtype)
        if y.size:
            layer_norm_forward(x2, w, b, dtype.type(eps), y, mean, rstd)
        ctx.save_for_backward(x2, w, mean, rstd)
        ctx.norm_shape = norm_shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x2, w, mean, rstd = ctx.saved_tensors
        rows, n = x2.shape
        g2 = as_rows(grad, x2.dtype).reshape(rows, n)
        dx = np.empty(grad.shape, x2.dtype)  # the kernel writes it as (rows, n); not a view, so a leaf keeps it
        if rows and n:
            dw, db = layer_norm_backward(x2, w, mean, rstd, g2, dx.reshape(rows, n))
        else:
            dw, db = np.zeros(n, x2.dtype), np.zeros(n, x2.dtype)
        return (dx,
                dw.reshape(ctx.norm_shape) if ctx.needs_input_grad[1] else None,
                db.reshape(ctx.norm_shape) if ctx.needs_input_grad[2] else None)

    @staticmethod
    def example(dtype, size):
        x, w, b = random_array(dtype, max(1, size // 96), 96), random_array(dtype, 96, seed=1), random_array(dtype, 96)
        return (x, w, b), dict(normalized_ndim=1, eps=1e-5)
