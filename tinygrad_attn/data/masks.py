"""Attention masks as boolean numpy arrays, True = "masked" (may not be attended).

This is the convention of torch.nn.Transformer and nn.MultiheadAttention
(`attn_mask`, `key_padding_mask`). `functional.scaled_dot_product_attention`
follows torch.nn.functional instead (True = may attend): pass it `~mask`.
"""
import numpy as np

from ..shapes import ShapeError
from ..tensor import Tensor
from .vocab import PAD


def causal_mask(size):
    """(size, size) mask hiding the future: entry [i, j] is True when j > i,
    so position i attends only to positions 0..i (torch's
    generate_square_subsequent_mask, as booleans).

        >>> causal_mask(3)
        array([[False,  True,  True],
               [False, False,  True],
               [False, False, False]])
    """
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"causal_mask: size must be a non-negative integer, got {size!r}")
    return np.triu(np.ones((size, size), dtype=bool), k=1)


def padding_mask(tokens, pad_id=PAD):
    """(batch, length) mask, True where `tokens` holds the padding id.

        >>> padding_mask(np.array([[5, 6, 0], [7, 0, 0]]))
        array([[False, False,  True],
               [False,  True,  True]])
    """
    tokens = tokens.data if isinstance(tokens, Tensor) else np.asarray(tokens)
    if tokens.dtype.kind not in "iu":
        raise TypeError(f"padding_mask: tokens must be integer ids, got dtype {tokens.dtype}")
    return tokens == pad_id


def lengths_to_padding_mask(lengths, max_len=None):
    """(batch, max_len) mask, True at positions >= each sequence's length.

    `max_len` defaults to the largest length.

        >>> lengths_to_padding_mask([2, 3], max_len=4)
        array([[False, False,  True,  True],
               [False, False, False,  True]])
    """
    lengths = lengths.data if isinstance(lengths, Tensor) else np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
        raise ShapeError(f"lengths_to_padding_mask: lengths must be a 1-d array of integers, got "
                         f"shape {lengths.shape} and dtype {lengths.dtype}")
    longest = int(lengths.max()) if lengths.size else 0
    max_len = longest if max_len is None else int(max_len)
    if lengths.size and (lengths.min() < 0 or longest > max_len):
        raise ValueError(f"lengths_to_padding_mask: lengths must be in [0, {max_len}], got "
                         f"min {lengths.min()} and max {longest}")
    return np.arange(max_len)[None, :] >= lengths[:, None]
