"""LayerNorm over the last axis of a (rows, n) array, forward and backward.

    mu = mean(x),  rstd = 1 / sqrt(mean((x - mu)^2) + eps),  xhat = (x - mu) * rstd
    y = xhat * w + b

Forward saves mu and rstd (two numbers per row) instead of xhat; backward
recomputes xhat on the fly. With gw = g * w,

    dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
    dw = sum over rows of g * xhat,   db = sum over rows of g

A row whose variance overflows (|x| near the float's maximum) gives NaN,
as in PyTorch, not the bias (which 1/sqrt(inf) = 0 would give).

Each row is one cache-resident pass. The kernels may reorder their sums
(fast-math 'reassoc', see fastmath.py): nothing here cancels
catastrophically. Backward works on fixed blocks of
rows: each block adds its rows' dw and db into its own partial sums, which
the caller adds in block order, so the result does not depend on how the
blocks are shared between threads.
"""
import numpy as np

from .fastmath import SUM_FASTMATH
from .registry import kernel
from .threads import parallel_for

_BLOCKS = 32  # backward's partial sums of dw and db: at most this many, each a fixed block of rows


@kernel(fastmath=SUM_FASTMATH)
def _layer_norm_forward(x, weight, bias, eps, out, mean, rstd, start, stop):
    """out = layer_norm(x) * weight + bias and mean, rstd for rows [start, stop)."""
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
        if var == x.dtype.type(np.inf):  # the variance overflowed: rs = 0 would output the bias
            rs = x.dtype.type(np.nan)
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
    parallel_for(_layer_norm_forward, x.shape[0], x, weight, bias, eps, out, mean, rstd, item_size=x.shape[1])


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
