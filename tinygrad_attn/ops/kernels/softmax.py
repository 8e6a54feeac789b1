"""Softmax and log-softmax over the last axis of a (rows, n) array.

Fused: each row is read once into cache and finished there (max, then exp
and sum in one loop, then scale), instead of numpy's five full passes over
memory with temporaries in between.

    softmax:      y_j = exp(x_j - m) / s,        s = sum_k exp(x_k - m),  m = max_k x_k
    log_softmax:  y_j = x_j - m - log s
    backward:     softmax      dx = y * (g - sum(g * y))
                  log_softmax  dx = g - exp(y) * sum(g)

Subtracting the row max keeps every exp argument <= 0: logits of +-1e4 are
fine. A row containing NaN gives NaN.

Like every kernel here, these are serial over a range of rows
[start, stop) and release the GIL; `threads.parallel_for` runs ranges on
several threads.
"""
import numpy as np
from numba import njit

from .mathx import exp

# Allow LLVM to reorder sums so it can vectorize them; no flag that assumes
# away infinities or NaNs (masked scores are -inf).
FASTMATH = {"nsz", "contract", "reassoc", "arcp"}


@njit(inline="always")
def row_max(row):
    m = row[0]
    for j in range(1, row.shape[0]):
        m = row[j] if row[j] > m else m  # (a NaN is skipped here but poisons the sum)
    return m


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def softmax_forward(x, out, log, start, stop):
    """out[r] = softmax(x[r]) (log_softmax if `log`) for rows r in [start, stop)."""
    one = x.dtype.type(1)
    for r in range(start, stop):
        xr, yr = x[r], out[r]
        m = row_max(xr)
        s = x.dtype.type(0)
        for j in range(xr.shape[0]):
            e = exp(xr[j] - m)
            yr[j] = e
            s += e
        if log:
            shift = m + np.log(s)
            for j in range(xr.shape[0]):
                yr[j] = xr[j] - shift
        else:
            inv = one / s
            for j in range(xr.shape[0]):
                yr[j] *= inv


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def softmax_backward(y, grad, out, log, start, stop):
    """out = dL/dx from the forward output y and grad = dL/dy, rows [start, stop)."""
    for r in range(start, stop):
        yr, gr, dr = y[r], grad[r], out[r]
        s = y.dtype.type(0)
        if log:
            for j in range(yr.shape[0]):
                s += gr[j]
            for j in range(yr.shape[0]):
                dr[j] = gr[j] - exp(yr[j]) * s
        else:
            for j in range(yr.shape[0]):
                s += gr[j] * yr[j]
            for j in range(yr.shape[0]):
                dr[j] = yr[j] * (gr[j] - s)
