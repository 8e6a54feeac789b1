"""See the numbers: the autograd graph with values and gradients, attention maps, gradient norms.

    dot_text = viz.graph(loss)                    # Graphviz DOT text, no extra software needed
    viz.render(loss, "graph.svg")                 # the same, drawn by Graphviz's `dot` program
    viz.attention_heatmap(weights, tokens, "attn.png")   # needs matplotlib
    viz.grad_norms(model.named_parameters())      # {name: ||grad||} after backward

The graph is drawn as micrograd draws it: one card per tensor (its name,
shape, first values and gradient), one box per op, and each arrow says which
operand of the op it is (A and B of a MatMul, Q, K and V of attention).

To see gradients in the graph, keep the graph and the gradients of the
intermediate tensors through backward, then draw:

    viz.retain_grads(loss)                        # every intermediate keeps its .grad
    loss.backward(retain_graph=True)              # backward frees the graph unless told not to
    print(viz.graph(loss))                        # the labels show each tensor's .grad

Leaves (inputs, parameters) always keep `.grad`; an intermediate tensor keeps
it only after `t.retain_grad()` (as in PyTorch), which `retain_grads` calls
for every intermediate of the graph.

The graph holds what backward needs, not the op outputs (autograd.Context):
an intermediate tensor that nothing holds any more is freed, and its card
says "data freed". To see every value, build the graph inside keep_tensors():

    with viz.keep_tensors():                      # the graph keeps every op's output
        loss = model(x)

matplotlib is imported only inside `attention_heatmap`, so `import
tinygrad_attn.viz` needs neither matplotlib nor Graphviz.
"""
import inspect
import math
import os
import shutil
import subprocess
import unicodedata
import warnings

import numpy as np

from .autograd import keep_tensors as keep_tensors  # viz.keep_tensors(): part of viz's interface
from .autograd import node_of, node_shape_dtype
from .tensor import Tensor

# ===================================================== the autograd graph

# The names of each op's tensor operands, in the order the op receives them
# (its `forward(ctx, ...)` arguments; `Op.apply(*tensors, **params)` passes the
# tensors first). Ops not listed here are labelled by their forward's own
# argument names, so this table only holds the names that read better than the
# code's: those of the formulas in the ops' docstrings.
OPERANDS = {
    "MatMul": ("A", "B"),                                   # Z = A @ B
    "LinearOp": ("x", "W", "b"),                            # y = x W^T + b
    "LayerNormOp": ("x", "w", "b"),                         # y = xhat * w + b
    "ScaledDotProductAttention": ("Q", "K", "V", "mask"),   # softmax(Q K^T * scale + M) V
    "AttentionWeights": ("Q", "K", "mask"),                 # P = softmax(Q K^T * scale + M)
    "PackedSelfAttention": ("qkv", "mask"),                 # Q, K, V side by side in one tensor
}


def operand_label(op, index):
    """What the `index`-th input of `op` (a Function subclass) is called.

    The name from `OPERANDS` if the op is listed there, else the name of that
    argument of the op's `forward` (`xs[2]` for the third of `forward(ctx,
    *xs)`), else the position itself as text ("2")."""
    names = OPERANDS.get(op.__name__, ())
    if index < len(names):
        return names[index]
    try:
        params = list(inspect.signature(op.forward).parameters.values())[1:]  # skip ctx
    except (TypeError, ValueError):
        params = []
    for position, param in enumerate(params):
        if param.kind == param.VAR_POSITIONAL:
            return f"{param.name}[{index - position}]"
        if position == index and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            return param.name
    return str(index)


def _nodes(root):
    """Every node of the graph that produced `root` (a leaf or constant
    tensor, or an op's Context: autograd.Context), each once, root first
    (depth first, so the order, and the DOT text, is the same on every run)."""
    seen, stack = set(), [node_of(root)]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if node._ctx is not None:
            stack.extend(node._ctx.parents)


def retain_grads(root):
    """Make every intermediate tensor of `root`'s graph keep its `.grad`
    through the next backward (`t.retain_grad()` on each), so that a graph
    drawn after `root.backward(retain_graph=True)` shows all the gradients
    (of the intermediates still held: by you, or by keep_tensors())."""
    for node in _nodes(root):
        if node._ctx is not None:
            node._retains_grad = True


def _number(value):
    """One value, short: 4 significant digits for floats."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{float(value):.4g}"


def preview(array, count=4):
    """The first `count` values of an array (row-major order) and how many
    more there are: "[0.5, -1, 2.25, 3, ... +12 more]"; a 0-d array is its value."""
    a = np.asarray(array)
    if a.ndim == 0:
        return _number(a.item())
    shown = [_number(v) for v in a.flat[:count]]  # .flat: no copy of a large array
    if a.size > count:
        shown.append(f"... +{a.size - count} more")
    return "[" + ", ".join(shown) + "]"


def _escape(text):
    """Text inside a double-quoted DOT string: backslashes and quotes escaped."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _field(text):
    """Text for one field of a record label: also { } | < > are escaped,
    since inside a record they would start fields and ports."""
    text = _escape(text)
    for char in "{}|<>":
        text = text.replace(char, "\\" + char)
    return text


def _grad_text(t, count):
    if t is None:
        return "grad not retained"               # a freed intermediate
    if t.grad is not None:
        return "grad " + preview(t.grad.data, count)
    if not t.requires_grad:
        return "no grad"                          # a constant: no gradient flows into it
    if t._ctx is None:
        return "grad none"                        # a leaf before any backward
    return "grad not retained"                   # intermediates drop theirs unless asked


def _tensor_fields(node, t, name, values, grads, count):
    """The lines of a node's card, top to bottom (t: its tensor, None if freed)."""
    fields = [name] if name else []
    shape, dtype = node_shape_dtype(node)
    fields.append(f"{shape if shape else 'scalar'} {dtype}")
    if values:
        fields.append("data freed" if t is None else "data " + preview(t.data, count))
    if grads:
        fields.append(_grad_text(t, count))
    elif node.requires_grad:
        fields.append("requires_grad")
    return fields


def _default_name(node):
    """A leaf without a name is a "leaf" (it requires grad) or a "constant";
    an op's result is named by the op box above it."""
    if node._ctx is not None:
        return None
    return "leaf" if node.requires_grad else "constant"


def graph(root, params=None, rankdir="BT", values=True, grads=True, count=4):
    """Graphviz DOT text of the autograd graph that produced `root`.

    Each tensor is a card (a record node): its name, shape and dtype, with
    values=True the first `count` values of `.data` ("data freed" for an
    intermediate nothing held: see keep_tensors) and with grads=True
    those of `.grad` ("grad none" before backward, "grad not retained" for an
    intermediate that did not `retain_grad()`, "no grad" for a constant).
    The name is `t.name`, or the name `params` (e.g.
    `model.named_parameters()`) gives it, or "leaf" / "constant".
    Ops are boxes; an arrow goes from each operand to its op and says which
    operand it is (`operand_label`). Leaves that require grad are filled.

    backward() frees the graph it walks: draw before it, or after
    backward(retain_graph=True) (see `retain_grads` for the gradients of
    intermediates). Node ids follow the walk, so the text is deterministic.
    """
    names = {}
    if params is not None:
        items = params.items() if isinstance(params, dict) else params
        names = {id(t): n for n, t in items}
    ids = {}

    def node_id(t):
        if id(t) not in ids:
            ids[id(t)] = f"t{len(ids)}"
        return ids[id(t)]

    lines = ["digraph autograd {", f"  rankdir={rankdir};",
             '  node [fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9, fontcolor="#555555"];']
    op_count = 0
    for node in _nodes(root):
        tid = node_id(node)
        t = node if node._ctx is None else node.output()  # None: an intermediate nothing held
        name = (t is not None and (names.get(id(t)) or t.name)) or _default_name(node)
        card = "|".join(_field(f) for f in _tensor_fields(node, t, name, values, grads, count))
        style = ', style=filled, fillcolor="#cde4ff"' if node._ctx is None and node.requires_grad else ""
        lines.append(f'  {tid} [label="{{{card}}}", shape=record{style}];')
        ctx = node._ctx
        if ctx is None:
            continue
        oid = f"op{op_count}"
        op_count += 1
        lines.append(f'  {oid} [label="{_escape(ctx.fn.__name__)}", shape=box, style=filled, '
                     'fillcolor="#eeeeee"];')
        lines.append(f"  {oid} -> {tid};")
        if ctx._freed:
            lines.append(f'  {oid}_freed [label="(graph freed by backward)", shape=plaintext];')
            lines.append(f"  {oid}_freed -> {oid} [style=dashed];")
        for index, parent in enumerate(ctx.parents):
            lines.append(f'  {node_id(parent)} -> {oid} [label="{_escape(operand_label(ctx.fn, index))}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(root, path, params=None, **options):
    """Write the graph of `root` as an image; the format comes from the file
    extension (.svg, .png, .pdf) and Graphviz's `dot` program does the drawing.
    Writes the DOT text to a .dot path without needing Graphviz. `options`
    are `graph`'s (values=, grads=, count=, rankdir=)."""
    text = graph(root, params, **options)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        raise ValueError(f"render: {path!r} has no extension to choose the format from "
                         "(use .svg, .png, .pdf, or .dot for the DOT text)")
    if ext in ("dot", "gv"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path
    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError("render: Graphviz's `dot` program was not found on PATH. Install Graphviz "
                           "(e.g. `apt install graphviz`) or save DOT text with a .dot path and "
                           "view it elsewhere (e.g. https://dreampuf.github.io/GraphvizOnline).")
    result = subprocess.run([dot, f"-T{ext}", "-o", path], input=text.encode(), capture_output=True)
    if result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"render: Graphviz's dot could not write {path} as {ext}: {message}")
    return path


# ===================================================== gradient norms

def grad_norms(named_parameters):
    """{name: L2 norm of its gradient} for every parameter that has one."""
    items = named_parameters.items() if isinstance(named_parameters, dict) else named_parameters
    return {name: float(np.sqrt(np.sum(np.square(p.grad.data, dtype=np.float64))))
            for name, p in items if p.grad is not None}


# ===================================================== attention heatmaps

# Unicode blocks of Chinese, Japanese and Korean text: radicals, CJK punctuation,
# kana, bopomofo, hangul, the ideographs, and full-width forms.
CJK_RANGES = ((0x2E80, 0x2FDF), (0x3000, 0x33FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA960, 0xA97F),
              (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))

# Fonts with Chinese (and most Japanese and Korean) characters, best first:
# what Linux distributions, macOS and Windows install under these names.
CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans CJK TC", "Noto Sans CJK JP", "Noto Sans CJK KR", "Noto Sans SC",
    "Source Han Sans SC", "Source Han Sans CN", "Source Han Sans", "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei", "Noto Serif CJK SC", "AR PL UMing CN", "AR PL UKai CN", "Droid Sans Fallback",
    "PingFang SC", "Hiragino Sans GB", "Heiti SC", "STHeiti", "Songti SC",                       # macOS
    "Microsoft YaHei", "SimHei", "SimSun", "DengXian",                                          # Windows
    "Arial Unicode MS",
)

CJK_FONT_HINT = ("install one (Debian/Ubuntu: `sudo apt install fonts-noto-cjk`; Fedora: "
                 "`sudo dnf install google-noto-sans-cjk-fonts`; conda: `conda install -c conda-forge "
                 "font-ttf-noto-cjk`; macOS and Windows come with one), or pass "
                 "font=\"/path/to/a/font.ttf\" (.otf and .ttc work too)")

_warned_no_cjk_font = False  # the hint is given once per session


def is_cjk(char):
    """Whether a character is Chinese, Japanese or Korean (`CJK_RANGES`)."""
    return any(lo <= ord(char) <= hi for lo, hi in CJK_RANGES)


def _fontconfig_cjk_files():
    """The files of the fonts that fontconfig (`fc-list`, on Linux) says
    cover Chinese, the regular weights only when there are some."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return []
    result = subprocess.run([fc_list, "--format", "%{file}|%{style}\n", ":lang=zh"],
                            capture_output=True, text=True)
    fonts = [line.rsplit("|", 1) for line in result.stdout.splitlines() if "|" in line]
    fonts = [(path, style) for path, style in fonts if path.lower().endswith((".ttf", ".otf", ".ttc"))]
    regular = [path for path, style in fonts if "Regular" in style]
    return sorted(set(regular or [path for path, _ in fonts]))


def find_cjk_font():
    """The family name of an installed font that draws Chinese characters,
    or None: the first of `CJK_FONTS` in matplotlib's font list. matplotlib
    lists the fonts it found when it first ran, so a font installed since
    then is found by asking fontconfig (`fc-list`) and added to its list."""
    from matplotlib import font_manager

    def known_family():
        installed = {entry.name for entry in font_manager.fontManager.ttflist}
        return next((family for family in CJK_FONTS if family in installed), None)

    family = known_family()
    if family is not None:
        return family
    added = []
    for path in _fontconfig_cjk_files():
        try:
            font_manager.fontManager.addfont(path)
            added.append(font_manager.FontProperties(fname=path).get_name())
        except (OSError, RuntimeError, ValueError):
            continue  # a file FreeType cannot read
    return known_family() or (added[0] if added else None)


def _missing_glyphs(chars):
    """The characters that matplotlib's default font has no glyph for."""
    from matplotlib import font_manager, ft2font

    if not chars:
        return set()
    charmap = ft2font.FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap()
    return {c for c in chars if ord(c) not in charmap}


def _choose_font(font, texts):
    """The FontProperties to draw `texts` with, or None for matplotlib's default.

    `font` is a font file (.ttf, .otf, .ttc) or a family name. Without one,
    when the default font cannot draw some CJK character of the texts, an
    installed CJK font (`find_cjk_font`) is used; if there is none, a
    warning (once per session) says how to install one.
    """
    global _warned_no_cjk_font
    from matplotlib.font_manager import FontProperties

    if font is not None:
        font = os.fspath(font)
        if os.path.isfile(font):
            return FontProperties(fname=font)
        if os.sep in font or font.lower().endswith((".ttf", ".otf", ".ttc")):
            raise FileNotFoundError(f"attention_heatmap: no font file {font!r}")
        return FontProperties(family=font)
    missing = _missing_glyphs({c for text in texts for c in text if is_cjk(c)})
    if not missing:
        return None  # no CJK text, or the default font draws it
    family = find_cjk_font()
    if family is not None:
        return FontProperties(family=family)
    if not _warned_no_cjk_font:
        _warned_no_cjk_font = True
        sample = "".join(sorted(missing)[:5])
        warnings.warn(f"attention_heatmap: no installed font has the characters {sample!r} (they would "
                      f"be drawn as empty boxes): {CJK_FONT_HINT}", stacklevel=3)
    return None


def _width(text):
    """How many columns `text` takes: a CJK character is two wide."""
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def _cell_text(value):
    return "0" if value == 0 else f"{value:.2f}"


def tight_layout(fig):
    """fig.tight_layout(), then no layout engine left on the figure. After
    tight_layout matplotlib keeps a placeholder engine, and any engine makes
    savefig lay every text out once more before drawing: for a heatmap with
    its numbers, 14% of the drawing (callgrind), for the same pixels.
    (matplotlib 3.5 has no layout engines, and no second pass.)"""
    fig.tight_layout()
    if hasattr(fig, "set_layout_engine"):
        fig.set_layout_engine(None)


def _write_numbers(ax, image, values, size):
    """Each cell's value in the cell, white on dark colours, black on light."""
    for (i, j), value in np.ndenumerate(values):
        r, g, b, _ = image.cmap(image.norm(value))
        dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5
        text = ax.text(j, i, _cell_text(value), ha="center", va="center", fontsize=size,
                       color="white" if dark else "black")
        text.set_in_layout(False)  # inside its cell: tight_layout need not measure it (-10% of a figure)


def attention_heatmap(weights, tokens=None, path=None, query_tokens=None, title=None, cmap="viridis",
                      annotate=None, font=None, max_annotated=12):
    """Draw attention weights as one heatmap per head; returns the figure.

    weights: (heads, L, S) or (L, S) (a Tensor or array; a leading batch axis
    of size 1 is dropped). tokens label the keys (columns) and, unless
    query_tokens is given, the queries (rows): entry [i, j] is how much query
    i attends to key j. Saves to `path` when given.

    annotate: write each weight in its cell (two decimals); by default
    (None) when the map is at most `max_annotated` cells wide and tall.
    Key labels stay upright when they are at most two columns wide (a CJK
    character takes two) or all fit side by side, else they turn 90 degrees.

    font: a font file (.ttf, .otf, .ttc) or family name for the tokens and
    the title. Without one, tokens in Chinese, Japanese or Korean are drawn
    with an installed CJK font (`find_cjk_font`); when none is installed, a
    warning (once) says how to install one.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("attention_heatmap needs matplotlib: pip install matplotlib (or the "
                          "package's train extra, pip install -e \".[train]\")") from e
    if path is not None:
        matplotlib.use("Agg", force=False)  # files only: works without a display
    import matplotlib.pyplot as plt

    w = weights.data if isinstance(weights, Tensor) else np.asarray(weights)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ValueError(f"attention_heatmap: expected weights of shape (heads, L, S) or (L, S), got {w.shape}")
    heads, L, S = w.shape
    keys = [str(t) for t in tokens] if tokens is not None else None
    queries = [str(t) for t in query_tokens] if query_tokens is not None else keys
    if keys is not None and len(keys) != S:
        raise ValueError(f"attention_heatmap: {len(keys)} key tokens for weights with {S} keys")
    if queries is not None and len(queries) != L:
        raise ValueError(f"attention_heatmap: {len(queries)} query tokens for weights with {L} queries")
    if annotate is None:
        annotate = max(L, S) <= max_annotated
    texts = (keys or []) + (queries or []) + ([title] if title else [])
    fontprops = _choose_font(font, texts)
    widest = max((_width(t) for t in keys), default=0) if keys else 0
    upright = widest <= 2 or S * (widest + 1) <= 40
    label_size = 9 if widest <= 4 else 7
    cell_size = 8 if max(L, S) <= 6 else 6

    with warnings.catch_warnings():
        if fontprops is None and _warned_no_cjk_font:  # said once already, and better
            warnings.filterwarnings("ignore", message="Glyph .* missing from")
        cols = min(heads, 4)
        rows = math.ceil(heads / cols)
        panel = 3.2 if not annotate or max(L, S) <= 6 else 4.2
        fig, axes = plt.subplots(rows, cols, figsize=(panel * cols, (panel - 0.2) * rows), squeeze=False)
        for h in range(rows * cols):
            ax = axes[h // cols][h % cols]
            if h >= heads:
                ax.axis("off")
                continue
            im = ax.imshow(w[h], cmap=cmap, vmin=0.0, vmax=max(float(w.max()), 1e-9))
            ax.set_title(f"head {h}", fontsize=9)
            ax.set_xlabel("key")
            ax.set_ylabel("query")
            if keys is not None:
                ax.set_xticks(range(S), keys, rotation=0 if upright else 90)
            if queries is not None:
                ax.set_yticks(range(L), queries)
            for label in ax.get_xticklabels() + ax.get_yticklabels():
                if fontprops is not None:
                    label.set_fontproperties(fontprops)
                label.set_fontsize(label_size)
            if annotate:
                _write_numbers(ax, im, w[h], cell_size)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        if title:
            fig.suptitle(title, **({} if fontprops is None else {"fontproperties": fontprops}))
        tight_layout(fig)
        if path is not None:
            fig.savefig(path, dpi=110)
            plt.close(fig)
    return fig
