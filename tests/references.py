"""The dropout hash, written again for the tests, and the masks it gives;
LayerNorm's reference on rows too large to square.

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


# --------------------------------------------------- LayerNorm on huge rows

def huge_rows(dtype, big, n=16, seed=0):
    """Three rows of n values: two of magnitude `big` (whose squares overflow
    `dtype`; |x| <= big, so x - mean stays representable) and an ordinary one."""
    x = np.random.default_rng(seed).standard_normal((3, n))
    x[:2] *= big / np.abs(x[:2]).max()
    return x.astype(dtype)


def torch_layer_norm(x, weight, bias, grad, eps=1e-5):
    """(y, dx, dw, db) of torch's layer_norm over the last axis of a (rows, n)
    array, in float64, for the loss sum(grad * y).

    Each row is divided first by a power of two c near its largest |x| (exact;
    c = 1 below 1) and normalised with eps / c^2: the same function, so a row
    too large to square even in float64 (1e200) has a reference too. The
    gradient of x / c is what torch's autograd differentiates through."""
    import torch
    as64 = lambda a: torch.tensor(np.asarray(a, np.float64), requires_grad=True)  # noqa: E731
    xt, wt, bt = as64(x), as64(weight), as64(bias)
    biggest = np.abs(x.astype(np.float64)).max(axis=-1)
    c = np.exp2(np.floor(np.log2(np.maximum(biggest, 1.0))))
    y = torch.stack([torch.nn.functional.layer_norm(xt[r] / float(c[r]), (x.shape[-1],), wt, bt,
                                                    eps / float(c[r]) / float(c[r])) for r in range(len(x))])
    (y * torch.tensor(np.asarray(grad, np.float64))).sum().backward()
    return [t.detach().numpy() for t in (y, xt.grad, wt.grad, bt.grad)]


def torch_rms_norm(x, weight, grad, eps=1e-6):
    """(y, dx, dw) of torch's rms_norm over the last axis, in float64, each row
    divided first by a power of two near its largest |x| as in torch_layer_norm."""
    import torch
    as64 = lambda a: torch.tensor(np.asarray(a, np.float64), requires_grad=True)  # noqa: E731
    xt, wt = as64(x), as64(weight)
    biggest = np.abs(x.astype(np.float64)).max(axis=-1)
    c = np.exp2(np.floor(np.log2(np.maximum(biggest, 1.0))))
    y = torch.stack([torch.nn.functional.rms_norm(xt[r] / float(c[r]), (x.shape[-1],), wt,
                                                  eps / float(c[r]) / float(c[r])) for r in range(len(x))])
    (y * torch.tensor(np.asarray(grad, np.float64))).sum().backward()
    return [t.detach().numpy() for t in (y, xt.grad, wt.grad)]


def assert_rows_close(actual, expected, rtol):
    """Row by row to rtol, on the scale of each row of `expected` (the
    gradient of a row of 1e30 is of order 1e-30, of an ordinary row 1)."""
    actual, expected = np.atleast_2d(actual), np.atleast_2d(expected)
    assert np.isfinite(actual).all(), actual
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * np.abs(e).max())
