"""The same computations in plain numpy (forward and hand-written backward),
and PyTorch twins of the benchmark's models (used by impl_numpy.py and
impl_torch.py).

Each numpy factory takes the input arrays and returns two callables,
forward and forward+backward (its backward starts from some gradient of the
output's shape: the work, not the values, is what matches the others).
"""
import math
import types

import numpy as np

# ------------------------------------------------------------ plain numpy

def numpy_blas():
    """The name and version of numpy's BLAS, as numpy reports it."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError):  # numpy < 1.26 has no mode="dicts"
        return "unknown"
    return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()


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


def dropout_ok(x, y, p):
    """y is inverted dropout of x: zeros or x / (1 - p), about a fraction p of zeros.
    (Each framework draws its own mask, so outputs are checked this way, not compared.)"""
    kept = y != 0
    return bool(np.allclose(y[kept], x[kept] / (1 - p), rtol=1e-6) and abs(kept.mean() - (1 - p)) < 0.01)


def np_silu(x):
    def fwd():
        return x / (1 + np.exp(-x))

    def fwd_bwd():
        s = 1 / (1 + np.exp(-x))
        return G * (s + x * s * (1 - s))
    G = np.ones_like(x)
    return fwd, fwd_bwd


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

def torch_models(torch):
    """PyTorch twins of the benchmark's models, with the parameter names of
    ours, so our state_dict loads into them: `EncoderLM` (W1), `Seq2Seq`
    (models.Seq2SeqTransformer) and `GPT` (models.GPT). Every layer argument
    is passed by keyword. Returns them as attributes of a namespace."""
    tnn = torch.nn

    class EncoderLM(tnn.Module):
        """Embedding + sinusoidal positions `pe` + post-norm encoder layers + Linear."""

        def __init__(self, vocab, d_model, nhead, ffn, layers, pe):
            super().__init__()
            self.embed = tnn.Embedding(num_embeddings=vocab, embedding_dim=d_model)
            self.register_buffer("pe", torch.tensor(pe), persistent=False)
            layer = tnn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=ffn, dropout=0.0,
                                                activation="relu", batch_first=True, norm_first=False)
            self.encoder = tnn.TransformerEncoder(encoder_layer=layer, num_layers=layers, enable_nested_tensor=False)
            self.head = tnn.Linear(in_features=d_model, out_features=vocab)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids) + self.pe[:ids.shape[1]]))

    class Seq2Seq(tnn.Module):
        def __init__(self, vocab_size, d_model, nhead, layers, ffn, pe):
            super().__init__()
            self.d_model = d_model
            self.src_embed = tnn.Embedding(num_embeddings=vocab_size, embedding_dim=d_model)
            self.tgt_embed = tnn.Embedding(num_embeddings=vocab_size, embedding_dim=d_model)
            self.register_buffer("pe", torch.tensor(pe), persistent=False)
            self.transformer = tnn.Transformer(d_model=d_model, nhead=nhead, num_encoder_layers=layers,
                                               num_decoder_layers=layers, dim_feedforward=ffn, dropout=0.0,
                                               batch_first=True, norm_first=False)
            self.generator = tnn.Linear(in_features=d_model, out_features=vocab_size)

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
        """Learned positions, pre-norm blocks with `activation`, a final LayerNorm, a tied head."""

        def __init__(self, vocab, block, n_layer, n_head, n_embd, activation, bias=True):
            super().__init__()
            self.tok_emb = tnn.Embedding(num_embeddings=vocab, embedding_dim=n_embd)
            self.pos_emb = tnn.Module()
            self.pos_emb.weight = tnn.Parameter(torch.zeros(block, n_embd))
            layer = tnn.TransformerEncoderLayer(d_model=n_embd, nhead=n_head, dim_feedforward=4 * n_embd,
                                                dropout=0.0, activation=activation, batch_first=True,
                                                norm_first=True, bias=bias)
            self.transformer = tnn.TransformerEncoder(encoder_layer=layer, num_layers=n_layer,
                                                      norm=tnn.LayerNorm(n_embd, bias=bias),
                                                      enable_nested_tensor=False)
            self.lm_head = tnn.Linear(in_features=n_embd, out_features=vocab, bias=False)
            self.lm_head.weight = self.tok_emb.weight

        def forward(self, idx):
            T = idx.shape[1]
            causal = tnn.Transformer.generate_square_subsequent_mask(T)
            return self.lm_head(self.transformer(self.tok_emb(idx) + self.pos_emb.weight[:T], mask=causal,
                                                 is_causal=True))

    return types.SimpleNamespace(EncoderLM=EncoderLM, Seq2Seq=Seq2Seq, GPT=GPT)
