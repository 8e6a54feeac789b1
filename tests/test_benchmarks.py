"""The benchmark harness (benchmarks/) runs: every table with tiny counts
(--quick), each framework in its own worker process, the frameworks agree
on every case they both run, and the output has the expected rows. No
timing is checked."""
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

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


def assert_agree(text):
    """The agreement column: a relative difference within the tolerance, or
    "not compared" (dropout draws a different mask in each framework)."""
    if not HAVE_TORCH:
        assert text in ("-", "compared"), text
    elif text != "compared":  # the tail of "not compared"
        assert float(text) <= cases.ARRAY_RTOL, text


def test_every_table_runs_and_the_frameworks_agree():
    lines = run_script("run.py", "--quick", "--skip-startup")
    assert any(line.strip().startswith("tinygrad_attn worker") for line in lines)
    for key, (label, *_) in cases.KERNELS.items():
        for mode in (" fwd", " fwd+bwd"):
            cells = row([line for line in lines if f" {cases.KERNELS[key][1]} " in line], label + mode)
            assert float(cells[1]) > 0 and float(cells[3]) > 0  # ours ms, numpy ms (after the shape)
            assert_agree(cells[-1])
    for label in ["dropout 0.0", "dropout 0.1", *cases.WORKLOADS.values(),
                  *(label for label, _, _ in cases.OPTIMIZERS.values())]:
        cells = row(lines, label)
        assert float(cells[0]) > 0
        assert_agree(cells[-1])
    for case in ("W1", "W2", "W3"):  # the busy table: per framework quiet, busy, busy/quiet
        cells = [c for c in row(lines[lines.index(next(line for line in lines if line.startswith("One core busy"))):],
                                cases.WORKLOADS[case]) if not c.startswith("±")]
        assert len(cells) == (6 if HAVE_TORCH else 3) and all(float(c) > 0 for c in cells)
    assert float(row(lines, "tinygrad_attn ")[1]) > 0  # peak RSS after the W1 steps
    assert not any("disagree" in line for line in lines)


def test_startup_measures_the_first_step_of_the_default_train():
    lines = run_script("run.py", "--quick", "--only", "startup")
    imported, first_step = map(float, row(lines, "this checkout's cache, as it is"))
    assert 0 < imported < first_step


@pytest.mark.skipif(not HAVE_TORCH, reason="compares with torch.profiler")
def test_profile_splits_a_step_for_both_frameworks():
    lines = run_script("profile.py", "--quick", "--only", "W1")
    for label in ("forward+backward: BLAS", "forward+backward: Numba kernels", "forward+backward: engine",
                  "optimizer step"):
        assert float(row([line.strip() for line in lines], label)[-3]) >= 0  # "... 12.34 ms 20%"
    ops = next(line for line in lines if "forward applies" in line).split()  # "ops per step: N forward applies"
    assert int(ops[3]) > 10  # W1's forward is a few dozen ops
    assert any("aten::mm" in line for line in lines)  # torch.profiler's table


class FakeWorker:
    def __init__(self, framework, path):
        self.framework, self.path = framework, path

    def ask(self, op, **args):
        return {"file": self.path}


def test_compare_reports_outputs_and_losses_that_differ(tmp_path):
    out = np.linspace(-1, 1, 50, dtype=np.float32)
    losses = np.array([2.5, 2.4, 2.3])
    np.savez(tmp_path / "a.npz", out=out, losses=losses)
    np.savez(tmp_path / "same.npz", out=out * (1 + 1e-6), losses=losses * (1 + 1e-6))
    np.savez(tmp_path / "off.npz", out=out + 1e-2, losses=losses * (1 + 1e-4))
    np.savez(tmp_path / "flag.npz", **{"dropout?": np.array(False)})
    ref = FakeWorker("ours", tmp_path / "a.npz")
    worst, problems = harness.compare("W1", ref, [FakeWorker("torch", tmp_path / "same.npz")])
    assert problems == [] and worst < 1e-5
    _, problems = harness.compare("W1", ref, [FakeWorker("torch", tmp_path / "off.npz")])
    assert len(problems) == 2 and "losses differs" in problems[0] and "out differs" in problems[1]
    _, problems = harness.compare("kernel", FakeWorker("ours", tmp_path / "flag.npz"), [])
    assert problems == ["ours: dropout check failed"]


def test_the_cpu_hog_is_killed_when_its_block_raises():
    with pytest.raises(RuntimeError), harness.cpu_hog() as pid:
        time.sleep(0.05)
        raise RuntimeError("boom")
    # Killed and reaped: the pid names no process any more.
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
