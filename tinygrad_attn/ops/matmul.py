"""Matrix multiplication with numpy's batch broadcasting, and `Linear` (x W^T + b).

Products of two matrices go to BLAS through numpy. Stacks of matrices go
to the `batched_matmul` kernel: numpy would run them one after another on
one core, the kernel spreads the batch over threads and reads permuted,
transposed (K^T) and broadcast operands where they are instead of copying
them. A stack times a single matrix is one big product: (..., n, k) @
(k, m) is computed as (rows, k) @ (k, m).
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, broadcast_shapes
from . import kernels
from ._layout import BLAS_NS, as_matrices, items_per_range


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


def stack_product(a, trans_a, b, trans_b, batch, m, n, k, dtype):
    """The stack op(A_i) @ op(B_i), i over the flattened `batch`, shaped batch + (m, n).

    a and b are (buffer, offsets, row stride) triples from `as_matrices`;
    op transposes when flagged. Small products share the batch across
    threads; large ones (where BLAS threads each product) run one by one.
    """
    count = math.prod(batch)
    out = np.empty((count, m, n), dtype)
    if out.size:
        flops = m * n * k
        per_range = count if flops >= 1 << 21 else items_per_range(BLAS_NS * flops)
        kernels.parallel_for(kernels.batched_matmul, count, kernels.BLAS, *a, trans_a, *b, trans_b, m, n, k,
                             out, min_items=per_range)
    return out.reshape(tuple(batch) + (m, n))


class MatMul(Function):
    """Z = A @ B, with (..., n, k) @ (..., k, m) -> (..., n, m).

    dL/dA = dL/dZ @ B^T,   dL/dB = A^T @ dL/dZ
    (transposes swap the last two axes). A 1-D operand is treated as a row
    (for A) or a column (for B) that is dropped from the result, as in numpy.
    """

    @staticmethod
    def forward(ctx, a, b):
        check_matmul_shapes(a.shape, b.shape)
        ctx.save_for_backward(a, b)
        ctx.kind = "numpy"
        if a.ndim >= 3 and b.ndim == 2:
            ctx.kind = "rows"  # one product (rows, k) @ (k, m)
            return (_flat_rows(a) @ b).reshape(a.shape[:-1] + (b.shape[1],))
        if a.ndim >= 2 and b.ndim >= 2 and max(a.ndim, b.ndim) >= 3 and np.result_type(a, b).kind == "f":
            ctx.kind = "stacks"
            ctx.batch = broadcast_shapes("matmul (batch dimensions)", a.shape[:-2], b.shape[:-2])
            ctx.dtype = np.result_type(a, b)
            a, b = a.astype(ctx.dtype, copy=False), b.astype(ctx.dtype, copy=False)
            *ctx.a, ctx.ta = as_matrices(a, ctx.batch, allow_transposed=True)
            *ctx.b, ctx.tb = as_matrices(b, ctx.batch, allow_transposed=True)
            m, k = a.shape[-2:]
            return stack_product(ctx.a, ctx.ta, ctx.b, ctx.tb, ctx.batch, m, b.shape[-1], k, ctx.dtype)
        return np.matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        if ctx.kind == "rows":
            g = _flat_rows(grad)
            return ((g @ b.T).reshape(a.shape) if need_a else None,
                    _flat_rows(a).T @ g if need_b else None)
        if ctx.kind == "stacks":
            (m, k), n = a.shape[-2:], b.shape[-1]
            *g, tg = as_matrices(grad.astype(ctx.dtype, copy=False), ctx.batch, allow_transposed=True)
            # dA = G B^T: B^T is b's storage with the flag flipped; dB = A^T G likewise.
            ga = stack_product(g, tg, ctx.b, not ctx.tb, ctx.batch, m, k, n, ctx.dtype) if need_a else None
            gb = stack_product(ctx.a, not ctx.ta, g, tg, ctx.batch, k, n, m, ctx.dtype) if need_b else None
            return ga, gb
        if a.ndim == 1 and b.ndim == 1:  # dot product: z is a scalar
            return grad * b, grad * a
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = np.expand_dims(grad, -2) if a.ndim == 1 else grad
        g2 = np.expand_dims(g2, -1) if b.ndim == 1 else g2
        ga = gb = None
        if need_a:
            ga = np.matmul(g2, np.swapaxes(b2, -1, -2))
            ga = ga[..., 0, :] if a.ndim == 1 else ga
        if need_b:
            gb = np.matmul(np.swapaxes(a2, -1, -2), g2)
            gb = gb[..., 0] if b.ndim == 1 else gb
        return ga, gb


class Linear(Function):
    """y = x W^T + b, with x: (..., in), W: (out, in) as in torch.nn.Linear, b: (out,).

    dL/dx = g W,   dL/dW = g^T x,   dL/db = sum of g      (g = dL/dy; the
    sums run over all leading axes of x)

    Why fused: x is flattened to one (rows, in) matrix, so forward and each
    gradient are single BLAS calls (numpy's matmul would loop over leading
    axes and the engine would then sum a stack of weight gradients); W^T is
    read transposed by BLAS, not copied; the bias is added in place.
    """

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1] or \
                (bias is not None and bias.shape != (weight.shape[0],)):
            with_bias = "" if bias is None else f" and a bias of shape {bias.shape}"
            raise ShapeError(f"linear: input of shape {x.shape} does not fit a weight of shape "
                             f"{weight.shape}{with_bias} (expected weight (out, in) with in = the "
                             "input's last dim, bias (out,))")
        x2 = _flat_rows(x)
        y = x2 @ weight.T
        if bias is not None:
            y += bias
        ctx.save_for_backward(x2, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return y.reshape(x.shape[:-1] + (weight.shape[0],))

    @staticmethod
    def backward(ctx, grad):
        x2, weight = ctx.saved_tensors
        g = _flat_rows(grad)
        grads = (
            (g @ weight).reshape(ctx.x_shape) if ctx.needs_input_grad[0] else None,
            g.T @ x2 if ctx.needs_input_grad[1] else None,
        )
        if ctx.has_bias:
            grads += (g.sum(axis=0) if ctx.needs_input_grad[2] else None,)
        return grads
