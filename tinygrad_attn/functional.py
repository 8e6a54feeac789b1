"""Functions on tensors with PyTorch's names and signatures (torch.nn.functional).

Layers in `tinygrad_attn.nn` call these; these call ops. Each op is applied
in one place: an op with a Tensor method (gelu, silu, softmax, log_softmax,
...) is applied there, and the function here calls the method; the others
(linear, layer_norm, attention, ...) are applied here. The heavy ones
(linear, softmax, log_softmax, layer_norm, rms_norm, apply_rotary_emb,
cross_entropy, attention, dropout, gelu, silu, swiglu) call fused ops backed by Numba
kernels. Each fused op has a composite twin, written step by step with
primitive ops, in
`tinygrad_attn.reference`: read those to see the math, and the tests check
the fused ones against them. Inside `with tinygrad_attn.reference_ops():`
(or under `@reference_ops()`, or after `set_reference_ops(True)`) every
fused op runs its twin instead (the engine chooses: nothing here asks),
so a whole model runs, and backpropagates, through the path you read. The
fused ops' backward, in plain numpy: `tinygrad_attn.reference.numpy_backward`.
"""
import warnings

import numpy as np

from .autograd import is_grad_enabled, no_grad
from .ops.attention import (AttentionWeights, PackedSelfAttention, ScaledDotProductAttention,
                            check_mask_dtype)
from .ops.dropout import DropoutOp
from .ops.elementwise import Swiglu
from .ops.cross_entropy import CrossEntropy
from .ops.matmul import LinearOp
from .ops.movement import repeat_kv_heads
from .ops.layer_norm import LayerNormOp
from .ops.rms_norm import RMSNormOp
from .ops.rotary import RotaryOp
from .shapes import ShapeError
from .tensor import Tensor, _promote, where


def relu(input, inplace=False):
    """max(input, 0), elementwise. inplace=True is not implemented."""
    _no_inplace("relu", inplace)
    return input.relu()


def gelu(input, *, approximate="none"):
    """input * Phi(input), Phi the standard normal CDF; approximate="tanh"
    uses 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return input.gelu(approximate=approximate)


def silu(input, inplace=False):
    """input * sigmoid(input), elementwise (SiLU, or swish; one fused kernel).
    inplace=True is not implemented."""
    _no_inplace("silu", inplace)
    return input.silu()


def swiglu(input):
    """silu(a) * b for the two halves [a | b] of input's last axis (SwiGLU's
    gate, one fused kernel): Llama's feed-forward w2(silu(w1 x) * w3 x) is
    w2(swiglu(x [W1; W3]^T)), one product for w1 and w3 (models.FeedForward).
    Not a PyTorch function; F.glu's layout, with silu on the first half."""
    return Swiglu.apply(input)


def sigmoid(input):
    """1 / (1 + exp(-input)), elementwise."""
    return input.sigmoid()


def tanh(input):
    """tanh(input), elementwise."""
    return input.tanh()


def linear(input, weight, bias=None):
    """y = x W^T + b, with W of shape (out_features, in_features) as in PyTorch.

    An integer input meets a float weight as in the arithmetic operators: it
    takes the weight's dtype (PyTorch raises; numpy would give float64)."""
    input, weight = _promote(input, weight)
    if bias is None:
        return LinearOp.apply(input, weight)
    bias, weight = _promote(bias, weight)
    return LinearOp.apply(input, weight, bias)


def _no_inplace(name, inplace):
    if inplace:
        raise NotImplementedError(f"{name}: inplace=True is not implemented (tensors are not "
                                  "modified in place here); use inplace=False")


def _embedding_unsupported(name, max_norm, scale_grad_by_freq, sparse):
    """Embedding arguments of PyTorch's that are not implemented here."""
    for arg, value, default in (("max_norm", max_norm, None),
                                ("scale_grad_by_freq", scale_grad_by_freq, False),
                                ("sparse", sparse, False)):
        if value != default:
            raise NotImplementedError(f"{name}: {arg}={value!r} is not implemented "
                                      f"(only the default, {arg}={default})")


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of `weight` (num_embeddings, dim) picked by integer indices `input` (any shape).

    With `padding_idx`, the positions holding that index give no gradient to
    its row (as in PyTorch). max_norm, scale_grad_by_freq and sparse are not
    implemented (NotImplementedError unless left at their defaults).
    The backward, a scatter-add into the rows: readable version
    tinygrad_attn.reference.numpy_backward.embedding_backward.
    """
    _embedding_unsupported("embedding", max_norm, scale_grad_by_freq, sparse)
    idx = input.data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"embedding: indices must be integers, got {idx.dtype}")
    n = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise IndexError(f"embedding: index out of range [0, {n}) "
                         f"(got min {idx.min()}, max {idx.max()})")
    out = weight[idx]
    if padding_idx is None:
        return out
    if not -n <= padding_idx < n:
        raise ValueError(f"embedding: padding_idx {padding_idx} is out of range for {n} embeddings")
    is_pad = idx == padding_idx % n
    if not is_pad.any():
        return out
    # Same values, but the padding positions are cut from the graph, so the
    # padding row receives no gradient from them.
    return where(Tensor(is_pad[..., None]), out.detach(), out)


def _softmax_dim(name, ndim, dim):
    """PyTorch's handling of softmax's dim=None (deprecated there: it warns
    and picks axis 0 for 0-, 1- and 3-D input, else axis 1)."""
    if dim is None:
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                      "to include dim=X as an argument.", UserWarning, stacklevel=3)
        dim = 0 if ndim in (0, 1, 3) else 1
    return dim


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x_i) / sum_j exp(x_j) along `dim` (one fused kernel; stable for any logits).

    A -inf entry gets 0; a row of only -inf has no softmax and gives NaN, as in
    PyTorch. Pass `dim`: without it PyTorch's deprecated implicit choice
    applies (with its warning). `dtype` casts the input first."""
    return input.softmax(_softmax_dim("softmax", input.ndim, dim), dtype=dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """x_i - log sum_j exp(x_j) along `dim` (one fused kernel); -inf stays -inf,
    and a row of only -inf gives NaN, as in PyTorch. `dim` and `dtype` as in
    `softmax`."""
    return input.log_softmax(_softmax_dim("log_softmax", input.ndim, dim), dtype=dtype)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last
    len(normalized_shape) axes (biased variance, as torch.nn.LayerNorm)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or input.shape[input.ndim - k:] != normalized_shape:
        raise ShapeError(f"layer_norm: input of shape {input.shape} does not end with "
                         f"normalized_shape {normalized_shape}")
    dtype = input.dtype if input.dtype.kind == "f" else np.float32
    weight = Tensor(np.ones(normalized_shape, dtype)) if weight is None else weight
    bias = Tensor(np.zeros(normalized_shape, dtype)) if bias is None else bias
    return LayerNormOp.apply(input, weight, bias, normalized_ndim=k, eps=eps)


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero each element with probability p and scale the rest by 1/(1-p);
    `input` itself when not training. inplace=True is not implemented.

    The mask is hashed from (a key drawn from the framework's generator,
    element index), so `manual_seed` makes it reproducible."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    _no_inplace("dropout", inplace)
    if not training or p == 0:
        return input
    return DropoutOp.apply(input, p=p)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Cross-entropy between logits `input` and integer class `target`, fused with log-softmax.

    input: (N, C), (C,) or (N, C, d1, ...) with classes on axis 1 as in
    PyTorch; target: integers of shape (N,), () or (N, d1, ...). Targets equal
    to `ignore_index` contribute nothing; "mean" divides by the number of the
    others (NaN if there are none, as PyTorch). With label smoothing e the
    loss per element is (1 - e) * (-log p_target) + e * mean_c(-log p_c).
    A -inf logit (a masked class) has p = 0: the loss stays finite unless it
    is the target or smoothing gives it weight (then +inf, as PyTorch), and
    the gradient is finite either way. Not implemented (NotImplementedError
    unless None): class `weight`, and the deprecated `size_average` and
    `reduce` (use `reduction`).
    """
    for arg, value in (("weight", weight), ("size_average", size_average), ("reduce", reduce)):
        if value is not None:
            raise NotImplementedError(f"cross_entropy: {arg}= is not implemented (only None)"
                                      + ("; use reduction=" if arg != "weight" else ""))
    logits = input
    t = target.data if isinstance(target, Tensor) else np.asarray(target)
    return CrossEntropy.apply(logits, target=t, ignore_index=ignore_index,
                              label_smoothing=label_smoothing, reduction=reduction)


def _mask_tensor(attn_mask, op):
    """attn_mask as a Tensor, its dtype checked first (Tensor() would turn int32 into int64)."""
    check_mask_dtype(attn_mask.data if isinstance(attn_mask, Tensor) else np.asarray(attn_mask), op)
    return attn_mask if isinstance(attn_mask, Tensor) else Tensor(np.asarray(attn_mask))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, *, scale=None, enable_gqa=False, need_weights=False):
    """softmax(Q K^T * scale + mask) V, batched over all leading axes, in one fused kernel.

    Q: (..., L, E), K: (..., S, E), V: (..., S, Ev); scale (keyword-only, as
    in PyTorch) defaults to 1/sqrt(E). `attn_mask` follows torch.nn.functional's convention: a
    boolean mask is True where a query MAY attend, a float mask is added to
    the scores. `is_causal` lets query i see keys j <= i. Dropout (p =
    dropout_p) is applied to the weights. Returns the output, or (output,
    weights) with need_weights=True (weights before dropout, with the batch
    shape of the output; gradients flow through them too).

    As in PyTorch, is_causal=True with an attn_mask raises, and
    enable_gqa=True lets key and value have fewer heads (axis -3) than the
    query: Hk and Hv must each divide Hq (they may differ), and query head
    h reads key head h // (Hq / Hk) and value head h // (Hq / Hv)
    (grouped-query attention: the kernel reads each shared head in place and
    sums its gradient over its group; need_weights' gradient path repeats
    the key instead). `need_weights` (keyword-only) is our extension.

    A query that may attend to no key (its mask row all False / -inf) gets
    zero weights, an output of 0 and no gradient. PyTorch's math path gives
    NaN there, which then spreads through the whole backward pass.
    """
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask should not be set "
                           "when is_causal=True (as in PyTorch)")
    inputs = (query, key, value)
    if attn_mask is not None:
        inputs += (_mask_tensor(attn_mask, "scaled_dot_product_attention"),)
    out, ctx = ScaledDotProductAttention.apply_with_ctx(*inputs, is_causal=is_causal, scale=scale,
                                                        dropout_p=dropout_p, enable_gqa=enable_gqa)
    if not need_weights:
        return out
    # The weights depend on query, key and the mask, not on value. (Select by
    # position, not by `t is not value`: in self-attention the same tensor is
    # all three, and the weights would silently lose their gradient.)
    qk_mask = (query, repeat_kv_heads(query, key) if enable_gqa else key) + inputs[3:]
    weights = None if ctx is None else ctx.weights  # None under reference_ops(): AttentionWeights' twin computes P
    if weights is not None and not (is_grad_enabled() and any(t.requires_grad for t in qk_mask)):
        return out, Tensor(weights)
    value_batch = value.shape[:-3] + query.shape[-3:-2] if enable_gqa else value.shape[:-2]  # heads as the query's
    return out, AttentionWeights.apply(*qk_mask, weights=weights, scale=scale, value_batch=value_batch,
                                       is_causal=is_causal)


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
    if not need_weights:
        return out
    if ctx is not None:
        return out, Tensor(ctx.weights)
    with no_grad():  # under reference_ops() the twin keeps no weights: AttentionWeights' twin computes them
        B, T, width = qkv.shape
        split = qkv.reshape(B, T, 3, num_heads, width // (3 * num_heads))
        q, k = (split[:, :, i].permute(0, 2, 1, 3) for i in range(2))
        return out, AttentionWeights.apply(q, k, *inputs[1:], scale=scale, is_causal=is_causal)


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last len(normalized_shape)
    axes (one fused kernel; Llama's normalization: LayerNorm without the mean).

    eps=None is PyTorch's rule: the machine epsilon of the input's dtype
    (torch.finfo(input.dtype).eps: 1.2e-7 in float32, 2.2e-16 in float64).
    Llama's models pass their own (llama2.c: norm_eps = 1e-5)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if k == 0 or input.shape[input.ndim - k:] != normalized_shape:
        raise ShapeError(f"rms_norm: input of shape {input.shape} does not end with "
                         f"normalized_shape {normalized_shape}")
    dtype = input.dtype if input.dtype.kind == "f" else np.dtype(np.float32)
    eps = float(np.finfo(dtype).eps) if eps is None else eps
    weight = Tensor(np.ones(normalized_shape, dtype)) if weight is None else weight
    return RMSNormOp.apply(input, weight, normalized_ndim=k, eps=eps)


def apply_rotary_emb(x, freqs_cos, freqs_sin):
    """Rotary position embedding (RoPE), llama2.c's `apply_rotary_emb` for one tensor.

    x: (..., T, n_heads, head_dim), positions on axis -3 as llama2.c's
    (batch, T, heads, head_dim); freqs_cos, freqs_sin: (T, head_dim // 2),
    the tables of `nn.precompute_freqs_cis` for these T positions (slice
    them, e.g. [start:start + T], for positions that do not start at 0).
    Each pair (x[2i], x[2i+1]) of every head vector at position t turns by
    the angle t * f_i (llama2.c's pairing, that of its complex numbers
    x[2i] + j x[2i+1]; Hugging Face pairs (i, i + head_dim/2) instead, so its
    weights need their q, k rows permuted). One fused kernel; the backward
    is the inverse rotation (by -t * f_i).

    Applied to queries and keys, the score q_t . k_s then depends on the
    positions only through t - s: R_t^T R_s = R_{s-t}.
    """
    cos, sin = (f if isinstance(f, Tensor) else Tensor(np.asarray(f)) for f in (freqs_cos, freqs_sin))
    return RotaryOp.apply(x, cos, sin)
