"""Plain numpy references for the fused ops (forward only, float64 math).

Written independently of the kernels: the tests compare both.
"""
import math

import numpy as np


def softmax(a, axis=-1):
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(a, axis=-1):
    m = a.max(axis=axis, keepdims=True)
    return a - m - np.log(np.exp(a - m).sum(axis=axis, keepdims=True))


def layer_norm(x, w, b, k, eps=1e-5):
    axes = tuple(range(x.ndim - k, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


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
    """The kept elements: bits >= p * 2^32 (C order index); p = 1 keeps none."""
    if p >= 1:
        return np.zeros(shape, bool)
    threshold = min(round(p * 2**32), 2**32 - 1)
    return random_bits(key, np.arange(math.prod(shape)).reshape(shape)) >= threshold


def dropout(x, p, key):
    scale = 0.0 if p >= 1 else 1 / (1 - p)
    return x * dropout_keep(x.shape, p, key) * x.dtype.type(scale)


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    n_classes = logits.shape[0 if logits.ndim == 1 else 1]
    x = logits.reshape(1, -1) if logits.ndim == 1 else np.moveaxis(logits, 1, -1).reshape(-1, n_classes)
    t = np.asarray(target).reshape(-1)
    logp = log_softmax(x, -1)
    valid = t != ignore_index
    nll = -logp[np.arange(len(t)), np.where(valid, t, 0)]
    loss = np.where(valid, (1 - label_smoothing) * nll - label_smoothing * logp.mean(-1), 0.0)
    if reduction == "none":
        return loss.reshape(np.shape(target)).astype(logits.dtype)
    total = loss.sum()
    if reduction == "sum":
        return total.astype(logits.dtype)
    return (total / valid.sum() if valid.any() else np.nan).astype(logits.dtype)


def attention(q, k, v, mask=None, causal=False, scale=None, p=0.0, key=0):
    """(out, weights) of scaled dot-product attention; a query with no key gets zero weights.

    Weights have the batch shape of the output (q, k, v and mask broadcast);
    dropout keeps element i of the weights (C order) as `dropout_keep` says."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.triu(np.ones((L, S), bool), 1), -np.inf, s)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    batch = np.broadcast_shapes(s.shape[:-2], v.shape[:-2])
    s = np.broadcast_to(s, batch + (L, S))
    m = s.max(axis=-1, keepdims=True)
    has_key = m > -np.inf
    e = np.exp(s - np.where(has_key, m, 0))
    w = np.where(has_key, e / np.where(has_key, e.sum(axis=-1, keepdims=True), 1), 0).astype(q.dtype)
    dropped = w * dropout_keep(w.shape, p, key) * (1 / (1 - p)) if 0 < p < 1 else w * (p < 1)
    return (dropped @ v).astype(q.dtype), w
