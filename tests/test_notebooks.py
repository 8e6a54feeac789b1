"""The notebooks of examples/ are their `# %%` scripts (examples/make_notebooks.py
writes them, and nothing has drifted), valid nbformat 4, and run top to
bottom in a real Jupyter kernel (nbclient + ipykernel) without a cell error:
the walkthrough; the exercise with every step blank (the next hint shows,
nothing crashes) and with the solution (every gradient matches, the
capstone trains and draws its curves)."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

nbformat = pytest.importorskip("nbformat")


def make_notebooks():
    spec = importlib.util.spec_from_file_location("make_notebooks", EXAMPLES / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["attention_walkthrough.py", "backprop_ninja_attention.py"])
def test_each_notebook_is_its_script_and_valid(script):
    maker = make_notebooks()
    source = (EXAMPLES / script).read_text(encoding="utf-8")
    committed = (EXAMPLES / script).with_suffix(".ipynb").read_text(encoding="utf-8")
    assert committed == maker.text(source), f"run python examples/make_notebooks.py ({script} changed)"
    nb = nbformat.reads(committed, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)   # committed without outputs
    # every line of the script is in a cell, bar the cell markers
    body = "\n".join(line for c in nb.cells for line in c.source.splitlines())
    for line in source.splitlines():
        if line.strip() and not line.startswith("# %%"):
            assert (line[2:] if line.startswith("# ") else line).strip() in body, line
    assert "import tinygrad_attn" in body


def test_the_check_mode_finds_a_stale_notebook(tmp_path, monkeypatch, capsys):
    maker = make_notebooks()
    for script in maker.NOTEBOOKS:
        (tmp_path / script).write_text((EXAMPLES / script).read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(maker, "HERE", tmp_path)
    assert maker.main(["--check"]) == 1 and "out of date" in capsys.readouterr().out
    assert maker.main([]) == 0 and maker.main(["--check"]) == 0
    assert json.loads((tmp_path / "attention_walkthrough.ipynb").read_text())["nbformat"] == 4


def execute(name, **env):
    """Run examples/<name>.ipynb in a fresh python3 kernel started in examples/; returns its text outputs."""
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    saved = {k: os.environ.get(k) for k in (*env, "PYTHONPATH")}
    os.environ.update(env)                     # the kernel inherits this process's environment
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    return text, outputs


def test_the_walkthrough_notebook_runs_in_a_kernel():
    text, _ = execute("attention_walkthrough")
    for part in ("== Forward, head 0", "agree with finite differences", "== dL/dX along its three paths",
                 "== Why gradients sum to zero", "== Worked numbers", "== Causal variant", "== Cross-entropy"):
        assert part in text, part


def test_the_exercise_notebook_runs_with_its_blanks():
    text, _ = execute("backprop_ninja_attention", BACKPROP_NINJA_SOLUTION="0")
    assert text.count("(see docs/backprop_through_attention.md §") == 1        # the next hint only
    assert "Next: d_p." in text and "Traceback" not in text
    assert "The capstone trains the block with your steps once they all match autograd's." in text


def test_the_exercise_notebook_runs_with_the_solution():
    text, outputs = execute("backprop_ninja_attention", BACKPROP_NINJA_SOLUTION="1", BACKPROP_NINJA_STEPS="20")
    assert "Every gradient matches autograd's." in text and "(the solution)" in text
    assert "== The capstone: 20 steps of sorting, your backward against autograd's ==" in text
    assert any("image/png" in o.get("data", {}) for o in outputs if o.output_type == "display_data")
