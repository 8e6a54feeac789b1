"""Layers with PyTorch's names: the module system, the building blocks of a
Transformer, and weight initialisation (`nn.init`).

    from tinygrad_attn import nn
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256)
    y = layer(x)                      # x: (T, batch, 64), PyTorch's default layout
    layer = nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)   # x: (batch, T, 64)

See docs/nn.md.
"""
from .. import functional  # noqa: F401  (nn.functional, as in torch.nn.functional)
from . import init  # noqa: F401
from .attention import MultiHeadAttention, MultiheadAttention
from .layers import GELU, Dropout, Embedding, Identity, LayerNorm, Linear, ReLU, SiLU
from .module import (IncompatibleKeys, Module, ModuleDict, ModuleList, Parameter, Sequential,
                     StateDictError)
from .positional import LearnedPositionalEmbedding, PositionalEncoding, sinusoidal_table
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)

__all__ = [
    "Module", "Parameter", "ModuleList", "ModuleDict", "Sequential", "StateDictError",
    "IncompatibleKeys", "init", "functional",
    "Identity", "Linear", "Embedding", "LayerNorm", "Dropout", "ReLU", "SiLU", "GELU",
    "MultiHeadAttention", "MultiheadAttention", "PositionalEncoding", "LearnedPositionalEmbedding",
    "sinusoidal_table", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
    "TransformerDecoder", "Transformer",
]
