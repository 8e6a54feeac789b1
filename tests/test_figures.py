"""docs/figures/make_figures.py draws the docs' figures from the code: it runs
(into a temporary directory), the graph it draws is the committed one, the
committed figures exist and the docs embed them."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    pytest.importorskip("matplotlib")
    out = tmp_path_factory.mktemp("figures")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(FIGURES / "make_figures.py"), "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    return out, run.stdout


def test_the_script_draws_every_figure_it_can(drawn):
    out, stdout = drawn
    for name in ("gradient_flow.png", "attention_gradients.png"):
        assert (out / name).read_bytes().startswith(PNG), name
    if shutil.which("dot"):
        assert (out / "attention_head.svg").read_text().lstrip().startswith("<?xml")
    else:
        assert "dot is not installed" in stdout


def test_the_committed_graph_is_what_the_code_draws(drawn):
    """The DOT text is deterministic: the committed graph (and its SVG) stays true to the code."""
    out, _ = drawn
    text = (out / "attention_head.dot").read_text()
    assert text == (FIGURES / "attention_head.dot").read_text()
    for card in ("X", "W_Q", "S = Q K^T / sqrt(d_k)", "P", "Z = P V", "L = 1/2 sum Z^2"):
        assert f'label="{{{card}|' in text, card
    for op in ("MatMul", "Exp", "Sum", "Div", "Sub"):            # the softmax, composed (reference_ops)
        assert f'label="{op}"' in text
    svg = (FIGURES / "attention_head.svg").read_text()
    for label in re.findall(r'label="\{([^|}]+)\|', text):
        assert label.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in svg, label


def test_the_docs_embed_the_committed_figures():
    doc = (ROOT / "docs" / "backprop_through_attention.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in ("attention_head.svg", "gradient_flow.png", "attention_gradients.png"):
        assert (FIGURES / name).stat().st_size > 1000, name
        assert f"(figures/{name})" in doc, name
        assert f"docs/figures/{name}" in readme, name
