"""The sum of squares of a float array, accumulated in float64: clip_grad_norm_'s norm.

    sum_i x_i^2,   each x_i widened to float64 first

so float32 gradients neither overflow nor lose digits. The array is cut
into fixed blocks (by its size alone), each summed on its own in SIMD lanes
(fast-math 'reassoc'), and the block sums are added in order: the result
does not depend on the number of threads. Done here rather than with
numpy's float64 dot product, which would also copy the array to float64
and, for a large array, wake BLAS's own threads between our jobs.
"""
import numpy as np

from .fastmath import SUM_FASTMATH
from .registry import kernel
from .threads import parallel_for

_BLOCK = 1 << 16  # elements per partial sum


@kernel(fastmath=SUM_FASTMATH)
def _sum_of_squares(x, partial, start, stop):
    """partial[b] = the sum of squares of block b of x, for blocks [start, stop)."""
    n = x.shape[0]
    for b in range(start, stop):
        s = 0.0
        for i in range(b * _BLOCK, min(n, (b + 1) * _BLOCK)):
            v = np.float64(x[i])
            s += v * v
        partial[b] = s


def sum_of_squares(x):
    """sum(x^2) of a 1-D float32/float64 array, as a Python float (float64 sums)."""
    blocks = -(-x.shape[0] // _BLOCK)
    partial = np.empty(blocks, np.float64)
    parallel_for(_sum_of_squares, blocks, x, partial, item_size=_BLOCK)
    return float(partial.sum())
