"""examples/backprop_ninja_attention.py: the solution matches autograd, every
blank raises with a hint naming a section of the doc, and the script runs
(and says what is left) with every step still blank."""
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def blanks(ninja):
    return {**ninja.learner_steps(), **{name: getattr(ninja, name) for name in ninja.FUSED}}


def test_forward_has_the_seed_notes_shapes_in_float64(ninja):
    values, grads = ninja.reference()
    assert values["X"].shape == (2, 4)
    assert values["Q"].shape == values["Z"].shape == (8, 2, 3)  # 8 heads of (2, 3)
    assert values["P"].shape == (8, 2, 2)
    assert values["concat"].shape == (2, 24) and values["WO"].shape == (24, 4)
    assert values["H"].shape == (2, 4) and values["loss"].shape == ()
    assert all(g.dtype == np.float64 for g in grads.values())
    np.testing.assert_allclose(values["P"].sum(-1), 1.0)


def test_the_solution_matches_autograd_to_1e_10(ninja):
    results, fused, chained = ninja.main(["--solution"], verbose=False)
    assert len(results) == len(ninja.learner_steps()) >= 39
    assert all(diff is not None and diff <= 1e-10 for diff in results.values()), results
    assert set(fused) == {"dlogits", "dR", "dscaled", "dQ", "dK", "dV"}
    assert all(diff is not None and diff <= 1e-10 for diff in fused.values()), fused
    assert chained is not None and chained <= 1e-10  # the solution's own chain, end to end


def test_every_variable_and_parameter_has_a_step(ninja):
    values, grads = ninja.reference()
    steps = {name[2:] for name in ninja.learner_steps()}
    assert steps == set(grads) - {"loss"}
    assert set(ninja.PARAMS) <= steps


def test_solution_answers_every_blank_with_the_same_arguments(ninja, solution):
    for name, fn in blanks(ninja).items():
        assert inspect.signature(getattr(solution, name)) == inspect.signature(fn), name


def test_every_blank_raises_with_a_hint_naming_a_section_of_the_doc(ninja):
    for name, fn in blanks(ninja).items():
        args = {name: None for name in inspect.signature(fn).parameters}
        with pytest.raises(NotImplementedError) as info:
            fn(**args)
        match = re.search(r"\(see docs/backprop_through_attention\.md §(\d+) (.+)\)$", str(info.value))
        assert match, (name, str(info.value))
        number, title = match.groups()
        assert f"\n## {number}. {title}\n" in DOC, (name, number, title)


def test_a_wrong_step_is_caught_and_the_steps_below_are_still_checked(ninja, solution, monkeypatch, capsys):
    monkeypatch.setattr(ninja, "d_logits", solution.d_logits)
    def d_H(dlogits, Wc):
        return dlogits @ Wc  # forgot the transpose

    monkeypatch.setattr(ninja, "d_H", d_H)
    monkeypatch.setattr(ninja, "d_Wc", solution.d_Wc)

    def d_beta(dH):
        return dH.mean(0)  # mean instead of sum: runs, but wrong

    monkeypatch.setattr(ninja, "d_beta", d_beta)
    results, fused, chained = ninja.main([])
    out = capsys.readouterr().out
    assert results["dlogits"] <= 1e-10 and results["dWc"] <= 1e-10
    assert results["dH"] == float("inf") and "dH" in out and "raised ValueError" in out
    assert results["dpicked"] is None and chained is None
    assert re.search(r"dWc +\| exact: \w+ +\| approximate: True", out)
    assert results["dbeta"] > 1e-10 and re.search(r"dbeta +\| exact: False \| approximate: False", out)


def test_the_script_runs_with_every_step_blank_and_says_what_is_left():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("BACKPROP_NINJA_SOLUTION", None)
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "dlogits         | not written: " in run.stdout
    assert "(see docs/backprop_through_attention.md §9 Cross-entropy with log-softmax)" in run.stdout
    assert "Not written yet: 39 of 39 steps, 4 of 4 fused forms. Next: d_picked." in run.stdout


def test_it_runs_as_a_notebook_cell_by_cell(monkeypatch, capsys):
    """As Jupyter (jupytext) or VS Code run it: the `# %%` cells in order, in
    one namespace, without __file__, with a kernel's own argv."""
    source = SCRIPT.read_text(encoding="utf-8")
    cells = re.split(r"^# %%.*$", source, flags=re.MULTILINE)
    assert len(cells) > 15
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "/tmp/kernel-1.json"])
    monkeypatch.setenv("BACKPROP_NINJA_SOLUTION", "1")  # so the last cell has something to show
    namespace = {"__name__": "__main__"}
    for cell in cells:
        exec(compile(cell, str(SCRIPT), "exec"), namespace)
    out = capsys.readouterr().out
    assert "Every gradient matches autograd's." in out and "(the solution)" in out
