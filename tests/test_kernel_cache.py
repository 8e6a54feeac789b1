"""The compiled-kernel cache shared by processes, and the background compile
of a cold cache (tinygrad_attn/ops/kernels/setup.py and precompile.py)."""
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from numba import njit

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn
from tinygrad_attn.ops import kernels
from tinygrad_attn.ops.kernels import precompile, setup, threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dry_run(step):
    """The (kernel, argument types) that step() would run, first calls first."""
    with threads.dry_run() as calls, np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()
    return calls


@njit(nogil=True)
def _fill(out, value, start, stop):
    for i in range(start, stop):
        out[i] = value


def test_dry_run_records_kernel_calls_without_running_them():
    out = np.zeros(10)
    with threads.dry_run() as calls:
        threads.parallel_for(_fill, 10, out, 7.0)
        threads.parallel_for(_fill, 5, out, 1.0)  # the same types: recorded once
    assert not out.any()
    assert [(k, tuple(map(str, types))) for k, types in calls] == [
        (_fill, ("array(float64, 1d, C)", "float64", "int64", "int64"))]
    threads.parallel_for(_fill, 10, out, 7.0)  # and afterwards, it runs again
    assert (out == 7).all()


def _encoder_step():
    layer, head = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True), nn.Linear(16, 7)
    padding = np.arange(5) > np.array([[4], [3], [2]])  # (3, 5): True = padding
    logits = head(layer(tg.randn(3, 5, 16), src_key_padding_mask=padding))
    F.cross_entropy(logits.reshape(-1, 7), np.arange(15) % 7).backward()


def _causal_decoder_step():
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.2, batch_first=True, norm_first=True)
    out = layer(tg.randn(2, 6, 16, requires_grad=True), tg.randn(2, 4, 16), tgt_is_causal=True,
                tgt_mask=nn.Transformer.generate_square_subsequent_mask(6))
    F.cross_entropy(out.reshape(-1, 16), np.zeros(12, np.int64), ignore_index=3).backward()


def _gpt_step():
    from tinygrad_attn import models
    gpt = models.GPT(models.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1))
    F.cross_entropy(gpt(np.arange(14).reshape(2, 7) % 11).reshape(-1, 11), np.zeros(14, np.int64)).backward()


def test_the_precompiled_step_covers_other_transformer_steps():
    """The background compile learns its kernels from one small step; steps
    of other shapes, layers, masks and dropout need no other signature."""
    compiled = set(dry_run(precompile.training_step))
    assert {k.__name__ for k, _ in compiled} == {
        "attention_forward", "attention_backward", "dropout_apply", "layer_norm_forward",
        "layer_norm_backward", "cross_entropy_forward", "cross_entropy_backward",
        "gelu_forward", "gelu_backward"}
    for step in (_encoder_step, _causal_decoder_step, _gpt_step):
        assert set(dry_run(step)) <= compiled


def test_every_kernel_has_a_shared_cache():
    if setup.fcntl is None:
        pytest.skip("no advisory file locks on this platform: Numba's plain cache is used")
    assert all(isinstance(k._cache, setup.SharedCache) for k in kernels.KERNELS)


def test_a_lookup_waits_while_another_process_saves_the_kernel(monkeypatch):
    """Saving holds a kernel's cache lock exclusively; a lookup waits until it
    is released (here the other side is a thread, which the OS treats like
    another process: each opens the lock file on its own), but not for long:
    after SharedCache.WAIT it counts as a miss."""
    if setup.fcntl is None:
        pytest.skip("no advisory file locks on this platform")
    kernel = kernels.layer_norm_forward
    if not kernel.signatures:
        F.layer_norm(tg.randn(2, 3), (3,))
    sig = kernel.signatures[0]
    monkeypatch.setattr(setup.SharedCache, "WAIT", 10.0)
    events = []

    def look_up_while_saving(hold_for):
        held, release = threading.Event(), threading.Event()

        def save_elsewhere():
            with setup.file_lock(kernel._cache.lock, exclusive=True):
                held.set()
                release.wait(hold_for)
                events.append("saved")
        other = threading.Thread(target=save_elsewhere)
        other.start()
        held.wait()
        found = kernel._cache.load_overload(sig, kernel.targetctx)
        events.append("looked up")
        release.set()
        other.join()
        return found

    assert look_up_while_saving(hold_for=0.2) is not None  # waited, then found it
    assert events == ["saved", "looked up"]
    events.clear()
    monkeypatch.setattr(setup.SharedCache, "WAIT", 0.0)
    assert look_up_while_saving(hold_for=10.0) is None  # gave up: a miss
    assert events == ["looked up", "saved"]


def test_start_if_cold_starts_one_background_compile(monkeypatch, tmp_path):
    if setup.fcntl is None:
        pytest.skip("no advisory file locks on this platform: no background compile")
    started = []

    class FakePopen:
        def __init__(self, args, env, pass_fds, **kwargs):
            started.append((args, env, pass_fds))
            # The child inherits the lock: here we keep our own copy of it instead.
            self.lock = os.dup(pass_fds[0])

    class FakeStats:
        cache_path = str(tmp_path)

    fake_kernels = [type("K", (), {"_cache": object.__new__(setup.SharedCache), "stats": FakeStats})]
    monkeypatch.setattr(precompile.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(precompile, "_process", None)
    monkeypatch.setattr(precompile, "_usable_cores", lambda: 2)
    monkeypatch.setenv("TINYGRAD_ATTN_PRECOMPILE", "0")
    precompile.start_if_cold(fake_kernels)
    assert not started  # turned off
    monkeypatch.delenv("TINYGRAD_ATTN_PRECOMPILE")
    precompile.start_if_cold(fake_kernels)
    args, env, _ = started[0]
    assert env["TINYGRAD_ATTN_PRECOMPILE"] == "0"  # the child starts no other
    assert "os.nice(19)" in args[-1]  # and yields to everything else
    assert "precompile.main" in args[-1] and str(tmp_path) in args[-1]  # the marker goes in the cache
    precompile.start_if_cold(fake_kernels)
    assert len(started) == 1  # the first one still runs (holds the lock)
    os.close(precompile._process.lock)  # it ends without leaving a marker
    precompile.start_if_cold(fake_kernels)
    assert len(started) == 2
    os.close(precompile._process.lock)
    open(os.path.join(tmp_path, f"tinygrad_attn-precompiled-{precompile._state_key()}"), "w").close()
    precompile.start_if_cold(fake_kernels)
    assert len(started) == 2  # the marker says the cache is warm


def test_background_compile_fills_a_cold_cache(tmp_path):
    """The background process's job, run directly: afterwards a fresh process
    runs a training step without compiling anything."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), TINYGRAD_ATTN_PRECOMPILE="0",
               PYTHONPATH=ROOT)
    marker = str(tmp_path / "marker")
    subprocess.run([sys.executable, "-c", "from tinygrad_attn.ops.kernels import precompile; "
                    f"precompile.main({marker!r})"], env=env, check=True)
    assert os.path.exists(marker)
    step = ("import numpy as np, tinygrad_attn as tg\n"
            "from tinygrad_attn import nn, functional as F\n"
            "layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)\n"
            "head = nn.Linear(32, 11)\n"
            "logits = head(layer(tg.randn(4, 10, 32)))\n"
            "F.cross_entropy(logits.reshape(-1, 11), np.arange(40) % 11).backward()\n"
            "print(sum(sum(k.stats.cache_hits.values()) for k in tg.ops.kernels.KERNELS),"
            "      sum(sum(k.stats.cache_misses.values()) for k in tg.ops.kernels.KERNELS))\n")
    hits, misses = subprocess.run([sys.executable, "-c", step], env=env, check=True, capture_output=True,
                                  text=True).stdout.split()
    assert (int(hits), int(misses)) == (7, 0)
