"""Fast-math flags, and row reductions (max, sum, sum of exp(x - m)).

A float sum can run in SIMD lanes with several partial sums only if LLVM
may reorder the additions: the fast-math flag 'reassoc'. The order is
still fixed by the compiled code, so results are deterministic.

But 'reassoc' also lets LLVM regroup (x - m) - log s into x - (m + log s),
and with logits of 1e4 in float32, m + log s rounds log s away. So kernels
where such a difference matters (log-softmax, cross-entropy) are compiled
with KERNEL_FASTMATH, without 'reassoc', and get their sums from the small
helpers below (SUM_FASTMATH, which contain nothing to regroup). Kernels
with nothing to fear (LayerNorm, attention) use SUM_FASTMATH throughout;
softmax too, routing its one risky difference through memory.
"""
from numba import njit

from .mathx import exp

KERNEL_FASTMATH = {"nsz", "contract", "arcp"}
SUM_FASTMATH = KERNEL_FASTMATH | {"reassoc"}


@njit(fastmath=SUM_FASTMATH)
def max_of(row):
    """max(row) (a NaN is skipped here, but exp(NaN - m) then poisons the sum)."""
    m = row[0]
    for j in range(1, row.shape[0]):
        m = row[j] if row[j] > m else m
    return m


@njit(fastmath=SUM_FASTMATH)
def sum_of(row):
    s = row.dtype.type(0)
    for j in range(row.shape[0]):
        s += row[j]
    return s


@njit(fastmath=SUM_FASTMATH)
def sum_exp(row, m):
    """sum_j exp(row_j - m)."""
    s = row.dtype.type(0)
    for j in range(row.shape[0]):
        s += exp(row[j] - m)
    return s
