"""Character-level language-model data from any UTF-8 text (nanoGPT's shakespeare_char).

    >>> data = CharLMData.from_file("input.txt", block_size=64)
    >>> data.vocab_size                       # distinct characters of the text
    65
    >>> x, y = data.get_batch("train", batch_size=12)   # (12, 64) int64 each
    >>> data.decode(x[0][1:]) == data.decode(y[0][:-1])  # y is x shifted by one
    True

The vocabulary is the sorted set of the text's characters; the first 90% of
the text trains, the last 10% validates (nanoGPT's split). A batch is
`batch_size` random windows: x = ids[i : i + block_size], y = ids[i + 1 :
i + 1 + block_size], so y[t] is the character that follows x[..t].
"""
from pathlib import Path

import numpy as np

from ..random import get_generator
from ..tensor import Tensor


class CharTokenizer:
    """Characters <-> integer ids, ids in the order of sorted characters.

    `CharTokenizer(text)` takes the vocabulary from `text`; rebuild the same
    tokenizer later (e.g. from a checkpoint) with `CharTokenizer(tok.chars)`.

        >>> tok = CharTokenizer("hello")
        >>> tok.chars, tok.encode("hole").tolist(), tok.decode([3, 1])
        ('ehlo', [1, 3, 2, 0], 'oh')
    """

    def __init__(self, text):
        if not isinstance(text, str):
            raise TypeError(f"CharTokenizer: expected a str, got {type(text).__name__}")
        self.chars = "".join(sorted(set(text)))
        if not self.chars:
            raise ValueError("CharTokenizer: cannot build a vocabulary from an empty text")
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        # A lookup table from code points to ids (-1: not in the vocabulary), for fast encoding.
        self._table = np.full(ord(self.chars[-1]) + 1, -1, dtype=np.int64)
        self._table[[ord(c) for c in self.chars]] = np.arange(len(self.chars))

    @property
    def vocab_size(self):
        return len(self.chars)

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"

    def encode(self, text):
        """int64 ids of the characters of `text`."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        ids = np.where(codes < len(self._table), self._table[np.minimum(codes, len(self._table) - 1)], -1)
        if (ids < 0).any():
            bad = text[int(np.argmax(ids < 0))]
            raise ValueError(f"CharTokenizer.encode: character {bad!r} (U+{ord(bad):04X}) is not in "
                             f"the vocabulary of {self.vocab_size} characters")
        return ids

    def decode(self, ids):
        """The text of a sequence of ids (list, array or Tensor)."""
        ids = ids.data if isinstance(ids, Tensor) else np.asarray(ids)
        ids = ids.reshape(-1)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"CharTokenizer.decode: ids must be integers in [0, {self.vocab_size}), "
                             f"got values from {ids.min()} to {ids.max()} (dtype {ids.dtype})")
        return "".join(self.chars[i] for i in ids.tolist())


def read_text(path):
    """The contents of a UTF-8 text file, with clear errors for a missing,
    empty or non-UTF-8 file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text file not found: {path}")
    if not path.is_file():
        raise IsADirectoryError(f"not a text file: {path}")
    raw = path.read_bytes()
    if not raw:
        raise ValueError(f"text file is empty: {path}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (invalid byte at offset {e.start}); "
                         "convert it to UTF-8 first") from None


class CharLMData:
    """A text split into training and validation ids, with random batches.

    text: the corpus; block_size: context length of a batch row;
    val_fraction: the share at the end of the text kept for validation
    (default 0.1; 0 means no validation split). Both splits must hold at
    least block_size + 1 characters.
    """

    def __init__(self, text, block_size, val_fraction=0.1, source="the text"):
        if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
            raise ValueError(f"CharLMData: block_size must be a positive integer, got {block_size!r}")
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"CharLMData: val_fraction must be in [0, 1), got {val_fraction!r}")
        if not text:
            raise ValueError(f"CharLMData: {source} is empty")
        if len(text) < block_size + 1:
            raise ValueError(f"CharLMData: {source} has {len(text)} characters, fewer than "
                             f"block_size + 1 = {block_size + 1}; use a longer text or a smaller block_size")
        self.block_size, self.val_fraction, self.source = int(block_size), float(val_fraction), source
        self.tokenizer = CharTokenizer(text)
        ids = self.tokenizer.encode(text)
        n_train = int(len(ids) * (1 - val_fraction))
        self.splits = {"train": ids[:n_train]}
        if val_fraction > 0:
            self.splits["val"] = ids[n_train:]
        for split, data in self.splits.items():
            if len(data) < block_size + 1:
                raise ValueError(f"CharLMData: the {split} split of {source} ({len(data)} of "
                                 f"{len(text)} characters) is shorter than block_size + 1 = "
                                 f"{block_size + 1}; use a longer text, a smaller block_size or "
                                 "another val_fraction")

    @classmethod
    def from_file(cls, path, block_size, val_fraction=0.1):
        """Read a UTF-8 text file (see `read_text` for the errors)."""
        return cls(read_text(path), block_size, val_fraction, source=str(path))

    def __repr__(self):
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        return (f"CharLMData({self.source}, vocab_size={self.vocab_size}, "
                f"block_size={self.block_size}, {sizes})")

    @property
    def vocab_size(self):
        return self.tokenizer.vocab_size

    def encode(self, text):
        return self.tokenizer.encode(text)

    def decode(self, ids):
        return self.tokenizer.decode(ids)

    def get_batch(self, split, batch_size, generator=None):
        """(x, y): int64 arrays (batch_size, block_size) of random windows of
        `split` ("train" or "val"), y shifted one character ahead of x.

        `generator`: a numpy Generator; default the framework's, seeded by
        `tinygrad_attn.manual_seed`.
        """
        if split not in self.splits:
            known = " or ".join(repr(s) for s in self.splits)
            raise ValueError(f"CharLMData.get_batch: unknown split {split!r}; use {known}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"CharLMData.get_batch: batch_size must be a positive integer, got {batch_size!r}")
        data = self.splits[split]
        rng = get_generator() if generator is None else generator
        starts = rng.integers(0, len(data) - self.block_size, size=batch_size)
        index = starts[:, None] + np.arange(self.block_size)[None, :]
        return data[index], data[index + 1]
