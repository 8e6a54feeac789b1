"""viz: the graph's cards against .data and .grad, operand labels, rendering
through `dot`, attention heatmaps (numbers, labels, fonts), gradient norms."""
import inspect
import os
import re
import shutil
import stat
import sys
import subprocess
import warnings

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import viz

EXPECTED_DOT = r'''digraph autograd {
  rankdir=BT;
  node [fontname="Helvetica", fontsize=10];
  edge [fontname="Helvetica", fontsize=9, fontcolor="#555555"];
  t0 [label="{scalar float32|data 11|grad not retained}", shape=record];
  op0 [label="Sum", shape=box, style=filled, fillcolor="#eeeeee"];
  op0 -> t0;
  t1 -> op0 [label="x"];
  t1 [label="{(2,) float32|data freed|grad not retained}", shape=record];
  op1 [label="Mul", shape=box, style=filled, fillcolor="#eeeeee"];
  op1 -> t1;
  t2 -> op1 [label="x"];
  t3 -> op1 [label="y"];
  t3 [label="{constant|(2,) float32|data [3, 4]|no grad}", shape=record];
  t2 [label="{x|(2,) float32|data [1, 2]|grad none}", shape=record, style=filled, fillcolor="#cde4ff"];
}
'''


def small_graph():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    c = tg.tensor([3.0, 4.0])
    return x, (x * c).sum()


# ------------------------------------------------ reading the DOT text back

def cards(dot):
    """{node id: the fields of its record label, unescaped}."""
    found = {}
    for node, label in re.findall(r'^  (t\d+) \[label="\{(.*)\}", shape=record', dot, re.M):
        fields = re.split(r"(?<!\\)\|", label)
        found[node] = [re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), f) for f in fields]
    return found


def card_of(dot, name):
    """The fields of the card whose first field is `name`."""
    matches = [fields for fields in cards(dot).values() if fields[0] == name]
    assert len(matches) == 1, (name, matches)
    return matches[0]


def node_of(dot, name):
    return next(node for node, fields in cards(dot).items() if fields[0] == name)


def edges_into_op(dot, op_name):
    """[(source card name, edge label)] of the arrows into the (single) op box `op_name`."""
    op = re.search(rf'^  (op\d+) \[label="{op_name}"', dot, re.M).group(1)
    names = {node: fields[0] for node, fields in cards(dot).items()}
    return [(names[src], label) for src, label in re.findall(rf'^  (t\d+) -> {op} \[label="([^"]*)"\];', dot, re.M)]


def numbers(field, prefix):
    """'grad [0.5, -1, ... +3 more]' -> ([0.5, -1.0], 3); 'grad 2' -> ([2.0], 0)."""
    assert field.startswith(prefix + " "), (field, prefix)
    body = field[len(prefix) + 1:]
    more = re.search(r"\.\.\. \+(\d+) more", body)
    values = re.sub(r",? ?\.\.\. \+\d+ more", "", body).strip("[]")
    return [float(v) for v in values.split(", ") if v], int(more.group(1)) if more else 0


def assert_shows(field, prefix, array):
    shown, more = numbers(field, prefix)
    flat = np.asarray(array, dtype=np.float64).ravel()
    assert more == max(flat.size - 4, 0)
    np.testing.assert_allclose(shown, flat[:4], rtol=1e-3, atol=1e-6)


def named_mlp():
    """loss = sum(relu(x @ W + b) * 0.5), every tensor named after itself."""
    rng = np.random.default_rng(0)
    x = tg.Tensor(rng.standard_normal((2, 3)).astype(np.float32))
    W = tg.Tensor(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    b = tg.Tensor(rng.standard_normal(5).astype(np.float32), requires_grad=True)
    z = x @ W + b
    h = z.relu()
    loss = (h * 0.5).sum()
    tensors = dict(x=x, W=W, b=b, z=z, h=h, loss=loss)
    for name, t in tensors.items():
        t.name = name
    return tensors


# ------------------------------------------------ the graph's cards

def test_dot_text_of_a_known_small_graph():
    x, loss = small_graph()
    assert viz.graph(loss, params={"x": x}) == EXPECTED_DOT


def test_the_graph_frees_intermediates_nobody_holds_unless_told_to_keep_them():
    """x * c is a temporary: the graph keeps its shape and dtype, not its data
    ("data freed"); built inside keep_tensors() its values are drawn."""
    with viz.keep_tensors():
        x, loss = small_graph()
    kept = viz.graph(loss, params={"x": x})
    assert kept == EXPECTED_DOT.replace("data freed", "data [3, 8]")
    _, loss = small_graph()
    assert viz.graph(loss).count("data freed") == 1


def test_cards_show_the_values_of_data():
    t = named_mlp()
    dot = viz.graph(t["loss"])
    for name in ("x", "W", "b", "z", "h", "loss"):
        fields = card_of(dot, name)
        assert fields[1] == f"{t[name].shape if t[name].shape else 'scalar'} float32"
        assert_shows(fields[2], "data", t[name].data)


def test_before_backward_no_card_has_a_gradient():
    t = named_mlp()
    dot = viz.graph(t["loss"])
    assert card_of(dot, "W")[-1] == "grad none"          # a leaf: backward has not run
    assert card_of(dot, "h")[-1] == "grad not retained"  # an intermediate
    assert card_of(dot, "x")[-1] == "no grad"            # requires no grad
    constant = [f for f in cards(dot).values() if f[0] == "constant"]  # the 0.5
    assert constant == [["constant", "scalar float32", "data 0.5", "no grad"]]


def test_after_backward_with_retain_graph_leaves_show_their_grad():
    t = named_mlp()
    t["loss"].backward(retain_graph=True)
    dot = viz.graph(t["loss"])
    for name in ("W", "b"):
        assert_shows(card_of(dot, name)[-1], "grad", t[name].grad.data)
    assert card_of(dot, "z")[-1] == "grad not retained"
    assert "graph freed" not in dot


def test_retain_grads_shows_every_gradient_and_matches_dot_grad():
    t = named_mlp()
    viz.retain_grads(t["loss"])
    t["loss"].backward(retain_graph=True)
    dot = viz.graph(t["loss"])
    for name in ("W", "b", "z", "h", "loss"):
        assert t[name].grad is not None, name
        assert_shows(card_of(dot, name)[-1], "grad", t[name].grad.data)
    assert card_of(dot, "loss")[-1] == "grad 1"
    # and the gradients are right: dloss/dz = 0.5 where z > 0
    np.testing.assert_allclose(t["z"].grad.data, 0.5 * (t["z"].data > 0))


def test_values_false_and_grads_false_leave_them_out():
    t = named_mlp()
    t["loss"].backward(retain_graph=True)
    dot = viz.graph(t["loss"], values=False, grads=False)
    assert "|data " not in dot and "|grad " not in dot
    assert card_of(dot, "W") == ["W", "(3, 5) float32", "requires_grad"]
    assert card_of(dot, "x") == ["x", "(2, 3) float32"]
    only_values = viz.graph(t["loss"], grads=False)
    assert card_of(only_values, "W")[1:] == ["(3, 5) float32", "data " + viz.preview(t["W"].data),
                                             "requires_grad"]
    only_grads = viz.graph(t["loss"], values=False)
    assert card_of(only_grads, "W")[1:] == ["(3, 5) float32", "grad " + viz.preview(t["W"].grad.data)]


def test_count_sets_how_many_values_a_card_shows():
    t = named_mlp()
    assert card_of(viz.graph(t["loss"], count=2), "W")[2] == "data " + viz.preview(t["W"].data, 2)
    assert viz.preview(t["W"].data, 2).endswith("... +13 more]")


def test_preview_formats():
    assert viz.preview(np.arange(10.0)) == "[0, 1, 2, 3, ... +6 more]"
    assert viz.preview(np.array([0.123456, -2.5e-7])) == "[0.1235, -2.5e-07]"
    assert viz.preview(np.float32(3.25)) == "3.25"
    assert viz.preview(np.array([True, False])) == "[True, False]"
    assert viz.preview(np.array([7, -1], dtype=np.int64)) == "[7, -1]"
    assert viz.preview(np.zeros((0, 3))) == "[]"
    assert viz.preview(np.array([np.nan, np.inf])) == "[nan, inf]"


def test_names_come_from_the_tensor_params_or_a_default_and_freed_graphs_are_marked():
    x, loss = small_graph()
    x.name = "input"
    assert '"{input|(2,) float32' in viz.graph(loss)
    assert '"{weight|(2,) float32' in viz.graph(loss, params=[("weight", x)])  # params win
    x.name = None
    assert '"{leaf|(2,) float32' in viz.graph(loss)
    loss.backward()
    assert "graph freed by backward" in viz.graph(loss)


def test_names_are_escaped_in_the_dot_text():
    x, loss = small_graph()
    x.name = 'say "hi" \\ {a|b} <c>\nnext'
    dot = viz.graph(loss)
    assert r'label="{say \"hi\" \\ \{a\|b\} \<c\>\nnext|(2,) float32' in dot
    assert card_of(dot, x.name)[1] == "(2,) float32"  # read back: one field, the same text


# ------------------------------------------------ which operand an arrow is

def test_matmul_edges_say_a_and_b():
    a = tg.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    b = tg.Tensor(np.ones((3, 4), np.float32), requires_grad=True)
    a.name, b.name = "left", "right"
    assert edges_into_op(viz.graph(a @ b), "MatMul") == [("left", "A"), ("right", "B")]
    c = tg.Tensor(np.ones((4, 2), np.float32), requires_grad=True)
    c.name = "first"
    assert sorted(edges_into_op(viz.graph(c @ a), "MatMul")) == [("first", "A"), ("left", "B")]


def test_attention_edges_say_q_k_v_and_mask():
    rng = np.random.default_rng(1)
    q, k, v = (tg.Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32), requires_grad=True) for _ in "qkv")
    q.name, k.name, v.name = "query", "key", "value"
    mask = tg.Tensor(np.zeros((3, 3), np.float32))
    mask.name = "bias"
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert sorted(edges_into_op(viz.graph(out), "ScaledDotProductAttention")) == [
        ("bias", "mask"), ("key", "K"), ("query", "Q"), ("value", "V")]
    # self-attention: one tensor is all three
    same = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert sorted(edges_into_op(viz.graph(same), "ScaledDotProductAttention")) == [
        ("query", "K"), ("query", "Q"), ("query", "V")]
    # the weights, as a differentiable output, depend on Q, K and the mask
    _, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, need_weights=True)
    assert sorted(edges_into_op(viz.graph(weights), "AttentionWeights")) == [
        ("bias", "mask"), ("key", "K"), ("query", "Q")]


def test_linear_packed_attention_and_cat_edges():
    rng = np.random.default_rng(2)
    x = tg.Tensor(rng.standard_normal((1, 3, 4)).astype(np.float32), requires_grad=True)
    W = tg.Tensor(rng.standard_normal((12, 4)).astype(np.float32), requires_grad=True)
    b = tg.Tensor(np.zeros(12, np.float32), requires_grad=True)
    x.name, W.name, b.name = "input", "weight", "bias"
    qkv = F.linear(x, W, b)
    qkv.name = "packed"
    assert edges_into_op(viz.graph(qkv), "LinearOp") == [("input", "x"), ("weight", "W"), ("bias", "b")]
    out = F.packed_self_attention(qkv, num_heads=2, is_causal=True)
    assert edges_into_op(viz.graph(out), "PackedSelfAttention") == [("packed", "qkv")]
    y = tg.cat([x, x * 2], 0)
    assert [label for _, label in edges_into_op(viz.graph(y), "Cat")] == ["xs[0]", "xs[1]"]
    cond = tg.Tensor(np.array([True, False]))
    cond.name = "cond"
    picked = tg.where(cond, b[:2], b[2:4])
    assert [label for _, label in edges_into_op(viz.graph(picked), "Where")] == ["cond", "x", "y"]


def test_every_registered_op_has_a_label_for_each_operand():
    """Every op gets distinct labels, from OPERANDS or from its forward's
    arguments; OPERANDS names only real ops, each label in the place of the
    forward argument it stands for (A for a, W for weight, mask for attn_mask)."""
    assert tg.Function.registry  # the ops registered themselves
    for name, op in sorted(tg.Function.registry.items()):
        params = list(inspect.signature(op.forward).parameters.values())[1:]
        varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        count = 3 if varargs else len(params)
        labels = [viz.operand_label(op, i) for i in range(count)]
        assert all(labels) and len(set(labels)) == count, (name, labels)
    for name, labels in viz.OPERANDS.items():
        assert name in tg.Function.registry, f"OPERANDS lists {name}, which is not an op"
        params = list(inspect.signature(tg.Function.registry[name].forward).parameters)[1:]
        for label, param in zip(labels, params, strict=False):
            assert label.lower() in param.lower(), (name, label, param)
        assert len(labels) <= len(params)


def test_an_unlisted_op_falls_back_to_its_forward_arguments_then_positions():
    class Blend(tg.Function):  # defined outside tinygrad_attn.ops: not registered
        @staticmethod
        def forward(ctx, first, second, ratio=0.5):
            return first * ratio + second * (1 - ratio)

    class Pile(tg.Function):
        @staticmethod
        def forward(ctx, *parts):
            return sum(parts)

    assert "Blend" not in tg.Function.registry
    assert [viz.operand_label(Blend, i) for i in range(4)] == ["first", "second", "ratio", "3"]
    assert [viz.operand_label(Pile, i) for i in range(2)] == ["parts[0]", "parts[1]"]
    a = tg.Tensor(np.ones(2, np.float32), requires_grad=True)
    b = a * 3
    a.name, b.name = "a", "b"
    assert edges_into_op(viz.graph(Blend.apply(a, b, ratio=0.25)), "Blend") == [("a", "first"), ("b", "second")]


# ------------------------------------------------ render

def test_render_without_graphviz_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no `dot` here
    _, loss = small_graph()
    with pytest.raises(RuntimeError, match="Graphviz"):
        viz.render(loss, str(tmp_path / "g.svg"))
    # .dot output needs no Graphviz
    out = viz.render(loss, str(tmp_path / "g.dot"))
    assert open(out).read() == viz.graph(loss)
    out = viz.render(loss, str(tmp_path / "v.dot"), values=False, grads=False)
    assert open(out).read() == viz.graph(loss, values=False, grads=False)
    with pytest.raises(ValueError, match="no extension"):
        viz.render(loss, str(tmp_path / "graph"))


def fake_dot(tmp_path, monkeypatch, script):
    """Put a shell script named `dot` first on PATH: a stand-in for Graphviz."""
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_render_pipes_dot_text_to_graphviz(tmp_path, monkeypatch):
    # A stand-in `dot` that records its arguments and copies stdin to the -o file.
    fake_dot(tmp_path, monkeypatch, 'echo "$@" > "$(dirname "$0")/args"\nout=$3\ncat > "$out"\n')
    _, loss = small_graph()
    out = viz.render(loss, str(tmp_path / "g.svg"))
    assert open(out).read() == viz.graph(loss)
    assert (tmp_path / "args").read_text().split()[:2] == ["-Tsvg", "-o"]


def test_a_failing_graphviz_is_reported_with_its_message(tmp_path, monkeypatch):
    fake_dot(tmp_path, monkeypatch, 'echo \'Format: "xyz" not recognized\' >&2\nexit 1\n')
    _, loss = small_graph()
    with pytest.raises(RuntimeError, match='could not write .*g.xyz as xyz: Format: "xyz" not recognized'):
        viz.render(loss, str(tmp_path / "g.xyz"))


@pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz not installed (the fake-dot test covers the plumbing)")
def test_render_with_real_graphviz(tmp_path):
    t = named_mlp()
    viz.retain_grads(t["loss"])
    t["loss"].backward(retain_graph=True)
    t["W"].name = 'odd {name} | <with> "quotes" \\'  # the escaping holds up in Graphviz's parser
    out = viz.render(t["loss"], str(tmp_path / "g.png"))
    assert open(out, "rb").read()[:4] == b"\x89PNG"
    svg = open(viz.render(t["loss"], str(tmp_path / "g.svg")), encoding="utf-8").read()
    assert "odd {name} | &lt;with&gt; &quot;quotes&quot; \\" in svg
    assert "grad " + viz.preview(t["h"].grad.data) in svg


def test_grad_norms():
    a = tg.tensor([3.0, 4.0], requires_grad=True)
    b = tg.tensor([1.0], requires_grad=True)
    (a * 1).sum().backward()
    norms = viz.grad_norms({"a": a, "b": b})
    assert norms == {"a": pytest.approx(np.sqrt(2))}


# ------------------------------------------------ attention heatmaps

# The notes' example sentences: "I love natural language processing", one
# token per character, and "sunlight lit up the room", one per word.
LOVE_NLP = list("我爱自然语言处理")
SUNLIGHT = ["阳光", "照亮", "了", "房间"]


@pytest.fixture
def plt():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    yield plt
    plt.close("all")


def panels(fig):
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.images]


def cell_values(ax):
    """{(row, col): number written in that cell}."""
    return {(round(t.get_position()[1]), round(t.get_position()[0])): float(t.get_text()) for t in ax.texts}


def test_attention_heatmap_writes_a_png(tmp_path, plt):
    w = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 3))  # (heads, L, S)
    path = tmp_path / "attn.png"
    viz.attention_heatmap(tg.Tensor(w), tokens=["a", "b", "c"], path=str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="key tokens"):
        viz.attention_heatmap(w, tokens=["a", "b"], path=str(path))


def test_small_maps_have_their_numbers_in_the_cells(plt):
    w = np.random.default_rng(3).dirichlet(np.ones(4), size=(2, 3))  # 2 heads, 3 queries, 4 keys
    w[0, 0, 1] = 0.0
    fig = viz.attention_heatmap(w, tokens=list("abcd"), query_tokens=list("xyz"))
    heads = panels(fig)
    assert len(heads) == 2
    for h, ax in enumerate(heads):
        shown = cell_values(ax)
        assert sorted(shown) == [(i, j) for i in range(3) for j in range(4)]
        for (i, j), value in shown.items():
            assert value == pytest.approx(w[h, i, j], abs=0.005)
    assert [t.get_text() for t in heads[0].texts][1] == "0"  # an exact zero is written "0"


def test_saving_a_heatmap_draws_it_once(plt, tmp_path, monkeypatch):
    """Its layout is done when it is returned: savefig does not lay out every
    text again (viz.tight_layout), and the cell numbers are not measured."""
    import matplotlib.figure
    fig = viz.attention_heatmap(np.full((2, 11, 11), 1 / 11), tokens=list("abcdefghijk"))
    assert all(not t.get_in_layout() for t in panels(fig)[0].texts)
    draws, draw = [], matplotlib.figure.Figure.draw
    monkeypatch.setattr(matplotlib.figure.Figure, "draw", lambda self, r: draws.append(r) or draw(self, r))
    fig.savefig(tmp_path / "map.png", dpi=50)
    assert len(draws) == 1


def test_numbers_are_off_for_large_maps_unless_forced(plt):
    w = np.full((13, 13), 1 / 13)
    assert len(panels(viz.attention_heatmap(w))[0].texts) == 0
    assert len(panels(viz.attention_heatmap(w, annotate=True))[0].texts) == 169
    assert len(panels(viz.attention_heatmap(np.eye(3), annotate=False))[0].texts) == 0
    assert len(panels(viz.attention_heatmap(np.full((13, 13), 1 / 13), max_annotated=13))[0].texts) == 169


def test_short_key_labels_stay_upright_long_ones_turn(plt, monkeypatch):
    monkeypatch.setattr(viz, "find_cjk_font", lambda: None)
    monkeypatch.setattr(viz, "_warned_no_cjk_font", True)  # no CJK font needed for this test

    def rotations(tokens):
        ax = panels(viz.attention_heatmap(np.full((len(tokens),) * 2, 1 / len(tokens)), tokens))[0]
        return {label.get_rotation() for label in ax.get_xticklabels()}

    assert rotations(list("abcdefghijklmnopqrstuvwxyz")) == {0}  # single characters: never rotated
    assert rotations(LOVE_NLP) == {0}
    assert rotations(SUNLIGHT) == {0}
    assert rotations(["sunlight", "lit", "the", "room"]) == {0}  # they fit side by side
    assert rotations("the quick brown fox jumps over the lazy dog again".split()) == {90}


def test_the_font_search_finds_a_cjk_font_in_matplotlibs_list(monkeypatch):
    font_manager = pytest.importorskip("matplotlib.font_manager")
    bundled = [e for e in font_manager.fontManager.ttflist if "mpl-data" in e.fname]
    fake = [font_manager.FontEntry(fname="/fonts/simhei.ttf", name="SimHei"),
            font_manager.FontEntry(fname="/fonts/wqy-zenhei.ttc", name="WenQuanYi Zen Hei")]
    monkeypatch.setattr(viz, "_fontconfig_cjk_files", lambda: [])
    monkeypatch.setattr(font_manager.fontManager, "ttflist", bundled + fake)
    assert viz.find_cjk_font() == "WenQuanYi Zen Hei"  # CJK_FONTS' order, not the list's
    prop = viz._choose_font(None, LOVE_NLP)
    assert prop.get_family() == ["WenQuanYi Zen Hei"]
    assert viz._choose_font(None, ["a", "b"]) is None  # no CJK: matplotlib's default font
    monkeypatch.setattr(font_manager.fontManager, "ttflist", bundled)
    assert viz.find_cjk_font() is None


def test_the_font_search_asks_fontconfig_for_fonts_matplotlib_has_not_seen(monkeypatch):
    """A font installed after matplotlib built its font list is found through fc-list."""
    font_manager = pytest.importorskip("matplotlib.font_manager")
    bundled = [e for e in font_manager.fontManager.ttflist if "mpl-data" in e.fname]
    dejavu = next(e.fname for e in bundled if e.name == "DejaVu Sans")
    monkeypatch.setattr(font_manager.fontManager, "ttflist", list(bundled))
    monkeypatch.setattr(viz, "_fontconfig_cjk_files", lambda: ["/no/such/font.ttc", dejavu])
    assert viz.find_cjk_font() == "DejaVu Sans"  # the readable file, now in matplotlib's list too
    assert sum(e.fname == dejavu for e in font_manager.fontManager.ttflist) == 2


def test_without_a_cjk_font_one_warning_says_how_to_install_one(plt, monkeypatch):
    font_manager = pytest.importorskip("matplotlib.font_manager")
    bundled = [e for e in font_manager.fontManager.ttflist if "mpl-data" in e.fname]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", bundled)
    monkeypatch.setattr(viz, "_fontconfig_cjk_files", lambda: [])
    monkeypatch.setattr(viz, "_warned_no_cjk_font", False)
    w = np.full((1, 4, 4), 0.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = viz.attention_heatmap(w, SUNLIGHT)
        fig.savefig(os.devnull, format="png")
        viz.attention_heatmap(w, SUNLIGHT)
    messages = [str(c.message) for c in caught]
    ours = [m for m in messages if "no installed font" in m]
    assert len(ours) == 1, messages
    assert "apt install fonts-noto-cjk" in ours[0] and "font=" in ours[0]


def test_font_accepts_a_file_or_a_family(plt, monkeypatch):
    font_manager = pytest.importorskip("matplotlib.font_manager")
    path = next(e.fname for e in font_manager.fontManager.ttflist if e.name == "DejaVu Serif")
    monkeypatch.setattr(viz, "_warned_no_cjk_font", True)
    ax = panels(viz.attention_heatmap(np.eye(2), ["a", "b"], font=path))[0]
    assert {label.get_fontproperties().get_file() for label in ax.get_xticklabels()} == {path}
    ax = panels(viz.attention_heatmap(np.eye(2), ["a", "b"], font="DejaVu Serif"))[0]
    assert {tuple(label.get_fontproperties().get_family()) for label in ax.get_yticklabels()} == {("DejaVu Serif",)}
    with pytest.raises(FileNotFoundError, match="no font file"):
        viz.attention_heatmap(np.eye(2), ["a", "b"], font="/no/such/font.ttf")


def test_a_font_without_the_characters_gives_glyph_warnings(plt):
    """Negative control for the test below: the warning it looks for is real."""
    font_manager = pytest.importorskip("matplotlib.font_manager")
    dejavu = next(e.fname for e in font_manager.fontManager.ttflist if e.name == "DejaVu Sans")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = viz.attention_heatmap(np.full((4, 4), 0.25), SUNLIGHT, font=dejavu)
        fig.savefig(os.devnull, format="png")
    assert any("Glyph" in str(c.message) and "missing" in str(c.message) for c in caught)


def _cjk_font_installed():
    fc_list = shutil.which("fc-list")
    return bool(fc_list and subprocess.run([fc_list, ":lang=zh"], capture_output=True, text=True).stdout.strip())


@pytest.mark.skipif(not _cjk_font_installed(), reason="no CJK font installed (`fc-list :lang=zh` lists none)")
def test_chinese_tokens_render_with_an_installed_cjk_font(plt, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = viz.attention_heatmap(np.full((1, 8, 8), 1 / 8), LOVE_NLP, title="我爱自然语言处理")
        fig.savefig(tmp_path / "love.png")
        fig = viz.attention_heatmap(np.full((4, 4), 0.25), SUNLIGHT, str(tmp_path / "sunlight.png"))
    problems = [str(c.message) for c in caught if "Glyph" in str(c.message) or "font" in str(c.message)]
    assert problems == []
    family = viz.find_cjk_font()
    assert family is not None
    ax = panels(viz.attention_heatmap(np.eye(2), ["我", "爱"]))[0]
    assert {tuple(label.get_fontproperties().get_family()) for label in ax.get_xticklabels()} == {(family,)}


def test_importing_viz_imports_no_matplotlib_and_a_missing_one_is_a_clear_error(monkeypatch):
    code = "import sys, tinygrad_attn.viz; print('matplotlib' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.stdout.strip() == "False", result.stderr
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match="needs matplotlib: pip install matplotlib"):
        viz.attention_heatmap(np.eye(2))
