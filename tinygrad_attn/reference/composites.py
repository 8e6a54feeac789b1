"""The reference versions of the fused functions in `functional`, and the
switch that runs them: `reference_ops`.

Each function here is a composition of primitive ops only (matmul, exp,
sum, div, where, ...), so every step is visible and the engine
differentiates it with no hand-written backward. They are the readable
definitions, and the tests' reference for the fused Numba ops that
`functional` calls (the same results up to rounding: float64 runs agree to
1e-15). Inside `with tinygrad_attn.reference_ops():` (or in a function
decorated with `@tinygrad_attn.reference_ops()`) `functional`, the Tensor
methods softmax, log_softmax and gelu, and so every layer and model run
these instead: the graph (`viz.graph`) holds each primitive step and a
debugger steps through the backward of each. The fused ops' own backward,
written out in plain numpy, is `tinygrad_attn.reference.numpy_backward`.

The switch is per thread (a `contextvars.ContextVar`): a thread that
enters `reference_ops()` changes nothing for the others, and a new thread
starts in a fresh context, with the fused ops (unless the interpreter makes
threads inherit the context, as Python 3.14's free-threaded build does).
Grad mode (`no_grad`), by contrast, is one process-wide flag.
"""
import contextlib
import contextvars
import math
import threading

import numpy as np

from ..ops.dropout import draw_key, keep_rule
from ..kernels.random_bits import uniform_bits_numpy
from ..shapes import ShapeError, normalize_axis
from ..tensor import Tensor, stack, where

_enabled = contextvars.ContextVar("tinygrad_attn.reference_ops", default=False)


def is_reference_ops_enabled():
    """Whether the fused functions run their reference versions now (in this thread)."""
    return _enabled.get()


def set_reference_ops(enabled):
    """True: the fused functions of `functional` (and Tensor.softmax,
    log_softmax, gelu) run their reference versions here, every primitive op
    in the graph; False: the fused ops (the default). For this thread;
    returns the previous setting."""
    previous = _enabled.get()
    _enabled.set(bool(enabled))
    return previous


class reference_ops(contextlib.ContextDecorator):
    """Run the reference versions inside: `with reference_ops():`, or as a
    decorator, `@reference_ops()`. `reference_ops(False)` runs the fused ops
    inside a reference region. Nests, and restores the previous setting on
    exit, also when an exception leaves the block. Per thread (see the
    module docstring); one instance may be entered in several threads at
    once, and again inside itself (a decorated function that recurses)."""

    def __init__(self, enabled=True):
        self.enabled = bool(enabled)
        self._local = threading.local()  # each thread's stack of the settings to restore

    def _tokens(self):
        return self._local.__dict__.setdefault("tokens", [])

    def __enter__(self):
        self._tokens().append(_enabled.set(self.enabled))
        return self

    def __exit__(self, *exc):
        _enabled.reset(self._tokens().pop())
        return False


def linear(x, weight, bias=None):
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch."""
    if x.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"linear: input of shape {x.shape} does not fit a weight of shape "
                         f"{weight.shape} (expected last input dim {weight.shape[-1]})")
    y = x @ weight.T
    return y if bias is None else y + bias


def softmax(x, dim=-1):
    """exp(x_i) / sum_j exp(x_j) along `dim`, shifted by the max for stability."""
    normalize_axis(dim, x.ndim, "softmax")
    shifted = x - x.max(axis=dim, keepdims=True).detach()
    e = shifted.exp()
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x, dim=-1):
    """x_i - log sum_j exp(x_j) along `dim`, shifted by the max as in softmax."""
    normalize_axis(dim, x.ndim, "log_softmax")
    shifted = x - x.max(axis=dim, keepdims=True).detach()
    return shifted - shifted.exp().sum(axis=dim, keepdims=True).log()


def _power_of_two_scale(x, axes):
    """Per row, 2^(e-1) for max|x| = m 2^e (0.5 <= m < 1), so |x| / c < 2; 1
    for rows whose max is below 1 (or not finite: they stay inf/NaN)."""
    e = np.frexp(np.abs(x).max(axis=axes, keepdims=True, initial=0))[1]
    return np.ldexp(np.ones((), x.dtype), np.maximum(e - 1, 0))


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) axes (biased variance, as torch.nn.LayerNorm)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if x.shape[x.ndim - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: input of shape {x.shape} does not end with "
                         f"normalized_shape {normalized_shape}")
    axes = tuple(range(x.ndim - k, x.ndim))
    # A row of 1e30 in float32 would overflow when squared. Dividing it by a
    # power of two c near its largest |x| is exact and changes nothing else:
    # layer_norm(x) = layer_norm(x / c) with eps / c^2. (c: a constant, 1 for rows below 1.)
    c = Tensor(_power_of_two_scale(x.data, axes))
    x, eps = x / c, eps / c / c
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    y = centered / (var + eps).sqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is the one the dropout kernel computes: element i (in C order)
    is kept when 32 random bits hashed from (key, i) are >= p * 2^32, with
    the key drawn from the framework's generator. So with the same
    `manual_seed` this and `functional.dropout` drop the same elements.
    """
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    threshold, scale = keep_rule(p, x.dtype)
    keep = uniform_bits_numpy(draw_key(), np.arange(x.numel()).reshape(x.shape)) >= threshold
    return x * Tensor(keep.astype(x.dtype) * scale)


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Cross-entropy between `logits` and integer class `target`.

    logits: (N, C), (C,) or (N, C, d1, ...) with classes on axis 1 as in
    PyTorch; target: integers of shape (N,), () or (N, d1, ...). Targets equal
    to `ignore_index` contribute nothing; "mean" divides by the number of the
    others. With label smoothing e the loss per element is
    (1 - e) * (-log p_target) + e * mean_c(-log p_c).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must hold integer class indices, got {t.dtype}")
    target_shape = t.shape
    if logits.ndim == 1:
        logits, t = logits.reshape(1, -1), t.reshape(1)
    elif logits.ndim > 2:
        logits = logits.swapaxes(1, -1) if logits.ndim == 3 else logits.permute(
            (0,) + tuple(range(2, logits.ndim)) + (1,))
    expected = logits.shape[:-1]
    if t.shape != expected:
        raise ShapeError(f"cross_entropy: target of shape {t.shape} does not match logits "
                         f"(expected target shape {expected} for {logits.shape[-1]} classes)")
    n_classes = logits.shape[-1]
    valid = t != ignore_index
    if ((t[valid] < 0) | (t[valid] >= n_classes)).any():
        raise IndexError(f"cross_entropy: target values must be in [0, {n_classes}) or ignore_index")
    safe_t = np.where(valid, t, 0)
    logp = log_softmax(logits, dim=-1)
    picked = logp.reshape(-1, n_classes)[np.arange(safe_t.size), safe_t.reshape(-1)].reshape(t.shape)
    loss = -picked
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * logp.mean(axis=-1)
    loss = loss * Tensor(valid.astype(logits.dtype))
    if reduction == "none":
        return loss.reshape(target_shape)  # () for (C,) logits, as PyTorch
    if reduction == "sum":
        return loss.sum()
    n_valid = int(valid.sum())
    return loss.sum() / n_valid if n_valid else loss.sum() * np.nan  # PyTorch also gives NaN


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, need_weights=False):
    """softmax(Q K^T * scale + mask) V, batched over all leading axes.

    Q: (..., L, E), K: (..., S, E), V: (..., S, Ev); scale defaults to
    1/sqrt(E). `attn_mask` follows torch.nn.functional's convention: a
    boolean mask is True where a query MAY attend, a float mask is added to
    the scores. `is_causal` lets query i see keys j <= i. Returns the
    output, or (output, weights) with need_weights=True.

    A query that may attend to no key gets zero weights (an output of 0
    and no gradient), as in the fused version: the row of -inf scores is
    replaced by a row of zeros before the softmax, and the softmax is then
    multiplied by a mask of rows that had any key.
    """
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"scaled_dot_product_attention: query {query.shape}, key {key.shape} and "
                         f"value {value.shape} do not fit (need query[-1] == key[-1] and "
                         f"key[-2] == value[-2])")
    L, S = query.shape[-2], key.shape[-2]
    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query @ key.swapaxes(-2, -1)) * scale
    if is_causal:
        scores = scores.masked_fill(Tensor(np.triu(np.ones((L, S), dtype=bool), k=1)), -np.inf)
    if attn_mask is not None:
        m = attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask)
        if m.dtype == np.bool_:
            scores = where(Tensor(m), scores, -np.inf)
        else:
            scores = scores + attn_mask
    has_key = (scores.data > -np.inf).any(axis=-1, keepdims=True)
    if not has_key.all():  # rows with no key: softmax of zeros, then zeroed
        scores = where(Tensor(has_key), scores, 0.0)
    weights = softmax(scores, dim=-1)
    if not has_key.all():
        weights = weights * Tensor(has_key.astype(weights.dtype))
    attn = dropout(weights, dropout_p) if dropout_p > 0 else weights
    out = attn @ value
    return (out, weights) if need_weights else out


def gelu(x, approximate="none"):
    """x * Phi(x), Phi the standard normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2
    (erfc, not 1 + erf: nothing cancels for negative x, where gelu is tiny).

    approximate="tanh": x/2 (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3),
    written as x * sigmoid(2u) (the same number: (1 + tanh u)/2 = 1/(1 + e^-2u)),
    which keeps its digits for negative x, where 1 + tanh u would cancel.
    """
    if approximate == "tanh":
        u = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
        return x * (u * 2).sigmoid()
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * ((x * -(1 / math.sqrt(2))).erfc() * 0.5)


def packed_self_attention(qkv, num_heads, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                          need_weights=False):
    """Multi-head self-attention on a packed projection qkv (B, T, 3 * H * hd),
    its last axis laid out (3, H, hd): each head attends with its Q, K, V;
    the result is the heads side by side, (B, T, H * hd)."""
    B, T, width = qkv.shape
    hd = width // (3 * num_heads)
    split = qkv.reshape(B, T, 3, num_heads, hd)
    q, k, v = (split[:, :, i].permute(0, 2, 1, 3) for i in range(3))  # each (B, H, T, hd)
    result = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, need_weights=need_weights)
    heads, weights = result if need_weights else (result, None)
    out = heads.permute(0, 2, 1, 3).reshape(B, T, num_heads * hd)  # concatenate the heads
    return (out, weights.detach()) if need_weights else out


def rms_norm(x, normalized_shape, weight=None, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape)
    axes: LayerNorm without subtracting the mean."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if x.shape[x.ndim - k:] != normalized_shape:
        raise ShapeError(f"rms_norm: input of shape {x.shape} does not end with "
                         f"normalized_shape {normalized_shape}")
    axes = tuple(range(x.ndim - k, x.ndim))
    y = x / ((x * x).mean(axis=axes, keepdims=True) + eps).sqrt()
    return y if weight is None else y * weight


def apply_rotary_emb(x, freqs_cos, freqs_sin):
    """Rotate each pair (x[2i], x[2i+1]) of every head vector of x (..., T, H, hd)
    by the angle of its position: with cos, sin (T, hd/2) of those angles,

        y[2i] = x[2i] cos - x[2i+1] sin,    y[2i+1] = x[2i] sin + x[2i+1] cos

    (llama2.c's apply_rotary_emb, in real numbers)."""
    shape = x.shape
    if x.ndim < 3 or shape[-1] % 2 or tuple(freqs_cos.shape) != (shape[-3], shape[-1] // 2):
        raise ShapeError(f"apply_rotary_emb: input of shape {shape} with freqs_cos {freqs_cos.shape}: "
                         f"expected x (..., T, n_heads, head_dim) and tables (T, head_dim // 2)")
    pairs = x.reshape(shape[:-1] + (shape[-1] // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]  # (..., T, H, hd/2) each
    cos = freqs_cos.astype(x.dtype).reshape(shape[-3], 1, shape[-1] // 2)  # broadcast over the heads
    sin = freqs_sin.astype(x.dtype).reshape(shape[-3], 1, shape[-1] // 2)
    return stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(shape)
