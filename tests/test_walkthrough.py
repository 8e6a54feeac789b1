"""examples/attention_walkthrough.py: the seeds' example runs, has the seeds'
shapes, is deterministic, and every gradient matches finite differences."""
import contextlib
import importlib.util
import io
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "examples" / "attention_walkthrough.py"


@pytest.fixture(scope="module")
def walkthrough():
    spec = importlib.util.spec_from_file_location("attention_walkthrough", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(walkthrough):
    """One printed run: (errors, intermediates, printed text)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        errors, inter = walkthrough.main()
    return errors, inter, buffer.getvalue()


def test_shapes_follow_the_seed_notes(run):
    errors, inter, _ = run
    assert inter["X"].shape == (2, 4)
    for i in range(8):
        assert inter[f"Q[{i}]"].shape == (2, 3)
        assert inter[f"scores[{i}]"].shape == (2, 2)
        assert inter[f"Z[{i}]"].shape == (2, 3)
    assert inter["concat"].shape == (2, 24)
    assert inter["Y"].shape == (2, 4)


def test_every_gradient_matches_finite_differences(run):
    errors, _, _ = run
    assert set(errors) >= {"WQ", "WK", "WV", "WO", "X", "Q[0]", "K[0]", "V[0]", "scores[0]",
                           "weights[0]", "Z[0]", "concat", "Y"}
    assert max(errors.values()) < 1e-6, errors


def test_output_is_deterministic_and_mentions_every_step(walkthrough, run, capsys):
    first = run[2]
    walkthrough.main()
    assert capsys.readouterr().out == first
    for text in ("scores[0] (2, 2)", "concat(Z_0..Z_7) (2, 24)", "Y = concat @ W^O (2, 4)",
                 "dL/dWO (24, 4)", "agree with finite differences"):
        assert text in first
