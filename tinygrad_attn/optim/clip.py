"""Gradient clipping, as torch.nn.utils.clip_grad_norm_ / clip_grad_value_.

Both change `p.grad` in place and are meant to be called between
`loss.backward()` and `optimizer.step()`.
"""
import math
import numbers

import numpy as np

from ..kernels.clip import sum_of_squares
from ..kernels.registry import kernel_example
from ..ops.array_views import random_array
from ..tensor import Tensor


def _grads(parameters):
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"clip_grad: parameter {i} is a {type(p).__name__}, not a Tensor")
    return [p.grad.data for p in params if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients together so that their joint norm is at most `max_norm`.

    The total norm is the `norm_type`-norm of all gradients seen as one
    vector: ||(||g_1||, ..., ||g_n||)||. If it exceeds max_norm, every
    gradient is multiplied by max_norm / (total_norm + 1e-6) (as PyTorch).
    `norm_type` may be any p > 0 or float("inf") (the largest |g|).
    Returns the total norm before clipping, as a 0-d Tensor (0.0 when no
    parameter has a gradient).

    Example:
        >>> loss.backward()
        >>> norm = clip_grad_norm_(model.parameters(), max_norm=1.0)
        >>> opt.step()
    """
    grads = _grads(parameters)
    if isinstance(max_norm, bool) or not isinstance(max_norm, numbers.Real) or not max_norm >= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be a number >= 0, got {max_norm!r}")
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 or inf, got {norm_type}")
    if not grads:
        return Tensor(0.0)

    # Accumulate in float64 so float32 gradients neither overflow nor lose digits.
    if norm_type == math.inf:
        norms = [float(np.max(np.abs(g))) if g.size else 0.0 for g in grads]
        total = max(norms)
    elif norm_type == 2.0:  # the usual case: one kernel pass per gradient, summing in float64
        total = math.sqrt(sum(sum_of_squares(np.ascontiguousarray(g).reshape(-1)) for g in grads))
    else:
        norms = [float(np.sum(np.abs(g, dtype=np.float64) ** norm_type)) for g in grads]
        total = sum(norms) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"clip_grad_norm_: the total norm of order {norm_type} of the gradients "
                           f"is {total}, so they cannot be clipped (error_if_nonfinite=True)")

    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # also for a NaN norm, which then spreads into the gradients, as in PyTorch
        for g in grads:
            g *= coef
    return Tensor(np.asarray(total, dtype=grads[0].dtype))


@kernel_example
def _example(dtype, size):
    """The norm's kernel (kernels/clip.py): clip_grad_norm_ on a made-up
    gradient of `size` elements; returns the norm and the clipped gradient."""
    p = Tensor(np.zeros(size, dtype))
    p.grad = Tensor(random_array(dtype, size))
    return [clip_grad_norm_([p], 1.0).data, p.grad.data]


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient element into [-clip_value, clip_value], in place.

    Example:
        >>> clip_grad_value_(model.parameters(), 0.5)
    """
    grads = _grads(parameters)
    if isinstance(clip_value, bool) or not isinstance(clip_value, numbers.Real) or not clip_value >= 0:
        raise ValueError(f"clip_grad_value_: clip_value must be a number >= 0, got {clip_value!r}")
    for g in grads:
        np.clip(g, -clip_value, clip_value, out=g)
