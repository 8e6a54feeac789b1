"""Softmax and log-softmax along one axis, each one fused Numba kernel per direction.

Why fused: composed from primitive ops, softmax makes five passes over
memory with a temporary each time (max, subtract, exp, sum, divide) and
its backward several more; the kernel finishes each row while it is in
cache, with an exp that vectorizes. The reference version, step by step
in primitive ops, is `tinygrad_attn.reference.softmax`.
"""
import numpy as np

from ..autograd import Function
from ..shapes import normalize_axis
from ..kernels.softmax import softmax_backward, softmax_forward
from .array_views import as_rows, float_dtype, random_array


def _rowwise(kernel, axis, *arrays, log):
    """Run a softmax kernel along `axis`: move the axis last, run on rows, move it back."""
    shape = arrays[0].shape
    moved = [np.moveaxis(a.reshape(shape or (1,)), axis, -1) for a in arrays]
    rows = [as_rows(a) for a in moved]
    out = np.empty(moved[0].shape, rows[0].dtype)
    if out.size:
        kernel(*rows, out.reshape(rows[0].shape), log)
    if out.shape == shape and axis == len(shape) - 1:
        return out  # not a view: the engine can keep it as a leaf's .grad without copying
    return np.moveaxis(out, -1, axis).reshape(shape)


class Softmax(Function):
    """y = softmax(x) along `axis`:  y_i = exp(x_i - max x) / sum_j exp(x_j - max x).

    dL/dx_i = y_i * (g_i - sum_j g_j y_j)        (g = dL/dy, sums along the axis)

    Readable version: tinygrad_attn.reference.numpy_backward.softmax_backward.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        float_dtype("softmax", x)
        ctx.axis = normalize_axis(axis, x.ndim, "softmax")
        y = _rowwise(softmax_forward, ctx.axis, x, log=False)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, = ctx.saved_tensors
        return _rowwise(softmax_backward, ctx.axis, y, grad, log=False)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, max(1, size // 96), 96),), dict(axis=-1)


class LogSoftmax(Function):
    """y = log_softmax(x) along `axis`:  y_i = x_i - max x - log sum_j exp(x_j - max x).

    dL/dx_i = g_i - exp(y_i) * sum_j g_j         (exp(y) is the softmax)

    Readable version: tinygrad_attn.reference.numpy_backward.log_softmax_backward.
    """

    @staticmethod
    def forward(ctx, x, axis=-1):
        float_dtype("log_softmax", x)
        ctx.axis = normalize_axis(axis, x.ndim, "log_softmax")
        y = _rowwise(softmax_forward, ctx.axis, x, log=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, = ctx.saved_tensors
        return _rowwise(softmax_backward, ctx.axis, y, grad, log=True)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, max(1, size // 96), 96),), dict(axis=-1)
