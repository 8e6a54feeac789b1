"""PyTorch twins of tinygrad_attn's models, to run an exported run in PyTorch.

    python -m tinygrad_attn export runs/charlm --to torch charlm.safetensors

    import torch
    from torch_models import load_exported
    model = load_exported("charlm.safetensors")       # built from the file's config, eval mode
    logits = model(torch.tensor([[5, 12, 7]]))         # (B, T, vocab_size), as tinygrad_attn's

`load_exported` reads the module name and config stored in the file, builds
the module and loads the weights with `load_state_dict(strict=True)`:

- `GPT`: the charlm model, written the way nanoGPT's model.py is (same
  parameter names: transformer.wte, transformer.wpe, transformer.h.i.ln_1,
  attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, transformer.ln_f,
  lm_head), plus tinygrad_attn's options dim_feedforward, gelu and
  tie_weights.
- `Seq2SeqTransformer`: token embeddings, the sinusoidal positional table,
  `torch.nn.Transformer` and a Linear head: the copy / reverse / sort model.
- `Llama`: the `--arch llama` charlm model, written the way llama2.c's
  model.py is (its parameter names: tok_embeddings, layers.i.attention.wq,
  feed_forward.w1, attention_norm, ffn_norm, norm, output): RMSNorm, rotary
  positions, grouped-query attention, SwiGLU.

All return the logits of every position, in float32 equal to
tinygrad_attn's to about 1e-6 (tests/test_export.py checks it).
Needs torch and safetensors (`pip install torch safetensors`).
"""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD = 0  # tinygrad_attn.data.PAD: padding, masked in attention


# --------------------------------------------------------------------------- GPT (nanoGPT's layout)
class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (nanoGPT's)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout, bias):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)  # q, k, v stacked (= in_proj_weight)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, n_embd, dim_feedforward, dropout, bias, gelu):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, dim_feedforward, bias=bias)
        self.gelu = nn.GELU(approximate="none" if gelu == "exact" else "tanh")
        self.c_proj = nn.Linear(dim_feedforward, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, dim_feedforward, dropout, bias, gelu):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, dim_feedforward, dropout, bias, gelu)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """tinygrad_attn.models.GPT in PyTorch, with the arguments of its GPTConfig."""

    def __init__(self, vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=128, dim_feedforward=None,
                 dropout=0.0, bias=True, tie_weights=True, gelu="exact"):
        super().__init__()
        dim_feedforward = 4 * n_embd if dim_feedforward is None else dim_feedforward
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(n_embd, n_head, dim_feedforward, dropout, bias, gelu)
                             for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        """Logits (B, T, vocab_size) of the next token at every position."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --------------------------------------------------------------------------- seq2seq
def sinusoidal_table(max_len, d_model):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    angles = pos / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, :d_model // 2])
    return table.float()


class Seq2SeqTransformer(nn.Module):
    """tinygrad_attn.models.Seq2SeqTransformer in PyTorch, with the arguments
    of its Seq2SeqConfig: x = E[ids] * sqrt(d_model) + PE, then
    torch.nn.Transformer (causal decoder, PAD masked), then a Linear head."""

    def __init__(self, vocab_size, d_model=64, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                 dim_feedforward=256, dropout=0.0, norm_first=False, max_len=256):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = nn.Embedding(vocab_size, d_model)
        self.register_buffer("pe", sinusoidal_table(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d_model=d_model, nhead=nhead, num_encoder_layers=num_encoder_layers,
                                          num_decoder_layers=num_decoder_layers,
                                          dim_feedforward=dim_feedforward, dropout=dropout,
                                          batch_first=True, norm_first=norm_first)
        self.generator = nn.Linear(d_model, vocab_size)

    def _embed(self, embedding, ids):
        return self.dropout(embedding(ids) * math.sqrt(self.d_model) + self.pe[:ids.shape[1]])

    def forward(self, src, tgt_in):
        """Logits (B, T, vocab_size) for source ids (B, S) and decoder input ids (B, T)."""
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # True: may not attend
        x = self.transformer(self._embed(self.src_embed, src), self._embed(self.tgt_embed, tgt_in),
                             tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src == PAD,
                             tgt_key_padding_mask=tgt_in == PAD, memory_key_padding_mask=src == PAD)
        return self.generator(x)


# --------------------------------------------------------------------------- Llama (llama2.c's model.py)
# Written after the structure and names of llama2.c's model.py (Karpathy), so
# that a state dict passes between the two unchanged. One deliberate
# difference: llama2.c computes RMSNorm and the rotation in float32
# (`x.float()`) whatever the model's dtype; this twin computes in the
# model's dtype, so that float64 comparisons mean something (in float32 the
# two are the same computation).
def llama_precompute_freqs_cis(dim, end, theta=10000.0):
    """(cos, sin) of t * f_i, f_i = 1 / theta^(2i/dim), (end, dim // 2), in float32 as llama2.c."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    angles = torch.outer(torch.arange(end), freqs).float()
    return torch.cos(angles), torch.sin(angles)


def llama_apply_rotary_emb(x, freqs_cos, freqs_sin):
    """Turn each pair (x[2i], x[2i+1]) of x (B, T, H, hd) by the angles of its position."""
    x_r, x_i = x.reshape(x.shape[:-1] + (-1, 2)).unbind(-1)
    cos = freqs_cos.view(1, x.shape[1], 1, -1).to(x.dtype)
    sin = freqs_sin.view(1, x.shape[1], 1, -1).to(x.dtype)
    return torch.stack([x_r * cos - x_i * sin, x_r * sin + x_i * cos], dim=-1).flatten(3)


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, dropout):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_heads if n_kv_heads is None else n_kv_heads
        self.n_rep, self.head_dim = self.n_heads // self.n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        self.resid_dropout = nn.Dropout(dropout)
        self.dropout = dropout

    def forward(self, x, freqs_cos, freqs_sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = llama_apply_rotary_emb(q, freqs_cos, freqs_sin), llama_apply_rotary_emb(k, freqs_cos, freqs_sin)
        # grouped-query attention: each key/value head repeated for its n_rep query heads (llama2.c's repeat_kv)
        k, v = (t.repeat_interleave(self.n_rep, dim=2) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.resid_dropout(self.wo(y.transpose(1, 2).contiguous().view(B, T, -1)))


class LlamaFeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, multiple_of, dropout):
        super().__init__()
        if hidden_dim is None:
            hidden_dim = int(2 * (4 * dim) / 3)
            hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class LlamaBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden_dim, multiple_of, norm_eps, dropout):
        super().__init__()
        self.attention = LlamaAttention(dim, n_heads, n_kv_heads, dropout)
        self.feed_forward = LlamaFeedForward(dim, hidden_dim, multiple_of, dropout)
        self.attention_norm = LlamaRMSNorm(dim, norm_eps)
        self.ffn_norm = LlamaRMSNorm(dim, norm_eps)

    def forward(self, x, freqs_cos, freqs_sin):
        h = x + self.attention(self.attention_norm(x), freqs_cos, freqs_sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """tinygrad_attn.models.Llama in PyTorch (llama2.c's Transformer), with the
    fields of its LlamaConfig (llama2.c's ModelArgs). forward(tokens) returns
    the logits of every position (llama2.c's, without targets, the last only)."""

    def __init__(self, dim=128, n_layers=4, n_heads=4, n_kv_heads=None, vocab_size=32000, hidden_dim=None,
                 multiple_of=32, norm_eps=1e-5, max_seq_len=64, dropout=0.0):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([LlamaBlock(dim, n_heads, n_kv_heads, hidden_dim, multiple_of, norm_eps,
                                                dropout) for _ in range(n_layers)])
        self.norm = LlamaRMSNorm(dim, norm_eps)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        self.tok_embeddings.weight = self.output.weight  # tied, as llama2.c
        freqs_cos, freqs_sin = llama_precompute_freqs_cis(dim // n_heads, max_seq_len)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def forward(self, tokens):
        """Logits (B, T, vocab_size) of the next token at every position."""
        T = tokens.shape[1]
        h = self.dropout(self.tok_embeddings(tokens))
        for layer in self.layers:
            h = layer(h, self.freqs_cos[:T], self.freqs_sin[:T])
        return self.output(self.norm(h))


# --------------------------------------------------------------------------- loading
MODULES = {"GPT": GPT, "Seq2SeqTransformer": Seq2SeqTransformer, "Llama": Llama}


def load_exported(path):
    """The module of a file written by `python -m tinygrad_attn export ... --to torch`,
    with its weights (strict=True), in eval mode."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    model = MODULES[metadata["module"]](**json.loads(metadata["config"]))
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()
