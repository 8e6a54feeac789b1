"""The benchmark harness (benchmarks/) runs: every table with tiny counts
(--quick), each framework in its own worker process, the frameworks agree
on every case they both run, and the output has the expected rows. No
timing is checked. The runs use one thread per framework (--threads 1):
threads that wait for a core only burn CPU time on a busy test machine."""
import importlib.util
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

import tinygrad_attn as tg

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
HAVE_TORCH = importlib.util.find_spec("torch") is not None

sys.path.insert(0, str(BENCH))
import cases
import harness

sys.path.remove(str(BENCH))


def bench_module(name):
    """benchmarks/NAME.py, imported in this process (benchmarks/ on the path
    meanwhile, the path as it was afterwards: worker.py reorders it). Our
    worker's module keeps malloc's defaults here (it would keep freed memory)."""
    if name in sys.modules:
        return sys.modules[name]
    saved, memory = list(sys.path), os.environ.get("TINYGRAD_ATTN_BENCH_MEMORY")
    sys.path.insert(0, str(BENCH))
    os.environ["TINYGRAD_ATTN_BENCH_MEMORY"] = "default"
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved
        if memory is None:
            del os.environ["TINYGRAD_ATTN_BENCH_MEMORY"]
        else:
            os.environ["TINYGRAD_ATTN_BENCH_MEMORY"] = memory


def run_script(name, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(BENCH / name), *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout.splitlines()


def row(lines, label):
    """The cells of the row starting with `label`, after it (a kernel row's
    closing note, "[no PyTorch twin]", left out)."""
    found = [line for line in lines if line.startswith(label)]
    assert found, f"no row {label!r} in:\n" + "\n".join(lines)
    return found[0][len(label):].split("  [")[0].split()


def note(lines, label):
    """A kernel row's closing note ("no PyTorch twin"), or ""."""
    line = next(line for line in lines if line.startswith(label))
    return line.split("  [", 1)[1].rstrip("]") if "  [" in line else ""


def assert_agree(text, expected):
    """The agreement column: the largest relative difference, within the
    tolerance; or, as `expected` says, "checked" (dropout kernels: each
    framework's own mask checked alone), "not compared" (its last word) or
    "-" (nothing to compare with: no PyTorch)."""
    if expected == "number":
        assert float(text) <= cases.ARRAY_RTOL, text
    else:
        assert text == expected, text


def ops_with_kernels():
    """The ops that run a kernel (they declare an example), in the registry's order."""
    return [name for name, op in tg.Function.registry.items() if op.example is not None]


def test_the_hand_written_rows_name_ops_with_kernels():
    """cases.KERNELS are rows of ops of the registry (that run a kernel), and
    PyTorch's twins are keyed by the names of such ops: a renamed op fails here."""
    ops = set(ops_with_kernels())
    assert {r.op for r in cases.KERNELS.values()} <= ops
    assert {key for _, keys in cases.KERNEL_GROUPS for key in keys} | set(cases.LLAMA_ROWS) == set(cases.KERNELS)
    if HAVE_TORCH:
        assert set(bench_module("impl_torch").OP_TWINS) <= ops


KERNEL_SIZE = 4096  # the --kernel-size of the test runs: tiny


def test_every_table_runs_and_the_frameworks_agree():
    lines = run_script("run.py", "--quick", "--skip-startup", "--threads", "1", "--kernel-size", str(KERNEL_SIZE))
    assert any(line.strip().startswith("tinygrad_attn worker") for line in lines)
    for key, r in cases.KERNELS.items():
        if key in cases.LLAMA_ROWS:
            continue  # the llama table's, below
        for mode in (" fwd", " fwd+bwd"):
            cells = row([line for line in lines if f" {r.shape} " in line], r.label + mode)
            assert float(cells[1]) > 0 and float(cells[3]) > 0  # ours ms, numpy ms (after the shape)
            assert_agree(cells[-1], "checked" if key == "dropout" else "number")
    # a row for every op with a kernel, from its example: ours timed, each other framework timed or said absent
    generic = lines[lines.index(next(line for line in lines if line.startswith("Every op with a kernel"))):]
    for name in ops_with_kernels():
        for mode in (" fwd", " fwd+bwd"):
            label = f"{name}{mode} "
            cells = [c for c in row(generic, label) if not c.startswith("±")]
            _, ours, numpy, torch, _, _, *agree = cells
            why, agree = note(generic, label), " ".join(agree)
            assert float(ours) > 0, cells
            assert (numpy == "-") == ("numpy" in why) and (torch == "-") == ("PyTorch" in why or not HAVE_TORCH), cells
            assert agree in ("-", "checked", "not compared") or float(agree) <= cases.ARRAY_RTOL, cells
    for key in cases.LLAMA_ROWS:  # ours against PyTorch's F.rms_norm, llama2.c's rotary
        for mode in (" fwd", " fwd+bwd"):
            cells = row(lines, f"{cases.KERNELS[key].label} {cases.KERNELS[key].shape}{mode}")
            assert float(cells[0]) > 0
            assert_agree(cells[-1], "number" if HAVE_TORCH else "-")
    with_torch = "number" if HAVE_TORCH else "-"
    for label, agree in [("dropout 0.0", with_torch), ("dropout 0.1", "compared" if HAVE_TORCH else "-"),
                         *((label, with_torch) for label in cases.WORKLOADS.values()),
                         *((label, with_torch) for label, _, _ in cases.OPTIMIZERS.values())]:
        cells = row(lines, label)
        assert float(cells[0]) > 0
        assert_agree(cells[-1], agree)
    busy = lines[lines.index(next(line for line in lines if line.startswith("One core busy"))):]
    for case in ("W1", "W2", "W3"):  # per framework: quiet ms, busy ms, busy/quiet
        cells = [c for c in row(busy, cases.WORKLOADS[case]) if not c.startswith("±")]
        assert len(cells) == (6 if HAVE_TORCH else 3) and all(float(c) > 0 for c in cells)
    assert float(row(lines, "tinygrad_attn ")[1]) > 0  # peak RSS after the W1 steps


def test_startup_measures_the_first_step_of_the_default_train():
    lines = run_script("run.py", "--quick", "--only", "startup")
    imported, first_step = map(float, row(lines, "this checkout's cache, as it is"))
    assert 0 < imported < first_step


@pytest.mark.skipif(not HAVE_TORCH, reason="compares with torch.profiler")
def test_profile_splits_a_step_for_both_frameworks():
    lines = run_script("profile.py", "--quick", "--only", "W1", "--threads", "1")
    for label in ("forward+backward: BLAS", "forward+backward: Numba kernels", "forward+backward: engine",
                  "optimizer step"):
        assert float(row([line.strip() for line in lines], label)[-3]) >= 0  # "... 12.34 ms 20%"
    ops = next(line for line in lines if "forward applies" in line).split()  # "ops per step: N forward applies"
    assert int(ops[3]) > 10  # W1's forward is a few dozen ops
    assert any("aten::mm" in line for line in lines)  # torch.profiler's table


class FakeWorker:
    """Answers "check" as a worker does: with a file of its results."""

    def __init__(self, framework, folder, **results):
        self.framework, self.folder, self.results = framework, folder, results

    def ask(self, op, **args):
        path = self.folder / f"{self.framework}-{len(list(self.folder.iterdir()))}.npz"
        np.savez(path, **self.results)
        return {"file": str(path)}


def test_compare_reports_outputs_and_losses_that_differ(tmp_path):
    out = np.linspace(-1, 1, 50, dtype=np.float32)
    losses = np.array([2.5, 2.4, 2.3])
    ref = FakeWorker("ours", tmp_path, out=out, losses=losses)
    same = FakeWorker("torch", tmp_path, out=out * (1 + 1e-6), losses=losses * (1 + 1e-6))
    worst, _, problems = harness.compare("W1", ref, [same])
    assert problems == [] and worst < 1e-5
    off = FakeWorker("torch", tmp_path, out=out + 1e-3, losses=losses * (1 + 1e-4))
    _, _, problems = harness.compare("W1", ref, [off])
    assert len(problems) == 2 and "losses differs" in problems[0] and "out differs" in problems[1]
    flag = FakeWorker("ours", tmp_path, **{"dropout?": np.array(False)})
    _, flags, problems = harness.compare("kernel", flag, [])
    assert flags == 1 and problems == ["ours: dropout check failed"]
    assert list(tmp_path.iterdir()) == []  # each check file is removed once read


class InProcessWorker:
    """A framework's worker (worker.Server) answering in this process, where
    an op defined by a test is registered (a worker process would not have it)."""

    def __init__(self, framework, directory):
        self.framework = framework
        self.server = bench_module("worker").Server(bench_module(f"impl_{framework}"), str(directory))

    def ask(self, op, **args):
        return self.server.handle({"op": op, **args})


@pytest.fixture
def probe_op():
    """A throwaway fused op, registered as every op of tinygrad_attn.ops is
    (by defining it), removed afterwards: SiLU's kernel on rows of 8."""
    from tinygrad_attn.kernels.elementwise import silu_backward, silu_forward

    class ProbeSwish(tg.Function):
        """z = x * sigmoid(x) on rows of 8, through SiLU's kernel.

        Readable version: tinygrad_attn.reference.numpy_backward.silu_backward.
        """
        __module__ = "tinygrad_attn.ops.probe"  # what registers an op (autograd.Function.__init_subclass__)

        @staticmethod
        def forward(ctx, x):
            flat = np.ascontiguousarray(x).reshape(-1)
            out = np.empty_like(flat)
            silu_forward(flat, out)
            ctx.save_for_backward(flat)
            return out.reshape(x.shape)

        @staticmethod
        def backward(ctx, grad):
            flat, = ctx.saved_tensors
            dx = np.empty_like(flat)
            silu_backward(flat, np.ascontiguousarray(grad, flat.dtype).reshape(-1), dx)
            return dx.reshape(grad.shape)

        @staticmethod
        def example(dtype, size):
            return (np.random.default_rng(0).standard_normal((max(1, size // 8), 8)).astype(dtype),), {}

    assert tg.Function.registry["ProbeSwish"] is ProbeSwish
    try:
        yield ProbeSwish
    finally:
        del tg.Function.registry["ProbeSwish"]


def test_an_op_added_now_gets_a_kernel_row_with_no_other_edit(probe_op, tmp_path):
    """The kernels table lists a row for an op nobody wrote into benchmarks/
    (run.kernel_groups, from our worker's list), and the row builds, agrees
    and runs in our worker and numpy's (its twin found from the docstring),
    at a tiny size; PyTorch has no twin of it, and says so."""
    ours, numpy = InProcessWorker("ours", tmp_path), InProcessWorker("numpy", tmp_path)

    class Run:  # what kernel_groups uses of a run: --kernel-size and our worker
        args = types.SimpleNamespace(kernel_size=64)
        session = types.SimpleNamespace(workers=lambda *frameworks: [ours])
    listed = bench_module("run").kernel_groups(Run)[-1][1]
    assert [label for _, label, _ in listed] == ops_with_kernels()
    (key, _, shape), = [r for r in listed if r[1] == "ProbeSwish"]
    assert key == cases.example_row("ProbeSwish", 64) and shape == "(8,8)"
    for mode in ("fwd", "fwdbwd"):
        case = cases.kernel_case(key, mode)
        ours.ask("init", case=case)
        assert ours.ask("setup", case=case) == numpy.ask("setup", case=case) == {}
        worst, flags, problems = harness.compare(case, ours, [numpy])
        assert problems == [] and flags == 0 and worst <= cases.ARRAY_RTOL
        for w in (ours, numpy):
            assert len(w.ask("time", case=case, steps=2, warmup=1)["times"]) == 2
    if HAVE_TORCH:
        assert InProcessWorker("torch", tmp_path).ask("setup", case=case) == {"absent": "no PyTorch twin"}


def test_the_cpu_hog_is_killed_when_its_block_raises():
    with pytest.raises(RuntimeError), harness.cpu_hog() as pid:
        time.sleep(0.05)
        raise RuntimeError("boom")
    # Killed and reaped: the pid names no process any more.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
