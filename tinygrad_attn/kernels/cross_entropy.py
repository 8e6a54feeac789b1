"""Cross-entropy of (rows, classes) logits against integer targets, fused
with log-softmax: the log-probabilities are never stored.

Per row, with l = logsumexp(x) = m + log s, m = max_c x_c, s = sum_c exp(x_c - m)
(so log p_c = x_c - l) and smoothing e:

    loss = (1 - e) * (l - x_t) + e * (l - mean_c x_c)       (0 if t == ignore_index)
    dloss/dx_c = p_c - (1 - e) * [c == t] - e / C,   p_c = exp(x_c - m - log s)

A term whose weight is 0 is skipped: a -inf logit (a masked class) has
p_c = 0 and gives a finite loss without smoothing, +inf with it (as in
PyTorch), never 0 * inf = NaN.

m and log s are kept apart (forward saves both for backward): with logits
of 1e4 in float32, m + log s would round log s away. The loops work on
rows [start, stop); the functions at the end run them over all rows.
"""
import numpy as np
from numba import njit

from .fastmath import KERNEL_FASTMATH, SUM_FASTMATH, exp
from .registry import kernel
from .threads import parallel_for


# The row's three sums come from a helper compiled with SUM_FASTMATH (it holds
# nothing 'reassoc' could regroup dangerously), so the kernels, compiled without
# it, still get SIMD sums. One helper, not three: each Numba function costs
# ~0.2 s to compile.
@njit(fastmath=SUM_FASTMATH)
def row_sums(row):
    """(m, s, total): m = max(row), s = sum_j exp(row_j - m), total = sum_j row_j.

    A NaN is skipped by the max, but exp(NaN - m) then poisons s."""
    m = row[0]
    for j in range(1, row.shape[0]):
        m = row[j] if row[j] > m else m
    s = row.dtype.type(0)
    total = row.dtype.type(0)
    for j in range(row.shape[0]):
        s += exp(row[j] - m)
        total += row[j]
    return m, s, total


@kernel(fastmath=KERNEL_FASTMATH)
def _cross_entropy_forward(logits, target, ignore_index, smoothing, loss, row_max_out, log_sum, start, stop):
    """Fill loss, and the row max m and log s for backward, for rows [start, stop)."""
    rows, classes = logits.shape
    one, zero = logits.dtype.type(1), logits.dtype.type(0)
    inv_classes = logits.dtype.type(1.0 / classes)  # a float32 kernel stays float32
    for r in range(start, stop):
        xr = logits[r]
        m, s, total = row_sums(xr)
        log_s = np.log(s)
        row_max_out[r] = m
        log_sum[r] = log_s
        t = target[r]
        if t == ignore_index:
            loss[r] = 0
        else:  # l - x = log s - (x - m)
            # A term of weight 0 adds 0, even when it is infinite: a -inf logit (a masked
            # class) makes the mean of the logits -inf, and 0 * inf would be NaN.
            value = zero
            if smoothing != one:
                value += (one - smoothing) * (log_s - (xr[t] - m))
            if smoothing != zero:
                value += smoothing * (log_s - (total * inv_classes - m))
            loss[r] = value


@kernel(fastmath=KERNEL_FASTMATH)
def _cross_entropy_backward(logits, target, row_max, log_sum, row_grad, ignore_index, smoothing, out,
                            start, stop):
    """out = dL/dlogits for rows [start, stop), where row_grad[r] = dL/dloss[r]."""
    rows, classes = logits.shape
    one = logits.dtype.type(1)
    for r in range(start, stop):
        xr, dr = logits[r], out[r]
        t = target[r]
        if t == ignore_index:
            dr[:] = 0
            continue
        g, m, log_s = row_grad[r], row_max[r], log_sum[r]
        uniform = smoothing * logits.dtype.type(1.0 / classes)
        for c in range(classes):
            dr[c] = g * (exp(xr[c] - m - log_s) - uniform)
        dr[t] -= g * (one - smoothing)


def cross_entropy_forward(logits, target, ignore_index, smoothing, loss, row_max, log_sum):
    """Fill each row's loss, and its max m and log s for backward; logits: C-contiguous (rows, C)."""
    parallel_for(_cross_entropy_forward, logits.shape[0], logits, target, ignore_index, smoothing, loss, row_max,
                 log_sum, item_size=logits.shape[1])


def cross_entropy_backward(logits, target, row_max, log_sum, row_grad, ignore_index, smoothing, out):
    """out = dL/dlogits (rows, C), where row_grad[r] = dL/dloss[r]."""
    parallel_for(_cross_entropy_backward, logits.shape[0], logits, target, row_max, log_sum, row_grad,
                 ignore_index, smoothing, out, item_size=logits.shape[1])
