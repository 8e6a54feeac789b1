"""The composite twins of the fused ops: each one the same computation built
from primitive ops, registered on its op with `@composite_of(Op)`.

A twin takes what its op's `apply` takes (tensors, then the op's
parameters) and is a composition of primitive ops only (matmul, exp, sum,
div, where, ...), so every step is visible and the engine differentiates
it with no hand-written backward. They are the readable definitions, and
the tests' reference for the fused Numba ops (tests/test_reference_ops.py
runs every fused op's gradcheck cases both ways: the same values and
gradients up to rounding, float64 runs agree to 1e-15). Inside
`with tinygrad_attn.reference_ops():` (or in a function decorated with
`@tinygrad_attn.reference_ops()`) a fused op's `apply` runs its twin here
(autograd.Function.apply_with_ctx chooses), so `functional`, the Tensor
methods and every layer and model do: the graph (`viz.graph`) holds each
primitive step and a debugger steps through the backward of each. The
fused ops' own backward, written out in plain numpy, is
`tinygrad_attn.reference.numpy_backward`.
"""
import math

import numpy as np

from ..autograd import composite_of
from ..kernels.random_bits import uniform_bits_numpy
from ..ops.attention import AttentionWeights, PackedSelfAttention, ScaledDotProductAttention, gqa_groups
from ..ops.cross_entropy import CrossEntropy
from ..ops.dropout import DropoutOp, draw_key, keep_rule
from ..ops.elementwise import Gelu, Silu, Swiglu
from ..ops.layer_norm import LayerNormOp
from ..ops.matmul import LinearOp
from ..ops.movement import repeat_kv_heads
from ..ops.rms_norm import RMSNormOp
from ..ops.rotary import RotaryOp
from ..ops.softmax import LogSoftmax, Softmax
from ..shapes import ShapeError, normalize_axis
from ..tensor import Tensor, stack, where


@composite_of(LinearOp)
def linear(x, weight, bias=None):
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch."""
    if x.shape[-1] != weight.shape[-1]:
        raise ShapeError(f"linear: input of shape {x.shape} does not fit a weight of shape "
                         f"{weight.shape} (expected last input dim {weight.shape[-1]})")
    y = x @ weight.T
    return y if bias is None else y + bias


@composite_of(Softmax)
def softmax(x, axis=-1):
    """exp(x_i) / sum_j exp(x_j) along `axis`, shifted by the max for stability."""
    normalize_axis(axis, x.ndim, "softmax")
    shifted = x - x.max(axis=axis, keepdims=True).detach()
    e = shifted.exp()
    return e / e.sum(axis=axis, keepdims=True)


@composite_of(LogSoftmax)
def log_softmax(x, axis=-1):
    """x_i - log sum_j exp(x_j) along `axis`, shifted by the max as in softmax."""
    normalize_axis(axis, x.ndim, "log_softmax")
    shifted = x - x.max(axis=axis, keepdims=True).detach()
    return shifted - shifted.exp().sum(axis=axis, keepdims=True).log()


def _power_of_two_scale(x, axes):
    """Per row, 2^(e-1) for max|x| = m 2^e (0.5 <= m < 1), so |x| / c < 2; 1
    for rows whose max is below 1 (or not finite: they stay inf/NaN)."""
    e = np.frexp(np.abs(x).max(axis=axes, keepdims=True, initial=0))[1]
    return np.ldexp(np.ones((), x.dtype), np.maximum(e - 1, 0))


@composite_of(LayerNormOp)
def layer_norm(x, weight, bias, normalized_ndim=1, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last
    `normalized_ndim` axes (biased variance, as torch.nn.LayerNorm)."""
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    if normalized_ndim < 1 or weight.shape != x.shape[x.ndim - normalized_ndim:] or bias.shape != weight.shape:
        raise ShapeError(f"layer_norm: input of shape {x.shape} with weight {weight.shape} and bias "
                         f"{bias.shape}: weight and bias must have the shape of the last {normalized_ndim} "
                         "input axes")
    # A row of 1e30 in float32 would overflow when squared. Dividing it by a
    # power of two c near its largest |x| is exact and changes nothing else:
    # layer_norm(x) = layer_norm(x / c) with eps / c^2. (c: a constant, 1 for rows below 1.)
    c = Tensor(_power_of_two_scale(x.data, axes))
    x, eps = x / c, eps / c / c
    mean = x.mean(axis=axes, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    return centered / (var + eps).sqrt() * weight + bias


@composite_of(DropoutOp)
def dropout(x, p=0.5, seed=None):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is the one the dropout kernel computes: element i (in C order)
    is kept when 32 random bits hashed from (key, i) are >= p * 2^32, with
    the key `seed`, or drawn from the framework's generator. So with the
    same `manual_seed` this and the fused op drop the same elements.
    """
    threshold, scale = keep_rule(p, x.dtype)
    key = draw_key() if seed is None else np.uint32(seed)
    keep = uniform_bits_numpy(key, np.arange(x.numel()).reshape(x.shape)) >= threshold
    return x * Tensor(keep.astype(x.dtype) * scale)


@composite_of(CrossEntropy)
def cross_entropy(logits, target=None, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
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
    logp = log_softmax(logits, axis=-1)
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


def _weights(query, key, attn_mask, is_causal, scale):
    """P = softmax(scale * Q K^T + M) over the keys (M: the mask, and -inf above
    the diagonal with is_causal).

    A query that may attend to no key gets zero weights (so an output of 0
    and no gradient), as in the fused op: the row of -inf scores is
    replaced by a row of zeros before the softmax, and the softmax is then
    multiplied by a mask of rows that had any key.
    """
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
    weights = softmax(scores, axis=-1)
    if not has_key.all():
        weights = weights * Tensor(has_key.astype(weights.dtype))
    return weights


def _check_fit(query, key, value):
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"scaled_dot_product_attention: query {query.shape}, key {key.shape} and "
                         f"value {value.shape} do not fit (need query[-1] == key[-1] and "
                         f"key[-2] == value[-2])")


@composite_of(ScaledDotProductAttention)
def scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0,
                                 seed=None, enable_gqa=False):
    """(P * D) V with P = softmax(Q K^T * scale + mask), batched over all leading axes.

    Q: (..., L, E), K: (..., S, E), V: (..., S, Ev); scale defaults to
    1/sqrt(E). `attn_mask` follows torch.nn.functional's convention: a
    boolean mask is True where a query MAY attend, a float mask is added to
    the scores. `is_causal` lets query i see keys j <= i. D: dropout of
    the weights with probability dropout_p (key `seed`, or drawn). With
    enable_gqa, key and value have fewer heads (axis -3) than the query,
    each count dividing the query's (they may differ): each is repeated for
    its group of query heads first.
    """
    if enable_gqa:
        gqa_groups("scaled_dot_product_attention", query.shape, key.shape, value.shape)
        key, value = repeat_kv_heads(query, key), repeat_kv_heads(query, value)
    _check_fit(query, key, value)
    weights = _weights(query, key, attn_mask, is_causal, scale)
    if dropout_p == 0:
        return weights @ value
    batch = np.broadcast_shapes(weights.shape[:-2], value.shape[:-2])  # one mask for each matrix of the output
    if weights.shape[:-2] != batch:
        weights = weights.expand(batch + weights.shape[-2:])
    return dropout(weights, dropout_p, seed) @ value


@composite_of(AttentionWeights)
def attention_weights(query, key, attn_mask=None, weights=None, scale=None, value_batch=(), is_causal=False):
    """P = softmax(Q K^T * scale + mask), with the batch shape of the output
    (the batch axes of query, key, mask and `value_batch` broadcast).
    (The fused op takes P from the attention op, `weights`; this twin
    computes it, so `weights` is not read.)"""
    P = _weights(query, key, attn_mask, is_causal, scale)
    batch = np.broadcast_shapes(P.shape[:-2], tuple(value_batch))
    return P if P.shape[:-2] == batch else P.expand(batch + P.shape[-2:])


@composite_of(Gelu)
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


@composite_of(Silu)
def silu(x):
    """x * sigmoid(x): the product of two primitive ops, whose backward the engine chains."""
    return x * x.sigmoid()


@composite_of(Swiglu)
def swiglu(h):
    """silu(a) * b for the halves [a | b] of h's last axis: two slices, a SiLU and a product."""
    n = h.shape[-1] // 2
    if h.shape[-1] % 2:
        raise ShapeError(f"swiglu: the last axis of the input holds the two halves [a | b], so its size "
                         f"must be even; got shape {h.shape}")
    a, b = h[..., :n], h[..., n:]
    return a * a.sigmoid() * b


@composite_of(PackedSelfAttention)
def packed_self_attention(qkv, attn_mask=None, num_heads=1, is_causal=False, scale=None, dropout_p=0.0, seed=None):
    """Multi-head self-attention on a packed projection qkv (B, T, 3 * H * hd),
    its last axis laid out (3, H, hd): each head attends with its Q, K, V;
    the result is the heads side by side, (B, T, H * hd)."""
    B, T, width = qkv.shape
    hd = width // (3 * num_heads)
    split = qkv.reshape(B, T, 3, num_heads, hd)
    q, k, v = (split[:, :, i].permute(0, 2, 1, 3) for i in range(3))  # each (B, H, T, hd)
    heads = scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale, dropout_p, seed)
    return heads.permute(0, 2, 1, 3).reshape(B, T, num_heads * hd)  # concatenate the heads


@composite_of(RMSNormOp)
def rms_norm(x, weight, normalized_ndim=1, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * weight over the last `normalized_ndim`
    axes: LayerNorm without subtracting the mean."""
    if normalized_ndim < 1 or weight.shape != x.shape[x.ndim - normalized_ndim:]:
        raise ShapeError(f"rms_norm: input of shape {x.shape} with weight {weight.shape}: the weight "
                         f"must have the shape of the last {normalized_ndim} input axes")
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    # rows too large to square: rms_norm(x) = rms_norm(x / c) with eps / c^2, as in layer_norm
    c = Tensor(_power_of_two_scale(x.data, axes))
    x, eps = x / c, eps / c / c
    return x / ((x * x).mean(axis=axes, keepdims=True) + eps).sqrt() * weight


@composite_of(RotaryOp)
def apply_rotary_emb(x, freqs_cos, freqs_sin):
    """Rotate each pair (x[2i], x[2i+1]) of every head vector of x (..., T, H, hd)
    by the angle of its position: with cos, sin (T, hd/2) of those angles,

        y[2i] = x[2i] cos - x[2i+1] sin,    y[2i+1] = x[2i] sin + x[2i+1] cos

    (llama2.c's apply_rotary_emb, in real numbers)."""
    shape = x.shape
    if x.ndim < 3 or shape[-1] % 2 or tuple(freqs_cos.shape) != (shape[-3], shape[-1] // 2) \
            or tuple(freqs_sin.shape) != tuple(freqs_cos.shape):
        raise ShapeError(f"apply_rotary_emb: input of shape {shape} with freqs_cos {freqs_cos.shape} and "
                         f"freqs_sin {freqs_sin.shape}: expected x (..., T, n_heads, head_dim) and tables "
                         "(T, head_dim // 2)")
    pairs = x.reshape(shape[:-1] + (shape[-1] // 2, 2))
    a, b = pairs[..., 0], pairs[..., 1]  # (..., T, H, hd/2) each
    cos = freqs_cos.astype(x.dtype).reshape(shape[-3], 1, shape[-1] // 2)  # broadcast over the heads
    sin = freqs_sin.astype(x.dtype).reshape(shape[-3], 1, shape[-1] // 2)
    return stack([a * cos - b * sin, a * sin + b * cos], dim=-1).reshape(shape)
