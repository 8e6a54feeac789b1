"""See what autograd sees: the graph as Graphviz DOT, attention maps, gradient norms.

    dot_text = viz.graph(loss)                    # DOT source, no extra software needed
    viz.render(loss, "graph.svg")                 # needs Graphviz's `dot` program
    viz.attention_heatmap(weights, tokens, "attn.png")   # needs matplotlib
    viz.grad_norms(model.named_parameters())      # {name: ||grad||} after backward

Draw a graph before calling backward (or call backward with
retain_graph=True): backward frees the graph it walks.
"""
import math
import os
import shutil
import subprocess

import numpy as np

from .tensor import Tensor


def _escape(text):
    """Text inside a double-quoted DOT string: backslashes and quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _tensor_label(t, names):
    name = names.get(id(t)) or t.name
    shape = str(t.shape) if t.shape else "scalar"
    parts = ([_escape(str(name))] if name else []) + [f"{shape} {t.dtype}"]
    if t.requires_grad:
        parts.append("requires_grad")
    return "\\n".join(parts)


def graph(root, params=None, rankdir="BT"):
    """Graphviz DOT text of the autograd graph that produced `root`.

    Tensors are ellipses (name, shape, dtype, whether they require grad),
    ops are boxes; arrows point from inputs to outputs. Leaves that require
    grad are filled. `params` (e.g. `model.named_parameters()`) names them.
    Node ids are assigned in traversal order, so the text is deterministic.
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
             '  node [fontname="Helvetica", fontsize=10];']
    seen, stack, op_count = set(), [root], 0
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        tid = node_id(t)
        style = ', style=filled, fillcolor="#cde4ff"' if t.is_leaf and t.requires_grad else ""
        lines.append(f'  {tid} [label="{_tensor_label(t, names)}", shape=ellipse{style}];')
        ctx = t._ctx
        if ctx is None:
            continue
        oid = f"op{op_count}"
        op_count += 1
        lines.append(f'  {oid} [label="{ctx.fn.__name__}", shape=box, style=filled, fillcolor="#eeeeee"];')
        lines.append(f"  {oid} -> {tid};")
        if ctx._freed:
            lines.append(f'  {oid}_freed [label="(graph freed by backward)", shape=plaintext];')
            lines.append(f"  {oid}_freed -> {oid} [style=dashed];")
        for parent in ctx.parents:
            lines.append(f"  {node_id(parent)} -> {oid};")
            stack.append(parent)
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(root, path, params=None):
    """Write the graph of `root` as an image; the format comes from the file
    extension (.svg, .png, .pdf) and Graphviz's `dot` program does the drawing.
    Writes the DOT text to a .dot path without needing Graphviz."""
    text = graph(root, params)
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if not ext:
        raise ValueError(f"render: {path!r} has no extension to choose the format from "
                         "(use .svg, .png, .pdf, or .dot for the DOT text)")
    if ext in ("dot", "gv"):
        with open(path, "w") as f:
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


def grad_norms(named_parameters):
    """{name: L2 norm of its gradient} for every parameter that has one."""
    items = named_parameters.items() if isinstance(named_parameters, dict) else named_parameters
    return {name: float(np.sqrt(np.sum(np.square(p.grad.data, dtype=np.float64))))
            for name, p in items if p.grad is not None}


def attention_heatmap(weights, tokens=None, path=None, query_tokens=None, title=None, cmap="viridis"):
    """Draw attention weights as one heatmap per head.

    weights: (heads, L, S) or (L, S) (a Tensor or array; a leading batch axis
    of size 1 is dropped). tokens label the keys (columns) and, unless
    query_tokens is given, the queries (rows): entry [i, j] is how much query
    i attends to key j. Saves to `path` when given; returns the figure.
    """
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    w = weights.data if isinstance(weights, Tensor) else np.asarray(weights)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ValueError(f"attention_heatmap: expected weights of shape (heads, L, S) or (L, S), got {w.shape}")
    heads, L, S = w.shape
    keys = list(tokens) if tokens is not None else None
    queries = list(query_tokens) if query_tokens is not None else keys
    if keys is not None and len(keys) != S:
        raise ValueError(f"attention_heatmap: {len(keys)} key tokens for weights with {S} keys")
    if queries is not None and len(queries) != L:
        raise ValueError(f"attention_heatmap: {len(queries)} query tokens for weights with {L} queries")

    cols = min(heads, 4)
    rows = math.ceil(heads / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
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
            ax.set_xticks(range(S), [str(t) for t in keys], rotation=90, fontsize=7)
        if queries is not None:
            ax.set_yticks(range(L), [str(t) for t in queries], fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
