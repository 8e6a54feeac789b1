"""The data library: seq2seq tasks, held-out sets, masks, exact match and
character-level language-model data."""
import itertools
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import Tensor, data
from tinygrad_attn.data import BOS, EOS, PAD, CopyTask, ReverseTask, SortTask

SHAKESPEARE = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"

EXPECTED_TARGET = {"copy": lambda s: list(s), "reverse": lambda s: s[::-1], "sort": sorted}


# ------------------------------------------------------------------ tasks

@pytest.mark.parametrize("name", ["copy", "reverse", "sort"])
@pytest.mark.parametrize("min_length", [None, 2])
def test_tasks_produce_the_right_targets_and_layout(name, min_length):
    task = data.get_task(name, num_symbols=7, length=8, min_length=min_length)
    tg.manual_seed(3)
    batch = task.train_batch(64)
    assert batch.src.shape == (64, 8) and batch.tgt_in.shape == batch.tgt_out.shape == (64, 9)
    assert all(a.dtype == np.int64 for a in (batch.src, batch.tgt_in, batch.tgt_out, batch.lengths))
    assert task.vocab_size == 10 and batch.src.max() < 10
    for src, tgt_in, tgt_out, n in zip(batch.src, batch.tgt_in, batch.tgt_out, batch.lengths):
        symbols = task.decode(src)
        assert len(symbols) == n and all(0 <= s < 7 for s in symbols)
        assert list(src[n:]) == [PAD] * (8 - n)
        target = EXPECTED_TARGET[name](symbols)
        assert list(tgt_in) == [BOS] + [s + 3 for s in target] + [PAD] * (8 - n)
        assert list(tgt_out) == [s + 3 for s in target] + [EOS] + [PAD] * (8 - n)
        assert task.decode(tgt_out) == target
    if min_length is None:
        assert (batch.lengths == 8).all()
    else:
        assert batch.lengths.min() >= 2 and len(set(batch.lengths.tolist())) > 3
    assert batch.num_tokens == int((batch.lengths + 1).sum())


def test_sort_defaults_follow_mingpt():
    task = SortTask()
    assert (task.num_symbols, task.length, task.vocab_size) == (3, 6, 6)
    batch = task.held_out_batch(20)
    for src, tgt in zip(batch.src, batch.tgt_out):
        assert task.decode(tgt) == sorted(task.decode(src))


def test_batches_are_deterministic_under_manual_seed():
    task = ReverseTask(min_length=3)
    tg.manual_seed(42)
    a = task.train_batch(16)
    tg.manual_seed(42)
    b = task.train_batch(16)
    c = task.train_batch(16)
    np.testing.assert_array_equal(a.src, b.src)
    np.testing.assert_array_equal(a.lengths, b.lengths)
    assert not np.array_equal(b.src, c.src)
    d = task.train_batch(16, generator=np.random.default_rng(42))
    e = task.train_batch(16, generator=np.random.default_rng(42))
    np.testing.assert_array_equal(d.src, e.src)


def test_held_out_set_is_fixed_and_independent_of_the_training_seed():
    task = CopyTask()
    tg.manual_seed(0)
    first = task.held_out_batch(300)
    task.train_batch(32)
    tg.manual_seed(1)
    again = task.held_out_batch(1000)
    np.testing.assert_array_equal(first.src, again.src[:300])  # a larger set extends a smaller one
    other = CopyTask(held_out_seed=1).held_out_batch(300)
    assert not np.array_equal(first.src, other.src)


def test_held_out_and_training_sequences_are_disjoint_for_copy():
    task = CopyTask(num_symbols=10, length=10)
    held = {tuple(row) for row in task.held_out_batch(1000).src}
    assert len(held) == 1000
    tg.manual_seed(0)
    for _ in range(30):
        batch = task.train_batch(128)
        assert not held.intersection(map(tuple, batch.src))
        assert not task.is_held_out(batch.src - 3, batch.lengths).any()


def test_held_out_partition_covers_the_whole_sort_space():
    task = SortTask()  # 3^6 = 729 possible sequences
    every = np.array(list(itertools.product(range(3), repeat=6)))
    held_mask = task.is_held_out(every, np.full(len(every), 6))
    assert 0.18 < held_mask.mean() < 0.32  # about held_out_fraction = 0.25
    held = {tuple(row + 3) for row in every[held_mask]}
    seen_held = {tuple(row) for row in task.held_out_batch(2000).src}
    assert seen_held <= held and len(seen_held) > 0.9 * len(held)
    tg.manual_seed(0)
    seen_train = {tuple(row) for _ in range(20) for row in task.train_batch(128).src}
    assert not seen_train & held
    assert len(seen_train) > 0.9 * (len(every) - len(held))  # training covers the rest


def test_variable_length_held_out_partition_depends_on_the_length():
    task = CopyTask(num_symbols=4, length=6, min_length=1)
    held = task.held_out_batch(500)
    assert task.is_held_out(held.src - 3, held.lengths).all()
    tg.manual_seed(0)
    train = task.train_batch(500)
    assert not task.is_held_out(train.src - 3, train.lengths).any()
    assert len(set(held.lengths.tolist())) > 3


def test_make_batch_encode_and_decode():
    task = ReverseTask(num_symbols=5, length=4)
    batch = task.make_batch([[1, 2, 3], [4, 0, 0, 1]])
    assert batch.src.tolist() == [[4, 5, 6, PAD], [7, 3, 3, 4]]
    assert batch.tgt_out.tolist() == [[6, 5, 4, EOS, PAD], [4, 3, 3, 7, EOS]]
    assert task.encode([0, 4]).tolist() == [3, 7]
    assert task.decode([BOS, 5, 3, EOS, 7]) == [2, 0]
    assert task.decode(Tensor([3, BOS, 4])) == [0, "<bos>", 1]
    with pytest.raises(ValueError, match=r"symbols must be in \[0, 5\)"):
        task.encode([5])
    with pytest.raises(ValueError, match="sequence 0 has 5 symbols"):
        task.make_batch([[1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        task.decode([9])


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_symbols=0), "num_symbols"),
    (dict(length=0), "length"),
    (dict(length=4, min_length=5), "min_length"),
    (dict(held_out_fraction=1.0), "held_out_fraction"),
])
def test_bad_task_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CopyTask(**kwargs)


def test_task_errors():
    with pytest.raises(ValueError, match="unknown task 'shuffle'"):
        data.get_task("shuffle")
    with pytest.raises(ValueError, match="positive integer"):
        CopyTask().train_batch(0)
    with pytest.raises(ValueError, match="no held-out"):
        CopyTask(held_out_fraction=0).held_out_batch(10)
    with pytest.raises(RuntimeError, match="too small"):
        CopyTask(num_symbols=1, length=1, held_out_fraction=0.01).held_out_batch(1)


# ------------------------------------------------------------ exact match

def test_exact_match_ignores_what_follows_eos():
    targets = np.array([[5, 4, EOS, PAD], [5, 4, EOS, PAD], [5, 4, EOS, PAD], [5, 4, 6, 7]])
    predictions = [[5, 4, EOS, 9],        # junk after EOS: correct
                   [5, 4, 4, EOS],        # an extra symbol: wrong
                   [5, 4],                # no EOS: wrong
                   [5, 4, 6, 7, PAD]]     # target without EOS, same symbols: correct
    assert data.sequence_matches(predictions, targets).tolist() == [True, False, False, True]
    assert data.exact_match(predictions, targets) == 0.5
    assert data.exact_match(targets, targets) == 1.0
    with pytest.raises(ValueError, match="3 predictions for 4 targets"):
        data.exact_match(predictions[:3], targets)


def test_exact_match_on_a_task_batch():
    task = SortTask()
    batch = task.held_out_batch(50)
    assert data.exact_match(batch.tgt_out, batch.tgt_out) == 1.0
    wrong = batch.tgt_out.copy()
    wrong[:10, 0] = np.where(wrong[:10, 0] == 3, 4, 3)
    assert data.exact_match(wrong, batch.tgt_out) == pytest.approx(0.8)


# ------------------------------------------------------------------ masks

def test_causal_mask():
    m = data.causal_mask(4)
    assert m.dtype == np.bool_
    np.testing.assert_array_equal(m, np.array([[j > i for j in range(4)] for i in range(4)]))
    torch = pytest.importorskip("torch")
    reference = torch.nn.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(m, np.isinf(reference.numpy()))
    with pytest.raises(ValueError, match="size"):
        data.causal_mask(-1)


def test_padding_masks():
    tokens = np.array([[5, 6, PAD], [7, PAD, PAD]])
    np.testing.assert_array_equal(data.padding_mask(tokens), [[0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(data.padding_mask(Tensor(tokens)), data.padding_mask(tokens))
    np.testing.assert_array_equal(data.lengths_to_padding_mask([2, 1]), data.padding_mask(tokens)[:, :2])
    np.testing.assert_array_equal(data.lengths_to_padding_mask(np.array([2, 3]), max_len=4),
                                  [[0, 0, 1, 1], [0, 0, 0, 1]])
    batch = ReverseTask(min_length=2).train_batch(16)
    np.testing.assert_array_equal(batch.src_key_padding_mask,
                                  data.lengths_to_padding_mask(batch.lengths, max_len=10))
    np.testing.assert_array_equal(batch.tgt_key_padding_mask,
                                  data.lengths_to_padding_mask(batch.lengths + 1, max_len=11))
    np.testing.assert_array_equal(batch.tgt_mask, data.causal_mask(11))
    with pytest.raises(ValueError, match="lengths must be in"):
        data.lengths_to_padding_mask([5], max_len=3)
    with pytest.raises(tg.ShapeError, match="1-d"):
        data.lengths_to_padding_mask([[1, 2]])
    with pytest.raises(TypeError, match="integer"):
        data.padding_mask(np.zeros(3))


# ---------------------------------------------------------------- char-LM

TEXT = "To be, or not to be: that is the question. " * 4


def test_tokenizer_round_trip_and_errors():
    tok = data.CharTokenizer(TEXT + "é✓")
    assert tok.chars == "".join(sorted(set(TEXT + "é✓"))) and tok.vocab_size == len(tok.chars)
    ids = tok.encode("to be é✓")
    assert ids.dtype == np.int64 and tok.decode(ids) == "to be é✓"
    assert data.CharTokenizer(tok.chars).encode(TEXT).tolist() == tok.encode(TEXT).tolist()
    with pytest.raises(ValueError, match=r"'z' \(U\+007A\) is not in the vocabulary"):
        tok.encode("zebra")
    with pytest.raises(ValueError, match="ids must be integers"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError, match="empty"):
        data.CharTokenizer("")


def test_char_lm_split_and_batches():
    lm = data.CharLMData(TEXT, block_size=8)
    n = len(TEXT)
    assert len(lm.splits["train"]) == int(n * 0.9) and len(lm.splits["val"]) == n - int(n * 0.9)
    assert lm.decode(lm.splits["train"]) + lm.decode(lm.splits["val"]) == TEXT
    tg.manual_seed(0)
    x, y = lm.get_batch("train", 5)
    assert x.shape == y.shape == (5, 8) and x.dtype == np.int64
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x one character later
    train_text = lm.decode(lm.splits["train"])
    for row_x, row_y in zip(x, y):
        start = train_text.find(lm.decode(row_x) + lm.decode(row_y)[-1])
        assert start >= 0  # each window is a real piece of the training text
    tg.manual_seed(0)
    x2, _ = lm.get_batch("train", 5)
    np.testing.assert_array_equal(x, x2)
    xv, yv = lm.get_batch("val", 3, generator=np.random.default_rng(1))
    assert lm.decode(xv[0]) in lm.decode(lm.splits["val"])


def test_char_lm_from_file_and_errors(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    lm = data.CharLMData.from_file(path, block_size=8)
    assert lm.vocab_size == len(set(TEXT))
    with pytest.raises(FileNotFoundError, match="text file not found: .*missing.txt"):
        data.CharLMData.from_file(tmp_path / "missing.txt", block_size=8)
    with pytest.raises(IsADirectoryError, match="not a text file"):
        data.CharLMData.from_file(tmp_path, block_size=8)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        data.CharLMData.from_file(tmp_path / "empty.txt", block_size=8)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8 text .*offset 3"):
        data.CharLMData.from_file(tmp_path / "latin1.txt", block_size=4)
    (tmp_path / "short.txt").write_text("abcdefgh", encoding="utf-8")
    with pytest.raises(ValueError, match="8 characters, fewer than block_size \\+ 1 = 9"):
        data.CharLMData.from_file(tmp_path / "short.txt", block_size=8)
    with pytest.raises(ValueError, match="the val split .* shorter than block_size \\+ 1 = 65"):
        data.CharLMData(TEXT, block_size=64)
    no_val = data.CharLMData(TEXT, block_size=64, val_fraction=0)
    with pytest.raises(ValueError, match="unknown split 'val'"):
        no_val.get_batch("val", 2)
    with pytest.raises(ValueError, match="batch_size"):
        lm.get_batch("train", 0)
    with pytest.raises(ValueError, match="block_size"):
        data.CharLMData(TEXT, block_size=0)


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason="shared tinyshakespeare.txt not present")
def test_tiny_shakespeare_matches_nanogpt_split():
    lm = data.CharLMData.from_file(SHAKESPEARE, block_size=64)
    assert lm.vocab_size == 65
    assert len(lm.splits["train"]) == 1003854 and len(lm.splits["val"]) == 111540  # nanoGPT's numbers
    x, y = lm.get_batch("val", 12)
    assert x.shape == (12, 64) and lm.decode(x[0][1:]) == lm.decode(y[0][:-1])
