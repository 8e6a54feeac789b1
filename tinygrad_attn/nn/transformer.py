"""The Transformer of "Attention Is All You Need", layer by layer.

Same structure, argument names, order and defaults, submodule names and
masks as torch.nn's Transformer family (so state dicts move between the two
and PyTorch code runs unchanged), including batch_first=False: inputs are
(T, B, d_model) unless batch_first=True. An encoder layer is

    post-norm (default, the paper):  x = norm1(x + SA(x));  x = norm2(x + FF(x))
    pre-norm (norm_first=True):      x = x + SA(norm1(x));  x = x + FF(norm2(x))

with SA = dropout1(self_attn(x, x, x)) and FF = dropout2(linear2(dropout(
activation(linear1(x))))). A decoder layer adds cross-attention to the
encoder output ("memory") between the two, with norm3 for the third block.
Masks follow torch.nn.MultiheadAttention: boolean True = may NOT attend, and
is_causal / tgt_is_causal / memory_is_causal are hints that need their mask
(as in PyTorch: `Transformer.generate_square_subsequent_mask(T)`).
"""
import copy

import numpy as np

from .. import functional as F
from ..autograd import is_grad_enabled
from ..shapes import ShapeError
from ..tensor import Tensor
from . import init
from .attention import MultiheadAttention, _mask_array
from .layers import GELU, Dropout, LayerNorm, Linear, ReLU, factory_dtype
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


def _is_relu_or_gelu(fn):
    """PyTorch's `activation_relu_or_gelu` flag: 1 for relu, 2 for gelu, else 0."""
    if fn is F.relu or isinstance(fn, ReLU):
        return 1
    if fn is F.gelu or isinstance(fn, GELU):
        return 2
    return 0


def _seq_len(src, batch_first):
    """The sequence length of src (torch's _get_seq_len)."""
    if src.ndim == 2:
        return src.shape[0]
    return src.shape[1 if batch_first else 0]


def _detect_is_causal_mask(mask, is_causal, size):
    """torch's rule for the stacks' is_causal=None: a given hint is kept; with
    no hint, a mask equal to the causal mask of `size` (the float one of
    generate_square_subsequent_mask, or its boolean True-above-the-diagonal
    form) makes is_causal True."""
    if is_causal is not None:
        return bool(is_causal)
    if mask is None:
        return False
    m = _mask_array(mask, "mask")
    if m.shape != (size, size):
        return False
    above = np.triu(np.ones((size, size), dtype=bool), k=1)
    causal = above if m.dtype == np.bool_ else np.where(above, -np.inf, 0.0)
    return bool((m == causal).all())


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward network, each wrapped in a residual
    connection and LayerNorm (Add&Norm).

    TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
                            activation=F.relu, layer_norm_eps=1e-5,
                            batch_first=False, norm_first=False, bias=True,
                            device=None, dtype=None)

    activation: "relu", "gelu" or any callable. device: None or "cpu";
    dtype: None (float32), float32 or float64.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__()
        dtype = factory_dtype(type(self).__name__, device, dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
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
        self.activation_relu_or_gelu = _is_relu_or_gelu(self.activation)
        if dtype is not None:
            self.to(dtype)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        """One encoder layer on src (S, B, d_model), or (B, S, d_model) with
        batch_first, or one sequence (S, d_model).

        src_mask (S, S) or (B * nhead, S, S), src_key_padding_mask (B, S), as
        for MultiheadAttention; is_causal=True is the hint that src_mask is
        the causal mask (it needs src_mask, as in PyTorch).
        """
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
                              need_weights=False, is_causal=is_causal)
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self):
        return f"norm_first={self.norm_first}, activation={_activation_name(self.activation)}"


class TransformerDecoderLayer(Module):
    """Masked self-attention, cross-attention to the encoder output, and a
    feed-forward network, each with a residual connection and LayerNorm.

    TransformerDecoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
                            activation=F.relu, layer_norm_eps=1e-5,
                            batch_first=False, norm_first=False, bias=True,
                            device=None, dtype=None)
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu,
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True, device=None,
                 dtype=None):
        super().__init__()
        dtype = factory_dtype(type(self).__name__, device, dtype)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
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
        if dtype is not None:
            self.to(dtype)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        """One decoder layer: tgt (T, B, d_model) attending to itself and to
        memory (S, B, d_model) (batch first with batch_first=True).

        tgt_mask (T, T), memory_mask (T, S), padding masks (B, T) and (B, S);
        tgt_is_causal / memory_is_causal are hints that need their mask.
        """
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
                              need_weights=False, is_causal=is_causal)
        return self.dropout1(x)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal):
        x, _ = self.multihead_attn(x, memory, memory, attn_mask=attn_mask,
                                   key_padding_mask=key_padding_mask, need_weights=False,
                                   is_causal=is_causal)
        return self.dropout2(x)

    def _ff_block(self, x):
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))

    def extra_repr(self):
        return f"norm_first={self.norm_first}, activation={_activation_name(self.activation)}"


class TransformerEncoder(Module):
    """`num_layers` deep copies of `encoder_layer` (independent weights,
    `layers.0`, `layers.1`, ...), then an optional final `norm`.

    TransformerEncoder(encoder_layer, num_layers, norm=None,
                       enable_nested_tensor=True, mask_check=True)

    PyTorch's nested-tensor path is reproduced in its results: where PyTorch
    takes it (enable_nested_tensor, a post-norm batch_first relu/gelu layer
    with biases and an even nhead, eval mode, no gradient recorded, a
    src_key_padding_mask whose padding is at the end of each row, no mask),
    the outputs at the padded positions are zeros before the final norm.
    With mask_check=False PyTorch takes that path for any padding mask and
    its result is undefined for padding that is not at the end; that case
    raises NotImplementedError here.
    """

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True,
                 mask_check=True):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check
        layer = encoder_layer
        attn = getattr(layer, "self_attn", None)
        self.use_nested_tensor = bool(
            enable_nested_tensor and isinstance(layer, TransformerEncoderLayer)
            and not layer.norm_first and attn.batch_first and attn._qkv_same_embed_dim
            and attn.in_proj_bias is not None and layer.activation_relu_or_gelu
            and layer.norm1.eps == layer.norm2.eps and attn.num_heads % 2 == 0)

    def _nested_valid(self, src, mask, src_key_padding_mask):
        """The (B, S) boolean "not padding" mask when PyTorch would run its
        nested-tensor path (which leaves zeros at padded positions), else None."""
        first = self.layers[0] if len(self.layers) else None
        if (not self.use_nested_tensor or first is None or first.training or src.ndim != 3
                or src_key_padding_mask is None or mask is not None):
            return None
        if is_grad_enabled() and (src.requires_grad or any(p.requires_grad for p in first.parameters())):
            return None
        kpm = _mask_array(src_key_padding_mask, "src_key_padding_mask")
        valid = ~kpm if kpm.dtype == np.bool_ else kpm == 0
        left_aligned = valid.ndim == 2 and bool((valid[:, 1:] <= valid[:, :-1]).all())
        if not left_aligned:
            if self.mask_check:
                return None  # PyTorch checks, and takes the ordinary path
            raise NotImplementedError("TransformerEncoder: mask_check=False with padding that is "
                                      "not at the end of each row (PyTorch's nested-tensor result "
                                      "is undefined there); use mask_check=True")
        return valid

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        """Run the layers on src ((S, B, d_model), or batch first as the layer).

        mask (S, S) and src_key_padding_mask (B, S) go to every layer.
        is_causal=None (the default) detects whether `mask` is the causal
        mask, as PyTorch; True is a hint that needs `mask`.
        """
        batch_first = self.layers[0].self_attn.batch_first if len(self.layers) else False
        is_causal = _detect_is_causal_mask(mask, is_causal, _seq_len(src, batch_first))
        valid = self._nested_valid(src, mask, src_key_padding_mask)
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                      is_causal=is_causal)
        if valid is not None:
            x = Tensor(np.where(valid[..., None], x.data, 0).astype(x.dtype, copy=False))
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Module):
    """`num_layers` deep copies of `decoder_layer`, then an optional final `norm`.

    TransformerDecoder(decoder_layer, num_layers, norm=None)
    """

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        """Run the layers on tgt with `memory`; masks as TransformerDecoderLayer.

        tgt_is_causal=None detects whether tgt_mask is the causal mask, as
        PyTorch; True is a hint that needs tgt_mask.
        """
        batch_first = self.layers[0].self_attn.batch_first if len(self.layers) else False
        tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal, _seq_len(tgt, batch_first))
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask,
                      tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """The encoder-decoder Transformer (6 + 6 layers, d_model 512, 8 heads by
    default, as in the paper), with final LayerNorms on both stacks and every
    weight matrix re-initialised xavier_uniform, as torch.nn.Transformer.

    Transformer(d_model=512, nhead=8, num_encoder_layers=6,
                num_decoder_layers=6, dim_feedforward=2048, dropout=0.1,
                activation=F.relu, custom_encoder=None, custom_decoder=None,
                layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                bias=True, device=None, dtype=None)

    The inputs are already embedded: token embeddings and positional
    encodings are the caller's.
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6,
                 dim_feedforward=2048, dropout=0.1, activation=F.relu, custom_encoder=None,
                 custom_decoder=None, layer_norm_eps=1e-5, batch_first=False, norm_first=False,
                 bias=True, device=None, dtype=None):
        super().__init__()
        dtype = factory_dtype("Transformer", device, dtype)
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
        if dtype is not None:
            self.to(dtype)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None, memory_key_padding_mask=None,
                src_is_causal=None, tgt_is_causal=None, memory_is_causal=False):
        """Encode src (S, B, d_model), decode tgt (T, B, d_model) against it
        (batch first with batch_first=True); returns (T, B, d_model).

        Masks and the *_is_causal hints as in the encoder and decoder
        stacks; the decoder is causal only if given tgt_mask (for example
        generate_square_subsequent_mask(T)).
        """
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
    def generate_square_subsequent_mask(sz, device=None, dtype=None):
        """The causal mask (sz, sz) as a float Tensor (float32 unless `dtype`
        says otherwise): 0 on and below the diagonal, -inf above it
        (position i may not see j > i)."""
        dtype = factory_dtype("generate_square_subsequent_mask", device, dtype)
        mask = np.triu(np.full((sz, sz), -np.inf), k=1)
        return Tensor(mask, dtype=np.float32 if dtype is None else dtype)
