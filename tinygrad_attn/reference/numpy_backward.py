"""The backward of every fused op, written out in plain numpy.

The fused ops (LinearOp, Softmax, LogSoftmax, LayerNormOp, CrossEntropy,
DropoutOp, ScaledDotProductAttention, AttentionWeights, PackedSelfAttention,
Gelu, Silu, RMSNormOp, RotaryOp) run Numba kernels: fast, but loops over rows
and blocks that hide the math. Here each one's backward is a few lines of numpy, the derivative in
its docstring and the forward beside it, to read next to the op (and next to
docs/backprop_through_attention.md). tests/test_numpy_backward.py checks
every function against the fused op's own backward, to 1e-12 in float64.

Conventions. `grad` is dL/d(output), the gradient arriving from above; a
backward returns dL/d(input) for its inputs, in their order and with their
shapes (axes that broadcasting added or stretched are summed back). These
functions recompute what they need from the inputs (the ops keep it from
forward instead). Arrays only: nothing here imports the framework, so this
file reads on its own.
"""
import math

import numpy as np


def erfc(x):
    """1 - erf(x) per element, without cancelling in the tail: libm's erfc
    as the Erfc op computes it (numpy has none)."""
    return np.vectorize(math.erfc, otypes=[np.float64])(x).astype(x.dtype, copy=False)


def _sum_to(g, shape):
    """g summed back to `shape`: over the leading axes broadcasting added and
    the size-1 axes it stretched (the backward of broadcasting)."""
    g = g.sum(axis=tuple(range(g.ndim - len(shape)))) if g.ndim > len(shape) else g
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g


def _rows(a):
    """(..., n) as a (rows, n) matrix: every leading axis is a row index."""
    return a.reshape(-1, a.shape[-1])


# ---------------------------------------------------------------- linear

def linear_forward(x, weight, bias=None):
    """y = x W^T + b, with x (..., in), W (out, in) as in torch.nn.Linear, b (out,)."""
    y = x @ weight.T
    return y if bias is None else y + bias


def linear_backward(x, weight, grad):
    """(dL/dx, dL/dW, dL/db) for y = x W^T + b, g = dL/dy of shape (..., out):

        dL/dx = g W,    dL/dW = g^T x,    dL/db = sum of g over the rows

    Every leading axis of x is a row: W and b are shared by all of them, so
    their gradients sum over all (x and g flattened to (rows, in), (rows, out)).
    (The fused op: tinygrad_attn.ops.matmul.LinearOp.)
    """
    return grad @ weight, _rows(grad).T @ _rows(x), _rows(grad).sum(axis=0)


# ---------------------------------------------------------------- softmax

def softmax_forward(x, axis=-1):
    """y_i = exp(x_i - m) / sum_j exp(x_j - m) along `axis`, m = max x (nothing overflows)."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_backward(y, grad, axis=-1):
    """dL/dx for y = softmax(x), from y itself and g = dL/dy.

    The Jacobian is dy_i/dx_j = y_i ([i == j] - y_j), so

        dL/dx_j = sum_i g_i y_i ([i == j] - y_j) = y_j (g_j - sum_i g_i y_i)

    one dot product per row, no (n, n) matrix. (The fused op:
    tinygrad_attn.ops.softmax.Softmax.)
    """
    return y * (grad - (grad * y).sum(axis=axis, keepdims=True))


def log_softmax_forward(x, axis=-1):
    """y_i = x_i - m - log sum_j exp(x_j - m) along `axis`, m = max x."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax_backward(y, grad, axis=-1):
    """dL/dx for y = log_softmax(x), from y itself and g = dL/dy.

    dy_i/dx_j = [i == j] - p_j with p = softmax(x) = exp(y), so

        dL/dx_j = g_j - p_j sum_i g_i

    (The fused op: tinygrad_attn.ops.softmax.LogSoftmax.)
    """
    return grad - np.exp(y) * grad.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------- layer norm

def _row_scale(x, axes):
    """Per row, 2^(e-1) for max|x| = m 2^e (0.5 <= m < 1); 1 for rows below 1."""
    return np.ldexp(np.ones((), x.dtype),
                    np.maximum(np.frexp(np.abs(x).max(axis=axes, keepdims=True, initial=0))[1] - 1, 0))


def _normalized(x, normalized_ndim, eps):
    """(xhat, rstd, axes): xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps),
    mean and biased var over the last `normalized_ndim` axes.

    Computed on x / c, c a power of two near each row's largest |x| (1 for
    rows below 1): exact, so xhat is the same, and rstd(x) = rstd(x / c) / c
    with eps / c^2; but a row of 1e30 in float32 no longer overflows when squared."""
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    c = _row_scale(x, axes)
    xs = x / c
    centered = xs - xs.mean(axis=axes, keepdims=True)
    rstd = 1 / np.sqrt((centered * centered).mean(axis=axes, keepdims=True) + eps / c / c)
    return centered * rstd, rstd / c, axes


def layer_norm_forward(x, weight, bias, normalized_ndim=1, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * w + b over the last `normalized_ndim` axes."""
    return _normalized(x, normalized_ndim, eps)[0] * weight + bias


def layer_norm_backward(x, weight, grad, normalized_ndim=1, eps=1e-5):
    """(dL/dx, dL/dw, dL/db) for y = xhat * w + b, g = dL/dy (w = ones for no weight).

    With gw = g * w and the means over each row's normalized values:

        dL/dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat))
        dL/dw = sum over rows of g * xhat,     dL/db = sum over rows of g

    The first term is the direct path; the two means are what x gives
    through its own mean (a shift: subtract the mean of gw) and its own
    variance (a scale: remove the part of gw along xhat). So dL/dx sums to 0
    over a row, exactly. It is orthogonal to xhat only when eps = 0: per row,

        dL/dx . xhat = eps (gw . xhat) / sigma^3,    sigma = sqrt(var + eps)

    since sum(xhat^2) = d (1 - eps / sigma^2) falls short of d (tiny at
    eps = 1e-5 for rows of unit size, not zero; docs/backprop_through_attention.md
    section 7). (The fused op: tinygrad_attn.ops.layer_norm.LayerNormOp.)
    """
    xhat, rstd, axes = _normalized(x, normalized_ndim, eps)
    gw = grad * weight
    dx = rstd * (gw - gw.mean(axis=axes, keepdims=True) - xhat * (gw * xhat).mean(axis=axes, keepdims=True))
    rows = tuple(range(x.ndim - normalized_ndim))
    return dx, (grad * xhat).sum(axis=rows), grad.sum(axis=rows)


# ---------------------------------------------------------------- cross-entropy

def _classes_last(logits, target):
    """PyTorch's layouts as (rows, C) logits and (rows,) targets: (C,) with a
    0-d target, (N, C) with (N,), (N, C, d1, ...) with (N, d1, ...)."""
    if logits.ndim == 1:
        return logits[None], np.reshape(target, 1)
    return _rows(np.moveaxis(logits, 1, -1)), np.reshape(target, -1)


def cross_entropy_forward(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """Per row r, with log p = log_softmax(x_r) over the classes and e = label_smoothing:

        loss_r = (1 - e) (-log p_{t_r}) + e mean_c(-log p_c),   0 where t_r == ignore_index

    then "none": the losses in the target's shape; "sum": their sum; "mean":
    the sum over the rows not ignored, divided by their number (NaN if none).
    """
    x, t = _classes_last(logits, target)
    valid = t != ignore_index
    logp = log_softmax_forward(x)
    nll = -logp[np.arange(len(t)), np.where(valid, t, 0)]
    loss = np.where(valid, (1 - label_smoothing) * nll - label_smoothing * logp.mean(axis=-1), 0.0)
    if reduction == "none":
        return loss.reshape(np.shape(target))
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum() if valid.any() else np.nan


def cross_entropy_backward(logits, target, grad, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """dL/dlogits; grad = dL/dloss (a scalar, or per row for reduction="none").

    Per row, with p = softmax(x_r) and the smoothed one-hot target
    q_c = (1 - e) [c == t_r] + e / C:

        d loss_r / dx_{r,c} = p_c - q_c

    (log_softmax_backward with g = -q: -q_c + p_c sum_c q_c, and q sums to 1).
    Each row is then scaled by its upstream gradient G_r: grad[r] for "none",
    grad for "sum", grad / (number of rows not ignored) for "mean"; ignored
    rows get 0. (The fused op: tinygrad_attn.ops.cross_entropy.CrossEntropy.)
    """
    x, t = _classes_last(logits, target)
    rows, n_classes = x.shape
    valid = t != ignore_index
    q = np.full(x.shape, label_smoothing / n_classes)
    q[np.arange(rows)[valid], t[valid]] += 1 - label_smoothing
    if reduction == "none":
        row_grad = np.reshape(grad, -1)
    else:
        row_grad = np.full(rows, grad / (max(valid.sum(), 1) if reduction == "mean" else 1))
    dx = (softmax_forward(x) - q) * (row_grad * valid)[:, None]
    if logits.ndim == 1:
        return dx[0]
    return np.moveaxis(dx.reshape((logits.shape[0],) + logits.shape[2:] + (n_classes,)), -1, 1)


# ---------------------------------------------------------------- dropout

def _keep_scale(p):
    """1 / (1 - p), what a kept element is multiplied by (p = 1 keeps nothing: 0)."""
    return 0.0 if p == 1 else 1 / (1 - p)


def dropout_forward(x, keep, p):
    """y = x * keep / (1 - p): `keep` is the boolean mask (True = kept, each with probability 1 - p)."""
    return x * keep * _keep_scale(p)


def dropout_backward(grad, keep, p):
    """dL/dx = g * keep / (1 - p): y is linear in x, so the same mask and scale
    act on the gradient. (The fused op: tinygrad_attn.ops.dropout.DropoutOp,
    which hashes the mask again in backward instead of storing it.)"""
    return grad * keep * _keep_scale(p)


# ---------------------------------------------------------------- attention

def _attention_weights(q, k, attn_mask, is_causal, scale):
    """(P, scale): P = softmax(scale * Q K^T + M) over the keys, M the mask as
    added scores (boolean: 0 where a query may attend, -inf elsewhere;
    is_causal: -inf above the diagonal). A query that may attend to no key
    (its row of scores all -inf) gets P = 0."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q @ np.swapaxes(k, -1, -2))
    L, S = scores.shape[-2:]
    if is_causal:
        scores = np.where(np.triu(np.ones((L, S), bool), k=1), -np.inf, scores)
    if attn_mask is not None:
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    has_key = (scores > -np.inf).any(axis=-1, keepdims=True)
    return softmax_forward(np.where(has_key, scores, 0.0)) * has_key, scale


def _repeat_heads(kv, heads):
    """Grouped-query attention: kv (..., Hkv, S, E) with each head repeated for the
    heads / Hkv consecutive query heads that share it (query head h reads kv head
    h // (heads / Hkv))."""
    return np.repeat(kv, heads // kv.shape[-3], axis=-3)


def _sum_groups(grad, kv_heads):
    """The backward of `_repeat_heads`: the gradients of a group's repeated copies
    (..., Hq, S, E), summed into their shared head: (..., Hkv, S, E)."""
    lead, (heads, S, E) = grad.shape[:-3], grad.shape[-3:]
    return grad.reshape(lead + (kv_heads, heads // kv_heads, S, E)).sum(axis=-3)


def attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, keep=None, dropout_p=0.0,
                      enable_gqa=False):
    """(O, P): O = (P * D) V,  P = softmax(scale * Q K^T + M) over the keys.

    Q (..., L, E), K (..., S, E), V (..., S, Ev); the batch axes (and the
    mask's) broadcast. scale defaults to 1/sqrt(E); attn_mask is boolean
    (True = may attend) or float (added); is_causal lets query i see keys
    j <= i. D = keep / (1 - dropout_p) drops weights (no dropout when keep
    is None). P is returned before dropout, with the batch shape of O.
    enable_gqa: K and V have fewer heads (axis -3), each shared by a group
    of query heads (grouped-query attention); K's and V's head counts may
    differ, each dividing Q's.
    """
    if enable_gqa:
        k, v = _repeat_heads(k, q.shape[-3]), _repeat_heads(v, q.shape[-3])
    P, _ = _attention_weights(q, k, attn_mask, is_causal, scale)
    P = np.broadcast_to(P, np.broadcast_shapes(P.shape[:-2], v.shape[:-2]) + P.shape[-2:])
    D = 1.0 if keep is None else keep * _keep_scale(dropout_p)
    return (P * D) @ v, P


def attention_backward(q, k, v, grad, attn_mask=None, is_causal=False, scale=None, keep=None, dropout_p=0.0,
                       grad_weights=None, enable_gqa=False):
    """(dL/dQ, dL/dK, dL/dV, dL/dM) for O = (P * D) V, P = softmax(S), S = scale * Q K^T + M.

    With G = dL/dO (`grad`), backward runs forward's steps in reverse:

        dV = (P * D)^T G                          (O = A V with A = P * D)
        dP = (G V^T) * D   (+ dL/dP, `grad_weights`, when P is an output too)
        dS = P * (dP - rowsum(P * dP))            (softmax_backward, row by row)
        dQ = scale * dS K,   dK = scale * dS^T Q  (S = scale * Q K^T)
        dM = dS                                   (a float mask is added to S)

    A masked score has P = 0, so dS = 0 there: no gradient reaches it, and
    a query with no key at all (P = 0 on its row) sends none back. dM is
    None for a boolean mask or none. Batch axes that broadcast are summed
    back to each input's shape. (The fused ops:
    tinygrad_attn.ops.attention.ScaledDotProductAttention, and
    AttentionWeights for the gradient that reaches P directly.)

    Grouped-query attention (enable_gqa): key head j is used by every query
    head h of its group (h // (Hq / Hk) == j), value head j by those with
    h // (Hq / Hv) == j (Hk and Hv may differ), so each one's gradient is
    the sum of theirs:

        dK_j = sum over h in K's group j of scale * dS_h^T Q_h,   dV_j = sum over V's group j of (P_h * D_h)^T G_h

    computed here as attention on the repeated heads, then summed per group.
    """
    if enable_gqa:
        k_rep, v_rep = _repeat_heads(k, q.shape[-3]), _repeat_heads(v, q.shape[-3])
        dQ, dK, dV, dM = attention_backward(q, k_rep, v_rep, grad, attn_mask, is_causal, scale, keep, dropout_p,
                                            grad_weights)
        return dQ, _sum_groups(dK, k.shape[-3]), _sum_groups(dV, v.shape[-3]), dM
    P, scale = _attention_weights(q, k, attn_mask, is_causal, scale)
    P = np.broadcast_to(P, np.broadcast_shapes(P.shape[:-2], v.shape[:-2], grad.shape[:-2]) + P.shape[-2:])
    D = 1.0 if keep is None else keep * _keep_scale(dropout_p)
    dV = np.swapaxes(P * D, -1, -2) @ grad
    dP = (grad @ np.swapaxes(v, -1, -2)) * D
    if grad_weights is not None:
        dP = dP + grad_weights
    dS = softmax_backward(P, dP)
    dQ, dK = scale * (dS @ k), scale * (np.swapaxes(dS, -1, -2) @ q)
    dM = _sum_to(dS, attn_mask.shape) if attn_mask is not None and attn_mask.dtype != bool else None
    return _sum_to(dQ, q.shape), _sum_to(dK, k.shape), _sum_to(dV, v.shape), dM


def _split_heads(qkv, num_heads):
    """(B, T, 3 * H * hd), its last axis laid out (3, H, hd), as Q, K, V of shape (B, H, T, hd)."""
    B, T, width = qkv.shape
    split = qkv.reshape(B, T, 3, num_heads, width // (3 * num_heads))
    return [split[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]


def _concat_heads(heads):
    """(B, H, T, hd) -> (B, T, H * hd): the heads side by side."""
    B, H, T, hd = heads.shape
    return heads.transpose(0, 2, 1, 3).reshape(B, T, H * hd)


def packed_self_attention_forward(qkv, num_heads, attn_mask=None, is_causal=False, scale=None, keep=None,
                                  dropout_p=0.0):
    """(out, P): split qkv (B, T, 3 * H * hd) into each head's Q, K, V, attend
    (attention_forward, every head at once: heads are a batch axis), and
    concatenate the heads' outputs: out (B, T, H * hd), P (B, H, T, T)."""
    heads, P = attention_forward(*_split_heads(qkv, num_heads), attn_mask, is_causal, scale, keep, dropout_p)
    return _concat_heads(heads), P


def packed_self_attention_backward(qkv, num_heads, grad, attn_mask=None, is_causal=False, scale=None, keep=None,
                                   dropout_p=0.0):
    """(dL/dqkv, dL/dM) for out = concat_h attention(Q_h, K_h, V_h), g = dL/dout (B, T, H * hd).

    Each step of forward, backwards: the concatenation's backward splits g
    into the heads' gradients (B, H, T, hd); attention_backward gives each
    head's dQ, dK, dV; the split's backward puts them back where Q, K, V lie
    in qkv, the layout (3, H, hd) on the last axis. (The fused op:
    tinygrad_attn.ops.attention.PackedSelfAttention, whose kernel writes each
    head's dQ, dK, dV straight into those places.)
    """
    B, T, _ = grad.shape
    grad_heads = grad.reshape(B, T, num_heads, -1).transpose(0, 2, 1, 3)
    dq, dk, dv, dmask = attention_backward(*_split_heads(qkv, num_heads), grad_heads, attn_mask, is_causal, scale,
                                           keep, dropout_p)
    dqkv = np.stack([d.transpose(0, 2, 1, 3) for d in (dq, dk, dv)], axis=2)  # (B, T, 3, H, hd)
    return dqkv.reshape(qkv.shape), dmask


# ---------------------------------------------------------------- GELU

_C = math.sqrt(2 / math.pi)  # the tanh form's sqrt(2/pi)


def gelu_forward(x, approximate="none"):
    """x * Phi(x), Phi(x) = erfc(-x / sqrt 2) / 2 the standard normal CDF;
    approximate="tanh": x/2 (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(_C * (x + 0.044715 * x ** 3)))
    return x * 0.5 * erfc(-x / math.sqrt(2))


def gelu_backward(x, grad, approximate="none"):
    """dL/dx = g * gelu'(x):

        exact:  d/dx x Phi(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
        tanh:   d/dx x/2 (1 + tanh u) = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) du/dx,
                du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)

    (The fused op: tinygrad_attn.ops.elementwise.Gelu.)
    """
    if approximate == "tanh":
        th = np.tanh(_C * (x + 0.044715 * x ** 3))
        return grad * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * _C * (1 + 3 * 0.044715 * x * x))
    return grad * (0.5 * erfc(-x / math.sqrt(2)) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


# ---------------------------------------------------------------- SiLU

def _sigmoid(x):
    """1 / (1 + e^-x), written (1 + tanh(x / 2)) / 2: the same number, and no exp to overflow."""
    return 0.5 * (1 + np.tanh(0.5 * x))


def silu_forward(x):
    """x * sigmoid(x)."""
    return x * _sigmoid(x)


def silu_backward(x, grad):
    """dL/dx = g * silu'(x), by the product rule with sigmoid' = s (1 - s):

        d/dx x s(x) = s + x s (1 - s),   s = sigmoid(x)

    (The fused op: tinygrad_attn.ops.elementwise.Silu.)
    """
    s = _sigmoid(x)
    return grad * (s + x * s * (1 - s))



def swiglu_forward(h):
    """silu(a) * b for the halves [a | b] of h's last axis."""
    a, b = np.split(h, 2, axis=-1)
    return silu_forward(a) * b


def swiglu_backward(h, grad):
    """dL/dh = [dL/da | dL/db] for z = silu(a) * b, g = dL/dz:

        dL/da = g * b * silu'(a) = g * b * (s + a s (1 - s)),   dL/db = g * silu(a)

    (the product rule; the two halves' gradients side by side, as h was).
    (The fused op: tinygrad_attn.ops.elementwise.Swiglu.)
    """
    a, b = np.split(h, 2, axis=-1)
    return np.concatenate([silu_backward(a, grad * b), grad * silu_forward(a)], axis=-1)

# ---------------------------------------------------------------- embedding

def embedding_forward(weight, indices):
    """Row indices[p] of weight (num_embeddings, dim) for every position p: weight[indices]."""
    return weight[indices]


def embedding_backward(indices, grad, num_embeddings, padding_idx=None):
    """dL/dW for y = W[indices], g = dL/dy of shape indices.shape + (dim,):

        dL/dW_r = sum over the positions p with indices[p] == r of g_p

    a scatter-add (a row picked twice gets both gradients; np.add.at, not
    dW[indices] += g, which would keep only one). With padding_idx, that
    row gets no gradient. (tinygrad_attn.functional.embedding: indexing,
    whose backward, GetItem's, is this scatter-add.)
    """
    dW = np.zeros((num_embeddings,) + grad.shape[np.ndim(indices):], grad.dtype)
    np.add.at(dW, indices, grad)
    if padding_idx is not None:
        dW[padding_idx] = 0
    return dW


# ---------------------------------------------------------------- rms norm

def rms_norm_forward(x, weight, normalized_ndim=1, eps=1e-6):
    """y = x / sqrt(mean(x^2) + eps) * w over the last `normalized_ndim` axes."""
    xhat, _, _ = _rms_normalized(x, normalized_ndim, eps)
    return xhat * weight


def _rms_normalized(x, normalized_ndim, eps):
    """(xhat, rstd, axes), rstd = 1 / sqrt(mean(x^2) + eps): on x / c, as `_normalized`, so a
    row too large to square gives its right values."""
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    c = _row_scale(x, axes)
    xs = x / c
    rstd = 1 / np.sqrt((xs * xs).mean(axis=axes, keepdims=True) + eps / c / c)
    return xs * rstd, rstd / c, axes


def rms_norm_backward(x, weight, grad, normalized_ndim=1, eps=1e-6):
    """(dL/dx, dL/dw) for y = xhat * w, xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps),
    g = dL/dy. With gw = g * w and the means over each row's normalized values:

        dL/dx = rstd * (gw - xhat * mean(gw * xhat))
        dL/dw = sum over rows of g * xhat

    The direct path, minus what x gives through its own scale (the part of
    gw along xhat). LayerNorm subtracts mean(gw) as well, for the mean it
    removed; RMSNorm removes none, so dL/dx need not sum to 0 over a row,
    but it is still orthogonal to xhat when eps = 0 (scaling a row changes
    nothing). (The fused op: tinygrad_attn.ops.rms_norm.RMSNormOp.)
    """
    xhat, rstd, axes = _rms_normalized(x, normalized_ndim, eps)
    gw = grad * weight
    dx = rstd * (gw - xhat * (gw * xhat).mean(axis=axes, keepdims=True))
    return dx, (grad * xhat).sum(axis=tuple(range(x.ndim - normalized_ndim)))


# ---------------------------------------------------------------- rotary position embedding

def rotary_forward(x, cos, sin):
    """y = R x: each pair (x[2i], x[2i+1]) of x (..., T, H, hd) rotated by the angle of
    its position, cos and sin (T, hd/2) of those angles (llama2.c's convention)."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, hd/2): the same angles for every head
    y = np.empty_like(x)
    y[..., 0::2], y[..., 1::2] = a * c - b * s, a * s + b * c
    return y


def rotary_backward(x, cos, sin, grad):
    """(dL/dx, dL/dcos, dL/dsin) for y = R x, g = dL/dy. Each 2x2 block of R is a
    rotation [[c, -s], [s, c]], orthogonal, so its transpose [[c, s], [-s, c]]
    rotates back:

        dL/dx[2i]   =  g[2i] c + g[2i+1] s
        dL/dx[2i+1] = -g[2i] s + g[2i+1] c           (the rotation by -theta)
        dL/dcos = sum over rows and heads of g[2i] x[2i] + g[2i+1] x[2i+1]
        dL/dsin = sum over rows and heads of g[2i+1] x[2i] - g[2i] x[2i+1]

    (The fused op: tinygrad_attn.ops.rotary.RotaryOp.)
    """
    dx = rotary_forward(grad, cos, -sin)  # R^T = R(-theta)
    a, b, ga, gb = x[..., 0::2], x[..., 1::2], grad[..., 0::2], grad[..., 1::2]
    rows_and_heads = tuple(range(x.ndim - 3)) + (x.ndim - 2,)
    return dx, (ga * a + gb * b).sum(axis=rows_and_heads), (gb * a - ga * b).sum(axis=rows_and_heads)
