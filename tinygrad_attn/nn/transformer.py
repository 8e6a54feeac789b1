"""The Transformer of "Attention Is All You Need", layer by layer.

Same structure, argument names, submodule names and masks as torch.nn's
Transformer family (so state dicts move between the two), with
batch_first=True by default. An encoder layer is

    post-norm (default, the paper):  x = norm1(x + SA(x));  x = norm2(x + FF(x))
    pre-norm (norm_first=True):      x = x + SA(norm1(x));  x = x + FF(norm2(x))

with SA = dropout1(self_attn(x, x, x)) and FF = dropout2(linear2(dropout(
activation(linear1(x))))). A decoder layer adds cross-attention to the
encoder output ("memory") between the two, with norm3 for the third block.
Masks follow torch.nn.MultiheadAttention: boolean True = may NOT attend.
"""
import copy

import numpy as np

from .. import functional as F
from ..shapes import ShapeError
from ..tensor import Tensor
from . import init
from .attention import MultiHeadAttention
from .layers import Dropout, LayerNorm, Linear
from .module import Module, ModuleList


def _activation(activation):
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if callable(activation):
        return activation
    raise ValueError(f"activation should be 'relu', 'gelu' or a callable, not {activation!r}")


def _activation_name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward network, each wrapped in a residual
    connection and LayerNorm (Add&Norm).

    forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False)
    src: (B, S, d_model) (batch_first) or (S, B, d_model); src_mask (S, S) or
    (B * nhead, S, S); src_key_padding_mask (B, S).
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              is_causal=is_causal)
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self):
        return f"norm_first={self.norm_first}, activation={_activation_name(self.activation)}"


class TransformerDecoderLayer(Module):
    """Masked self-attention, cross-attention to the encoder output, and a
    feed-forward network, each with a residual connection and LayerNorm.

    forward(tgt, memory, tgt_mask=None, memory_mask=None,
            tgt_key_padding_mask=None, memory_key_padding_mask=None,
            tgt_is_causal=False, memory_is_causal=False)
    tgt: (B, T, d_model), memory: (B, S, d_model) (batch_first); tgt_mask
    (T, T), memory_mask (T, S), padding masks (B, T) and (B, S).
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=True, norm_first=False, bias=True):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.multihead_attn = MultiHeadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                    memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                               memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              is_causal=is_causal)
        return self.dropout1(x)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x, _ = self.multihead_attn(x, memory, memory, attn_mask=attn_mask,
                                   key_padding_mask=key_padding_mask, is_causal=is_causal)
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self):
        return f"norm_first={self.norm_first}, activation={_activation_name(self.activation)}"


class TransformerEncoder(Module):
    """`num_layers` deep copies of `encoder_layer` (independent weights,
    `layers.0`, `layers.1`, ...), then an optional final `norm`.

    forward(src, mask=None, src_key_padding_mask=None, is_causal=None)
    """

    def __init__(self, encoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Module):
    """`num_layers` deep copies of `decoder_layer`, then an optional final `norm`.

    forward(tgt, memory, tgt_mask=None, memory_mask=None,
            tgt_key_padding_mask=None, memory_key_padding_mask=None,
            tgt_is_causal=None, memory_is_causal=False)
    """

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """The encoder-decoder Transformer (6 + 6 layers, d_model 512, 8 heads by
    default, as in the paper), with final LayerNorms on both stacks and every
    weight matrix re-initialised xavier_uniform, as torch.nn.Transformer.

    forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
            src_key_padding_mask=None, tgt_key_padding_mask=None,
            memory_key_padding_mask=None, src_is_causal=None,
            tgt_is_causal=None, memory_is_causal=False) -> (B, T, d_model)

    src: (B, S, d_model), tgt: (B, T, d_model) with batch_first (the
    default here; torch's default is False). The inputs are already
    embedded: token embeddings and positional encodings are the caller's.
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=True, norm_first=False,
                 bias=True):
        super().__init__()
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                      batch_first, norm_first, bias)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(TransformerEncoderLayer(*layer_args), num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(TransformerDecoderLayer(*layer_args), num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
        self.d_model, self.nhead, self.batch_first = d_model, nhead, batch_first

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal=None, tgt_is_causal=None, memory_is_causal=False):
        batch_axis = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_axis] != tgt.shape[batch_axis]:
            raise ShapeError(f"Transformer: src {src.shape} and tgt {tgt.shape} have different "
                             f"batch sizes (batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ShapeError(f"Transformer: src {src.shape} and tgt {tgt.shape} must both have "
                             f"d_model = {self.d_model} features")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, dtype=None):
        """The causal mask (sz, sz) as a float Tensor (float32 unless `dtype`
        says otherwise): 0 on and below the diagonal, -inf above it
        (position i may not see j > i)."""
        mask = np.triu(np.full((sz, sz), -np.inf), k=1)
        return Tensor(mask, dtype=np.float32 if dtype is None else dtype)
