"""Dropout with a counter-based random mask.

Element i is kept when uniform_bits(key, i) >= threshold, with threshold =
p * 2^32, and kept elements are scaled by 1 / (1 - p). The mask depends
only on (key, i): it is the same whatever the number of threads, it can be
regenerated in backward instead of stored, and the loop is SIMD integer
arithmetic (no per-element call into a random number library).

Dropout is linear in x, so backward is the same call on the gradient with
the same key. Indices are taken modulo 2^32.
"""
from .fastmath import KERNEL_FASTMATH
from .random_bits import uniform_bits
from .registry import kernel
from .threads import parallel_for


@kernel(fastmath=KERNEL_FASTMATH)
def _dropout_apply(x, key, threshold, scale, out, start, stop):
    """out[i] = x[i] * mask[i] * scale for i in [start, stop) (1-D arrays)."""
    zero = x.dtype.type(0)
    xs, outs = x[start:stop], out[start:stop]  # indices from 0: no negative-index checks in the loop
    for j in range(xs.shape[0]):
        # multiply rather than select, so a NaN in x stays visible
        outs[j] = xs[j] * (scale if uniform_bits(key, start + j) >= threshold else zero)


def dropout_apply(x, key, threshold, scale, out):
    """out = x * mask * scale, x and out 1-D (the mask of element i is decided by (key, i))."""
    parallel_for(_dropout_apply, x.shape[0], x, key, threshold, scale, out)
