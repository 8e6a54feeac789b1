"""Movement ops: they move, copy or select elements without arithmetic.

Their backward moves the gradient back to where each element came from:
the inverse reshape or permutation, a sum over broadcast copies, or a
scatter-add for indexing (so an element picked twice gets both gradients).
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, normalize_axis, normalize_new_axis, unbroadcast
from ..kernels.movement import scatter_add_runs
from .array_views import random_array


def _check_int_dims(op, shape):
    """A new shape must be integers (-1 included); numpy's own error would not name the op."""
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in dims):
        raise TypeError(f"{op}: the shape must be integers, got {shape!r}")


class Reshape(Function):
    """z = x viewed with a new shape (same elements, same order).   dz/dx: reshape back."""

    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x.shape
        _check_int_dims("reshape", shape)
        try:
            return x.reshape(shape)
        except ValueError:
            raise ShapeError(f"reshape: cannot reshape a tensor of shape {x.shape} "
                             f"({x.size} elements) into shape {tuple(shape)}") from None

    @staticmethod
    def backward(ctx, grad):
        return grad.reshape(ctx.in_shape)


class Permute(Function):
    """z = x with its axes reordered: z.shape[i] = x.shape[axes[i]].
    dz/dx: apply the inverse permutation to the gradient."""

    @staticmethod
    def forward(ctx, x, axes):
        axes = tuple(normalize_axis(a, x.ndim, "permute") for a in axes)
        if sorted(axes) != list(range(x.ndim)):
            raise ShapeError(f"permute: axes {axes} are not a permutation of the "
                             f"{x.ndim} axes of a tensor of shape {x.shape}")
        ctx.inverse = tuple(np.argsort(axes))
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, grad):
        return grad.transpose(ctx.inverse)


class Expand(Function):
    """z = x broadcast to `shape` (a view; size-1 axes repeat, new axes lead).
    dz/dx: sum the gradient over the copies, by the same `unbroadcast` helper
    the engine uses for every broadcasting op."""

    @staticmethod
    def forward(ctx, x, shape):
        shape = tuple(shape)
        _check_int_dims("expand", shape)
        lead = len(shape) - x.ndim
        if lead < 0:
            raise ShapeError(f"expand: cannot expand a tensor of shape {x.shape} to fewer "
                             f"dimensions {shape}")
        # -1 keeps the input's size on that axis, as in PyTorch.
        shape = tuple(x.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(shape))
        try:
            z = np.broadcast_to(x, shape)
        except ValueError:
            raise ShapeError(f"expand: cannot expand a tensor of shape {x.shape} to shape {shape}") from None
        ctx.in_shape = x.shape
        return z

    @staticmethod
    def backward(ctx, grad):
        return unbroadcast(grad, ctx.in_shape)


def _axes_used(item):
    """How many axes of the indexed array an index item consumes (Ellipsis aside)."""
    if item is None or isinstance(item, (bool, np.bool_)):  # x[None], x[True]: a new axis
        return 0
    if isinstance(item, np.ndarray) and item.dtype == np.bool_:
        return item.ndim
    return 1


def _check_boolean_masks(items, shape):
    """numpy's rule: a boolean mask has exactly the shape of the axes it
    indexes. (Turned into integer arrays below, a mask that is too short
    would silently select from the first rows instead.)"""
    fill = len(shape) - sum(_axes_used(i) for i in items if i is not Ellipsis)
    axis = 0
    for item in items:
        if item is Ellipsis:
            axis += max(fill, 0)
            continue
        if isinstance(item, np.ndarray) and item.dtype == np.bool_ and item.ndim:
            covered = shape[axis:axis + item.ndim]
            if len(covered) < item.ndim:
                raise IndexError(f"getitem: a boolean index of shape {item.shape} at axis {axis} runs "
                                 f"past the last axis of a tensor of shape {shape}")
            if item.shape != covered:
                where = (f"axis {axis} (size {covered[0]})" if item.ndim == 1
                         else f"axes {axis}..{axis + item.ndim - 1} (sizes {covered})")
                raise IndexError(f"getitem: a boolean index of shape {item.shape} does not match "
                                 f"{where} of a tensor of shape {shape}")
        axis += _axes_used(item)


def _normalize_index(index, shape):
    """Turn lists inside an index into numpy arrays and boolean masks into the
    integer arrays they select, so that forward and backward index the same
    elements."""
    items = index if isinstance(index, tuple) else (index,)
    items = [np.asarray(item) if isinstance(item, list) else item for item in items]
    _check_boolean_masks(items, shape)
    out, advanced = [], False
    for item in items:
        if isinstance(item, np.ndarray):
            if item.dtype == np.bool_:
                out.extend(item.nonzero())
            elif item.dtype.kind in "iu":
                out.append(item)
            else:
                raise IndexError(f"getitem: index arrays must be integer or boolean, got {item.dtype}")
            advanced = True
        else:
            out.append(item)
    return tuple(out), advanced


def _scatter_add_rows(shape, rows, grad):
    """A zero array of `shape` with grad[i] added to row rows[i], for every i
    (the gradient of x[rows], an embedding lookup's).

    np.add.at does this one element at a time; here the rows are sorted once
    (stably, so the order of the additions is fixed) and each run of equal
    rows is summed into its row by a kernel (kernels/movement.py), or by one
    np.add.reduceat for other dtypes. Readable version:
    tinygrad_attn.reference.numpy_backward.embedding_backward."""
    rows = rows.reshape(-1)
    rows = np.where(rows < 0, rows + shape[0], rows)  # x[-1] is the last row
    width = math.prod(shape[1:])
    g = grad.reshape(rows.size, width)
    out = np.zeros(shape, grad.dtype)  # returned itself, not a view: a leaf (the table) keeps it without a copy
    if rows.size:
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        starts = np.flatnonzero(np.diff(sorted_rows, prepend=-1))  # where each run of one row begins
        if g.dtype in (np.float32, np.float64):
            scatter_add_runs(np.ascontiguousarray(g), order, np.append(starts, rows.size),
                                     sorted_rows[starts].astype(np.int64), out.reshape(shape[0], width))
        else:
            out.reshape(shape[0], width)[sorted_rows[starts]] = np.add.reduceat(g[order], starts, axis=0)
    return out


class GetItem(Function):
    """z = x[index] with ints, slices, None, Ellipsis, integer or boolean arrays.

    dz/dx: a zero tensor of x's shape with the gradient scatter-added at the
    selected positions; repeated indices accumulate, so x[[0, 0]] sends two
    gradients to x[0] (np.add.at; x[rows] by `_scatter_add_rows`).
    """

    @staticmethod
    def forward(ctx, x, index):
        index, advanced = _normalize_index(index, x.shape)
        ctx.in_shape, ctx.index, ctx.advanced = x.shape, index, advanced
        try:
            return np.asarray(x[index])
        except IndexError as e:
            raise IndexError(f"getitem: {e} (tensor of shape {x.shape})") from None

    @staticmethod
    def backward(ctx, grad):
        index = ctx.index
        if len(index) == 1 and isinstance(index[0], np.ndarray) and len(ctx.in_shape) >= 1:
            return _scatter_add_rows(ctx.in_shape, index[0], grad)  # x[rows], e.g. an embedding
        out = np.zeros(ctx.in_shape, dtype=grad.dtype)
        if ctx.advanced:
            np.add.at(out, index, grad)
        else:
            out[ctx.index] = grad  # basic indexing picks each element at most once
        return out

    @staticmethod
    def example(dtype, size):
        rows = np.arange(max(1, size // 8)) * 7 % 64  # a lookup of rows (an embedding's): its backward is the kernel's
        return (random_array(dtype, 64, 8),), dict(index=rows)


class Cat(Function):
    """z = the inputs joined along `axis`.   dz/dx_k: the k-th slice of the gradient."""

    @staticmethod
    def forward(ctx, *xs, axis=0):
        if not xs:
            raise ValueError("cat: expected at least one tensor")
        first = xs[0]
        axis = normalize_axis(axis, first.ndim, "cat")
        for x in xs[1:]:
            if x.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, first.shape))
                                           if i != axis):
                raise ShapeError(f"cat: shapes {first.shape} and {x.shape} differ outside axis {axis}")
        ctx.axis = axis
        ctx.offsets = np.cumsum([x.shape[axis] for x in xs])[:-1]
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        return tuple(np.split(grad, ctx.offsets, axis=ctx.axis))


class Stack(Function):
    """z = the inputs stacked along a new axis.   dz/dx_k = the gradient at index k of that axis."""

    @staticmethod
    def forward(ctx, *xs, axis=0):
        if not xs:
            raise ValueError("stack: expected at least one tensor")
        for x in xs[1:]:
            if x.shape != xs[0].shape:
                raise ShapeError(f"stack: all tensors need the same shape, got {xs[0].shape} and {x.shape}")
        axis = normalize_new_axis(axis, xs[0].ndim, "stack")
        ctx.axis = axis
        return np.stack(xs, axis=axis)

    @staticmethod
    def backward(ctx, grad):
        return tuple(np.moveaxis(grad, ctx.axis, 0))


def repeat_kv_heads(query, kv):
    """Grouped-query attention: kv (..., Hkv, S, E) with each head repeated for
    the Hq / Hkv consecutive query heads that share it (query head h reads kv
    head h // (Hq / Hkv), as torch's repeat_interleave on axis -3). The
    backward of the repeat sums the group's gradients into the shared head.

    On tensors, unlike the ops above: it applies Reshape, Expand and Reshape,
    so the graph holds those three. F.scaled_dot_product_attention's weights
    with enable_gqa use it, and so does attention's composite twin."""
    hq, hkv = query.shape[-3], kv.shape[-3]
    if hq == hkv:
        return kv
    lead, (S, E) = kv.shape[:-3], kv.shape[-2:]
    one_each = Reshape.apply(kv, shape=lead + (hkv, 1, S, E))
    return Reshape.apply(Expand.apply(one_each, shape=lead + (hkv, hq // hkv, S, E)), shape=lead + (hq, S, E))
