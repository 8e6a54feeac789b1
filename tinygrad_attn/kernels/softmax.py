"""Softmax and log-softmax over the last axis of a (rows, n) array.

Fused: each row is read once into cache and finished there (max, then exp
and sum in one loop, then scale), instead of numpy's five full passes over
memory with temporaries in between.

    softmax:      y_j = exp(x_j - m) / s,        s = sum_k exp(x_k - m),  m = max_k x_k
    log_softmax:  y_j = (x_j - m) - log s        (in this order: m + log s would round
                                                  log s away when m is 1e4 in float32)
    backward:     softmax      dx = y * (g - sum(g * y))
                  log_softmax  dx = g - exp(y) * sum(g)

Subtracting the row max keeps every exp argument <= 0: logits of +-1e4 are
fine. A row containing NaN gives NaN.

The loops are serial over a range of rows [start, stop) and release the
GIL; the functions at the end run them over all rows on our threads.
"""
import numpy as np

from .fastmath import SUM_FASTMATH, exp
from .registry import kernel
from .threads import parallel_for

# SUM_FASTMATH lets LLVM reorder the row sums (see fastmath.py). The one
# difference it must not regroup, (x - m) - log s, goes through memory:
# x - m is stored first and log s subtracted in a second loop.


@kernel(fastmath=SUM_FASTMATH)
def _softmax_forward(x, out, log, start, stop):
    """out[r] = softmax(x[r]) (log_softmax if `log`) for rows r in [start, stop)."""
    n = x.shape[1]
    one, zero = x.dtype.type(1), x.dtype.type(0)
    for r in range(start, stop):
        xr, yr = x[r], out[r]
        m = xr[0]
        for j in range(1, n):
            m = xr[j] if xr[j] > m else m  # a NaN is skipped here but poisons the sum
        s = zero
        if log:
            for j in range(n):
                shifted = xr[j] - m
                yr[j] = shifted
                s += exp(shifted)
            log_s = np.log(s)
            for j in range(n):
                yr[j] -= log_s
        else:
            for j in range(n):
                e = exp(xr[j] - m)
                yr[j] = e
                s += e
            inv = one / s
            for j in range(n):
                yr[j] *= inv


@kernel(fastmath=SUM_FASTMATH)
def _softmax_backward(y, grad, out, log, start, stop):
    """out = dL/dx from the forward output y and grad = dL/dy, rows [start, stop)."""
    n = y.shape[1]
    for r in range(start, stop):
        yr, gr, dr = y[r], grad[r], out[r]
        s = y.dtype.type(0)
        if log:
            for j in range(n):
                s += gr[j]
            for j in range(n):
                dr[j] = gr[j] - exp(yr[j]) * s
        else:
            for j in range(n):
                s += gr[j] * yr[j]
            for j in range(n):
                dr[j] = yr[j] * (gr[j] - s)


def softmax_forward(x, out, log):
    """out = softmax(x) row by row (log_softmax if `log`); x, out: C-contiguous (rows, n)."""
    parallel_for(_softmax_forward, x.shape[0], x, out, log, item_size=x.shape[1])


def softmax_backward(y, grad, out, log):
    """out = dL/dx from the forward output y and grad = dL/dy, all C-contiguous (rows, n)."""
    parallel_for(_softmax_backward, y.shape[0], y, grad, out, log, item_size=y.shape[1])
