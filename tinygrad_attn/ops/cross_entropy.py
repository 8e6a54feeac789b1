"""Cross-entropy of logits against integer class targets, fused with log-softmax.

Why fused: the reference version (`tinygrad_attn.reference.cross_entropy`)
stores the full log-probability matrix, gathers from it and scatters the
gradient back; the kernel computes logsumexp per row and never stores the
log-probabilities, and its backward is one pass: softmax minus one-hot.
"""
import numpy as np

from ..autograd import Function
from ..shapes import ShapeError
from ..kernels.cross_entropy import cross_entropy_backward, cross_entropy_forward
from .array_views import float_dtype, random_array

REDUCTIONS = ("mean", "sum", "none")


def _classes_last(logits):
    """(N, C) / (C,) / (N, C, d1, ...) logits as (rows, C), rows in target order."""
    if logits.ndim == 1:
        return logits.reshape(1, -1)
    if logits.ndim > 2:
        logits = np.moveaxis(logits, 1, -1)
    return np.ascontiguousarray(logits).reshape(-1, logits.shape[-1])


class CrossEntropy(Function):
    """loss_r = (1 - e) * (l_r - x_{r,t_r}) + e * (l_r - mean_c x_{r,c}),  l_r = logsumexp_c x_{r,c}

    per row r (0 where t_r == ignore_index), e = label_smoothing; then summed,
    averaged over the rows not ignored, or returned per row. With
    p = softmax(x_r) and G_r = dL/dloss_r:

        dL/dx_{r,c} = G_r * (p_c - (1 - e) [c == t_r] - e / C)

    Classes are on axis 1 for (N, C, d1, ...) logits, as in PyTorch.
    Readable version: tinygrad_attn.reference.numpy_backward.cross_entropy_backward.
    """

    @staticmethod
    def forward(ctx, logits, target=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
        dtype = float_dtype("cross_entropy", logits)
        if reduction not in REDUCTIONS:
            raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
        if not isinstance(ignore_index, (int, np.integer)) or isinstance(ignore_index, bool):
            raise TypeError(f"cross_entropy: ignore_index must be an integer, got {ignore_index!r}")
        if not -2 ** 63 <= ignore_index < 2 ** 63:
            raise ValueError(f"cross_entropy: ignore_index {ignore_index} is outside the int64 range of "
                             "class indices")
        t = np.asarray(target)
        if t.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: target must hold integer class indices, got {t.dtype}")
        if logits.ndim == 0:
            raise ShapeError("cross_entropy: logits need a class axis, got a 0-d array")
        class_axis = 0 if logits.ndim == 1 else 1
        n_classes = logits.shape[class_axis]
        expected = logits.shape[:class_axis] + logits.shape[class_axis + 1:]
        if t.shape != expected:
            raise ShapeError(f"cross_entropy: target of shape {t.shape} does not match logits of shape "
                             f"{logits.shape} (expected target shape {expected} for {n_classes} classes)")
        t = t.astype(np.int64).reshape(-1)
        valid = t != ignore_index
        if ((t < 0) | (t >= n_classes))[valid].any():
            raise IndexError(f"cross_entropy: target values must be in [0, {n_classes}) or ignore_index "
                             f"({ignore_index})")
        x2 = _classes_last(logits)
        loss, row_max, log_sum = (np.empty(x2.shape[0], dtype) for _ in range(3))
        smoothing = dtype.type(label_smoothing)
        if x2.size:
            cross_entropy_forward(x2, t, ignore_index, smoothing, loss, row_max, log_sum)
        elif n_classes == 0 and valid.any():
            raise ShapeError("cross_entropy: logits have no classes")
        ctx.save_for_backward(x2, t, row_max, log_sum)
        ctx.logits_shape, ctx.ignore_index, ctx.smoothing = logits.shape, ignore_index, smoothing
        ctx.reduction, ctx.n_valid = reduction, int(valid.sum())
        if reduction == "none":
            return loss.reshape(expected)
        total = loss.sum(dtype=dtype)
        if reduction == "sum":
            return np.asarray(total)
        return np.asarray(total / ctx.n_valid if ctx.n_valid else dtype.type(np.nan))  # NaN, as PyTorch

    @staticmethod
    def backward(ctx, grad):
        x2, t, row_max, log_sum = ctx.saved_tensors
        if ctx.reduction == "none":
            row_grad = np.ascontiguousarray(grad, x2.dtype).reshape(-1)
        else:
            g = grad / ctx.n_valid if ctx.reduction == "mean" and ctx.n_valid else grad
            row_grad = np.full(x2.shape[0], g, x2.dtype)
        dx2 = np.empty_like(x2)
        if x2.size:
            cross_entropy_backward(x2, t, row_max, log_sum, row_grad, ctx.ignore_index, ctx.smoothing,
                                           dx2)
        shape = ctx.logits_shape
        if len(shape) > 2:
            return np.moveaxis(dx2.reshape((shape[0],) + shape[2:] + (shape[1],)), -1, 1)
        return dx2.reshape(shape)

    @staticmethod
    def example(dtype, size):
        rows = max(2, size // 96)
        target = np.arange(rows) % 96
        target[1] = -100  # ignored
        return (random_array(dtype, rows, 96),), dict(target=target, label_smoothing=0.1)
