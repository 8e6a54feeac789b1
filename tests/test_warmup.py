"""What importing tinygrad_attn does (nothing but Numba's cache setting), and
compiling a training step's kernels ahead of time (warmup.py)."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from numba.core.caching import FunctionCache

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn
from tinygrad_attn import kernels
from tinygrad_attn import warmup
from tinygrad_attn.kernels import threads

from .test_ops import CASE_IDS, CASES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT, **env)).stdout


def test_import_starts_no_process_and_changes_no_global_state(tmp_path):
    """With an empty kernel cache (where a background compile used to start),
    importing leaves no child process, keeps malloc's settings, Numba's own
    dispatcher caches and BLAS's thread count, and compiles nothing."""
    out = _run("""
        import os, numpy, threadpoolctl
        before = [lib["num_threads"] for lib in threadpoolctl.threadpool_info()]
        import tinygrad_attn
        from numba.core.caching import FunctionCache
        from tinygrad_attn import kernels
        def parent(pid):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:  # gone meanwhile
                return None
        children = [d for d in os.listdir("/proc") if d.isdigit() and parent(d) == os.getpid()]
        after = [lib["num_threads"] for lib in threadpoolctl.threadpool_info()]
        print(len(children), before == after,
              all(type(k._cache) is FunctionCache for k in kernels.KERNELS),
              sum(len(k.signatures) for k in kernels.KERNELS),
              sum(len(files) for _, _, files in os.walk(os.environ["NUMBA_CACHE_DIR"])))
        """, NUMBA_CACHE_DIR=str(tmp_path))
    assert out.split() == ["0", "True", "True", "0", "0"]
    assert not hasattr(tg, "_memory")


def test_blas_runs_single_threaded_inside_our_jobs_and_nothing_else_changes():
    """Inside a job of a BLAS-calling kernel, BLAS runs on one thread on each
    of our threads (set for that thread alone where the library allows it);
    afterwards the calling thread and the process are as before."""
    from tinygrad_attn.kernels.threads import _blas
    controllers, local = _blas.controllers(), _blas.local_setters()
    assert controllers and local, "numpy's OpenBLAS here has openblas_set_num_threads_local"
    before_global = [c.get_num_threads() for c in controllers]
    before_local = [fn(0) for fn in local]  # read (set returns the previous value), then put back
    for fn, n in zip(local, before_local):
        fn(n)
    seen = []

    def kernel(start, stop):
        values = [fn(1) for fn in local]  # what this thread had
        seen.append(values)
    threads.parallel_for(kernel, 8, item_size=threads.GRAIN, blas=True)
    assert len(seen) == 8 and all(values == [1] * len(local) for values in seen)
    assert [c.get_num_threads() for c in controllers] == before_global
    assert [fn(before) for fn, before in zip(local, before_local)] == before_local


def test_set_num_threads_covers_our_pool_and_blas():
    from tinygrad_attn.kernels.threads import _blas
    before = [c.get_num_threads() for c in _blas.controllers()]
    try:
        tg.set_num_threads(1)
        assert tg.get_num_threads() == 1 and all(c.get_num_threads() == 1 for c in _blas.controllers())
        calls = []
        threads.parallel_for(lambda start, stop: calls.append((start, stop)), 100, item_size=threads.GRAIN)
        assert calls == [(0, 100)]  # one thread: one range
        tg.set_num_threads(3)
        assert tg.get_num_threads() == 3 and all(c.get_num_threads() == 3 for c in _blas.controllers())
    finally:
        tg.set_num_threads(None)
    assert tg.get_num_threads() == threads._usable_cores()
    assert [c.get_num_threads() for c in _blas.controllers()] == before  # None: BLAS as it was
    for bad in (0, -1, 1.5, True, "2"):
        try:
            tg.set_num_threads(bad)
        except ValueError as e:
            assert "set_num_threads" in str(e)
        else:
            raise AssertionError(f"set_num_threads({bad!r}) did not raise")


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


def _dry_run(step):
    with threads.dry_run() as calls, np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step()
    return calls


def _encoder_step():
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
    head = nn.Linear(16, 7)
    padding = np.arange(5) > np.array([[4], [3], [2]])  # (3, 5): True = padding
    logits = head(layer(tg.randn(3, 5, 16), src_key_padding_mask=padding))
    F.cross_entropy(logits.reshape(-1, 7), np.arange(15) % 7).backward()


def _causal_decoder_step():
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.2, norm_first=True, batch_first=True)
    out = layer(tg.randn(2, 6, 16, requires_grad=True), tg.randn(2, 4, 16), tgt_is_causal=True,
                tgt_mask=nn.Transformer.generate_square_subsequent_mask(6))
    F.cross_entropy(out.reshape(-1, 16), np.zeros(12, np.int64), ignore_index=3).backward()


def _gpt_step():
    from tinygrad_attn import models
    gpt = models.GPT(models.GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1))
    F.cross_entropy(gpt(np.arange(14).reshape(2, 7) % 11).reshape(-1, 11), np.zeros(14, np.int64)).backward()


def test_the_ops_examples_cover_every_kernel_and_transformer_steps():
    """Warming up learns its kernels from the ops' examples; every kernel is
    among them, and steps of other shapes, layers, masks and dropout need no
    other signature."""
    compiled = set(warmup.kernel_signatures((np.float32,)))
    missing = [k.__name__ for k in kernels.KERNELS if k not in {k for k, _ in compiled}]
    assert not missing, f"kernels that no op's example (nor a @kernel_example) calls: {missing}"
    # one float32 version of each: every compiled version costs a cold start 0.3-2 s
    # (a read-only offsets array, say, is another Numba type)
    assert len(compiled) == len(kernels.KERNELS)
    for step in (_encoder_step, _causal_decoder_step, _gpt_step):
        assert set(_dry_run(step)) <= compiled
    both = warmup.kernel_signatures((np.float32, np.float64))
    assert len(both) == 2 * len(compiled)


def test_the_kernels_no_op_calls_are_learnt_from_their_kernel_examples():
    """Code outside the ops that runs kernels (an optimizer's update,
    clipping) registers an example beside it with @kernel_example; the
    warm-up runs each registered one, in every dtype, so warmup.py lists
    none (a planted example is run too)."""
    seen = []

    @kernels.kernel_example
    def planted(dtype, size):
        seen.append((dtype, size))
        return []
    try:
        warmup.kernel_signatures((np.float32, np.float64))
    finally:
        kernels.EXAMPLES.remove(planted)
    assert seen == [(np.float32, warmup.EXAMPLE_SIZE), (np.float64, warmup.EXAMPLE_SIZE)]
    assert {example.__module__ for example in kernels.EXAMPLES} == {"tinygrad_attn.optim.adam",
                                                                    "tinygrad_attn.optim.clip"}


@pytest.mark.parametrize("name,i", CASE_IDS, ids=[f"{n}-{i}" for n, i in CASE_IDS])
@settings(max_examples=4)
@given(data=st.data())
def test_an_op_that_runs_a_kernel_declares_an_example(name, i, data):
    """A new op is picked up: if its gradcheck case (tests/test_ops.py CASES)
    runs a kernel, the op must declare an `example`, which the warm-up runs
    to compile that kernel with the types the op gives it."""
    case = data.draw(CASES[name][i])
    tensors = [tg.Tensor(a, requires_grad=True) for a in case.arrays]

    def step():
        out = case.fn(*tensors)
        out.backward(np.ones(out.shape, out.dtype))
    called = sorted({kernel.__name__ for kernel, _ in _dry_run(step)})
    assert not called or tg.Function.registry[name].example is not None, \
        f"{name} runs the kernels {called} but declares no example (see autograd.Function)"


class _FakeKernel:
    def __init__(self, name):
        self.__name__, self.compiled = name, []

    def compile(self, signature):
        self.compiled.append(signature)


def test_two_processes_never_compile_the_same_kernel(monkeypatch, tmp_path):
    """Both processes take the kernels nobody claimed yet, in one order;
    each kernel (all its signatures) goes to exactly one of them."""
    fakes = [_FakeKernel(f"k{i}") for i in range(5)]
    calls = [(k, s) for k in fakes for s in ("f32", "f64")]
    for index in (4, 3):  # the helper got these two first
        assert warmup._claim(str(tmp_path), index)
    assert not warmup._claim(str(tmp_path), 4)
    started = []
    monkeypatch.setattr(warmup, "_start_helper", lambda claims, calls: started.append(claims) or _DoneProcess())
    monkeypatch.setattr(warmup, "is_warm", lambda key: False)
    monkeypatch.setattr(warmup.threads, "_usable_cores", lambda: 2)
    monkeypatch.setattr(warmup.tempfile, "mkdtemp", lambda prefix: str(tmp_path))
    monkeypatch.setattr(warmup, "_marker", lambda key: str(tmp_path.parent / "marker"))
    progress = []
    warmup.compile_kernels(calls, helper=True, progress=lambda i, n, name: progress.append((i, name)))
    assert started == [str(tmp_path)]
    assert [k.compiled for k in fakes] == [["f32", "f64"]] * 3 + [[], []]
    assert progress == [(0, "k0"), (1, "k1"), (2, "k2"), (5, "")]
    assert not tmp_path.exists()  # the claims directory is removed
    # the helper's side: it skips the kernel the main process claimed
    claims = tmp_path.parent / "claims"
    claims.mkdir()
    warmup._claim(str(claims), 1)
    for k in fakes:
        k.compiled.clear()
    monkeypatch.setattr(warmup, "KERNELS", tuple(fakes))
    (claims / "calls.pickle").write_bytes(__import__("pickle").dumps([(i, s) for i in range(5) for s in ("f32", "f64")]))
    warmup._helper_main(str(claims))
    assert [k.compiled for k in fakes] == [["f32", "f64"], []] + [["f32", "f64"]] * 3


def test_the_biggest_kernels_are_compiled_first():
    """So the two processes end together: the last kernels left are small."""
    from tinygrad_attn.kernels import attention, elementwise, matmul
    calls = [(elementwise._relu_forward, "a"), (matmul._matmul, "b"), (attention._attention_forward, "c"),
             (matmul._matmul, "d")]
    order = [kernel for kernel, _ in warmup._work_order(calls)]
    assert order == [attention._attention_forward, matmul._matmul, elementwise._relu_forward]
    assert dict(warmup._work_order(calls))[matmul._matmul] == ["b", "d"]


class _DoneProcess:
    def wait(self, timeout=None):
        return 0


def test_warmup_with_a_helper_fills_a_cold_cache(tmp_path):
    """A real cold compile shared with a helper process; afterwards a fresh
    process runs training steps without compiling anything."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path)}
    out = _run("""
        import numpy as np
        from tinygrad_attn import warmup
        calls = warmup.kernel_signatures((np.float32,))
        print(warmup.is_warm(warmup.calls_key(calls)))
        warmup.compile_kernels(calls, helper=True)
        print(warmup.is_warm(warmup.calls_key(calls)))
        """, **env)
    assert out.split() == ["False", "True"]
    hits, misses = _run("""
        import numpy as np
        import tinygrad_attn as tg
        from tinygrad_attn import warmup
        warmup.kernel_examples(np.float32)
        print(sum(sum(k.stats.cache_hits.values()) for k in tg.kernels.KERNELS),
              sum(sum(k.stats.cache_misses.values()) for k in tg.kernels.KERNELS))
        """, **env).split()
    assert int(hits) == len(kernels.KERNELS) and int(misses) == 0
    assert all(type(k._cache) is FunctionCache for k in kernels.KERNELS)


def test_keep_freed_memory_is_an_explicit_choice_the_commands_make(monkeypatch):
    """Importing never tunes malloc; keep_freed_memory() does (True on glibc,
    once), and the training commands call it, as programs may."""
    import platform

    from tinygrad_attn import cli, memory
    out = _run("""
        import tinygrad_attn
        from tinygrad_attn import memory
        print(memory._applied, tinygrad_attn.keep_freed_memory(), memory._applied, memory.keep_freed_memory())
        """)
    glibc = platform.libc_ver()[0] == "glibc"
    assert out.split() == ["False", str(glibc), str(glibc), str(glibc)]
    calls = []
    monkeypatch.setattr(memory, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setitem(cli.COMMANDS, "decode", lambda args: 0)
    assert cli.main(["decode", "somewhere"]) == 0 and calls == [1]
