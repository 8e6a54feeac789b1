"""Matrix multiplication with numpy's batch broadcasting."""
import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, broadcast_shapes


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
        return np.matmul(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        if a.ndim == 1 and b.ndim == 1:  # dot product: z is a scalar
            return grad * b, grad * a
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        g2 = np.expand_dims(grad, -2) if a.ndim == 1 else grad
        g2 = np.expand_dims(g2, -1) if b.ndim == 1 else g2
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = np.matmul(g2, np.swapaxes(b2, -1, -2))
            ga = ga[..., 0, :] if a.ndim == 1 else ga
        if ctx.needs_input_grad[1]:
            gb = np.matmul(np.swapaxes(a2, -1, -2), g2)
            gb = gb[..., 0] if b.ndim == 1 else gb
        return ga, gb
