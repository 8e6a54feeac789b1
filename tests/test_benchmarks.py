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


def run_script(name, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(BENCH / name), *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    return done.stdout.splitlines()


def row(lines, label):
    found = [line for line in lines if line.startswith(label)]
    assert found, f"no row {label!r} in:\n" + "\n".join(lines)
    return found[0][len(label):].split()


def assert_agree(text, expected):
    """The agreement column: the largest relative difference, within the
    tolerance; or, as `expected` says, "checked" (dropout kernels: each
    framework's own mask checked alone), "not compared" (its last word) or
    "-" (nothing to compare with: no PyTorch)."""
    if expected == "number":
        assert float(text) <= cases.ARRAY_RTOL, text
    else:
        assert text == expected, text


def test_every_fused_op_has_a_kernel_case_or_a_reason():
    """A new fused op (one with a composite twin) is picked up: benchmarks/cases.py
    times it in a kernel case, or says why not."""
    fused = {name for name, op in tg.Function.registry.items() if op.composite is not None}
    timed = set(cases.KERNEL_OPS.values())
    assert set(cases.KERNEL_OPS) == set(cases.KERNELS)
    assert not timed & set(cases.NOT_BENCHMARKED)
    missing = sorted(fused - timed - set(cases.NOT_BENCHMARKED))
    assert not missing, f"fused ops with no kernel case in benchmarks/cases.py nor a reason: {missing}"


def test_every_table_runs_and_the_frameworks_agree():
    lines = run_script("run.py", "--quick", "--skip-startup", "--threads", "1")
    assert any(line.strip().startswith("tinygrad_attn worker") for line in lines)
    for key, (label, shape, *_) in cases.KERNELS.items():
        if key in cases.LLAMA_KERNELS:
            continue  # the llama table's, below
        for mode in (" fwd", " fwd+bwd"):
            cells = row([line for line in lines if f" {shape} " in line], label + mode)
            assert float(cells[1]) > 0 and float(cells[3]) > 0  # ours ms, numpy ms (after the shape)
            assert_agree(cells[-1], "checked" if key == "dropout" else "number")
    for label, shape, *_ in cases.LLAMA_KERNELS.values():  # ours against PyTorch's F.rms_norm, llama2.c's rotary
        for mode in (" fwd", " fwd+bwd"):
            cells = row(lines, f"{label} {shape}{mode}")
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


def test_the_cpu_hog_is_killed_when_its_block_raises():
    with pytest.raises(RuntimeError), harness.cpu_hog() as pid:
        time.sleep(0.05)
        raise RuntimeError("boom")
    # Killed and reaped: the pid names no process any more.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
