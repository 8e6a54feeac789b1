"""Cross-entropy of (rows, classes) logits against integer targets, fused
with log-softmax: the log-probabilities are never stored.

Per row, with l = logsumexp(x) (so log p_c = x_c - l) and smoothing e:

    loss = (1 - e) * (l - x_t) + e * (l - mean_c x_c)       (0 if t == ignore_index)
    dloss/dx_c = p_c - (1 - e) * [c == t] - e / C,   p_c = exp(x_c - l)

Forward keeps l per row for backward. Kernels work on rows [start, stop).
"""
import numpy as np
from numba import njit

from .mathx import exp
from .softmax import FASTMATH, row_max


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def cross_entropy_forward(logits, target, ignore_index, smoothing, loss, logsumexp, start, stop):
    """Fill loss (per row) and logsumexp (per row, for backward)."""
    rows, classes = logits.shape
    one = logits.dtype.type(1)
    inv_classes = logits.dtype.type(1.0 / classes)  # a float32 kernel stays float32
    for r in range(start, stop):
        xr = logits[r]
        m = row_max(xr)
        s = logits.dtype.type(0)
        total = logits.dtype.type(0)
        for c in range(classes):
            s += exp(xr[c] - m)
            total += xr[c]
        lse = m + np.log(s)
        logsumexp[r] = lse
        t = target[r]
        if t == ignore_index:
            loss[r] = 0
        else:
            loss[r] = (one - smoothing) * (lse - xr[t]) + smoothing * (lse - total * inv_classes)


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def cross_entropy_backward(logits, target, logsumexp, row_grad, ignore_index, smoothing, out, start, stop):
    """out = dL/dlogits, where row_grad[r] = dL/dloss[r]."""
    rows, classes = logits.shape
    one = logits.dtype.type(1)
    for r in range(start, stop):
        xr, dr = logits[r], out[r]
        t = target[r]
        if t == ignore_index:
            dr[:] = 0
            continue
        g, lse = row_grad[r], logsumexp[r]
        uniform = smoothing * logits.dtype.type(1.0 / classes)
        for c in range(classes):
            dr[c] = g * (exp(xr[c] - lse) - uniform)
        dr[t] -= g * (one - smoothing)
