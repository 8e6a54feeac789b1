"""Incremental decoding with a key/value cache, for `GPT.generate`,
`Llama.generate` and `Seq2SeqTransformer.greedy_decode`.

Without a cache, each new token runs the model on the whole prefix again,
although the keys and values of the earlier positions have not changed
(in a causal stack, layer l's output at position t depends only on
positions <= t). With one, a step feeds only the new position: each
self-attention layer projects it to q, k, v, appends k and v to its cache,
and lets q attend to every cached key. All of those are in its past, so a
one-position step needs no causal mask. A prompt (or a restarted window,
see `GPT.generate`) goes through in one batched "prefill" pass with a
causal mask, which fills the caches. Cross-attention keys and values of the
encoder output are computed once per decode. Why the cache changes no
number (and when it would: no causal mask, or positions that move) is
derived in docs/backprop_through_attention.md, section 13a.

The functions below redo the forward of a `TransformerEncoderLayer` /
`TransformerDecoderLayer` (both norm_first settings) in eval mode (no
dropout), with the layer's own parameters (self_attn.in_proj_weight,
out_proj, norm1, linear1, ...; the activation is the layer's own callable,
on a Tensor). They are plain numpy on purpose: generation needs no
gradient, and at one position per step the work is so small that the cost
of building Tensors and dispatching ops would dominate it. The result equals
the full forward up to float rounding: tests/test_generation.py compares
logits (float32 and float64) and the generated tokens.

A Llama layer (`llama_step`) caches its keys already rotated by their
positions, and the new positions' angles continue from the cache's length;
it keeps only the n_kv_heads shared key/value heads, and the query heads of
a group read their shared head in place.

Shapes: B batch, P new positions in this call, S cached positions after it,
E = d_model, H heads of hd features, V vocabulary. Inputs are batch first,
(B, P, E), whatever the layers' batch_first. Since the layers' forward is
not called, their hooks do not run and MultiheadAttention's record_weights
records nothing here (attention heatmaps come from a forward pass).
"""
import math

import numpy as np

from .tensor import Tensor


class KVCache:
    """The keys and values of one self-attention layer for positions 0..length-1,
    in arrays preallocated for `max_len` positions, (B, H, max_len, hd) each."""

    def __init__(self, batch, num_heads, max_len, head_dim, dtype):
        self.keys = np.zeros((batch, num_heads, max_len, head_dim), dtype)
        self.values = np.zeros((batch, num_heads, max_len, head_dim), dtype)
        self.length = 0

    def append(self, k, v):
        """Store k, v (B, H, P, hd) at the next P positions; return views of
        all cached keys and values, (B, H, S, hd) each with S = length."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.keys.shape[2]:
            raise ValueError(f"KVCache: {stop} positions do not fit a cache of {self.keys.shape[2]}")
        self.keys[:, :, start:stop] = k
        self.values[:, :, start:stop] = v
        self.length = stop
        return self.keys[:, :, :stop], self.values[:, :, :stop]


def caches_for(layers, batch, max_len, dtype):
    """One empty KVCache per layer, for its self-attention."""
    return [KVCache(batch, layer.self_attn.num_heads, max_len, layer.self_attn.head_dim, dtype)
            for layer in layers]


# --------------------------------------------------------------------------- the pieces, in numpy
def _linear(layer, x):
    """A Linear module: x W^T + b, with W (out, in) and b (out,) or None."""
    y = x @ layer.weight.data.T  # (..., out)
    return y if layer.bias is None else y + layer.bias.data


def _in_proj(attn, x, part):
    """x's projection by rows `part` of attn's stacked in_proj_weight (q | k | v)
    and in_proj_bias: slice(0, d) for q, slice(d, None) for k | v."""
    y = x @ attn.in_proj_weight.data[part].T  # (..., rows)
    return y if attn.in_proj_bias is None else y + attn.in_proj_bias.data[part]


def _layer_norm(norm, x):
    """A LayerNorm module over the last axis: (x - mean) / sqrt(var + eps) * weight + bias."""
    n = x.shape[-1]
    centered = x - x.sum(axis=-1, keepdims=True) / n  # (..., E)  (sum / n: np.mean costs more here)
    var = (centered * centered).sum(axis=-1, keepdims=True) / n  # (..., 1), biased, as LayerNorm
    y = centered / np.sqrt(var + norm.eps)  # (..., E)
    if norm.weight is not None:
        y = y * norm.weight.data
    return y if norm.bias is None else y + norm.bias.data


def _split_heads(x, num_heads, parts=1):
    """(B, T, parts*H*hd) -> (parts, B, H, T, hd): the last axis of a packed
    projection holds (parts, H, hd), as in_proj_weight stacks q | k | v."""
    B, T, D = x.shape
    return x.reshape(B, T, parts, num_heads, D // (parts * num_heads)).transpose(2, 0, 3, 1, 4)


def _merge_heads(z):
    """(B, H, T, hd) -> (B, T, H*hd): the heads side by side, as the output projection wants."""
    B, H, T, hd = z.shape
    return z.transpose(0, 2, 1, 3).reshape(B, T, H * hd)


def _attend(q, k, v, blocked=None):
    """softmax(q k^T / sqrt(hd), with blocked scores at -inf) v, for q (B, H, P, hd)
    and k, v (B, H, S, hd); `blocked` broadcasts to (B, H, P, S), True = may not attend.
    A query that may attend to no key gets zero weights, as in MultiheadAttention."""
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, P, S)
    if blocked is None:
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))  # (B, H, P, S)
        return (weights / weights.sum(axis=-1, keepdims=True)) @ v  # (B, H, P, hd)
    scores = np.where(blocked, -np.inf, scores)  # (B, H, P, S)
    top = scores.max(axis=-1, keepdims=True)  # (B, H, P, 1), -inf where all keys are blocked
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0))  # (B, H, P, S)
    total = weights.sum(axis=-1, keepdims=True)  # (B, H, P, 1), 0 where all keys are blocked
    return (weights / np.where(total > 0, total, 1)) @ v  # (B, H, P, hd)


def cached_self_attention(attn, x, cache):
    """`attn(x, x, x)` with the causal attn_mask, for the P new positions x (B, P, E)
    that follow the cache's `length` earlier ones; appends their keys and values."""
    start, P = cache.length, x.shape[1]
    qkv = _in_proj(attn, x, slice(None))  # (B, P, 3*H*hd): q | k | v
    q, k, v = _split_heads(qkv, attn.num_heads, parts=3)  # (B, H, P, hd) each
    keys, values = cache.append(k, v)  # (B, H, S, hd) each, S = start + P
    # New position start+i may see keys 0..start+i: all of them when P = 1, so no mask then.
    future = np.arange(start + P) > start + np.arange(P)[:, None] if P > 1 else None  # (P, S)
    z = _attend(q, keys, values, future)  # (B, H, P, hd)
    return _linear(attn.out_proj, _merge_heads(z))  # (B, P, E)


def memory_keys_values(attn, memory):
    """The cross-attention keys and values of the encoder output memory (B, S, E)
    (a Tensor or an array), computed once per decode: (B, H, S, hd) each."""
    memory = memory.data if isinstance(memory, Tensor) else memory
    kv = _in_proj(attn, memory, slice(attn.num_heads * attn.head_dim, None))  # (B, S, 2*H*hd): k | v
    k, v = _split_heads(kv, attn.num_heads, parts=2)  # (B, H, S, hd) each
    return k, v


def cached_cross_attention(attn, x, memory_kv, memory_padding):
    """`attn(x, memory, memory, key_padding_mask=memory_padding)` for x (B, P, E),
    with the memory's keys and values from `memory_keys_values`; memory_padding
    (B, S) is True at padding (ignored keys), or None."""
    q = _in_proj(attn, x, slice(0, attn.num_heads * attn.head_dim))  # (B, P, H*hd)
    q = _split_heads(q, attn.num_heads)[0]  # (B, H, P, hd)
    blocked = None if memory_padding is None else memory_padding[:, None, None, :]  # (B, 1, 1, S)
    z = _attend(q, *memory_kv, blocked)  # (B, H, P, hd)
    return _linear(attn.out_proj, _merge_heads(z))  # (B, P, E)


def _feed_forward(layer, x):
    h = _linear(layer.linear1, x)  # (B, P, ffn)
    h = layer.activation(Tensor(h)).data  # (B, P, ffn): the layer's own activation
    return _linear(layer.linear2, h)  # (B, P, E)


# --------------------------------------------------------------------------- layers and models
def encoder_layer_step(layer, x, cache):
    """A `TransformerEncoderLayer` with the causal src_mask (GPT's block), on the new
    positions x (B, P, E)."""
    def attend(h):
        return cached_self_attention(layer.self_attn, h, cache)
    if layer.norm_first:
        x = x + attend(_layer_norm(layer.norm1, x))  # (B, P, E)
        return x + _feed_forward(layer, _layer_norm(layer.norm2, x))  # (B, P, E)
    x = _layer_norm(layer.norm1, x + attend(x))  # (B, P, E)
    return _layer_norm(layer.norm2, x + _feed_forward(layer, x))  # (B, P, E)


def decoder_layer_step(layer, x, cache, memory_kv, memory_padding):
    """A `TransformerDecoderLayer` with the causal tgt_mask, on the new positions x (B, P, E)."""
    def attend(h):
        return cached_self_attention(layer.self_attn, h, cache)

    def cross(h):
        return cached_cross_attention(layer.multihead_attn, h, memory_kv, memory_padding)
    if layer.norm_first:
        x = x + attend(_layer_norm(layer.norm1, x))  # (B, P, E)
        x = x + cross(_layer_norm(layer.norm2, x))  # (B, P, E)
        return x + _feed_forward(layer, _layer_norm(layer.norm3, x))  # (B, P, E)
    x = _layer_norm(layer.norm1, x + attend(x))  # (B, P, E)
    x = _layer_norm(layer.norm2, x + cross(x))  # (B, P, E)
    return _layer_norm(layer.norm3, x + _feed_forward(layer, x))  # (B, P, E)


def gpt_step(model, ids, caches):
    """Logits (B, V) of the id after `ids` (B, P), the ids at positions
    caches[0].length .. + P - 1 of the window. Appends their keys and values."""
    start, P = caches[0].length, ids.shape[1]
    x = model.tok_emb.weight.data[ids] + model.pos_emb.weight.data[start:start + P]  # (B, P, E)
    for layer, cache in zip(model.transformer.layers, caches):
        x = encoder_layer_step(layer, x, cache)  # (B, P, E)
    x = x[:, -1]  # (B, E): only the last position predicts the next id
    if model.transformer.norm is not None:
        x = _layer_norm(model.transformer.norm, x)  # (B, E)
    return _linear(model.lm_head, x)  # (B, V)


def seq2seq_step(model, ids, caches, memory_kvs, memory_padding):
    """Logits (B, V) of the token after the decoder inputs `ids` (B, P) at
    positions caches[0].length .. + P - 1. Appends their keys and values."""
    start, P = caches[0].length, ids.shape[1]
    x = model.tgt_embed.weight.data[ids] * math.sqrt(model.config.d_model)  # (B, P, E)
    x = x + model.pos.pe.data[start:start + P].astype(x.dtype, copy=False)  # (B, P, E): + PE[positions]
    decoder = model.transformer.decoder
    for layer, cache, memory_kv in zip(decoder.layers, caches, memory_kvs):
        x = decoder_layer_step(layer, x, cache, memory_kv, memory_padding)  # (B, P, E)
    x = x[:, -1]  # (B, E)
    if decoder.norm is not None:
        x = _layer_norm(decoder.norm, x)  # (B, E)
    return _linear(model.generator, x)  # (B, V)


# --------------------------------------------------------------------------- Llama
def llama_caches(model, batch, max_len):
    """One empty KVCache per Llama layer, holding only its n_kv_heads shared
    key/value heads: smaller than a full-heads cache by n_heads / n_kv_heads."""
    return [KVCache(batch, layer.attention.n_kv_heads, max_len, layer.attention.head_dim,
                    model.tok_embeddings.weight.dtype) for layer in model.layers]


def _rms_norm(norm, x):
    """An RMSNorm module over the last axis: x / sqrt(mean(x^2) + eps) * weight
    (eps None: the dtype's machine epsilon, PyTorch's rule)."""
    eps = np.finfo(x.dtype).eps if norm.eps is None else norm.eps
    y = x / np.sqrt((x * x).sum(axis=-1, keepdims=True) / x.shape[-1] + eps)  # (..., E)
    return y if norm.weight is None else y * norm.weight.data


def _rotate(x, cos, sin):
    """Each pair (x[2i], x[2i+1]) of x (B, P, heads, hd) turned by the angles of the
    positions, cos and sin (P, hd/2) (functional.apply_rotary_emb)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, P, heads, hd/2)
    c, s = cos[:, None, :], sin[:, None, :]  # (P, 1, hd/2): the same angles for every head
    y = np.empty_like(x)
    y[..., 0::2], y[..., 1::2] = a * c - b * s, a * s + b * c
    return y


def cached_llama_attention(attn, x, cache, cos, sin):
    """`attn(x, cos, sin)` (a LlamaAttention) for the P new positions x (B, P, dim) that
    follow the cache's `length` earlier ones, cos and sin (P, hd/2) the rotary tables
    of their positions; appends their rotated keys and their values.

    The g = n_heads / n_kv_heads query heads that share a key/value head are
    stacked along the query axis, (B, n_kv, g * P, hd), so each attends to the
    one cached head as it is: no copy of the shared keys and values."""
    start, (B, P, _) = cache.length, x.shape
    H, Hkv, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    g = H // Hkv
    q = _rotate((x @ attn.wq.weight.data.T).reshape(B, P, H, hd), cos, sin)  # (B, P, H, hd)
    k = _rotate((x @ attn.wk.weight.data.T).reshape(B, P, Hkv, hd), cos, sin)  # (B, P, Hkv, hd)
    v = (x @ attn.wv.weight.data.T).reshape(B, P, Hkv, hd)  # (B, P, Hkv, hd)
    keys, values = cache.append(k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3))  # (B, Hkv, S, hd) each
    q = q.transpose(0, 2, 1, 3).reshape(B, Hkv, g * P, hd)  # query head h = kv head h // g, row j * P + p
    future = np.arange(start + P) > start + np.arange(P)[:, None] if P > 1 else None  # (P, S)
    z = _attend(q, keys, values, None if future is None else np.tile(future, (g, 1)))  # (B, Hkv, g*P, hd)
    return _merge_heads(z.reshape(B, H, P, hd)) @ attn.wo.weight.data.T  # (B, P, dim)


def llama_step(model, ids, caches):
    """Logits (B, V) of the id after `ids` (B, P) of a `Llama`, the ids at positions
    caches[0].length .. + P - 1: their rotary angles continue from the cache.
    Appends their keys and values."""
    start, P = caches[0].length, ids.shape[1]
    cos, sin = model.freqs_cos.data[start:start + P], model.freqs_sin.data[start:start + P]  # (P, hd/2)
    x = model.tok_embeddings.weight.data[ids]  # (B, P, dim)
    for layer, cache in zip(model.layers, caches):
        x = x + cached_llama_attention(layer.attention, _rms_norm(layer.attention_norm, x), cache, cos, sin)
        ff = layer.feed_forward
        h = _rms_norm(layer.ffn_norm, x)  # (B, P, dim)
        gate = h @ ff.w1.weight.data.T  # (B, P, hidden)
        gate = gate / (1 + np.exp(-gate))  # silu
        x = x + (gate * (h @ ff.w3.weight.data.T)) @ ff.w2.weight.data.T  # (B, P, dim)
    x = _rms_norm(model.norm, x[:, -1])  # (B, dim): only the last position predicts the next id
    return x @ model.output.weight.data.T  # (B, V)
