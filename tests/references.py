"""The dropout hash, written again for the tests, and the masks it gives.

The plain numpy versions of the fused ops, forward and backward, live in
the package (tinygrad_attn.reference.numpy_backward); what is here rebuilds the
masks the kernels draw, independently of kernels/random_bits.py, so a test
can hand the numpy versions the very mask an op used.
"""
import math

import numpy as np


def random_bits(key, index):
    """lowbias32(lowbias32(index ^ key) + key) in uint32 arithmetic: the dropout hash."""
    def lowbias32(x):
        x = (x ^ (x >> 16)) * np.uint32(0x7FEB352D)
        x = (x ^ (x >> 15)) * np.uint32(0x846CA68B)
        return x ^ (x >> 16)
    key = np.uint32(key)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps modulo 2^32 on purpose (numpy warns for 0-d)
        return lowbias32(lowbias32(np.asarray(index, dtype=np.uint64).astype(np.uint32) ^ key) + key)


def dropout_keep(shape, p, key):
    """The kept elements: bits >= p * 2^32 (C order index); p = 1 keeps none, p = 0 all."""
    if p >= 1:
        return np.zeros(shape, bool)
    threshold = min(round(p * 2**32), 2**32 - 1)
    return random_bits(key, np.arange(math.prod(shape)).reshape(shape)) >= threshold


def attention_keep(q, k, v, mask, p, key):
    """The dropout mask of the attention weights, which have the batch shape of
    the output (q, k, v and the mask broadcast together): element i kept as
    `dropout_keep` says."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], () if mask is None else mask.shape[:-2])
    return dropout_keep(batch + (q.shape[-2], k.shape[-2]), p, key)
