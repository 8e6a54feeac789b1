"""Checkpoints: safetensors round trips, atomic saves, clear errors."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import nn

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
          np.float16, np.float32, np.float64]


def test_round_trip_of_every_dtype_with_metadata(tmp_path):
    rng = np.random.default_rng(0)
    state = {f"t_{np.dtype(d).name}": (rng.normal(size=(2, 3)) * 50).astype(d) for d in DTYPES}
    state["scalar"] = np.array(3.5)
    state["empty"] = np.zeros((0, 4), np.float32)
    state["strided"] = np.arange(12.0).reshape(3, 4).T  # not contiguous
    state["tensor"] = tg.randn(4, 2)
    metadata = {"config": json.dumps({"d_model": 8, "nhead": 2}), "step": "120"}
    path = tmp_path / "all.safetensors"
    tg.save(state, path, metadata=metadata)
    loaded, meta = tg.load(path, with_metadata=True)
    assert meta == metadata and json.loads(meta["config"])["nhead"] == 2
    assert set(loaded) == set(state)
    for name, value in state.items():
        expected = value.data if isinstance(value, tg.Tensor) else value
        if expected.dtype == np.float16:  # half precision loads as float32, exactly
            expected = expected.astype(np.float32)
        assert loaded[name].dtype == expected.dtype and loaded[name].shape == expected.shape, name
        np.testing.assert_array_equal(loaded[name], expected)
    assert tg.load(path).keys() == loaded.keys()
    tg.save({"x": np.ones(1)}, str(tmp_path / "plain.safetensors"))  # str paths too, no metadata
    assert tg.load(str(tmp_path / "plain.safetensors"), with_metadata=True)[1] == {}


def test_model_round_trip_through_a_file(tmp_path):
    tg.manual_seed(0)
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16, dropout=0.0)
    path = tmp_path / "model.safetensors"
    tg.save(model.state_dict(), path)
    tg.manual_seed(1)
    other = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16, dropout=0.0)
    other.load_state_dict(tg.load(path))
    src, tgt = tg.randn(5, 2, 8), tg.randn(3, 2, 8)  # (T, B, d_model), the default layout
    np.testing.assert_array_equal(other(src, tgt).data, model(src, tgt).data)
    # The loaded arrays are ordinary writable arrays.
    assert all(a.flags.writeable for a in tg.load(path).values())


def test_a_failing_save_leaves_the_earlier_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    tg.save({"w": np.arange(4.0)}, path, metadata={"version": "1"})
    before = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        tg.save({"w": np.zeros(1000)}, path, metadata={"version": "2"})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]  # no temporary file left behind
    # Bad input fails before any file is touched.
    with pytest.raises(TypeError, match="'bad' has dtype object"):
        tg.save({"w": np.ones(2), "bad": np.array([object()])}, path)
    with pytest.raises(TypeError, match="metadata must be a dict of str -> str"):
        tg.save({"w": np.ones(2)}, path, metadata={"step": 3})
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.safetensors"]
    np.testing.assert_array_equal(tg.load(path)["w"], np.arange(4.0))


@pytest.mark.parametrize("keep", [0, 5, 8, 12, -1, -20])
def test_truncated_files_are_reported_as_truncated(tmp_path, keep):
    path = tmp_path / "ckpt.safetensors"
    tg.save({"a": np.arange(10.0), "b": np.ones((3, 3), np.float32)}, path)
    raw = path.read_bytes()
    path.write_bytes(raw[:keep] if keep >= 0 else raw[:len(raw) + keep])
    expected = "truncated"
    with pytest.raises(tg.CheckpointError, match=expected):
        tg.load(path)


@pytest.mark.parametrize("content", [
    b"this is a plain text file, not a checkpoint\n" * 3,
    b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s.",  # a pickle
    (20).to_bytes(8, "little") + b'{"a": [1, 2, 3]}    ',                  # JSON, not safetensors
    (8).to_bytes(8, "little") + b"{not js}",
])
def test_foreign_files_are_reported_as_not_checkpoints(tmp_path, content):
    path = tmp_path / "foreign.bin"
    path.write_bytes(content)
    with pytest.raises(tg.CheckpointError, match="is not a (valid )?safetensors"):
        tg.load(path)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        tg.load("/nonexistent/ckpt.safetensors")


# ------------------------------------------------------- the format's layout rules

def _write(path, header, data_size, header_len=None):
    """A safetensors file of `header` (a dict) and a data buffer of data_size zero
    bytes (sparse: nothing is written); header_len: what the length field says."""
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write((len(text) if header_len is None else header_len).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + data_size)
    return path


def _peak_bytes_of(fn):
    """(result or exception, the peak of Python memory allocated while fn ran)."""
    import tracemalloc
    tracemalloc.start()
    try:
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001  (the caller checks which)
            result = e
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


F32 = lambda n, begin: {"dtype": "F32", "shape": [n], "data_offsets": [begin, begin + 4 * n]}  # noqa: E731


@pytest.mark.parametrize("header,data_size,message", [
    ({"a": F32(4, 0), "b": F32(4, 0)}, 16, r"tensor '[ab]' at data_offsets \[0, 16\] overlaps the one before"),
    ({"a": F32(4, 0), "b": F32(2, 8)}, 16, r"tensor 'b' at data_offsets \[8, 16\] overlaps the one before"),
    ({"a": F32(4, 4)}, 20, r"tensor 'a' at data_offsets \[4, 20\] leaves 4 bytes unused before it"),
    ({"a": F32(4, 0), "b": F32(4, 20)}, 36, r"tensor 'b' .* leaves 4 bytes unused before it"),
    ({"a": F32(4, 0)}, 20, r"4 bytes after the last tensor"),
])
def test_tensors_must_tile_the_data_buffer_in_order(tmp_path, header, data_size, message):
    """The format's rule, as its reference reader checks it: sorted by their
    offsets, the tensors cover the data buffer one after the other, with no
    overlap, no gap and nothing after the last."""
    path = _write(tmp_path / "bad.safetensors", header, data_size)
    with pytest.raises(tg.CheckpointError) as caught:
        tg.load(path)
    assert str(path) in str(caught.value) and "must tile the data buffer" in str(caught.value)
    assert caught.match(message)


def test_overlapping_tensors_are_refused_before_their_data_is_read(tmp_path):
    big = 2_000_000  # floats: 8 MB of data, which load must not read
    path = _write(tmp_path / "overlap.safetensors", {"a": F32(big, 0), "b": F32(big, 0)}, 4 * big)
    error, peak = _peak_bytes_of(lambda: tg.load(path))
    assert isinstance(error, tg.CheckpointError) and "overlaps" in str(error)
    assert peak < 1_000_000


def test_tiling_follows_the_offsets_not_the_order_of_the_header(tmp_path):
    """The JSON order means nothing; empty tensors may share an offset (as the
    reference reader allows)."""
    empty = {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]}
    path = _write(tmp_path / "ok.safetensors", {"b": F32(2, 4), "e1": empty, "a": F32(1, 0), "e2": empty}, 12)
    arrays = tg.load(path)
    assert sorted(arrays) == ["a", "b", "e1", "e2"] and arrays["b"].shape == (2,) and arrays["e1"].shape == (0,)


def test_a_header_longer_than_the_format_allows_is_refused_before_reading_it(tmp_path):
    """The format caps the header at 100,000,000 bytes; load refuses a longer
    one from its length field alone, without reading (or allocating) it."""
    path = _write(tmp_path / "huge.safetensors", {"a": F32(1, 0)}, 100_000_100, header_len=100_000_001)
    error, peak = _peak_bytes_of(lambda: tg.load(path))
    assert isinstance(error, tg.CheckpointError), error
    assert str(path) in str(error) and "100,000,001" in str(error) and "limit of 100,000,000" in str(error)
    assert peak < 1_000_000


def test_a_header_at_the_limit_is_read(tmp_path, monkeypatch):
    """Negative control of the cap, at a limit of 64 bytes: a header of
    exactly 64 bytes (padded with spaces, as safetensors pads) loads, one of
    65 is refused."""
    from tinygrad_attn import checkpoint
    monkeypatch.setattr(checkpoint, "MAX_HEADER_SIZE", 64)
    text = json.dumps({"a": F32(1, 0)}).encode()
    for size, loads in ((64, True), (65, False)):
        path = tmp_path / f"padded{size}.safetensors"
        path.write_bytes(size.to_bytes(8, "little") + text + b" " * (size - len(text)) + bytes(4))
        if loads:
            assert tg.load(path)["a"].shape == (1,)
        else:
            with pytest.raises(tg.CheckpointError, match="limit of 64"):
                tg.load(path)


# ------ Malformed headers, leftovers of killed saves, files written by PyTorch


@pytest.mark.parametrize("entry,message", [
    ({"dtype": "F32", "shape": [2], "data_offsets": ["0", "8"]}, r"tensor 'w' has data_offsets \['0', '8'\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0]}, r"tensor 'w' has data_offsets \[0\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, r"tensor 'w' has data_offsets \[8, 0\]"),
    ({"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}, r"tensor 'w' has shape \['2'\]"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}, r"tensor 'w' of dtype F32 and shape \[3\] "
                                                             r"needs 12 bytes, its data_offsets give 8"),
    ({"dtype": "F32", "shape": [2]}, r"the entry of tensor 'w' needs dtype, shape and data_offsets"),
    ({"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}, r"tensor 'w' has dtype 'F8_E4M3', which "
                                                                 r"load cannot read"),
])
def test_a_malformed_safetensors_header_is_named(tmp_path, entry, message):
    header = json.dumps({"w": entry}).encode()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(8))
    with pytest.raises(tg.CheckpointError, match=message):
        tg.load(path)


def _dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_save_removes_leftover_temp_files_of_earlier_saves_of_the_same_file(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    dead = _dead_pid()
    leftovers = [f".ckpt.safetensors.{dead}-0123abcd.tmp", ".ckpt.safetensors.89abcdef.tmp"]  # + old naming
    kept = [
        f".other.safetensors.{dead}-0123abcd.tmp",       # another file's leftover
        f".ckpt.safetensors.x.{dead}-0123abcd.tmp",      # the leftover of ckpt.safetensors.x
        f".ckpt.safetensors.{os.getpid()}-00000000.tmp",  # a save in progress in a live process
        "ckpt.safetensors.tmp", "notes.txt",
    ]
    for name in leftovers + kept:
        (tmp_path / name).write_bytes(b"partial checkpoint bytes")
    tg.save({"w": np.ones(3)}, path)
    assert sorted(os.listdir(tmp_path)) == sorted(kept + ["ckpt.safetensors"])
    np.testing.assert_array_equal(tg.load(path)["w"], np.ones(3))


@pytest.mark.skipif(os.name != "posix", reason="the live-writer test uses POSIX locks")
def test_a_temp_file_locked_by_a_live_writer_survives_and_a_killed_save_is_cleaned_up(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
               TINYGRAD_ATTN_PRECOMPILE="0")
    # A save that is killed (SIGKILL) between writing its temp file and renaming it.
    killed = subprocess.run([sys.executable, "-c", (
        "import os, signal, numpy as np, tinygrad_attn as tg\n"
        "os.replace = lambda src, dst: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"tg.save({{'w': np.zeros(1000)}}, {str(path)!r})\n")], env=env)
    assert killed.returncode == -signal.SIGKILL
    leftover, = os.listdir(tmp_path)
    assert leftover.startswith(".ckpt.safetensors.") and os.path.getsize(tmp_path / leftover) > 8000
    # Another machine's writer: a pid that is not alive here, but the file is locked.
    dead = _dead_pid()
    locked = tmp_path / f".ckpt.safetensors.{dead}-feedbeef.tmp"
    locked.write_bytes(b"being written")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys\n"
        f"f = open({str(locked)!r}, 'rb')\n"
        "fcntl.flock(f.fileno(), fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        tg.save({"w": np.ones(2)}, path)
        assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.safetensors", locked.name])
    finally:
        holder.stdin.close()
        holder.wait()
    tg.save({"w": np.ones(2)}, path)  # the lock is gone with its process: now it is a leftover
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_saving_into_a_missing_directory_names_the_target(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "ckpt.safetensors"
    with pytest.raises(FileNotFoundError, match="save: cannot write .*ckpt.safetensors: the directory "
                                                ".*dir does not exist") as info:
        tg.save({"w": np.ones(2)}, target)
    assert ".tmp" not in str(info.value)


@pytest.mark.parametrize("torch_dtype", ["bfloat16", "float16"])
def test_half_precision_files_written_by_torch_load_as_float32(tmp_path, torch_dtype):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file
    torch.manual_seed(0)
    dtype = getattr(torch, torch_dtype)
    state = {"w": (torch.randn(4, 5) * 100).to(dtype), "b": torch.tensor([-0.0, 1e-3, 65504.0]).to(dtype),
             "scalar": torch.tensor(3.140625, dtype=dtype), "ids": torch.arange(3)}
    path = tmp_path / "half.safetensors"
    save_file(state, str(path))
    loaded = tg.load(path)
    for name, value in state.items():
        expected = value.float().numpy() if value.is_floating_point() else value.numpy()
        assert loaded[name].dtype == expected.dtype and loaded[name].shape == expected.shape, name
        np.testing.assert_array_equal(loaded[name], expected)  # exact: every half value is a float32
        assert loaded[name].flags.writeable
    model = nn.Linear(5, 4)
    model.load_state_dict({"weight": loaded["w"], "bias": loaded["b"][:1].repeat(4)})
    np.testing.assert_array_equal(model.weight.data, state["w"].float().numpy())
