"""examples/backprop_ninja_attention.py: the warm-ups, the whole encoder block
and the capstone. The solution matches autograd to 1e-10 and trains along
autograd's loss curve; every blank raises with a hint naming a section of
the doc; the table shows the next hint only; a step whose gradient is zero
by construction is checked where it can fail; the script runs with every
step blank."""
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .nn_helpers import ops_in_graph

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPT = EXAMPLES / "backprop_ninja_attention.py"
DOC = (ROOT / "docs" / "backprop_through_attention.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def ninja():
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("backprop_ninja_attention")


@pytest.fixture(scope="module")
def solution(ninja):
    return importlib.import_module("backprop_ninja_solution")


@pytest.fixture(scope="module")
def solved(ninja):
    """main --solution without the capstone: {part: (steps, fused, end to end)}."""
    return ninja.main(["--solution", "--no-capstone"], verbose=False)


def blanks(ninja):
    """Every function the learner writes, by name."""
    return {name: getattr(ninja, name) for spec in ninja.PARTS.values() for name in (*spec["steps"], *spec["fused"])}


def run_script(*args, env=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env or {})}
    env.pop("BACKPROP_NINJA_SOLUTION", None)
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_the_block_is_a_whole_encoder_block_with_its_input_and_loss_in_float64(ninja):
    import tinygrad_attn as tg
    params, constants = ninja.block_example()
    leaves = {k: tg.Tensor(v, requires_grad=True) for k, v in params.items()}
    tensors = ninja.block_forward(leaves, constants)
    assert {"GetItem", "MaskedFill", "Softmax", "LayerNormOp", "Gelu", "Log", "Exp"} <= ops_in_graph(tensors["loss"])
    tokens, pad = constants["tokens"], constants["pad"]
    assert tokens.shape[0] >= 2 and pad.any() and not pad[0].any()             # two sequences, one padded
    assert len(np.unique(tokens[~pad])) < (~pad).sum()                         # tokens repeat: a scatter-add
    values, grads = ninja.reference("block")
    B, T, d, H, d_k = 2, 5, 8, 4, 3
    assert values["Q"].shape == values["Z"].shape == (B, H, T, d_k) and T != d_k
    assert values["P"].shape == (B, H, T, T) and values["concat"].shape == (B, T, H * d_k)
    assert values["FF"].shape == values["H2"].shape == (B, T, d) and values["Fh"].shape == (B, T, 16)
    assert values["logits"].shape == (B, T, 6) and values["picked"].shape == ((~pad).sum(),)
    np.testing.assert_array_equal(values["P"][1][..., pad[1]], 0)             # padding keys get no weight
    assert all(g.dtype == np.float64 for g in grads.values())
    assert "lmax" not in grads                                                # detached: no gradient
    for part in ninja.PARTS:
        assert all(g.dtype == np.float64 for g in ninja.reference(part)[1].values())


def test_the_solution_matches_autograd_to_1e_10(ninja, solved):
    assert set(solved) == {"softmax", "layer_norm", "block"}
    for part, (results, fused, chained) in solved.items():
        assert len(results) == len(ninja.PARTS[part]["steps"])
        assert all(diff is not None and diff <= 1e-10 for diff in results.values()), (part, results)
        assert all(diff is not None and diff <= 1e-10 for diff in fused.values()), (part, fused)
        assert chained is not None and chained <= 1e-10, part            # the solution's own chain, end to end
    assert len(solved["block"][0]) >= 40 and set(solved["block"][1]) == {"dlogits", "dQ", "dK", "dV"}


def test_every_variable_and_parameter_has_a_step(ninja):
    for part, spec in ninja.PARTS.items():
        values, grads = ninja.reference(part)
        steps = {name[2:] for name in spec["steps"]}
        assert steps == set(grads) - {"loss"}, part
        assert set(spec["params"]) <= steps


def test_solution_answers_every_blank_with_the_same_arguments(ninja, solution):
    for name, fn in blanks(ninja).items():
        assert inspect.signature(getattr(solution, name)) == inspect.signature(fn), name


def test_every_blank_raises_with_a_hint_naming_a_section_of_the_doc(ninja):
    sections = set()
    for name, fn in blanks(ninja).items():
        args = {name: None for name in inspect.signature(fn).parameters}
        with pytest.raises(NotImplementedError) as info:
            fn(**args)
        match = re.search(r"\(see docs/backprop_through_attention\.md §(\d+a?) (.+)\)$", str(info.value))
        assert match, (name, str(info.value))
        number, title = match.groups()
        assert f"\n## {number}. {title}\n" in DOC, (name, number, title)
        sections.add(number)
    assert {"1a", "2a", "11a"} <= sections  # the max shift, the broadcast sum, the gather


def test_the_max_shift_step_is_checked_on_an_upstream_gradient_where_it_can_fail(ninja, monkeypatch, capsys):
    """Autograd's dsmax is rounding noise: a d_smax returning zeros would match it. The table
    checks it on a random upstream instead, where zeros (or the wrong sign) fail."""
    values, grads = ninja.reference("softmax")
    assert np.abs(grads["smax"]).max() < 1e-15
    for wrong in (lambda dshifted: np.zeros((3, 1)), lambda dshifted: dshifted.sum(-1, keepdims=True)):
        monkeypatch.setattr(ninja, "d_smax", wrong)
        results, _, chained = ninja.main(["--no-capstone"])["softmax"]
        assert results["dsmax"] > 1e-3
    out = capsys.readouterr().out
    assert "dsmax           | zero by construction (§2a): autograd's is rounding noise" in out
    assert "dlmax           | detached: zero gradient by construction (§2a), no step" in out


def test_a_wrong_step_is_caught_and_the_steps_below_are_still_checked(ninja, solution, monkeypatch, capsys):
    monkeypatch.setattr(ninja, "d_logits", solution.d_logits)

    def d_H2(dlogits, Wout):
        return dlogits @ Wout  # forgot the transpose

    monkeypatch.setattr(ninja, "d_H2", d_H2)
    monkeypatch.setattr(ninja, "d_Wout", solution.d_Wout)

    def d_bout(dlogits):
        return dlogits.mean((0, 1))  # mean instead of sum: runs, but wrong

    monkeypatch.setattr(ninja, "d_bout", d_bout)
    results, fused, chained = ninja.main(["--no-capstone"])["block"]
    out = capsys.readouterr().out
    assert results["dlogits"] <= 1e-10 and results["dWout"] <= 1e-10
    assert results["dH2"] == float("inf") and "dH2             | d_H2 raised ValueError" in out
    assert results["dpicked"] is None and chained is None
    assert re.search(r"dWout +\| exact: \w+ +\| approximate: True", out)
    assert results["dbout"] > 1e-10 and re.search(r"dbout +\| exact: False \| approximate: False", out)


def test_the_script_runs_with_every_step_blank_and_shows_only_the_next_hint(ninja, capsys):
    out = run_script()
    assert out.count("(see docs/backprop_through_attention.md §") == 1
    assert ("dp              | not written: loss = (p * G).sum(): the backward of a sum is a broadcast, then the "
            "product (see docs/backprop_through_attention.md §1a Sums and broadcasts") in out
    assert "dH2 .. dWemb    | not written (35 steps)" in out
    assert "The block, 42 of 42 steps and 2 of 2 fused forms.\nNext: d_p." in out
    assert "The capstone trains the block with your steps once they all match autograd's." in out
    ninja.main(["--hints", "--no-capstone"])
    every = capsys.readouterr().out
    assert every.count("(see docs/backprop_through_attention.md §") == 7 + 1 + 9 + 1 + 42 + 2


def test_the_capstone_trains_along_autograds_loss_curve(ninja, solution):
    """With the solution's steps (no autograd in the backward) the loss curve is autograd's,
    to rounding; the block learns to sort."""
    steps, _ = ninja.functions("block", solution=True)
    assert all(fn.__module__ == "backprop_ninja_solution" for fn in steps.values())
    mine, trained = ninja.train(steps, n_steps=200)
    theirs, _ = ninja.train(None, n_steps=200)
    assert len(mine) == len(theirs) == 200
    np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=1e-9)
    assert mine[-20:].mean() < mine[:20].mean() / 5
    assert ninja.held_out_accuracy(trained) > 0.5


def test_the_capstone_waits_for_every_step_and_a_wrong_one_leaves_the_curves_apart(ninja, solution, monkeypatch,
                                                                                  capsys):
    assert ninja.capstone(solution=False) is None                      # blanks: not ready
    assert "once they all match autograd's" in capsys.readouterr().out
    steps, _ = ninja.functions("block", solution=True)
    steps["d_Fh"] = lambda dFa, Fh: dFa * ninja.normal_cdf(Fh)       # gelu' without h phi(h): trained anyway
    wrong, _ = ninja.train(steps, n_steps=5)
    right, _ = ninja.train(None, n_steps=5)
    assert wrong[0] == right[0] and np.abs(wrong[1:] - right[1:]).max() > 1e-6


def test_a_step_written_for_the_tables_batch_only_is_named_before_the_capstone_trains(ninja, monkeypatch,
                                                                                      capsys):
    """d_Z with the table's sizes (2, 5) written in passes the table; the capstone's batches are
    (32, 3..5), so it names the step instead of crashing in the middle of training."""
    steps, fused = ninja.functions("block", solution=True)
    steps["d_Z"] = lambda dconcat, Z: dconcat.reshape(2, 5, 4, 3).swapaxes(1, 2)
    assert ninja.matches_autograd({"d_Z": steps["d_Z"]}, *ninja.reference("block"))
    monkeypatch.setattr(ninja, "functions", lambda part, solution=False: (steps, fused))
    assert ninja.capstone(n_steps=3) is None
    out = capsys.readouterr().out
    assert "not on a training batch (32, " in out and ": d_Z." in out
    with pytest.raises(ninja.StepError, match=r"d_Z raised ValueError on a batch of tokens \(32, \d\)"):
        ninja.train(steps, n_steps=1)


def test_the_capstone_plots_into_a_new_file_only(ninja, tmp_path, capsys):
    path = tmp_path / "loss.png"
    ninja.draw(np.array([1.0, 0.5]), np.array([1.0, 0.5]), str(path))
    assert path.stat().st_size > 1000 and "Wrote" in capsys.readouterr().out
    with pytest.raises(FileExistsError, match="exists"):
        ninja.draw(np.array([1.0]), np.array([1.0]), str(path))


def test_it_runs_as_a_notebook_cell_by_cell(monkeypatch, capsys):
    """As Jupyter (jupytext) or VS Code run it: the `# %%` cells in order, in
    one namespace, without __file__, with a kernel's own argv."""
    source = SCRIPT.read_text(encoding="utf-8")
    cells = re.split(r"^# %%.*$", source, flags=re.MULTILINE)
    assert len(cells) > 15
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "/tmp/kernel-1.json"])
    monkeypatch.setenv("BACKPROP_NINJA_SOLUTION", "1")  # so the last cell has something to show
    monkeypatch.setenv("BACKPROP_NINJA_STEPS", "10")
    namespace = {"__name__": "__main__"}
    for cell in cells:
        exec(compile(cell, str(SCRIPT), "exec"), namespace)
    out = capsys.readouterr().out
    assert "Every gradient matches autograd's." in out and "(the solution)" in out
    assert "== The capstone: 10 steps of sorting" in out
