"""Reductions: sum, mean, max, min, var, logsumexp.

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
        if x.size == 0:
            raise ValueError(f"{cls.name}: cannot reduce an empty tensor of shape {x.shape}")
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


class Var(Function):
    """z = sum((x - mean)^2) / (N - correction) over `axis`.

    dz/dx_i = 2 (x_i - mean) / (N - correction). (The mean's own dependence
    on x_i drops out because the deviations sum to zero.) correction=1 is
    the unbiased estimate, PyTorch's default; correction=0 the biased one.
    """

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False, correction=1):
        axes = normalize_axes(axis, x.ndim, "var")
        count = int(np.prod([x.shape[a] for a in axes]))
        dev = x - x.mean(axis=axes, keepdims=True)
        denom = max(count - correction, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (dev * dev).sum(axis=axes, keepdims=keepdims) / x.dtype.type(denom)
        ctx.save_for_backward(dev)
        ctx.axes, ctx.keepdims, ctx.denom = axes, keepdims, denom
        return np.asarray(z, dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad):
        dev, = ctx.saved_tensors
        return _keep(grad, ctx.axes, ctx.keepdims) * (2 * dev / dev.dtype.type(ctx.denom))


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
