"""RMSNorm as one fused op (Llama's normalization: LayerNorm without the mean).

Why fused: composed from primitive ops, RMSNorm is six ops with a full
temporary each (square, mean, add eps, sqrt, divide, scale) and more in
backward; the kernel does each row in one cache-resident pass and saves one
number per row (1/rms) for backward. The reference version, in primitive
ops, is `tinygrad_attn.reference.rms_norm`.
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError
from ..kernels.rms_norm import rms_norm_backward, rms_norm_forward
from .array_views import as_rows, float_dtype, random_array


class RMSNormOp(Function):
    """y = x / sqrt(mean(x^2) + eps) * w over the last `normalized_ndim` axes.

    With rstd = 1 / sqrt(mean(x^2) + eps) per row, xhat = x * rstd,
    g = dL/dy and gw = g * w (n values per row):

        dL/dx = rstd * (gw - xhat * mean(gw * xhat))
        dL/dw = sum over rows of g * xhat

    (LayerNorm's dL/dx also subtracts mean(gw): RMSNorm removes no mean.)
    Readable version: tinygrad_attn.reference.numpy_backward.rms_norm_backward.
    """

    @staticmethod
    def forward(ctx, x, weight, normalized_ndim=1, eps=1e-6):
        dtype = float_dtype("rms_norm", x)
        norm_shape = x.shape[x.ndim - normalized_ndim:]
        if normalized_ndim < 1 or x.ndim < normalized_ndim or weight.shape != norm_shape:
            raise ShapeError(f"rms_norm: input of shape {x.shape} with weight {weight.shape}: the weight "
                             f"must have the shape of the last {normalized_ndim} input axes")
        n = math.prod(norm_shape)
        x2 = np.ascontiguousarray(x).reshape(-1, n)
        w = as_rows(weight, dtype).reshape(n)
        y = np.empty_like(x2)
        rstd = np.empty(x2.shape[0], dtype)
        if y.size:
            rms_norm_forward(x2, w, dtype.type(eps), y, rstd)
        ctx.save_for_backward(x2, w, rstd)
        ctx.norm_shape = norm_shape
        return y.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x2, w, rstd = ctx.saved_tensors
        rows, n = x2.shape
        g2 = as_rows(grad, x2.dtype).reshape(rows, n)
        dx = np.empty(grad.shape, x2.dtype)  # the kernel writes it as (rows, n); not a view, so a leaf keeps it
        if rows and n:
            dw = rms_norm_backward(x2, w, rstd, g2, dx.reshape(rows, n))
        else:
            dw = np.zeros(n, x2.dtype)
        return dx, dw.reshape(ctx.norm_shape) if ctx.needs_input_grad[1] else None

    @staticmethod
    def example(dtype, size):
        x, w = random_array(dtype, max(1, size // 96), 96), random_array(dtype, 96, seed=1)
        return (x, w), dict(normalized_ndim=1, eps=1e-5)
