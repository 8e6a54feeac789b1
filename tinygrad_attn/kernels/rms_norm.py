"""RMSNorm over the last axis of a (rows, n) array, forward and backward.

    rstd = 1 / sqrt(mean(x^2) + eps),   xhat = x * rstd,   y = xhat * w

LayerNorm without the mean: nothing is subtracted, so a row is only
scaled. Forward saves rstd (one number per row); backward recomputes
xhat. With gw = g * w,

    dx = rstd * (gw - xhat * mean(gw * xhat))
    dw = sum over rows of g * xhat

(LayerNorm's dx has one more term, - mean(gw): the gradient of the mean
it removed.)

Rows too large to square. In float32 the squares of a row of magnitude
~1.8e19 or more pass the largest float (3.4e38) though its normalised
values are ordinary numbers: the mean square would be inf, rstd 0, and
the output and gradient 0 (what PyTorch's float32 rms_norm returns). As in
layer_norm.py, the forward loop marks such a row (rstd NaN) and
`_rms_norm_rescaled` does it again on x / c, c a power of two near its
largest |x|: exact, with rstd(x) = rstd(x / c) / c and eps / c^2. A row
holding inf gives rstd 0 (NaN where x is inf, 0 elsewhere, as PyTorch and
the twins), one holding NaN gives NaN.

Each row is one cache-resident pass; the sums may be reordered (fast-math
'reassoc', see fastmath.py): they add squares or products of bounded
terms, nothing cancels catastrophically. Backward works on fixed blocks of
rows, each adding its rows' dw into its own partial sum, which the caller
adds in block order, so the result does not depend on the thread count.
"""
import math

import numpy as np
from numba import njit

from .fastmath import SUM_FASTMATH
from .registry import kernel
from .threads import parallel_for

_BLOCKS = 32  # backward's partial sums of dw: at most this many, each a fixed block of rows


@kernel(fastmath=SUM_FASTMATH)
def _rms_norm_forward(x, weight, eps, out, rstd, redo, start, stop):
    """out = x * rstd * weight and rstd for rows [start, stop); a row whose
    mean square is not finite gets rstd NaN and sets redo[0]."""
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)  # not 1 / n: int / int64 would be float64
    for r in range(start, stop):
        xr = x[r]
        total = x.dtype.type(0)
        for j in range(n):
            total += xr[j] * xr[j]
        rs = x.dtype.type(1) / np.sqrt(total * inv_n + eps)
        if not total < x.dtype.type(np.inf):  # squares overflowed (or inf/NaN in the row): rs = 0 would
            rs = x.dtype.type(np.nan)         # output 0; marked, done again by _rms_norm_rescaled
            redo[0] = True
        rstd[r] = rs
        yr = out[r]
        for j in range(n):
            yr[j] = xr[j] * rs * weight[j]


@njit(nogil=True, cache=True, fastmath=SUM_FASTMATH)
def _rms_norm_rescaled(x, weight, eps, out, rstd):
    """The rows the forward loop marked (rstd NaN) again, on x / c with
    c = 2^(e-1) for max|x| = m 2^e (0.5 <= m < 1), so |x / c| < 2. A row
    holding inf gets rstd 0, one holding NaN NaN. Not in KERNELS, as layer_norm's: ordinary data
    never runs it, so warmup does not compile it."""
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)
    for r in range(x.shape[0]):
        if rstd[r] == rstd[r]:  # not marked
            continue
        xr = x[r]
        biggest = x.dtype.type(0)
        for j in range(n):
            a = abs(xr[j])
            biggest = a if a > biggest else biggest  # NaN never compares greater
        if not biggest < x.dtype.type(np.inf):  # inf in the row: rs = 1/sqrt(inf) = 0, as the twins and
            rs = x.dtype.type(0)                # PyTorch give (inf * 0 = NaN, the rest 0)
        else:  # (a NaN row comes here, NaN never being the biggest, and gets rs NaN)
            scale = x.dtype.type(math.ldexp(1.0, 1 - math.frexp(biggest)[1]))
            total = x.dtype.type(0)
            for j in range(n):
                v = xr[j] * scale
                total += v * v
            # eps / c^2 as eps * scale * scale: it underflows to 0 (harmless) where c^2 would overflow
            rs = x.dtype.type(1) / np.sqrt(total * inv_n + eps * scale * scale) * scale
        rstd[r] = rs
        yr = out[r]
        for j in range(n):
            yr[j] = xr[j] * rs * weight[j]


@kernel(fastmath=SUM_FASTMATH)
def _rms_norm_backward(x, weight, rstd, grad, dx, dweight_blocks, block_rows, start, stop):
    """For blocks [start, stop) of `block_rows` rows: dx, and each block's partial sum of dw."""
    rows, n = x.shape
    inv_n = x.dtype.type(1.0 / n)
    for blk in range(start, stop):
        dw = dweight_blocks[blk]
        dw[:] = 0
        last = (blk + 1) * block_rows
        for r in range(blk * block_rows, last if last < rows else rows):
            xr, gr, dr = x[r], grad[r], dx[r]
            rs = rstd[r]
            sum_gw_xhat = x.dtype.type(0)
            for j in range(n):
                sum_gw_xhat += gr[j] * weight[j] * (xr[j] * rs)
            mean_gw_xhat = sum_gw_xhat * inv_n
            for j in range(n):
                xhat = xr[j] * rs
                dw[j] += gr[j] * xhat
                dr[j] = rs * (gr[j] * weight[j] - xhat * mean_gw_xhat)


def rms_norm_forward(x, weight, eps, out, rstd):
    """out = rms_norm(x) * weight, and each row's rstd; x, out: (rows, n)."""
    redo = np.zeros(1, np.bool_)  # set by a row too large to square (or holding inf or NaN)
    parallel_for(_rms_norm_forward, x.shape[0], x, weight, eps, out, rstd, redo, item_size=x.shape[1])
    if redo[0]:
        _rms_norm_rescaled(x, weight, eps, out, rstd)


def rms_norm_backward(x, weight, rstd, grad, dx):
    """Fill dx = dL/dx (rows, n); return dw, summed over fixed blocks of rows in
    block order, so it does not depend on how the blocks were shared between threads."""
    rows, n = x.shape
    block_rows = max(1, -(-rows // _BLOCKS))
    n_blocks = -(-rows // block_rows)
    dw_blocks = np.empty((n_blocks, n), x.dtype)
    parallel_for(_rms_norm_backward, n_blocks, x, weight, rstd, grad, dx, dw_blocks, block_rows,
                 item_size=block_rows * n)
    return dw_blocks.sum(axis=0)
