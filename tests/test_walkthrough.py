"""examples/attention_walkthrough.py: the example of the seed notes (the
lecture notes this project's math comes from; README.md, "Learn") runs, has
their shapes, is deterministic, every gradient matches finite differences, and each
claim it prints holds numerically."""
import contextlib
import importlib.util
import io
from pathlib import Path

import numpy as np
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
    """One printed run: (results, printed text)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        results = walkthrough.main()
    return results, buffer.getvalue()


def test_shapes_follow_the_seed_notes(run):
    inter = run[0]["inter"]
    assert inter["X"].shape == (2, 4)
    for i in range(8):
        assert inter[f"Q[{i}]"].shape == (2, 3)
        assert inter[f"scores[{i}]"].shape == (2, 2)
        assert inter[f"Z[{i}]"].shape == (2, 3)
    assert inter["concat"].shape == (2, 24)
    assert inter["Y"].shape == (2, 4)


def test_every_gradient_matches_finite_differences(run):
    results = run[0]
    errors = results["errors"]
    assert set(errors) >= {"WQ", "WK", "WV", "WO", "X", "Q[0]", "K[0]", "V[0]", "scores[0]",
                           "weights[0]", "Z[0]", "concat", "Y"}
    assert max(errors.values()) < 1e-6, errors
    assert results["causal"]["X"] < 1e-6 and results["cross_entropy"]["X"] < 1e-6


def test_the_words_are_labelled_and_head_0_attends_unevenly(run):
    results, out = run
    weights = results["inter"]["weights[0]"].data
    assert np.abs(weights - 0.5).min() > 0.2  # every weight at least 0.2 away from uniform
    assert "'Thinking' attends 0.129 to 'Thinking', 0.871 to 'Machines'" in out


def test_dx_is_the_sum_of_its_query_key_and_value_paths(run):
    paths = run[0]["paths"]
    np.testing.assert_allclose(paths["Q"] + paths["K"] + paths["V"], paths["X.grad"], rtol=0, atol=1e-12)
    assert paths["formula"] < 1e-12  # each path is sum_i G_{Q_i} (W^Q_i)^T, ...
    assert all(np.abs(paths[p]).max() > 1e-3 for p in "QKV")  # none of them is trivially zero
    np.testing.assert_allclose(paths["K"].sum(axis=0), 0, atol=1e-12)


def test_softmax_rows_and_key_gradients_sum_to_zero_but_queries_do_not(walkthrough, run):
    sums = run[0]["zero_sums"]
    assert sums["rows"] < 1e-12 and sums["keys"] < 1e-12
    assert sums["queries"] > 0.1
    # the claim in the stated form, directly: G_K = G_S^T Q / sqrt(d_k) for every head
    inter = run[0]["inter"]
    for i in range(8):
        G_S, Q = inter[f"scaled[{i}]"].grad.data, inter[f"Q[{i}]"].data
        np.testing.assert_allclose(inter[f"K[{i}]"].grad.data, G_S.T @ Q / np.sqrt(3), atol=1e-12)


def test_causal_variant(run):
    causal = run[0]["causal"]
    np.testing.assert_array_equal(causal["weights"][0], [1.0, 0.0])
    assert causal["masked_grad"] == 0 and causal["first_query_grad"] == 0
    assert causal["rows"] < 1e-12 and causal["keys"] < 1e-12


def test_cross_entropy_variant(run):
    ce = run[0]["cross_entropy"]
    assert ce["dlogits"] < 1e-12 and ce["rows"] < 1e-12 and ce["loss"] > 0


def test_output_is_deterministic_and_mentions_every_step(walkthrough, run, capsys):
    first = run[1]
    walkthrough.main()
    assert capsys.readouterr().out == first
    for text in ("scores[0] (2, 2)", "concat(Z_0..Z_7) (2, 24)", "Y = concat @ W^O (2, 4)",
                 "dL/dWO (24, 4)", "agree with finite differences", "divided by sqrt(d_k)",
                 "through the keys", "Causal variant", "Cross-entropy"):
        assert text in first
    assert "scaled by" not in first and "scaled by" not in PATH.read_text()


def test_the_worked_numbers_of_head_0_by_hand_equal_autograds(run):
    worked, out = run[0]["worked"], run[1]
    assert set(worked) == {"G_P", "G_S", "G_Q", "G_K", "G_V"}
    for by_hand, autograd in worked.values():
        np.testing.assert_allclose(by_hand, autograd, rtol=0, atol=1e-15)
    assert "r_0 = sum_j G_P[0, j] P[0, j] = (0.8516)(0.1286) + (-0.0141)(0.8714) = 0.0973" in out
    assert "G_S[1, 1] = P[1, 1] (G_P[1, 1] - r_1) = 0.2723 (-0.0542 - 0.8302) = -0.2408" in out


def test_importing_runs_nothing_and_the_script_runs_every_cell(capsys):
    import runpy
    import sys
    spec = importlib.util.spec_from_file_location("attention_walkthrough_quiet", PATH)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert capsys.readouterr().out == ""                      # the run cells are for __main__ only
    argv = sys.argv
    sys.argv = [str(PATH)]
    try:
        names = runpy.run_path(str(PATH), run_name="__main__")
    finally:
        sys.argv = argv
    out = capsys.readouterr().out
    assert {"errors", "paths", "sums", "worked", "causal", "ce"} <= set(names)
    assert out.index("== Forward, head 0") < out.index("== Worked numbers") < out.index("== Causal variant")
