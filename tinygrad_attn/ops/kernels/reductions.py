"""Fast-math flags, and the row reductions of cross-entropy (max, sum of exp(x - m), sum).

A float sum can run in SIMD lanes with several partial sums only if LLVM
may reorder the additions: the fast-math flag 'reassoc'. The order is
still fixed by the compiled code, so results are deterministic.

But 'reassoc' also lets LLVM regroup (x - m) - log s into x - (m + log s),
and with logits of 1e4 in float32, m + log s rounds log s away. So kernels
where such a difference matters (log-softmax, cross-entropy) are compiled
with KERNEL_FASTMATH, without 'reassoc', and get their sums from a small
helper (SUM_FASTMATH: it contains nothing to regroup; one helper, not
three, because each Numba function costs ~0.2 s to compile). Kernels
with nothing to fear (LayerNorm, attention) use SUM_FASTMATH throughout;
softmax too, routing its one risky difference through memory.
"""
from numba import njit

from .mathx import exp

KERNEL_FASTMATH = {"nsz", "contract", "arcp"}
SUM_FASTMATH = KERNEL_FASTMATH | {"reassoc"}


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
