"""Functions on tensors with PyTorch's names and signatures (torch.nn.functional).

Layers in `tinygrad_attn.nn` call these; these call ops. The heavy ones
(linear, softmax, log_softmax, layer_norm, cross_entropy, attention, dropout)
call fused ops backed by Numba kernels. Their composite versions, written
step by step with primitive ops, are in `tinygrad_attn.reference`: read
those to see the math, and the tests check the fused ones against them.
"""
import numpy as np

from .autograd import is_grad_enabled
from .ops.attention import (AttentionWeights, PackedSelfAttention, ScaledDotProductAttention,
                            check_mask_dtype)
from .ops.dropout import DropoutOp
from .ops.loss import CrossEntropy
from .ops.matmul import LinearOp
from .ops.norm import LayerNormOp
from .ops.softmax import LogSoftmax, Softmax
from .shapes import ShapeError
from .tensor import Tensor, _promote


def relu(x):
    return x.relu()


def gelu(x, approximate="none"):
    return x.gelu(approximate=approximate)


def sigmoid(x):
    return x.sigmoid()


def tanh(x):
    return x.tanh()


def linear(x, weight, bias=None):
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    An integer input meets a float weight as in the arithmetic operators: it
    takes the weight's dtype (PyTorch raises; numpy would give float64)."""
    x, weight = _promote(x, weight)
    if bias is None:
        return LinearOp.apply(x, weight)
    bias, weight = _promote(bias, weight)
    return LinearOp.apply(x, weight, bias)


def embedding(indices, weight):
    """Rows of `weight` picked by integer `indices` (any shape)."""
    idx = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= weight.shape[0]):
        raise IndexError(f"embedding: index out of range [0, {weight.shape[0]}) "
                         f"(got min {idx.min()}, max {idx.max()})")
    return weight[idx]


def softmax(x, dim=-1):
    """exp(x_i) / sum_j exp(x_j) along `dim` (one fused kernel; stable for any logits).

    A -inf entry gets 0; a row of only -inf has no softmax and gives NaN, as in PyTorch."""
    return Softmax.apply(x, axis=dim)


def log_softmax(x, dim=-1):
    """x_i - log sum_j exp(x_j) along `dim` (one fused kernel); -inf stays -inf, and a
    row of only -inf gives NaN, as in PyTorch."""
    return LogSoftmax.apply(x, axis=dim)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) axes (biased variance, as torch.nn.LayerNorm)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or x.shape[x.ndim - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: input of shape {x.shape} does not end with "
                         f"normalized_shape {normalized_shape}")
    dtype = x.dtype if x.dtype.kind == "f" else np.float32
    weight = Tensor(np.ones(normalized_shape, dtype)) if weight is None else weight
    bias = Tensor(np.zeros(normalized_shape, dtype)) if bias is None else bias
    return LayerNormOp.apply(x, weight, bias, normalized_ndim=k, eps=eps)


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p).

    The mask is hashed from (a key drawn from the framework's generator,
    element index), so `manual_seed` makes it reproducible."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    return DropoutOp.apply(x, p=p)


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Cross-entropy between `logits` and integer class `target`, fused with log-softmax.

    logits: (N, C), (C,) or (N, C, d1, ...) with classes on axis 1 as in
    PyTorch; target: integers of shape (N,), () or (N, d1, ...). Targets equal
    to `ignore_index` contribute nothing; "mean" divides by the number of the
    others (NaN if there are none, as PyTorch). With label smoothing e the
    loss per element is (1 - e) * (-log p_target) + e * mean_c(-log p_c).
    A -inf logit (a masked class) has p = 0: the loss stays finite unless it
    is the target or smoothing gives it weight (then +inf, as PyTorch), and
    the gradient is finite either way.
    """
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    return CrossEntropy.apply(logits, target=t, ignore_index=ignore_index,
                              label_smoothing=label_smoothing, reduction=reduction)


def _mask_tensor(attn_mask, op):
    """attn_mask as a Tensor, its dtype checked first (Tensor() would turn int32 into int64)."""
    check_mask_dtype(attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask), op)
    return attn_mask if isinstance(attn_mask, Tensor) else Tensor(np.asarray(attn_mask))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, need_weights=False):
    """softmax(Q K^T * scale + mask) V, batched over all leading axes, in one fused kernel.

    Q: (..., L, E), K: (..., S, E), V: (..., S, Ev); scale defaults to
    1/sqrt(E). `attn_mask` follows torch.nn.functional's convention: a
    boolean mask is True where a query MAY attend, a float mask is added to
    the scores. `is_causal` lets query i see keys j <= i. Dropout (p =
    dropout_p) is applied to the weights. Returns the output, or (output,
    weights) with need_weights=True (weights before dropout, with the batch
    shape of the output; gradients flow through them too).

    A query that may attend to no key (its mask row all False / -inf) gets
    zero weights, an output of 0 and no gradient. PyTorch's math path gives
    NaN there, which then spreads through the whole backward pass.
    """
    inputs = (query, key, value)
    if attn_mask is not None:
        inputs += (_mask_tensor(attn_mask, "scaled_dot_product_attention"),)
    out, ctx = ScaledDotProductAttention.apply_with_ctx(*inputs, is_causal=is_causal, scale=scale,
                                                        dropout_p=dropout_p)
    if not need_weights:
        return out
    weights = ctx.weights
    # The weights depend on query, key and the mask, not on value. (Select by
    # position, not by `t is not value`: in self-attention the same tensor is
    # all three, and the weights would silently lose their gradient.)
    qk_mask = (query, key) + inputs[3:]
    if is_grad_enabled() and any(t.requires_grad for t in qk_mask):
        return out, AttentionWeights.apply(*qk_mask, weights=weights, scale=scale,
                                           value_batch=value.shape[:-2])
    return out, Tensor(weights)


def packed_self_attention(qkv, num_heads, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                          need_weights=False):
    """Multi-head self-attention on a packed projection, in one fused op.

    qkv: (B, T, 3 * num_heads * head_dim), x W^T + b for the stacked
    query, key and value weights (torch.nn.MultiheadAttention's
    in_proj_weight): its last axis holds (3, num_heads, head_dim). Each head
    h attends with Q_h, K_h, V_h read in place; the result is (B, T,
    num_heads * head_dim), the heads side by side, ready for the output
    projection. `attn_mask` (broadcastable to (B, num_heads, T, T)),
    `is_causal`, `dropout_p` and `scale` are as in
    `scaled_dot_product_attention` (boolean True = may attend).

    With need_weights=True also returns the weights (B, num_heads, T, T),
    before dropout, as a record: no gradient flows through them (use
    `scaled_dot_product_attention` on separate Q, K, V for that).
    """
    inputs = (qkv,)
    if attn_mask is not None:
        inputs += (_mask_tensor(attn_mask, "packed_self_attention"),)
    out, ctx = PackedSelfAttention.apply_with_ctx(*inputs, num_heads=num_heads, is_causal=is_causal,
                                                  scale=scale, dropout_p=dropout_p)
    return (out, Tensor(ctx.weights)) if need_weights else out
