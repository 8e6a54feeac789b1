"""Reductions: sum, mean, max, min, var, std, logsumexp.

Each takes `axis` (an int, a tuple of ints, or None for all axes) and
`keepdims`. Backward first restores the reduced axes as size-1 axes
(`_keep`), then broadcasts the gradient back over them.
"""
import numpy as np

from ..autograd import Function
from ..shapes import normalize_axes


def _keep(grad, axes, keepdims):
    """Re-insert the reduced axes (as size 1) into a gradient of a reduction."""
    return grad if keepdims else np.expand_dims(grad, axes)


class Sum(Function):
    """z = sum of x over `axis`.   dz/dx_i = 1: the gradient is copied to every summed element."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim, "sum")
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, axes, keepdims
        return np.asarray(x.sum(axis=axes, keepdims=keepdims))

    @staticmethod
    def backward(ctx, grad):
        return np.broadcast_to(_keep(grad, ctx.axes, ctx.keepdims), ctx.shape)


class Mean(Function):
    """z = (1/N) sum of x over `axis`.   dz/dx_i = 1/N."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim, "mean")
        ctx.shape, ctx.axes, ctx.keepdims = x.shape, axes, keepdims
        ctx.count = int(np.prod([x.shape[a] for a in axes]))
        return np.asarray(x.mean(axis=axes, keepdims=keepdims))

    @staticmethod
    def backward(ctx, grad):
        g = _keep(grad, ctx.axes, ctx.keepdims) / grad.dtype.type(ctx.count)
        return np.broadcast_to(g, ctx.shape)


class _Extreme(Function):
    """Shared body of Max and Min: z = extreme of x over `axis`.

    dz/dx_i = 1 for the element(s) equal to the extreme, 0 elsewhere; when
    several elements tie, the gradient is split evenly between them (as
    PyTorch's amax/amin do).
    """

    reduce = None
    name = None

    @classmethod
    def forward(cls, ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim, cls.name)
        empty = [a for a in axes if x.shape[a] == 0]
        if empty:  # as PyTorch: an empty tensor is fine if the reduced axes are not empty
            raise ValueError(f"{cls.name}: cannot reduce over axis {empty[0]} of size 0 (tensor of "
                             f"shape {x.shape}); an extreme of no elements is undefined")
        z = np.asarray(cls.reduce(x, axis=axes, keepdims=True))
        ctx.save_for_backward(x, z)
        ctx.axes, ctx.keepdims = axes, keepdims
        return z if keepdims else np.squeeze(z, axis=axes)

    @staticmethod
    def backward(ctx, grad):
        x, z = ctx.saved_tensors
        winners = x == z
        share = winners / winners.sum(axis=ctx.axes, keepdims=True)
        return _keep(grad, ctx.axes, ctx.keepdims) * share


class Max(_Extreme):
    """z = max of x over `axis`; the gradient goes to the maximal element(s)."""
    reduce = staticmethod(np.max)
    name = "max"


class Min(_Extreme):
    """z = min of x over `axis`; the gradient goes to the minimal element(s)."""
    reduce = staticmethod(np.min)
    name = "min"


def _variance(ctx, x, axis, keepdims, correction, op):
    """sum((x - mean)^2) / (N - correction) over `axis` (NaN when N <= correction,
    as in PyTorch); keeps the deviations and the divisor on ctx for backward."""
    axes = normalize_axes(axis, x.ndim, op)
    count = int(np.prod([x.shape[a] for a in axes]))
    dev = x - x.mean(axis=axes, keepdims=True)
    denom = max(count - correction, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (dev * dev).sum(axis=axes, keepdims=keepdims) / x.dtype.type(denom)
    ctx.axes, ctx.keepdims, ctx.denom = axes, keepdims, denom
    return dev, np.asarray(z, dtype=x.dtype)


class Var(Function):
    """z = sum((x - mean)^2) / (N - correction) over `axis`.

    dz/dx_i = 2 (x_i - mean) / (N - correction). (The mean's own dependence
    on x_i drops out because the deviations sum to zero.) correction=1 is
    the unbiased estimate, PyTorch's default; correction=0 the biased one.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False, correction=1):
        dev, z = _variance(ctx, x, axis, keepdims, correction, "var")
        ctx.save_for_backward(dev)
        return z

    @staticmethod
    def backward(ctx, grad):
        dev, = ctx.saved_tensors
        return _keep(grad, ctx.axes, ctx.keepdims) * (2 * dev / dev.dtype.type(ctx.denom))


class Std(Function):
    """z = sqrt(var(x)) over `axis` (var as in `Var`, with its `correction`).

    dz/dx_i = (x_i - mean) / ((N - correction) z), and 0 where z = 0: there
    every deviation is 0 too, and PyTorch defines the gradient of a constant
    input as 0 instead of 0 / 0 (sqrt composed with var would give NaN).
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False, correction=1):
        dev, var = _variance(ctx, x, axis, keepdims, correction, "std")
        z = np.sqrt(var)
        ctx.save_for_backward(dev, z)
        return z

    @staticmethod
    def backward(ctx, grad):
        dev, z = ctx.saved_tensors
        z = _keep(z, ctx.axes, ctx.keepdims)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = _keep(grad, ctx.axes, ctx.keepdims) / (dev.dtype.type(ctx.denom) * z)
        return np.where(z == 0, np.zeros((), dev.dtype), g) * dev


class LogSumExp(Function):
    """z = log(sum(exp(x))) over `axis`, computed as m + log(sum(exp(x - m)))
    with m = max(x) so that large inputs do not overflow.

    dz/dx_i = exp(x_i) / sum(exp(x)) = softmax(x)_i.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        axes = normalize_axes(axis, x.ndim, "logsumexp")
        m = x.max(axis=axes, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)  # all -inf rows give -inf, not NaN
        z = m + np.log(np.exp(x - m).sum(axis=axes, keepdims=True))
        ctx.save_for_backward(x, z)
        ctx.axes, ctx.keepdims = axes, keepdims
        return z if keepdims else np.squeeze(z, axis=axes)

    @staticmethod
    def backward(ctx, grad):
        x, z = ctx.saved_tensors
        return _keep(grad, ctx.axes, ctx.keepdims) * np.exp(x - z)
