"""Scaled dot-product attention as one fused op, its weights as a second, and
self-attention on a packed projection as a third.

Why fused: composed from primitive ops (the reference version,
`tinygrad_attn.reference.scaled_dot_product_attention`) attention is a matmul, a scale, a mask, a
five-pass softmax, a dropout and a second matmul, each with a temporary of
shape (..., L, S) and its own backward. The kernel does the whole chain
for one (batch, head) matrix while it is in cache; BLAS does the products.

Why packed: self-attention projects one input x to Q, K and V. One
(E -> 3E) product makes all three, (B, T, 3, H, hd); `PackedSelfAttention`
reads each head's Q, K, V where they lie in it and writes dQ, dK, dV into
one gradient of the same layout, so the projection's backward is again a
single product (three projections would cost three products each way and
a sum of three input gradients).
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, broadcast_shapes
from ..kernels.attention import attention_backward, attention_forward
from ..kernels.softmax import softmax_backward
from .array_views import as_matrices, as_rows, batch_index, float_dtype, output_like, random_array
from .dropout import draw_key, keep_rule
from .matmul import stack_product


def check_mask_dtype(mask, op, name="attn_mask"):
    """The one rule for attention masks, shared with MultiHeadAttention: boolean
    (True = may attend) or floating point (added to the scores). An integer
    mask is ambiguous (0/1 flags or additive?), so it is refused, as PyTorch does."""
    if mask.dtype != np.bool_ and mask.dtype.kind != "f":
        raise TypeError(f"{op}: {name} must be boolean or floating point, got {mask.dtype} "
                        "(convert 0/1 flags with mask.astype(bool))")


def gqa_groups(op, q_shape, k_shape, v_shape):
    """Grouped-query attention: how many query heads (axis -3) share each key head
    and each value head, (Hq // Hk, Hq // Hv), or a ShapeError naming the op and the
    shapes. As in PyTorch, key and value may have different head counts, each
    dividing the query's."""
    if len(q_shape) < 3 or len(k_shape) < 3 or len(v_shape) < 3:
        raise ShapeError(f"{op}: enable_gqa needs heads on axis -3, got query {q_shape}, key {k_shape} "
                         f"and value {v_shape}")
    hq, hk, hv = q_shape[-3], k_shape[-3], v_shape[-3]
    if not hk or not hv or hq % hk or hq % hv:
        raise ShapeError(f"{op}: with enable_gqa the number of heads (axis -3) of key ({hk}) and of value "
                         f"({hv}) must each divide the number of query heads {hq} (query {q_shape}, "
                         f"key {k_shape}, value {v_shape})")
    return hq // hk, hq // hv


class _Plan:
    """Shapes, dtype and the BLAS view of Q, K, V (no copies) for one attention call."""

    def __init__(self, op, q, k, v, mask, value_batch=(), enable_gqa=False):
        """`v` may be None (for the weights alone; `value_batch` then gives its batch shape).
        With enable_gqa, gk = Hq // Hk consecutive query heads share a key head and
        gv = Hq // Hv a value head: K and V are read over `k_batch` and `v_batch`, the
        batch with Hk and Hv heads; groups = (gk, gv, lcm(gk, gv)) for the kernels."""
        operands = (q, k) if v is None else (q, k, v)
        if min(a.ndim for a in operands) < 2 or q.shape[-1] != k.shape[-1] \
                or (v is not None and k.shape[-2] != v.shape[-2]):
            raise ShapeError(f"{op}: query {q.shape}, key {k.shape} and value "
                             f"{None if v is None else v.shape} do not fit (need query (..., L, E), "
                             "key (..., S, E), value (..., S, Ev))")
        self.dtype = float_dtype(op, *operands)
        self.L, self.E = q.shape[-2:]
        self.S = k.shape[-2]
        self.Ev = 0 if v is None else v.shape[-1]
        mask_batch = () if mask is None else mask.shape[:-2]
        if mask is not None:
            check_mask_dtype(mask, op)
            broadcast_shapes(f"{op} (attn_mask)", mask.shape, (self.L, self.S))
        gk, gv = gqa_groups(op, q.shape, k.shape, v.shape) if enable_gqa else (1, 1)
        self.groups = (gk, gv, math.lcm(gk, gv))
        # a shared key or value head stands for its group's query heads: broadcast as if it had Hq
        kv_batches = [a.shape[:-3] + q.shape[-3:-2] if g > 1 else a.shape[:-2] for a, g in zip(operands[1:], (gk, gv))]
        self.batch = broadcast_shapes(f"{op} (batch dimensions)", q.shape[:-2], *kv_batches, mask_batch,
                                      value_batch)
        self.k_batch = self.batch[:-1] + k.shape[-3:-2] if gk > 1 else self.batch
        self.v_batch = self.batch[:-1] + v.shape[-3:-2] if gv > 1 else self.batch
        self.n = math.prod(self.batch)
        self.inputs = [a.astype(self.dtype, copy=False) for a in operands]
        self.q = self.blas(self.inputs[0])
        self.k = self.blas(self.inputs[1], self.k_batch)
        self.v = self.blas(self.inputs[2], self.v_batch) if v is not None else None
        if mask is None:
            self.mask, self.im = np.zeros((1, 1, 1), self.dtype), np.zeros(self.n, np.int64)
        else:
            full = np.broadcast_to(mask, mask_batch + (self.L, self.S))
            if mask.dtype == np.bool_:  # True = may attend: add 0 there, -inf elsewhere
                additive = np.where(full, self.dtype.type(0), self.dtype.type(-np.inf))
            else:
                additive = full.astype(self.dtype)
            # (not reshape(-1, L, S): L may be 0)
            self.mask = np.ascontiguousarray(additive).reshape(math.prod(mask_batch), self.L, self.S)
            self.im = batch_index(mask_batch, self.batch)

    def scale(self, scale):
        """The scale of the scores, in the plan's dtype: 1/sqrt(E) by default."""
        return self.dtype.type((1 / math.sqrt(self.E) if self.E else 1.0) if scale is None else scale)

    def blas(self, x, batch=None):
        """(buffer, offsets, row stride) of x's matrices over the full batch, or `batch`
        (see as_matrices)."""
        return as_matrices(x, self.batch if batch is None else batch)[:3]

    def output(self, like, rows, cols, batch=None):
        """An output (batch..., rows, cols), batch the full batch unless given: laid out like
        `like` when that has this batch (a permuted view in gives a permuted result out), else
        C-ordered."""
        batch = self.batch if batch is None else batch
        shape = batch + (rows, cols)
        if like.shape[:-2] == batch:
            return output_like(like, shape, self.dtype)
        return np.empty(shape, self.dtype)


def _attend(ctx, plan, out, has_mask, is_causal, scale, dropout_p, seed):
    """Run the forward kernel: P_i and out_i = (P_i * D) V_i for every batch index i.

    `out` is (batch..., L, Ev) in any layout `as_matrices` reads in place.
    Keeps on ctx what `_attend_backward` needs, and the weights P
    (ctx.weights, batch shape + (L, S)).
    """
    dtype = plan.dtype
    scale = plan.scale(scale)
    threshold, keep_scale, key = np.uint32(0), dtype.type(1), np.uint32(0)  # no dropout
    if dropout_p:
        threshold, keep_scale = keep_rule(dropout_p, dtype)
        key = draw_key() if seed is None else np.uint32(seed)
    weights = np.empty((plan.n, plan.L, plan.S), dtype)
    if plan.n and plan.L:
        attention_forward(plan.q, plan.k, plan.v, plan.E, plan.Ev, (plan.mask, plan.im, has_mask), bool(is_causal),
                          scale, (key, threshold, keep_scale), plan.groups, weights, plan.blas(out))
    ctx.plan, ctx.scale, ctx.dropout = plan, scale, (key, threshold, keep_scale)
    ctx.weights = weights.reshape(plan.batch + (plan.L, plan.S))
    ctx.save_for_backward(weights)


def _attend_backward(ctx, grad, dq, dk, dv, want_dmask):
    """Run the backward kernel for grad = dL/dout, writing dQ, dK, dV into
    the given arrays (any layout `as_matrices` reads in place). Returns
    dL/dmask (batch..., L, S) if `want_dmask`, else None."""
    weights, = ctx.saved_tensors
    plan = ctx.plan
    dmask = np.zeros((plan.n, plan.L, plan.S) if want_dmask else (1, 1, 1), plan.dtype)
    if plan.n and plan.L:
        attention_backward(plan.q, plan.k, plan.v, plan.E, plan.Ev, weights,
                           plan.blas(grad.astype(plan.dtype, copy=False)), ctx.scale, ctx.dropout, plan.groups,
                           plan.blas(dq), plan.blas(dk, plan.k_batch), plan.blas(dv, plan.v_batch),
                           (dmask, want_dmask))
    else:
        dk[...], dv[...] = 0, 0  # no query: nothing flows back
    return dmask.reshape(plan.batch + (plan.L, plan.S)) if want_dmask else None


class ScaledDotProductAttention(Function):
    """O = (P * D) V,  P = softmax(scale * Q K^T + M) over keys, for every batch index.

    Q: (..., L, E), K: (..., S, E), V: (..., S, Ev); M: the mask (a float
    mask is added, a boolean one is True where a query may attend; with
    is_causal query i sees keys j <= i); D: dropout (0 or 1/(1-p)). A query
    that may attend to no key gets P = 0, so O = 0 and no gradient. With
    G = dL/dO:

        dL/dV = (P * D)^T G,   dP = (G V^T) * D,   dS = P * (dP - rowsum(P * dP))
        dL/dQ = scale * dS K,  dL/dK = scale * dS^T Q,  dL/dM = dS (float mask)

    With enable_gqa (grouped-query attention), K has Hk heads on axis -3, V
    has Hv, and Q has Hq, a multiple of both (Hk and Hv may differ, as in
    PyTorch): query head h reads key head h // (Hq / Hk) and value head
    h // (Hq / Hv), where they lie (no copy), and the gradient of a shared
    head is the sum over the query heads of its group:

        dL/dK_j = sum over h with h // (Hq / Hk) == j of scale * dS_h^T Q_h
        dL/dV_j = sum over h with h // (Hq / Hv) == j of (P_h * D_h)^T G_h

    Forward keeps P on ctx.weights (need_weights returns it); it has the
    batch shape of the output (q, k, v and the mask broadcast together).
    Readable version: tinygrad_attn.reference.numpy_backward.attention_backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, seed=None,
                enable_gqa=False):
        plan = _Plan("scaled_dot_product_attention", q, k, v, attn_mask, enable_gqa=enable_gqa)
        out = plan.output(q, plan.L, plan.Ev)
        _attend(ctx, plan, out, attn_mask is not None, is_causal, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, grad):
        plan = ctx.plan
        q, k, v = plan.inputs
        dq, dk = plan.output(q, plan.L, plan.E), plan.output(k, plan.S, plan.E, plan.k_batch)
        dv = plan.output(v, plan.S, plan.Ev, plan.v_batch)
        has_mask = len(ctx.needs_input_grad) > 3
        dmask = _attend_backward(ctx, grad, dq, dk, dv, has_mask and ctx.needs_input_grad[3])
        return (dq, dk, dv) + ((dmask,) if has_mask else ())

    @staticmethod
    def example(dtype, size):
        batch = max(1, size // (4 * 48 * 32))  # (batch, 4 heads, 48 positions, head size 32)
        q = random_array(dtype, batch, 4, 48, 32)
        k, v = (random_array(dtype, batch, 2, 48, 32, seed=i) for i in (1, 2))  # 2 key/value heads, 2 queries each
        return (q, k, v), dict(is_causal=True, dropout_p=0.1, seed=3, enable_gqa=True)


class AttentionWeights(Function):
    """P = softmax(scale * Q K^T + M), the attention weights, as a differentiable output.

    `scaled_dot_product_attention(..., need_weights=True)` returns P through
    this op so gradients can flow through the weights too; forward takes P
    from the attention op (`weights=`) instead of computing it again. With
    G = dL/dP:

        dS = P * (G - rowsum(G * P))
        dL/dQ = scale * dS K,   dL/dK = scale * dS^T Q,   dL/dM = dS (float mask)

    Readable version: tinygrad_attn.reference.numpy_backward.attention_backward
    (its grad_weights= is this G). `is_causal` is in P already (the
    composite twin, which computes P, reads it).
    """

    @staticmethod
    def forward(ctx, q, k, attn_mask=None, weights=None, scale=None, value_batch=(), is_causal=False):
        plan = _Plan("attention weights", q, k, None, attn_mask, value_batch)
        if weights is None or weights.shape != plan.batch + (plan.L, plan.S):
            raise ShapeError(f"attention weights: weights of shape "
                             f"{None if weights is None else weights.shape} do not fit query {q.shape} "
                             f"and key {k.shape}")
        ctx.plan = plan
        ctx.scale = plan.scale(scale)
        weights = np.ascontiguousarray(weights, plan.dtype)
        ctx.save_for_backward(weights)
        return weights

    @staticmethod
    def backward(ctx, grad):
        weights, = ctx.saved_tensors
        plan = ctx.plan
        p2 = as_rows(weights)
        ds = np.empty_like(p2)
        if ds.size:
            softmax_backward(p2, as_rows(grad, plan.dtype), ds, False)
        ds = ds.reshape(plan.batch + (plan.L, plan.S))
        dsm = plan.blas(ds)
        dq = stack_product(dsm, False, plan.k, False, plan.batch, plan.L, plan.E, plan.S, plan.dtype)
        dk = stack_product(dsm, True, plan.q, False, plan.batch, plan.S, plan.E, plan.L, plan.dtype)
        grads = (dq * ctx.scale, dk * ctx.scale)
        if len(ctx.needs_input_grad) > 2:
            grads += (ds if ctx.needs_input_grad[2] else None,)
        return grads

    @staticmethod
    def example(dtype, size):
        batch = max(1, size // (4 * 48 * 32))
        q, k = (random_array(dtype, batch, 4, 48, 32, seed=i) for i in range(2))
        weights = np.exp(random_array(dtype, batch, 4, 48, 48, seed=2))
        return (q, k), dict(weights=weights / weights.sum(axis=-1, keepdims=True))


def _heads(x, parts, num_heads, op):
    """The `parts` consecutive slices of x's last axis, each split into heads:
    (B, T, parts * H * hd) -> `parts` views (B, H, T, hd), no copies."""
    if x.ndim != 3 or num_heads < 1 or x.shape[-1] % (parts * num_heads):
        raise ShapeError(f"{op}: expected (batch, length, {parts} * num_heads * head_dim) with "
                         f"num_heads {num_heads}, got shape {x.shape}")
    B, T, width = x.shape
    split = x.reshape(B, T, parts, num_heads, width // (parts * num_heads))
    return [split[:, :, i].transpose(0, 2, 1, 3) for i in range(parts)]


class PackedSelfAttention(Function):
    """Multi-head self-attention on a packed projection:

        qkv (B, T, 3 * H * hd) = x W^T + b, its last axis laid out (3, H, hd)
        out (B, T, H * hd): out[:, :, h] = attention(Q_h, K_h, V_h), the heads side by side

    with Q_h = qkv[:, :, 0, h], K_h = qkv[:, :, 1, h], V_h = qkv[:, :, 2, h]
    (the packed in_proj of torch.nn.MultiheadAttention, and the heads
    concatenated as its out_proj expects them). The math, forward and
    backward, is `ScaledDotProductAttention`'s for each (batch, head); the
    mask broadcasts to (B, H, T, T). dL/dqkv is assembled from dQ, dK and
    dV in the same packed layout: the kernel writes each head's gradients
    straight into their places.
    Readable version: tinygrad_attn.reference.numpy_backward.packed_self_attention_backward.
    """

    @staticmethod
    def forward(ctx, qkv, attn_mask=None, num_heads=1, is_causal=False, scale=None, dropout_p=0.0,
                seed=None):
        op = "packed self-attention"
        q, k, v = _heads(qkv, 3, num_heads, op)
        plan = _Plan(op, q, k, v, attn_mask)
        if plan.batch != q.shape[:2]:
            raise ShapeError(f"{op}: attn_mask of shape {attn_mask.shape} does not broadcast to "
                             f"(batch, heads, T, T) = {q.shape[:3] + q.shape[2:3]}")
        B, T, width = qkv.shape
        out = np.empty((B, T, width // 3), plan.dtype)
        out_heads, = _heads(out, 1, num_heads, op)
        _attend(ctx, plan, out_heads, attn_mask is not None, is_causal, scale, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, grad):
        plan = ctx.plan
        B, H, T, hd = plan.batch + (plan.L, plan.E)
        dqkv = np.empty((B, T, 3 * H * hd), plan.dtype)
        grad_heads, = _heads(grad, 1, H, "packed self-attention")
        has_mask = len(ctx.needs_input_grad) > 1
        dmask = _attend_backward(ctx, grad_heads, *_heads(dqkv, 3, H, "packed self-attention"),
                                 has_mask and ctx.needs_input_grad[1])
        return (dqkv,) + ((dmask,) if has_mask else ())

    @staticmethod
    def example(dtype, size):
        qkv = random_array(dtype, max(1, size // (48 * 3 * 4 * 32)), 48, 3 * 4 * 32)  # 4 heads of size 32
        return (qkv,), dict(num_heads=4, is_causal=True, dropout_p=0.1, seed=3)
