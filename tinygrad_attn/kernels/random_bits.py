"""A counter-based random number generator: 32 random bits per (key, index).

Dropout needs one uniform number per element, decided by (key, element
index) alone, so a mask is the same whatever the number of threads, can be
regenerated in backward instead of stored, and the loop vectorizes.
`uniform_bits` hashes the index with a 32-bit integer mixer (lowbias32, by
C. Wellons), keyed by the key; `uniform_bits_numpy` is the same function
on numpy arrays, for the readable reference implementations and the tests.
"""
import numpy as np
from numba import njit


@njit(inline="always")
def mix32(x):
    """lowbias32: a bijection of uint32 with good avalanche (Wellons)."""
    # Numba widens integer arithmetic to 64 bits; np.uint32(...) keeps the low 32.
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = np.uint32(x * np.uint32(0x846CA68B))
    return np.uint32(x ^ (x >> np.uint32(16)))


@njit(inline="always")
def uniform_bits(key, index):
    """32 random bits for element `index` of the stream named by `key`.

    Two rounds of the mixer over (index, key): neighbouring indices give
    unrelated bits, and the same (key, index) always gives the same bits.
    """
    return mix32(np.uint32(mix32(np.uint32(index) ^ key) + key))


def uniform_bits_numpy(key, indices):
    """`uniform_bits` for a numpy array of indices."""
    def mix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)  # uint32 arithmetic wraps modulo 2^32, as in the kernel
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))
    key = np.uint32(key)
    with np.errstate(over="ignore"):  # a 0-d array computes as a scalar, which warns where arrays wrap silently
        return mix(mix(np.asarray(indices).astype(np.uint32) ^ key) + key)
