"""Sequence-to-sequence tasks generated on the fly: copy, reverse, sort.

Each task draws random source sequences of symbols 0..num_symbols-1 and
asks for a target computed from them (the same sequence, reversed, sorted).
Batches are ready for an encoder-decoder Transformer trained with teacher
forcing, with the token ids of `tinygrad_attn.data.vocab`:

    src     = s_1 ... s_L PAD ...          (B, length)
    tgt_in  = BOS t_1 ... t_L PAD ...      (B, length + 1)   decoder input
    tgt_out = t_1 ... t_L EOS PAD ...      (B, length + 1)   what to predict

    >>> task = ReverseTask(num_symbols=10, length=10)
    >>> tg.manual_seed(0)
    >>> batch = task.train_batch(32)          # a fresh random batch
    >>> loss = F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=PAD)
    >>> test = task.held_out_batch(1000)     # the same 1000 sequences every time

Held-out sequences never appear in training. Every possible sequence is
assigned once and for all to the held-out part or to the training part, by
a hash of its tokens: a `held_out_fraction` of the sequence space is held
out (minGPT's sort task uses the same idea). `train_batch` draws from the
generator of `tinygrad_attn.random` (or the one given) and rejects held-out
sequences; `held_out_batch` draws from its own generator seeded with
`held_out_seed`, so the evaluation set does not depend on the training seed
or on how many batches were drawn.
"""
from dataclasses import dataclass

import numpy as np

from ..random import get_generator
from ..tensor import Tensor
from .masks import causal_mask
from .vocab import BOS, EOS, NUM_SPECIAL, PAD, SPECIAL_NAMES


@dataclass(frozen=True, eq=False)  # eq would compare arrays elementwise
class Seq2SeqBatch:
    """One batch of a sequence-to-sequence task (int64 arrays, PAD-padded).

    `src` (B, S), `tgt_in` and `tgt_out` (B, S + 1) as in the module
    docstring; `lengths` (B,) the number of symbols of each source. Masks
    are True where attention must not look (torch.nn.Transformer's
    convention).
    """

    src: np.ndarray
    tgt_in: np.ndarray
    tgt_out: np.ndarray
    lengths: np.ndarray

    def __len__(self):
        return len(self.src)

    @property
    def src_key_padding_mask(self):
        """(B, S) True at padding positions of the source."""
        return self.src == PAD

    @property
    def tgt_key_padding_mask(self):
        """(B, T) True at padding positions of the decoder input."""
        return self.tgt_in == PAD

    @property
    def tgt_mask(self):
        """(T, T) causal mask for the decoder's self-attention."""
        return causal_mask(self.tgt_in.shape[1])

    @property
    def num_tokens(self):
        """Number of target tokens the loss counts (not PAD)."""
        return int(np.count_nonzero(self.tgt_out != PAD))


def _mix64(h):
    """splitmix64's finaliser: spreads every input bit over the whole word."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


class Seq2SeqTask:
    """Base class of the built-in tasks: subclasses define `target`.

    num_symbols: how many distinct symbols (the "vocab 10" of the copy task;
        the model's vocabulary is `vocab_size` = num_symbols + 3).
    length: the longest source sequence.
    min_length: the shortest (default: `length`, so every sequence has the
        same length); lengths are drawn uniformly in [min_length, length].
    held_out_fraction: the share of all possible sequences reserved for
        evaluation (0 disables held-out sequences).
    held_out_seed: seeds the generator of `held_out_batch`.
    """

    name = None

    def __init__(self, num_symbols=10, length=10, min_length=None, held_out_fraction=0.25,
                 held_out_seed=0):
        cls = type(self).__name__
        for key, value in (("num_symbols", num_symbols), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{cls}: {key} must be a positive integer, got {value!r}")
        min_length = length if min_length is None else min_length
        if (isinstance(min_length, bool) or not isinstance(min_length, (int, np.integer))
                or not 1 <= min_length <= length):
            raise ValueError(f"{cls}: min_length must be an integer in [1, length={length}], "
                             f"got {min_length!r}")
        if not 0.0 <= held_out_fraction < 1.0:
            raise ValueError(f"{cls}: held_out_fraction must be in [0, 1), got {held_out_fraction!r}")
        self.num_symbols, self.length, self.min_length = int(num_symbols), int(length), int(min_length)
        self.held_out_fraction, self.held_out_seed = float(held_out_fraction), held_out_seed

    def __repr__(self):
        return (f"{type(self).__name__}(num_symbols={self.num_symbols}, length={self.length}, "
                f"min_length={self.min_length}, held_out_fraction={self.held_out_fraction})")

    @property
    def vocab_size(self):
        """Number of token ids (symbols plus PAD, BOS, EOS)."""
        return self.num_symbols + NUM_SPECIAL

    @property
    def src_len(self):
        return self.length

    @property
    def tgt_len(self):
        return self.length + 1

    # ----------------------------------------------------- the task itself
    def target(self, symbols, lengths):
        """Targets for sources `symbols` (n, length) whose row i has
        `lengths[i]` symbols (the rest is -1 and must stay -1)."""
        raise NotImplementedError

    # ------------------------------------------------------------ batches
    def train_batch(self, batch_size, generator=None):
        """A random batch of training sequences (never held-out ones).

        `generator`: a numpy Generator; default the framework's, seeded by
        `tinygrad_attn.manual_seed`.
        """
        rng = get_generator() if generator is None else generator
        return self._batch(*self._draw(batch_size, rng, held_out=False))

    def held_out_batch(self, n):
        """The first `n` held-out sequences: the same ones on every call,
        whatever the training seed (a larger n extends a smaller one)."""
        if self.held_out_fraction == 0:
            raise ValueError(f"{type(self).__name__}: held_out_fraction is 0, so there are no "
                             "held-out sequences")
        rng = np.random.default_rng(self.held_out_seed)
        return self._batch(*self._draw(n, rng, held_out=True, chunk=1024))

    def make_batch(self, sequences):
        """A batch from given source sequences (lists of symbols), e.g. to
        decode the user's own examples."""
        n = len(sequences)
        symbols = np.full((n, self.length), -1, dtype=np.int64)
        lengths = np.zeros(n, dtype=np.int64)
        for i, seq in enumerate(sequences):
            seq = np.asarray(seq, dtype=np.int64).reshape(-1)
            if not 1 <= len(seq) <= self.length:
                raise ValueError(f"{type(self).__name__}.make_batch: sequence {i} has {len(seq)} "
                                 f"symbols, expected 1 to {self.length}")
            self._check_symbols(seq, f"make_batch: sequence {i}")
            symbols[i, :len(seq)] = seq
            lengths[i] = len(seq)
        return self._batch(symbols, lengths)

    def is_held_out(self, symbols, lengths):
        """Boolean (n,): which sequences belong to the held-out part."""
        if self.held_out_fraction == 0:
            return np.zeros(len(symbols), dtype=bool)
        ids = self._to_ids(symbols, lengths).astype(np.uint64)
        h = np.full(len(ids), 0x9E3779B97F4A7C15, dtype=np.uint64)
        for j in range(ids.shape[1]):  # fold the tokens in one by one, then mix
            h = _mix64(h ^ ids[:, j])
        unit = (h >> np.uint64(11)).astype(np.float64) / 2.0 ** 53  # uniform in [0, 1)
        return unit < self.held_out_fraction

    def split_sizes(self, limit=100_000):
        """(training, held-out): how many distinct sequences each part has,
        counted by enumerating them all; None when there are more than
        `limit` (both parts are then far from empty). A task needs both:
        `train_batch` and `held_out_batch` cannot draw from an empty part."""
        lengths = range(self.min_length, self.length + 1)
        total = 0
        for length in lengths:
            total += self.num_symbols ** length
            if total > limit:
                return None
        held_out = 0
        for length in lengths:
            n = self.num_symbols ** length
            # every sequence of this length: the digits of 0..n-1 in base num_symbols
            digits = (np.arange(n)[:, None] // self.num_symbols ** np.arange(length)[None, :]) % self.num_symbols
            symbols = np.full((n, self.length), -1, dtype=np.int64)
            symbols[:, :length] = digits
            held_out += int(self.is_held_out(symbols, np.full(n, length)).sum())
        return total - held_out, held_out

    def _draw(self, n, rng, held_out, chunk=None):
        """n (symbols, lengths) from `rng`, keeping only the requested part."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"{type(self).__name__}: the number of sequences must be a positive "
                             f"integer, got {n!r}")
        chunk = chunk or max(64, 2 * n)
        kept_symbols, kept_lengths, total = [], [], 0
        for _ in range(1000):
            symbols = rng.integers(0, self.num_symbols, size=(chunk, self.length))
            lengths = (rng.integers(self.min_length, self.length + 1, size=chunk)
                       if self.min_length < self.length else np.full(chunk, self.length))
            symbols[np.arange(self.length)[None, :] >= lengths[:, None]] = -1
            keep = self.is_held_out(symbols, lengths) == held_out
            kept_symbols.append(symbols[keep])
            kept_lengths.append(lengths[keep])
            total += int(keep.sum())
            if total >= n:
                return (np.concatenate(kept_symbols)[:n].astype(np.int64),
                        np.concatenate(kept_lengths)[:n].astype(np.int64))
        part = "held-out" if held_out else "training"
        raise RuntimeError(f"{type(self).__name__}: could not draw {n} {part} sequences; the space "
                           f"of sequences is too small for held_out_fraction={self.held_out_fraction}")

    def _batch(self, symbols, lengths):
        n, width = len(symbols), self.length + 1
        target = self.target(symbols, lengths)
        rows = np.arange(n)
        tgt_in = np.full((n, width), PAD, dtype=np.int64)
        tgt_in[:, 0] = BOS
        tgt_in[:, 1:] = self._to_ids(target, lengths)
        tgt_out = np.full((n, width), PAD, dtype=np.int64)
        tgt_out[:, :-1] = self._to_ids(target, lengths)
        tgt_out[rows, lengths] = EOS
        return Seq2SeqBatch(self._to_ids(symbols, lengths), tgt_in, tgt_out, lengths)

    def _to_ids(self, symbols, lengths):
        return np.where(np.arange(symbols.shape[1])[None, :] < lengths[:, None],
                        symbols + NUM_SPECIAL, PAD).astype(np.int64)

    # ------------------------------------------------------ encode/decode
    def encode(self, symbols):
        """Token ids of a sequence of symbols."""
        symbols = np.asarray(symbols, dtype=np.int64)
        self._check_symbols(symbols, "encode")
        return symbols + NUM_SPECIAL

    def decode(self, ids):
        """Symbols of a token sequence: a leading BOS is dropped, the sequence
        ends at the first EOS, PAD is skipped; a stray BOS or EOS shows as
        "<bos>". Accepts a list, an array or a Tensor of ids.

            >>> task.decode([1, 5, 3, 4, 2, 0])
            [2, 0, 1]
        """
        ids = ids.data if isinstance(ids, Tensor) else np.asarray(ids)
        ids = [int(i) for i in ids.reshape(-1)]
        if ids and ids[0] == BOS:
            ids = ids[1:]
        out = []
        for i in ids:
            if i == EOS:
                break
            if i == PAD:
                continue
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"{type(self).__name__}.decode: token id {i} is outside the "
                                 f"vocabulary [0, {self.vocab_size})")
            out.append(SPECIAL_NAMES[i] if i < NUM_SPECIAL else i - NUM_SPECIAL)
        return out

    def _check_symbols(self, symbols, what):
        if symbols.size and (symbols.min() < 0 or symbols.max() >= self.num_symbols):
            raise ValueError(f"{type(self).__name__}.{what}: symbols must be in "
                             f"[0, {self.num_symbols}), got {symbols.tolist()}")


class CopyTask(Seq2SeqTask):
    """Target = source (the Annotated Transformer's first test).

        >>> CopyTask().target(np.array([[3, 1, 2]]), np.array([3]))
        array([[3, 1, 2]])
    """

    name = "copy"

    def target(self, symbols, lengths):
        return symbols.copy()


class ReverseTask(Seq2SeqTask):
    """Target = source reversed (only its real symbols, padding stays at the end).

        >>> ReverseTask().target(np.array([[3, 1, 2, -1]]), np.array([3]))
        array([[ 2,  1,  3, -1]])
    """

    name = "reverse"

    def target(self, symbols, lengths):
        positions = np.arange(symbols.shape[1])[None, :]
        source_index = np.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)
        return np.take_along_axis(symbols, source_index, axis=1)


class SortTask(Seq2SeqTask):
    """Target = source sorted ascending. Defaults follow minGPT's sort
    demo: sequences of 6 digits 0-2.

        >>> SortTask().target(np.array([[2, 0, 1, 0, 2, 1]]), np.array([6]))
        array([[0, 0, 1, 1, 2, 2]])
    """

    name = "sort"

    def __init__(self, num_symbols=3, length=6, min_length=None, held_out_fraction=0.25,
                 held_out_seed=0):
        super().__init__(num_symbols, length, min_length, held_out_fraction, held_out_seed)

    def target(self, symbols, lengths):
        big = np.iinfo(np.int64).max  # padding sorts last, then becomes -1 again
        ordered = np.sort(np.where(symbols < 0, big, symbols), axis=1)
        return np.where(ordered == big, -1, ordered)


TASKS = {cls.name: cls for cls in (CopyTask, ReverseTask, SortTask)}


def get_task(name, **kwargs):
    """A task by name ("copy", "reverse", "sort"), built with `kwargs`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name](**kwargs)


def _until_eos(seq):
    """Tokens up to and including the first EOS; without EOS, the sequence
    minus its trailing padding."""
    seq = [int(t) for t in (seq.data if isinstance(seq, Tensor) else np.asarray(seq)).reshape(-1)]
    if EOS in seq:
        return seq[:seq.index(EOS) + 1]
    while seq and seq[-1] == PAD:
        seq.pop()
    return seq


def sequence_matches(predictions, targets):
    """Boolean per sequence: does the prediction equal the target, up to the
    first EOS (anything after it, padding or not, is ignored)?

    predictions: token ids aligned with `tgt_out` (no leading BOS), (B, T')
    or a list of sequences; targets: (B, T), like `batch.tgt_out`.
    """
    if len(predictions) != len(targets):
        raise ValueError(f"sequence_matches: {len(predictions)} predictions for {len(targets)} targets")
    return np.array([_until_eos(p) == _until_eos(t) for p, t in zip(predictions, targets)], dtype=bool)


def exact_match(predictions, targets):
    """Fraction of sequences predicted exactly (see `sequence_matches`).

        >>> exact_match([[5, 4, 2, 0], [5, 5, 2, 7]], [[5, 4, 2, 0], [5, 4, 2, 0]])
        0.5
    """
    matches = sequence_matches(predictions, targets)
    return float(matches.mean()) if len(matches) else 0.0
