"""What the workers share besides the cases: numpy's BLAS, the check of a
dropout's output, and PyTorch twins of the benchmark's models (impl_torch.py).
(The kernel rows' numpy versions are the ops' own numpy twins: impl_numpy.py.)
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


def dropout_ok(x, y, p):
    """y is inverted dropout of x: zeros or x / (1 - p), about a fraction p of
    zeros (within 1%, or 4 standard deviations on a small array).
    (Each framework draws its own mask, so outputs are checked this way, not compared.)"""
    kept = y != 0
    spread = max(0.01, 4 * math.sqrt(p * (1 - p) / max(y.size, 1)))
    return bool(np.allclose(y[kept], x[kept] / (1 - p), rtol=1e-6) and abs(kept.mean() - (1 - p)) < spread)


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
