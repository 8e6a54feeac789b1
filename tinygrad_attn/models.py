"""Ready-made Transformers built from `tinygrad_attn.nn`.

- `Seq2SeqTransformer`: the encoder-decoder model of "Attention Is All You
  Need" for the built-in copy / reverse / sort tasks, with batched greedy
  decoding.
- `GPT`: a decoder-only language model (GPT-2 / nanoGPT layout) for
  character-level text, with sampling (temperature, top-k).
- `Llama`: today's small decoder (llama2.c's Llama 2: RMSNorm, rotary
  positions, grouped-query attention, SwiGLU), whose state dict is
  llama2.c's, with the same sampling.

Each model is described by a small config dataclass that turns into a JSON
string and back, so a checkpoint can rebuild its model:

    cfg = GPTConfig(vocab_size=65)
    model = GPT(cfg)
    tg.save(model.state_dict(), "gpt.safetensors", metadata={"model": cfg.to_json()})
    ...
    model = GPT(GPTConfig.from_json(meta["model"]))
"""
import json
import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from . import functional as F
from . import generation, nn
from .autograd import no_grad
from .data.vocab import BOS, EOS, PAD
from .random import get_generator
from .shapes import ShapeError
from .tensor import cat
from .tensor import Tensor


class _JSONConfig:
    """to_json / from_json for the config dataclasses below."""

    def to_json(self):
        return json.dumps({"kind": type(self).__name__, **asdict(self)}, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        values = json.loads(text)
        kind = values.pop("kind", cls.__name__)
        if kind != cls.__name__:
            raise ValueError(f"{cls.__name__}.from_json: this is a {kind}, not a {cls.__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{cls.__name__}.from_json: unknown fields {unknown}")
        return cls(**values)


def _as_ids(x, what):
    """Integer token ids as a numpy int64 array (from a list, array or Tensor)."""
    ids = x.data if isinstance(x, Tensor) else np.asarray(x)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{what}: token ids must be integers, got dtype {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def _check_ids(ids, vocab_size, what):
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{what}: token ids must be in [0, {vocab_size}), got values from "
                         f"{ids.min()} to {ids.max()}")


# --------------------------------------------------------------------------- seq2seq
@dataclass
class Seq2SeqConfig(_JSONConfig):
    """Hyper-parameters of a `Seq2SeqTransformer`.

    vocab_size counts every token id, special ones included (a task's
    `vocab_size`); max_len bounds the length of source and target.
    """

    vocab_size: int
    d_model: int = 64
    nhead: int = 4
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    dim_feedforward: int = 256
    dropout: float = 0.0
    norm_first: bool = False
    max_len: int = 256


class Seq2SeqTransformer(nn.Module):
    """Token embeddings + sinusoidal positions -> nn.Transformer -> logits.

        x_src = PE(E_src[src] * sqrt(d_model)),  x_tgt = PE(E_tgt[tgt_in] * sqrt(d_model))
        logits = generator(Transformer(x_src, x_tgt))          (B, T, vocab_size)

    The embeddings start N(0, 1/d_model), so after the sqrt(d_model) scale
    a token vector has entries of unit size, like the positional encoding
    added to it. Token ids follow `tinygrad_attn.data.vocab`: PAD = 0 is
    masked in attention, BOS = 1 starts the decoder input, EOS = 2 ends it.

    forward(src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None)
    takes integer ids (B, S) and (B, T); padding masks default to "where the
    ids are PAD". The decoder is causal: position t sees tgt_in[:, :t+1].
    """

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.src_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.vocab_size, c.d_model)
        for emb in (self.src_embed, self.tgt_embed):
            nn.init.normal_(emb.weight, 0.0, c.d_model ** -0.5)
        self.pos = nn.PositionalEncoding(c.d_model, max_len=c.max_len, dropout=c.dropout)
        self.transformer = nn.Transformer(
            d_model=c.d_model, nhead=c.nhead, num_encoder_layers=c.num_encoder_layers,
            num_decoder_layers=c.num_decoder_layers, dim_feedforward=c.dim_feedforward,
            dropout=c.dropout, norm_first=c.norm_first, batch_first=True)
        self.generator = nn.Linear(c.d_model, c.vocab_size)

    def _embed(self, embedding, ids):
        return self.pos(embedding(ids) * math.sqrt(self.config.d_model))

    def encode(self, src, src_key_padding_mask=None):
        """The encoder's output ("memory"), (B, S, d_model)."""
        src = _as_ids(src, "Seq2SeqTransformer.encode")
        _check_ids(src, self.config.vocab_size, "Seq2SeqTransformer.encode")
        if src_key_padding_mask is None:
            src_key_padding_mask = src == PAD
        return self.transformer.encoder(self._embed(self.src_embed, src),
                                        src_key_padding_mask=src_key_padding_mask)

    def decode(self, tgt_in, memory, memory_key_padding_mask=None, tgt_key_padding_mask=None):
        """Logits (B, T, vocab_size) of the next token at each decoder position."""
        tgt_in = _as_ids(tgt_in, "Seq2SeqTransformer.decode")
        _check_ids(tgt_in, self.config.vocab_size, "Seq2SeqTransformer.decode")
        if tgt_in.shape[-1] > self.config.max_len:
            raise ShapeError(f"Seq2SeqTransformer: target of length {tgt_in.shape[-1]} is longer "
                             f"than max_len {self.config.max_len}")
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.shape[-1])
        x = self.transformer.decoder(self._embed(self.tgt_embed, tgt_in), memory, tgt_mask=causal,
                                     tgt_key_padding_mask=tgt_key_padding_mask,
                                     memory_key_padding_mask=memory_key_padding_mask,
                                     tgt_is_causal=True)
        return self.generator(x)

    def forward(self, src, tgt_in, src_key_padding_mask=None, tgt_key_padding_mask=None):
        src = _as_ids(src, "Seq2SeqTransformer")
        tgt_in = _as_ids(tgt_in, "Seq2SeqTransformer")
        if src.ndim != 2 or tgt_in.ndim != 2 or len(src) != len(tgt_in):
            raise ShapeError(f"Seq2SeqTransformer: expected src (B, S) and tgt_in (B, T) with the "
                             f"same B, got {src.shape} and {tgt_in.shape}")
        if src_key_padding_mask is None:
            src_key_padding_mask = src == PAD
        if tgt_key_padding_mask is None and (tgt_in == PAD).any():
            tgt_key_padding_mask = tgt_in == PAD
        memory = self.encode(src, src_key_padding_mask)
        return self.decode(tgt_in, memory, memory_key_padding_mask=src_key_padding_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask)

    def greedy_decode(self, src, max_len=None, use_cache=True):
        """Decode a batch greedily: start from BOS, append the most likely
        token, stop a sequence at EOS (PAD after it) and the batch when every
        sequence has ended or after `max_len` tokens (default: the source
        width + 1, room for the sequence and its EOS).

        src: ids (B, S) or one sequence (S,). Returns int64 ids aligned with
        a task's `tgt_out` (no leading BOS): (B, <= max_len), or (<= max_len,).

        use_cache=True (our keyword; the default) keeps each decoder layer's
        self-attention keys and values and computes the cross-attention keys
        and values of the encoder output once, so a step feeds only the new
        token (`tinygrad_attn.generation`); use_cache=False reruns the
        decoder on the whole prefix at every step. Both give the same tokens.
        """
        src = _as_ids(src, "Seq2SeqTransformer.greedy_decode")
        single = src.ndim == 1
        if single:
            src = src[None]
        if src.ndim != 2:
            raise ShapeError(f"Seq2SeqTransformer.greedy_decode: expected src (B, S) or (S,), "
                             f"got {src.shape}")
        max_len = src.shape[1] + 1 if max_len is None else int(max_len)
        if not 1 <= max_len < self.config.max_len:
            raise ValueError(f"Seq2SeqTransformer.greedy_decode: max_len must be in "
                             f"[1, {self.config.max_len - 1}], got {max_len}")
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                padding = src == PAD
                memory = self.encode(src, padding)
                ys = np.full((len(src), 1), BOS, dtype=np.int64)
                done = np.zeros(len(src), dtype=bool)
                if use_cache:
                    decoder = self.transformer.decoder
                    caches = generation.caches_for(decoder.layers, len(src), max_len, memory.dtype)
                    memory_kvs = [generation.memory_keys_values(layer.multihead_attn, memory)
                                  for layer in decoder.layers]
                for _ in range(max_len):
                    if use_cache:  # only the newest token goes in
                        last = generation.seq2seq_step(self, ys[:, -1:], caches, memory_kvs, padding)
                    else:  # the decoder reruns on the whole prefix
                        last = self.decode(ys, memory, memory_key_padding_mask=padding).data[:, -1]
                    nxt = np.where(done, PAD, last.argmax(axis=-1))
                    ys = np.concatenate([ys, nxt[:, None]], axis=1)
                    done |= nxt == EOS
                    if done.all():
                        break
        finally:
            self.train(was_training)
        out = ys[:, 1:]
        return out[0] if single else out

    def attention_layers(self):
        """(name, MultiHeadAttention) for every attention layer, in the order
        data flows: encoder self-attention, then decoder self- and
        cross-attention per layer."""
        layers = [(f"encoder.{i}.self_attn", layer.self_attn)
                  for i, layer in enumerate(self.transformer.encoder.layers)]
        for i, layer in enumerate(self.transformer.decoder.layers):
            layers += [(f"decoder.{i}.self_attn", layer.self_attn),
                       (f"decoder.{i}.cross_attn", layer.multihead_attn)]
        return layers


# --------------------------------------------------------------------------- GPT
@dataclass
class GPTConfig(_JSONConfig):
    """Hyper-parameters of a `GPT` (nanoGPT's names).

    dim_feedforward defaults to 4 * n_embd; tie_weights shares the token
    embedding with the output layer (GPT-2); bias=False drops the biases of
    the Linear and LayerNorm layers (nanoGPT's training default; its model
    default, like ours, keeps them); gelu is "exact" (x Phi(x), nanoGPT's
    nn.GELU()) or "tanh" (the tanh approximation of GPT-2's code).
    """

    vocab_size: int
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dim_feedforward: int = None
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    gelu: str = "exact"

    def __post_init__(self):
        if self.dim_feedforward is None:
            self.dim_feedforward = 4 * self.n_embd
        if self.gelu not in GELU_KINDS:
            raise ValueError(f"GPTConfig: gelu must be one of {', '.join(GELU_KINDS)}, got {self.gelu!r}")


def gelu_tanh(x):
    """GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    return F.gelu(x, approximate="tanh")


# GPTConfig.gelu -> the feed-forward activation
GELU_KINDS = {"exact": "gelu", "tanh": gelu_tanh}


class _Sampling:
    """`generate` for the decoder-only language models (GPT, Llama). A model
    gives _context_size() (its block size), _new_caches(batch, length) and
    _cached_step(ids, caches) (tinygrad_attn.generation)."""

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, use_cache=True):
        """Continue each row of `idx` (B, T) or (T,) by `max_new_tokens` ids.

        Each new id is drawn from softmax(logits / temperature) of the last
        position, keeping only the `top_k` most likely ids when given;
        temperature=0 picks the most likely id (greedy). Draws from
        `generator` (a numpy Generator), by default the framework's
        (`tg.manual_seed`). Returns the ids with the continuation appended
        (int64 array).

        The context window: the model sees the ids from a window start on,
        at positions 0, 1, ...; it begins as the last block_size ids of the
        prompt (a Llama's max_seq_len), and when it would grow past
        block_size ids it restarts from its last `context_keep()` ids
        (block_size // 2). nanoGPT (and llama2.c's generate) instead
        crops to the last block_size ids at every step; with learned
        absolute positions that moves every id to a new position at every
        step once the window is full, so no cached key or value would stay
        valid. With this rule a window grows one position per step, and
        `use_cache=True` (our keyword; the default) runs it incrementally:
        a restarted window is encoded in one batched pass that fills a
        key/value cache per layer, then each step feeds only the new id
        (`tinygrad_attn.generation`). `use_cache=False` runs the whole
        window through `forward` at every step under the same rule: the same
        ids from the same draws (the logits agree to float rounding), slower.
        """
        idx = _as_ids(idx, f"{type(self).__name__}.generate")
        single = idx.ndim == 1
        if single:
            idx = idx[None]
        if idx.ndim != 2 or idx.shape[1] == 0:
            raise ShapeError(f"{type(self).__name__}.generate: expected a non-empty prompt (B, T) or (T,), "
                             f"got {idx.shape}")
        _check_ids(idx, self.config.vocab_size, f"{type(self).__name__}.generate")
        if not temperature >= 0:
            raise ValueError(f"{type(self).__name__}.generate: temperature must be >= 0, got {temperature}")
        if top_k is not None and not 1 <= top_k:
            raise ValueError(f"{type(self).__name__}.generate: top_k must be a positive integer, got {top_k}")
        rng = get_generator() if generator is None else generator
        block, keep = self._context_size(), self.context_keep()
        was_training = self.training
        self.eval()
        try:
            with no_grad():
                start = max(0, idx.shape[1] - block)  # the window is idx[:, start:]
                caches = None  # key/value caches of the window, made when it (re)starts
                for _ in range(max_new_tokens):
                    if idx.shape[1] - start > block:  # full: restart from its last `keep` ids
                        start, caches = idx.shape[1] - keep, None
                    if not use_cache:
                        logits = self(idx[:, start:]).data[:, -1]
                    elif caches is None:  # a new window: encode it in one pass, filling the caches
                        caches = self._new_caches(len(idx), block)
                        logits = self._cached_step(idx[:, start:], caches)
                    else:  # one new position
                        logits = self._cached_step(idx[:, -1:], caches)
                    nxt = _sample(logits.astype(np.float64), temperature, top_k, rng)
                    idx = np.concatenate([idx, nxt[:, None]], axis=1)
        finally:
            self.train(was_training)
        return idx[0] if single else idx

    def context_keep(self):
        """How many ids a full context window keeps when it restarts (see
        `generate`): half the context size (block_size // 2), at least 1."""
        return max(1, self._context_size() // 2)


class GPT(_Sampling, nn.Module):
    """A decoder-only Transformer language model (GPT-2's layout):

        x = E_tok[idx] + E_pos[0..T-1]                    (dropout)
        x = block_l(x), l = 1..n_layer     block: x + SA(LN(x)), then x + FF(LN(x)),
                                           causal self-attention, GELU feed-forward
        logits = lm_head(LN_f(x))                         (B, T, vocab_size)

    The blocks and LN_f are an `nn.TransformerEncoder` of
    `TransformerEncoderLayer(norm_first=True, activation="gelu")` (or
    `gelu_tanh` with gelu="tanh") called with is_causal=True, so position t
    only sees positions <= t.
    Initialisation follows GPT-2 / nanoGPT: weights N(0, 0.02), biases 0,
    and the projections that write into the residual stream (attention
    output, second FF layer) N(0, 0.02 / sqrt(2 n_layer)), so the residual
    sum does not grow with depth.

    forward(idx) with integer ids (B, T), T <= block_size -> logits.
    """

    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.n_embd)
        self.pos_emb = nn.LearnedPositionalEmbedding(c.n_embd, max_len=c.block_size, dropout=c.dropout)
        block = nn.TransformerEncoderLayer(
            d_model=c.n_embd, nhead=c.n_head, dim_feedforward=c.dim_feedforward, dropout=c.dropout,
            activation=GELU_KINDS[c.gelu], norm_first=True, bias=c.bias, batch_first=True)
        self.transformer = nn.TransformerEncoder(encoder_layer=block, num_layers=c.n_layer,
                                                 norm=nn.LayerNorm(c.n_embd, bias=c.bias))
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self._init_weights()
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight

    def _init_weights(self):
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.MultiHeadAttention):
                nn.init.normal_(module.in_proj_weight, 0.0, std)
        nn.init.normal_(self.pos_emb.weight, 0.0, std)
        for block in self.transformer.layers:
            nn.init.normal_(block.self_attn.out_proj.weight, 0.0, residual_std)
            nn.init.normal_(block.linear2.weight, 0.0, residual_std)

    def forward(self, idx):
        idx = _as_ids(idx, "GPT")
        if idx.ndim != 2 or not 1 <= idx.shape[1] <= self.config.block_size:
            raise ShapeError(f"GPT: expected ids (B, T) with 1 <= T <= block_size "
                             f"{self.config.block_size}, got {idx.shape}")
        _check_ids(idx, self.config.vocab_size, "GPT")
        causal = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        x = self.transformer(self.pos_emb(self.tok_emb(idx)), mask=causal, is_causal=True)
        return self.lm_head(x)

    def _context_size(self):
        return self.config.block_size

    def _new_caches(self, batch, length):
        return generation.caches_for(self.transformer.layers, batch, length, self.tok_emb.weight.dtype)

    def _cached_step(self, ids, caches):
        return generation.gpt_step(self, ids, caches)

    def attention_layers(self):
        """(name, MultiHeadAttention) for each block's causal self-attention."""
        return [(f"layer.{i}.self_attn", block.self_attn)
                for i, block in enumerate(self.transformer.layers)]


def _sample(logits, temperature, top_k, rng):
    """One id per row of `logits` (B, V): greedy at temperature 0, else drawn
    from softmax(logits / temperature) restricted to the top_k largest."""
    if temperature == 0:
        return logits.argmax(axis=-1)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = np.partition(logits, -top_k, axis=-1)[:, -top_k][:, None]
        logits = np.where(logits < kth, -np.inf, logits)
    cdf = np.cumsum(np.exp(logits - logits.max(axis=-1, keepdims=True)), axis=-1)
    cdf /= cdf[:, -1:]  # exactly 1 at the end, so every draw lands on an id of nonzero probability
    # Inverse-CDF sampling: one uniform number u in [0, 1) per row picks the first id with cdf > u.
    u = rng.random(len(cdf))[:, None]
    return (cdf <= u).sum(axis=-1)


# --------------------------------------------------------------------------- Llama
def llama_hidden_dim(dim, hidden_dim=None, multiple_of=256):
    """The SwiGLU hidden size, llama2.c's rule: hidden_dim if given, else
    4 * dim, then two thirds of it (int(2 * h / 3): three matrices instead of
    two keep the parameter count of a 4 * dim MLP), rounded up to a multiple
    of `multiple_of`."""
    if hidden_dim is not None:
        return hidden_dim
    hidden_dim = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)


@dataclass
class LlamaConfig(_JSONConfig):
    """Hyper-parameters of a `Llama`: the fields of llama2.c's ModelArgs, in
    its order, so `ModelArgs(**asdict(config))` builds llama2.c's model.

    n_kv_heads: key/value heads (None: n_heads), each shared by
    n_heads / n_kv_heads query heads (grouped-query attention).
    hidden_dim: the SwiGLU width (None: `llama_hidden_dim`'s rule with
    multiple_of). norm_eps: the RMSNorms' eps. max_seq_len: the longest
    context (the rotary tables' length). The defaults are nanoGPT's CPU
    size; llama2.c's ModelArgs defaults are Llama 2 7B's (dim 4096, 32
    layers and heads, vocabulary 32000, multiple_of 256, 2048 positions).
    """

    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = None
    vocab_size: int = 32000
    hidden_dim: int = None
    multiple_of: int = 32
    norm_eps: float = 1e-5
    max_seq_len: int = 64
    dropout: float = 0.0

    def __post_init__(self):
        kv = self.n_heads if self.n_kv_heads is None else self.n_kv_heads
        if self.dim % self.n_heads or self.n_heads % kv or (self.dim // self.n_heads) % 2:
            raise ValueError(f"LlamaConfig: n_heads {self.n_heads} must divide dim {self.dim} into heads of an "
                             f"even size (rotary pairs), and n_kv_heads {kv} must divide n_heads")


class LlamaAttention(nn.Module):
    """Causal self-attention with rotary positions and grouped-query heads
    (llama2.c's Attention): q = x Wq^T, k = x Wk^T, v = x Wv^T (no biases),
    q and k rotated by their positions, n_kv_heads key/value heads each
    shared by n_heads / n_kv_heads consecutive query heads, then Wo."""

    def __init__(self, args):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.resid_dropout = nn.Dropout(args.dropout)
        self.dropout = args.dropout
        # as MultiheadAttention's: record_weights = True keeps the last forward's
        # weights (B, n_heads, T, T) in last_attn_weights (the training heatmaps)
        self.record_weights, self.last_attn_weights = False, None

    def forward(self, x, freqs_cos, freqs_sin):
        """x (B, T, dim) and the rotary tables of positions 0..T-1 -> (B, T, dim)."""
        B, T, _ = x.shape
        q = self.wq(x).reshape(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).reshape(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).reshape(B, T, self.n_kv_heads, self.head_dim)
        q, k = F.apply_rotary_emb(q, freqs_cos, freqs_sin), F.apply_rotary_emb(k, freqs_cos, freqs_sin)
        q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))  # heads as a batch axis: (B, heads, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True, enable_gqa=True, need_weights=self.record_weights)
        if self.record_weights:
            y, weights = y
            self.last_attn_weights = weights.data
        y = y.permute(0, 2, 1, 3).reshape(B, T, self.n_heads * self.head_dim)  # the heads side by side
        return self.resid_dropout(self.wo(y))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x), no biases (llama2.c's FeedForward);
    the hidden width follows `llama_hidden_dim`.

    Computed as w2(swiglu(x [W1; W3]^T)): w1 x and w3 x side by side from one
    product, then silu of the first half times the second in one kernel
    (`F.swiglu`). The same numbers as llama2.c's three calls; the modules
    w1 and w3 hold the weights (and the state dict's names), but their
    forward is not called."""

    def __init__(self, dim, hidden_dim, multiple_of, dropout):
        super().__init__()
        hidden_dim = llama_hidden_dim(dim, hidden_dim, multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        h = F.linear(x, cat([self.w1.weight, self.w3.weight]))  # (B, T, 2 * hidden): [w1 x | w3 x]
        return self.dropout(self.w2(F.swiglu(h)))                # w2(silu(w1 x) * w3 x)


class TransformerBlock(nn.Module):
    """Pre-norm Llama block: h = x + attention(RMSNorm(x)), out = h + feed_forward(RMSNorm(h))."""

    def __init__(self, layer_id, args):
        super().__init__()
        self.layer_id = layer_id
        self.attention = LlamaAttention(args)
        self.feed_forward = FeedForward(args.dim, args.hidden_dim, args.multiple_of, args.dropout)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, freqs_cos, freqs_sin):
        h = x + self.attention(self.attention_norm(x), freqs_cos, freqs_sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(_Sampling, nn.Module):
    """A Llama-2 language model with llama2.c's layout and parameter names:

        x = E[tokens]                                           (dropout)
        x = layers.{i}(x)   h = x + attention(attention_norm(x)),
                            x = h + feed_forward(ffn_norm(h))
        logits = output(norm(x))                                (B, T, vocab_size)

    RMSNorm instead of LayerNorm, rotary positions in q and k instead of a
    position table, grouped-query attention (`LlamaAttention`), a SwiGLU
    feed-forward (`FeedForward`), no biases, and the output layer tied to
    the token embedding. A state dict saved from llama2.c's model.py
    (tok_embeddings, layers.{i}.attention.wq/wk/wv/wo,
    layers.{i}.feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm,
    output) loads unchanged (tests/test_llama.py). Two departures, both
    noted where they matter: llama2.c computes RMSNorm and the rotation in
    float32 whatever the model's dtype (`x.float()`), this model in its
    dtype (float64 stays float64); and llama2.c's forward without targets
    returns the last position's logits only, this one every position's.

    Initialisation is llama2.c's: every weight N(0, 0.02), and the
    parameters named w3 and wo N(0, 0.02 / sqrt(2 n_layers)) (llama2.c
    scales w3, the SwiGLU gate's partner, where GPT-2 would scale w2).
    The rotary tables are non-persistent buffers freqs_cos, freqs_sin
    (max_seq_len, head_dim // 2), as in llama2.c.

    forward(tokens) with integer ids (B, T), T <= max_seq_len -> logits.
    """

    def __init__(self, params):
        super().__init__()
        self.config = self.params = c = params
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList([TransformerBlock(i, c) for i in range(c.n_layers)])
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self._init_weights()
        self.output.weight = self.tok_embeddings.weight  # weight tying, as llama2.c
        freqs_cos, freqs_sin = nn.precompute_freqs_cis(c.dim // c.n_heads, c.max_seq_len)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def _init_weights(self):
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("w3.weight") or name.endswith("wo.weight"):
                nn.init.normal_(p, 0.0, residual_std)

    def forward(self, tokens):
        tokens = _as_ids(tokens, "Llama")
        if tokens.ndim != 2 or not 1 <= tokens.shape[1] <= self.config.max_seq_len:
            raise ShapeError(f"Llama: expected ids (B, T) with 1 <= T <= max_seq_len "
                             f"{self.config.max_seq_len}, got {tokens.shape}")
        _check_ids(tokens, self.config.vocab_size, "Llama")
        T = tokens.shape[1]
        h = self.dropout(self.tok_embeddings(tokens))
        freqs_cos, freqs_sin = self.freqs_cos.data[:T], self.freqs_sin.data[:T]
        for layer in self.layers:
            h = layer(h, freqs_cos, freqs_sin)
        return self.output(self.norm(h))

    def _context_size(self):
        return self.config.max_seq_len

    def _new_caches(self, batch, length):
        return generation.llama_caches(self, batch, length)

    def _cached_step(self, ids, caches):
        return generation.llama_step(self, ids, caches)

    def attention_layers(self):
        """(name, LlamaAttention) for each block's causal self-attention."""
        return [(f"layers.{i}.attention", layer.attention) for i, layer in enumerate(self.layers)]
