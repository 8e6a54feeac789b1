"""Shape helpers shared by every op: axis normalisation, broadcasting checks
and the one exception type for shape errors.

They know only tuples and numpy arrays, so kernels, ops and the Tensor class
can all use them.
"""
import numpy as np


class ShapeError(ValueError):
    """Raised when the shapes given to an op do not fit together.

    The message always names the op and the shapes involved.
    """


def normalize_axis(axis, ndim, op):
    """Return `axis` as a non-negative int, or raise naming the op."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    lo = -max(ndim, 1)
    hi = max(ndim, 1) - 1
    if not lo <= axis <= hi:
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor with ndim {ndim} "
                         f"(expected an axis in [{lo}, {hi}])")
    return int(axis) % max(ndim, 1)


def normalize_new_axis(axis, ndim, op):
    """Normalise the position of an axis to be inserted (unsqueeze, stack):
    any of the ndim + 1 slots, counted from either end."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {axis!r}")
    if not -(ndim + 1) <= axis <= ndim:
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor with ndim {ndim} "
                         f"(a new axis goes in [{-(ndim + 1)}, {ndim}])")
    return int(axis) % (ndim + 1)


def normalize_axes(axis, ndim, op):
    """Return a sorted tuple of non-negative axes; `None` means every axis.

    A 0-d tensor accepts axis 0 or -1 and reduces over nothing (as PyTorch
    does: x.sum(dim=0) of a scalar is the scalar)."""
    if axis is None:
        return tuple(range(ndim))
    # a sequence of axes, or else one axis (normalize_axis checks it is an int)
    axes = tuple(axis) if isinstance(axis, (tuple, list, range, np.ndarray)) else (axis,)
    out = tuple(sorted(normalize_axis(a, ndim, op) for a in axes))
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} repeats an axis")
    return out if ndim else ()


def broadcast_shapes(op, *shapes):
    """numpy's broadcast of `shapes`, with an error that names the op."""
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(f"{op}: shapes {listed} cannot be broadcast together") from None


def unbroadcast(grad, shape):
    """Sum `grad` back down to `shape`, undoing numpy broadcasting.

    If y = broadcast(x) copies x along some axes, then every copy contributes
    to the loss, so dL/dx is the sum of dL/dy over the copied axes: the extra
    leading axes and the axes where x had size 1.
    """
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra < 0 or any(s != 1 and s != g for s, g in zip(shape, grad.shape[extra:])):
        raise ShapeError(f"unbroadcast: a gradient of shape {grad.shape} cannot be reduced "
                         f"to an input of shape {shape}")
    summed = tuple(range(extra)) + tuple(
        extra + i for i, s in enumerate(shape) if s == 1 and grad.shape[extra + i] != 1)
    if summed:
        grad = grad.sum(axis=summed, keepdims=True)
    return grad.reshape(shape)
