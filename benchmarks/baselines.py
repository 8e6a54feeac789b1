"""The same computations in plain numpy (forward and hand-written backward)
and in PyTorch, for benchmarks/run.py.

Each factory takes the input arrays and returns two callables, forward
and forward+backward, so every framework is timed on the same work.
"""
import math

import numpy as np


# ------------------------------------------------------------ plain numpy

def np_softmax(x):
    def fwd():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def fwd_bwd():
        y = fwd()
        return y * (G - (G * y).sum(axis=-1, keepdims=True))
    G = np.ones_like(x)
    return fwd, fwd_bwd


def np_layer_norm(x, w, b, eps=1e-5):
    def fwd():
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        rstd = 1 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
        return xc * rstd * w + b, xc * rstd, rstd

    def fwd_bwd():
        y, xhat, rstd = fwd()
        gw = G * w
        dx = rstd * (gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True))
        rows = G.reshape(-1, G.shape[-1])
        return dx, (rows * xhat.reshape(rows.shape)).sum(axis=0), rows.sum(axis=0)
    G = np.ones_like(x)
    return (lambda: fwd()[0]), fwd_bwd


def np_cross_entropy(logits, target):
    n = logits.shape[0]

    def fwd():
        m = logits.max(axis=-1, keepdims=True)
        lse = m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
        return (lse[:, 0] - logits[np.arange(n), target]).mean(), lse

    def fwd_bwd():
        _, lse = fwd()
        d = np.exp(logits - lse)
        d[np.arange(n), target] -= 1
        return d / n
    return (lambda: fwd()[0]), fwd_bwd


def np_matmul(a, b):
    def fwd():
        return a @ b

    def fwd_bwd():
        g = fwd()
        return g @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ g
    return fwd, fwd_bwd


def np_linear(x, w, bias):
    x2 = x.reshape(-1, x.shape[-1])

    def fwd():
        return x2 @ w.T + bias

    def fwd_bwd():
        g = fwd()
        return g @ w, g.T @ x2, g.sum(axis=0)
    return fwd, fwd_bwd


def np_dropout(x, p, rng):
    def fwd():
        keep = rng.random(x.shape, dtype=np.float32) >= p
        return x * keep / np.float32(1 - p), keep

    def fwd_bwd():
        y, keep = fwd()
        return y * keep / np.float32(1 - p)
    return (lambda: fwd()[0]), fwd_bwd


def np_attention(q, k, v, causal):
    scale = 1 / math.sqrt(q.shape[-1])
    L, S = q.shape[-2], k.shape[-2]
    blocked = np.triu(np.ones((L, S), bool), 1) if causal else None

    def fwd():
        s = q @ np.swapaxes(k, -1, -2) * np.float32(scale)
        if blocked is not None:
            s = np.where(blocked, -np.inf, s)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return p @ v, p

    def fwd_bwd():
        out, p = fwd()
        g = out
        dv = np.swapaxes(p, -1, -2) @ g
        dp = g @ np.swapaxes(v, -1, -2)
        ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) * np.float32(scale)
        return ds @ k, np.swapaxes(ds, -1, -2) @ q, dv
    return (lambda: fwd()[0]), fwd_bwd


# ---------------------------------------------------------------- PyTorch

def torch_case(torch, fn, arrays, differentiable):
    """fwd and fwd+bwd (backward of a gradient of ones, made once) of fn on torch tensors."""
    ts = [torch.tensor(a, requires_grad=d) for a, d in zip(arrays, differentiable)]
    with torch.no_grad():
        ones = torch.ones_like(fn(*ts))

    def fwd():
        with torch.no_grad():
            return fn(*ts)

    def fwd_bwd():
        fn(*ts).backward(ones)
        for t in ts:
            t.grad = None
    return fwd, fwd_bwd


def torch_models(torch):
    """PyTorch twins of tinygrad_attn.models' Seq2SeqTransformer and GPT, with
    the same parameter names, so our state_dict loads into them."""
    tnn = torch.nn

    class Seq2Seq(tnn.Module):
        def __init__(self, c, pe):
            super().__init__()
            self.d_model = c.d_model
            self.src_embed, self.tgt_embed = tnn.Embedding(c.vocab_size, c.d_model), tnn.Embedding(c.vocab_size, c.d_model)
            self.register_buffer("pe", torch.tensor(pe), persistent=False)
            self.transformer = tnn.Transformer(c.d_model, c.nhead, c.num_encoder_layers, c.num_decoder_layers,
                                               c.dim_feedforward, c.dropout, batch_first=True, norm_first=c.norm_first)
            self.generator = tnn.Linear(c.d_model, c.vocab_size)

        def embed(self, embedding, ids):
            return embedding(ids) * math.sqrt(self.d_model) + self.pe[:ids.shape[1]]

        def forward(self, src, tgt_in, src_pad, tgt_pad):
            T = tgt_in.shape[1]
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # bool, like the padding masks
            x = self.transformer(self.embed(self.src_embed, src), self.embed(self.tgt_embed, tgt_in),
                                 tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                 memory_key_padding_mask=src_pad, tgt_is_causal=True)
            return self.generator(x)

    class GPT(tnn.Module):
        def __init__(self, c):
            super().__init__()
            self.tok_emb = tnn.Embedding(c.vocab_size, c.n_embd)
            self.pos_emb = tnn.Module()
            self.pos_emb.weight = tnn.Parameter(torch.zeros(c.block_size, c.n_embd))
            block = tnn.TransformerEncoderLayer(c.n_embd, c.n_head, c.dim_feedforward, c.dropout,
                                                activation="gelu", batch_first=True, norm_first=True, bias=c.bias)
            self.transformer = tnn.TransformerEncoder(block, c.n_layer, norm=tnn.LayerNorm(c.n_embd, bias=c.bias),
                                                      enable_nested_tensor=False)
            self.lm_head = tnn.Linear(c.n_embd, c.vocab_size, bias=False)
            self.lm_head.weight = self.tok_emb.weight

        def forward(self, idx):
            T = idx.shape[1]
            causal = tnn.Transformer.generate_square_subsequent_mask(T)
            return self.lm_head(self.transformer(self.tok_emb(idx) + self.pos_emb.weight[:T], mask=causal,
                                                 is_causal=True))

    return Seq2Seq, GPT
