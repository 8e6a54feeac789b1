"""Matrix multiplication with numpy's batch broadcasting, and `LinearOp` (x W^T + b).

Every product of two matrices or more goes to the `batched_matmul` kernel,
which cuts the work into pieces and calls BLAS on each, reading
permuted, transposed (K^T) and broadcast operands where they are instead
of copying them. A stack times a single matrix is one big product:
(..., n, k) @ (k, m) is computed as (rows, k) @ (k, m). Only products with
a 1-D operand (vectors, cheap) are left to numpy.
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, broadcast_shapes
from ..kernels.matmul import batched_matmul, batched_matmul_pair
from .array_views import as_matrices, random_array


def check_matmul_shapes(a_shape, b_shape):
    """Raise a ShapeError naming both shapes unless a @ b is defined."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ShapeError(f"matmul: both operands need at least one dimension, got shapes "
                         f"{a_shape} and {b_shape}")
    k_b = b_shape[0] if len(b_shape) == 1 else b_shape[-2]
    if a_shape[-1] != k_b:
        raise ShapeError(f"matmul: cannot multiply shapes {a_shape} and {b_shape}: inner "
                         f"dimensions {a_shape[-1]} and {k_b} differ")
    if len(a_shape) > 2 or len(b_shape) > 2:
        broadcast_shapes("matmul (batch dimensions)", a_shape[:-2], b_shape[:-2])


def _flat_rows(x):
    """(..., k) as a (rows, k) matrix (a view when x is contiguous)."""
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])  # not -1: k may be 0


def stack_product(a, trans_a, b, trans_b, batch, m, n, k, dtype, bias=None):
    """The stack op(A_i) @ op(B_i) (+ bias), i over the flattened `batch`, shaped batch + (m, n).

    a and b are (buffer, offsets, row stride) triples from `as_matrices`;
    op transposes when flagged."""
    out = np.empty((math.prod(batch), m, n), dtype)
    batched_matmul(a, trans_a, b, trans_b, m, n, k, out, bias)
    return out.reshape(tuple(batch) + (m, n))


def _stack_args(a, b, bias=None):
    """(the arguments of `batched_matmul` for a @ b (+ bias), the result's shape), operands of
    two or more axes of one float dtype, numpy's batch broadcasting."""
    batch = () if a.ndim == b.ndim == 2 else broadcast_shapes("matmul (batch dimensions)", a.shape[:-2],
                                                               b.shape[:-2])
    *ma, ta = as_matrices(a, batch, allow_transposed=True)
    *mb, tb = as_matrices(b, batch, allow_transposed=True)  # each a (buffer, offsets, row stride) triple
    (m, k), n = a.shape[-2:], b.shape[-1]
    out = np.empty((math.prod(batch), m, n), a.dtype)
    return (tuple(ma), ta, tuple(mb), tb, m, n, k, out, bias), tuple(batch) + (m, n)


def _numpy_only(a, b):
    return a.dtype != b.dtype or a.dtype not in (np.float32, np.float64)  # integers: numpy


def product(a, b, bias=None):
    """a @ b (+ bias) for operands of two or more axes, numpy's batch broadcasting."""
    if _numpy_only(a, b):
        return np.matmul(a, b) if bias is None else np.matmul(a, b) + bias
    args, shape = _stack_args(a, b, bias)
    batched_matmul(*args)
    return args[7].reshape(shape)


def products(a1, b1, a2, b2):
    """(a1 @ b1, a2 @ b2), two independent products in one parallel job
    (kernels/matmul.py's `batched_matmul_pair` says why): a layer's two
    gradient products."""
    if _numpy_only(a1, b1) or _numpy_only(a2, b2):
        return product(a1, b1), product(a2, b2)
    (first, shape1), (second, shape2) = _stack_args(a1, b1), _stack_args(a2, b2)
    batched_matmul_pair(first, second)
    return first[7].reshape(shape1), second[7].reshape(shape2)


def transposed(x):
    """x with its last two axes swapped (a view: BLAS reads it transposed)."""
    return np.swapaxes(x, -1, -2)


class MatMul(Function):
    """Z = A @ B, with (..., n, k) @ (..., k, m) -> (..., n, m).

    dL/dA = dL/dZ @ B^T,   dL/dB = A^T @ dL/dZ
    (transposes swap the last two axes). A 1-D operand is treated as a row
    (for A) or a column (for B) that is dropped from the result, as in numpy.
    """

    @staticmethod
    def forward(ctx, a, b):
        check_matmul_shapes(a.shape, b.shape)
        dtype = np.result_type(a, b)
        a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
        ctx.save_for_backward(a, b)
        if a.ndim < 2 or b.ndim < 2:  # a vector: numpy
            return np.matmul(a, b)
        if a.ndim >= 3 and b.ndim == 2:  # one product (rows, k) @ (k, m)
            return product(_flat_rows(a), b).reshape(a.shape[:-1] + (b.shape[1],))
        return product(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        grad = grad.astype(a.dtype, copy=False)
        if a.ndim >= 2 and b.ndim >= 2:
            if a.ndim >= 3 and b.ndim == 2:  # the single product of forward
                a2, g2 = _flat_rows(a), _flat_rows(grad)
                if need_a and need_b:
                    da, db = products(g2, transposed(b), transposed(a2), g2)
                    return da.reshape(a.shape), db
                return (product(g2, transposed(b)).reshape(a.shape) if need_a else None,
                        product(transposed(a2), g2) if need_b else None)
            # dA = G B^T, dB = A^T G over the broadcast batch (the engine sums broadcast axes)
            if need_a and need_b:
                return products(grad, transposed(b), transposed(a), grad)
            return (product(grad, transposed(b)) if need_a else None,
                    product(transposed(a), grad) if need_b else None)
        if a.ndim == 1 and b.ndim == 1:  # dot product: z is a scalar
            return grad * b, grad * a
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = np.expand_dims(grad, -2) if a.ndim == 1 else grad
        g2 = np.expand_dims(g2, -1) if b.ndim == 1 else g2
        ga = gb = None
        if need_a:
            ga = np.matmul(g2, transposed(b2))
            ga = ga[..., 0, :] if a.ndim == 1 else ga
        if need_b:
            gb = np.matmul(transposed(a2), g2)
            gb = gb[..., 0] if b.ndim == 1 else gb
        return ga, gb

    @staticmethod
    def example(dtype, size):
        count = max(1, size // 4096)  # a stack of 64 x 64 products
        return (random_array(dtype, count, 64, 64), random_array(dtype, count, 64, 64, seed=1)), {}


class LinearOp(Function):
    """y = x W^T + b, with x: (..., in), W: (out, in) as in torch.nn.Linear, b: (out,).

    dL/dx = g W,   dL/dW = g^T x,   dL/db = sum of g      (g = dL/dy; the
    sums run over all leading axes of x)

    Why fused: x is flattened to one (rows, in) matrix, so forward and each
    gradient are single products (numpy's matmul would loop over leading
    axes and the engine would then sum a stack of weight gradients); W^T is
    read transposed by BLAS, not copied; the bias is added to each block of
    the output while it is in cache.
    Readable version: tinygrad_attn.reference.numpy_backward.linear_backward.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1] or \
                (bias is not None and bias.shape != (weight.shape[0],)):
            with_bias = "" if bias is None else f" and a bias of shape {bias.shape}"
            raise ShapeError(f"linear: input of shape {x.shape} does not fit a weight of shape "
                             f"{weight.shape}{with_bias} (expected weight (out, in) with in = the "
                             "input's last dim, bias (out,))")
        dtype = np.result_type(x, weight)
        x2 = _flat_rows(x).astype(dtype, copy=False)
        weight = weight.astype(dtype, copy=False)
        y = product(x2, transposed(weight), None if bias is None else bias.astype(dtype, copy=False))
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.reshape(x.shape[:-1] + (weight.shape[0],))

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g = _flat_rows(grad).astype(x2.dtype, copy=False)
        if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:  # dx = g W and dW = g^T x in one job
            dx, dw = products(g, weight, transposed(g), x2)
            grads = (dx.reshape(ctx.x_shape), dw)
        else:
            grads = (
                product(g, weight).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None,
                product(transposed(g), x2) if ctx.needs_input_grad[1] else None,
            )
        if ctx.has_bias:
            grads += (g.sum(axis=0) if ctx.needs_input_grad[2] else None,)
        return grads

    @staticmethod
    def example(dtype, size):
        x = random_array(dtype, max(1, size // 128), 128)
        return (x, random_array(dtype, 96, 128, seed=1), random_array(dtype, 96, seed=2)), {}
