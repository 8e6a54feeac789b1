"""The benchmark command runs: its model and encoder tables build the same
models in both frameworks and check that they agree before timing them."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_encoder_and_model_tables_run():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "encoder", "--only", "models",
                           "--repeat", "1", "--rounds", "1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.splitlines()
    for label in ("0.0 ", "0.1 ", "copy:", "charlm:"):  # a timed row each: ours ms, torch ms, ratio ("-" without PyTorch)
        ours, torch_ms, ratio = next(line for line in rows if line.startswith(label)).split()[-3:]
        assert float(ours) > 0
