"""viz: DOT text of a known graph, rendering through `dot`, heatmaps, gradient norms."""
import os
import stat

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import viz

EXPECTED_DOT = r'''digraph autograd {
  rankdir=BT;
  node [fontname="Helvetica", fontsize=10];
  t0 [label="scalar float32\nrequires_grad", shape=ellipse];
  op0 [label="Sum", shape=box, style=filled, fillcolor="#eeeeee"];
  op0 -> t0;
  t1 -> op0;
  t1 [label="(2,) float32\nrequires_grad", shape=ellipse];
  op1 [label="Mul", shape=box, style=filled, fillcolor="#eeeeee"];
  op1 -> t1;
  t2 -> op1;
  t3 -> op1;
  t3 [label="(2,) float32", shape=ellipse];
  t2 [label="x\n(2,) float32\nrequires_grad", shape=ellipse, style=filled, fillcolor="#cde4ff"];
}
'''


def small_graph():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    c = tg.tensor([3.0, 4.0])
    return x, (x * c).sum()


def test_dot_text_of_a_known_small_graph():
    x, loss = small_graph()
    assert viz.graph(loss, params={"x": x}) == EXPECTED_DOT


def test_dot_uses_tensor_names_and_marks_freed_graphs():
    x, loss = small_graph()
    x.name = "input"
    assert '"input\\n(2,) float32' in viz.graph(loss)
    loss.backward()
    assert "graph freed by backward" in viz.graph(loss)


def test_names_are_escaped_in_the_dot_text():
    x, loss = small_graph()
    x.name = 'say "hi" \\ bye'
    assert r'label="say \"hi\" \\ bye\n(2,) float32' in viz.graph(loss)


def test_render_without_graphviz_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    _, loss = small_graph()
    with pytest.raises(RuntimeError, match="Graphviz"):
        viz.render(loss, str(tmp_path / "g.svg"))
    # .dot output needs no Graphviz
    out = viz.render(loss, str(tmp_path / "g.dot"))
    assert open(out).read() == viz.graph(loss)
    with pytest.raises(ValueError, match="no extension"):
        viz.render(loss, str(tmp_path / "graph"))


def test_render_pipes_dot_text_to_graphviz(tmp_path, monkeypatch):
    # A stand-in `dot` that records its arguments and copies stdin to the -o file.
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\nout=$3\ncat > "$out"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _, loss = small_graph()
    out = viz.render(loss, str(tmp_path / "g.svg"))
    assert open(out).read() == viz.graph(loss)
    assert (tmp_path / "args").read_text().split()[:2] == ["-Tsvg", "-o"]


def test_grad_norms():
    a = tg.tensor([3.0, 4.0], requires_grad=True)
    b = tg.tensor([1.0], requires_grad=True)
    (a * 1).sum().backward()
    norms = viz.grad_norms({"a": a, "b": b})
    assert norms == {"a": pytest.approx(np.sqrt(2))}


def test_attention_heatmap_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    w = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 3))  # (heads, L, S)
    path = tmp_path / "attn.png"
    viz.attention_heatmap(tg.Tensor(w), tokens=["a", "b", "c"], path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="key tokens"):
        viz.attention_heatmap(w, tokens=["a", "b"], path=str(path))


def test_a_failing_graphviz_is_reported_with_its_message(tmp_path, monkeypatch):
    fake = tmp_path / "dot"
    fake.write_text('#!/bin/sh\necho \'Format: "xyz" not recognized\' >&2\nexit 1\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _, loss = small_graph()
    with pytest.raises(RuntimeError, match='could not write .*g.xyz as xyz: Format: "xyz" not recognized'):
        viz.render(loss, str(tmp_path / "g.xyz"))


@pytest.mark.skipif(not __import__("shutil").which("dot"), reason="Graphviz not installed (the fake-dot test covers the plumbing)")
def test_render_with_real_graphviz(tmp_path):
    _, loss = small_graph()
    out = viz.render(loss, str(tmp_path / "g.png"))
    assert open(out, "rb").read()[:4] == b"\x89PNG"
