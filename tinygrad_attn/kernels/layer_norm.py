"""LayerNorm over the last axis of a (rows, n) array, forward and backward.

    mu = mean(x),  rstd = 1 / sqrt(mean((x - mu)^2) + eps),  xhat = (x - mu) * rstd
    y = xhat * w + b

Forward saves mu and rstd (two numbers per row) instead of xhat; backward
recomputes xhat on the fly. With gw = g * w,

    dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
    dw = sum over rows of g * xhat,   db = sum over rows of g

Rows too large to square. In float32 a row of magnitude 1e20 or more has
squares beyond the largest float (3.4e38) though its normalised values are
ordinary numbers: the variance would be inf, rstd 0 and the output the bias
(PyTorch's float32 kernel gives NaN). The forward loop marks such a row
(rstd NaN) and `_layer_norm_rescaled` does it again divided by a power of
two c near its largest |x|: exact, and mean(x) = c mean(x/c), rstd(x) =
rstd(x/c) / c with eps / c^2, none of which overflows. Right for every row
whose x - mean is representable; a row holding inf or NaN gives NaN, as in
PyTorch. The second pass is a loop of its own, run only when a row was
marked: the same code as a branch inside the forward loop, though never
taken, slowed that loop by 6-15% (measured: its code changes how LLVM
compiles the loop), while the marking costs nothing measurable.

Each ordinary row is one cache-resident pass. The kernels may reorder their sums
(fast-math 'reassoc', see fastmath.py): nothing here cancels
catastrophically. Backward works on fixed blocks of
rows: each block adds its rows' dw and db into its own partial sums, which
the caller adds in block order, so the result does not depend on how the
blocks are shared between threads.
"""
import math

import numpy as np
from numba import njit

from .fastmath import SUM_FASTMATH
from .registry import kernel
from .threads import parallel_for

_BLOCKS = 32  # backward's partial sums of dw and db: at most this many, each a fixed block of rows


@kernel(fastmath=SUM_FASTMATH)
def _layer_norm_forward(x, weight, bias, eps, out, mean, rstd, redo, start, stop):
    """out = layer_norm(x) * weight + bias and mean, rstd for rows [start, stop);
    a row whose variance is not finite gets rstd NaN and sets redo[0]."""
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)  # not 1 / n: int / int64 would be float64
    for r in range(start, stop):
        xr = x[r]
        total = x.dtype.type(0)
        for j in range(n):
            total += xr[j]
        mu = total * inv_n
        var = x.dtype.type(0)
        for j in range(n):  # two passes: the variance of centered values does not cancel
            d = xr[j] - mu
            var += d * d
        rs = x.dtype.type(1) / np.sqrt(var * inv_n + eps)
        if not var < x.dtype.type(np.inf):  # squares overflowed (or inf/NaN in the row): rs = 0 would
            rs = x.dtype.type(np.nan)       # output the bias; marked, done again by _layer_norm_rescaled
            redo[0] = True
        mean[r] = mu
        rstd[r] = rs
        yr = out[r]
        for j in range(n):
            yr[j] = (xr[j] - mu) * rs * weight[j] + bias[j]


@njit(nogil=True, cache=True, fastmath=SUM_FASTMATH)
def _layer_norm_rescaled(x, weight, bias, eps, out, mean, rstd):
    """The rows the forward loop marked (rstd NaN) again, on x / c with
    c = 2^(e-1) for max|x| = m 2^e (0.5 <= m < 1), so |x / c| < 2. A row
    holding inf stays NaN (one holding NaN gives NaN again). Not in KERNELS:
    a training step on ordinary data never runs it, so warmup does not
    compile it; its first call in a fresh cache compiles it (about a second)."""
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)  # not 1 / n: int / int64 would be float64
    for r in range(x.shape[0]):
        if rstd[r] == rstd[r]:  # not marked
            continue
        xr = x[r]
        biggest = x.dtype.type(0)
        for j in range(n):
            a = abs(xr[j])
            biggest = a if a > biggest else biggest  # NaN never compares greater
        if not biggest < x.dtype.type(np.inf):  # an infinite value: the row stays NaN
            continue
        e = math.frexp(biggest)[1]
        scale = x.dtype.type(math.ldexp(1.0, 1 - e))
        total = x.dtype.type(0)
        for j in range(n):
            total += xr[j] * scale
        mu = total * inv_n
        var = x.dtype.type(0)
        for j in range(n):
            d = xr[j] * scale - mu
            var += d * d
        # eps / c^2 as eps * scale * scale: it underflows to 0 (harmless) where c^2 would overflow
        rs = x.dtype.type(1) / np.sqrt(var * inv_n + eps * scale * scale) * scale
        mu = mu * x.dtype.type(math.ldexp(1.0, e - 1))
        mean[r] = mu
        rstd[r] = rs
        yr = out[r]
        for j in range(n):
            yr[j] = (xr[j] - mu) * rs * weight[j] + bias[j]


@kernel(fastmath=SUM_FASTMATH)
def _layer_norm_backward(x, weight, mean, rstd, grad, dx, dweight_blocks, dbias_blocks, block_rows,
                         start, stop):
    """For blocks [start, stop) of `block_rows` rows: dx, and each block's partial sums of dw, db."""
    rows, n = x.shape
    inv_n = x.dtype.type(1.0 / n)  # not 1 / n: int / int64 would be float64
    for blk in range(start, stop):
        dw, db = dweight_blocks[blk], dbias_blocks[blk]
        dw[:] = 0
        db[:] = 0
        last = (blk + 1) * block_rows
        for r in range(blk * block_rows, last if last < rows else rows):
            xr, gr, dr = x[r], grad[r], dx[r]
            mu, rs = mean[r], rstd[r]
            sum_gw = x.dtype.type(0)
            sum_gw_xhat = x.dtype.type(0)
            for j in range(n):
                gw = gr[j] * weight[j]
                sum_gw += gw
                sum_gw_xhat += gw * ((xr[j] - mu) * rs)
            mean_gw, mean_gw_xhat = sum_gw * inv_n, sum_gw_xhat * inv_n
            for j in range(n):
                xhat = (xr[j] - mu) * rs
                dw[j] += gr[j] * xhat
                db[j] += gr[j]
                dr[j] = rs * (gr[j] * weight[j] - mean_gw - xhat * mean_gw_xhat)


def layer_norm_forward(x, weight, bias, eps, out, mean, rstd):
    """out = layer_norm(x) * weight + bias, and each row's mean and rstd; x, out: (rows, n)."""
    redo = np.zeros(1, np.bool_)  # set by a row too large to square (or holding inf or NaN)
    parallel_for(_layer_norm_forward, x.shape[0], x, weight, bias, eps, out, mean, rstd, redo,
                 item_size=x.shape[1])
    if redo[0]:
        _layer_norm_rescaled(x, weight, bias, eps, out, mean, rstd)


def layer_norm_backward(x, weight, mean, rstd, grad, dx):
    """Fill dx = dL/dx (rows, n); return (dw, db), summed over fixed blocks of rows in block
    order, so they do not depend on how the blocks were shared between threads."""
    rows, n = x.shape
    block_rows = max(1, -(-rows // _BLOCKS))
    n_blocks = -(-rows // block_rows)
    dw_blocks, db_blocks = np.empty((n_blocks, n), x.dtype), np.empty((n_blocks, n), x.dtype)
    parallel_for(_layer_norm_backward, n_blocks, x, weight, mean, rstd, grad, dx, dw_blocks, db_blocks,
                 block_rows, item_size=block_rows * n)
    return dw_blocks.sum(axis=0), db_blocks.sum(axis=0)
