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

Like every kernel here, these are serial over a range of rows
[start, stop) and release the GIL; `threads.parallel_for` runs ranges on
several threads.
"""
import numpy as np
from numba import njit

from .mathx import exp
from .reductions import KERNEL_FASTMATH, dot, max_of, store_exp, sum_exp, sum_of


@njit(nogil=True, cache=True, fastmath=KERNEL_FASTMATH)
def softmax_forward(x, out, log, start, stop):
    """out[r] = softmax(x[r]) (log_softmax if `log`) for rows r in [start, stop)."""
    one = x.dtype.type(1)
    for r in range(start, stop):
        xr, yr = x[r], out[r]
        m = max_of(xr)
        if log:
            log_s = np.log(sum_exp(xr, m))
            for j in range(xr.shape[0]):
                yr[j] = (xr[j] - m) - log_s
        else:
            inv = one / store_exp(xr, m, yr)
            for j in range(xr.shape[0]):
                yr[j] *= inv


@njit(nogil=True, cache=True, fastmath=KERNEL_FASTMATH)
def softmax_backward(y, grad, out, log, start, stop):
    """out = dL/dx from the forward output y and grad = dL/dy, rows [start, stop)."""
    for r in range(start, stop):
        yr, gr, dr = y[r], grad[r], out[r]
        if log:
            s = sum_of(gr)
            for j in range(yr.shape[0]):
                dr[j] = gr[j] - exp(yr[j]) * s
        else:
            s = dot(gr, yr)
            for j in range(yr.shape[0]):
                dr[j] = yr[j] * (gr[j] - s)
