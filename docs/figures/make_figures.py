"""Draw the figures of docs/backprop_through_attention.md and the README, from the code itself.

    PYTHONPATH=. python docs/figures/make_figures.py              # into docs/figures/
    PYTHONPATH=. python docs/figures/make_figures.py --out DIR    # anywhere else

attention_head.dot   the autograd graph of one attention head (section 5), drawn by
                     tinygrad_attn.viz from a real forward and backward: every value and
                     gradient on its card. Needs nothing.
attention_head.svg   the same, laid out by Graphviz's `dot` (skipped, with a note, without it).
gradient_flow.png    the size of the gradient entering each layer of 6-layer post-norm and
                     pre-norm stacks (section 8), from examples/gradient_flow.py. Needs matplotlib.
attention_gradients.png   the attention weights of the exercise's encoder block next to the
                     gradients of their scores (sections 2, 4, 5), from
                     examples/backprop_ninja_attention.py. Needs matplotlib.

tests/test_figures.py runs this script into a temporary directory and checks that the
DOT text it draws is the one committed here.
"""
import argparse
import importlib.util
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np

import tinygrad_attn as tg
import tinygrad_attn.functional as F
from tinygrad_attn import viz

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"


def example(name):
    """An example script of examples/, imported as a module."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_head_graph():
    """DOT text of one head of the seed example (2 words, d = 4, d_k = 3), its softmax
    composed from primitive ops (reference_ops), after backward from L = 1/2 sum(Z^2)."""
    rng = np.random.default_rng(10)
    X = tg.Tensor(rng.normal(size=(2, 4)), requires_grad=True)
    weights = {name: tg.Tensor(rng.normal(scale=0.8, size=(4, 3)), requires_grad=True)
               for name in ("W_Q", "W_K", "W_V")}
    with viz.keep_tensors(), tg.reference_ops():       # keep every value; softmax as exp, sum, div
        Q, K, V = (X @ weights[f"W_{n}"] for n in "QKV")
        S = Q @ K.swapaxes(-1, -2) / math.sqrt(3)       # the scaled scores
        P = F.softmax(S, dim=-1)                        # the attention weights
        Z = P @ V
        loss = (Z * Z).sum() * 0.5
    for t, name in ((X, "X"), (Q, "Q"), (K, "K"), (V, "V"), (S, "S = Q K^T / sqrt(d_k)"), (P, "P"),
                    (Z, "Z = P V"), (loss, "L = 1/2 sum Z^2"), *((w, n) for n, w in weights.items())):
        t.name = name
    viz.retain_grads(loss)
    loss.backward(retain_graph=True)
    return viz.graph(loss, count=2)


def gradient_flow_figure(path):
    """|dL/dh| entering each layer, top to bottom, for the four stacks of gradient_flow.py."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    flow = example("gradient_flow")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    styles = {"post-norm": ("C0", "-"), "pre-norm": ("C1", "-"),
              "post-norm, no residual": ("C0", ":"), "pre-norm, no residual": ("C1", ":")}
    for name, (norm_first, residual) in flow.STACKS.items():
        r = flow.stack_gradients(norm_first, residual)
        norms = [r["top_norm"]] + r["entering"][::-1]           # the top, then layers 5 .. 0
        color, line = styles[name]
        ax.plot(range(len(norms)), norms, line, color=color, marker="o", ms=3, label=name)
    ax.set_xticks(range(flow.LAYERS + 1), ["top"] + [f"into {i}" for i in range(flow.LAYERS - 1, 0, -1)] + ["x"])
    ax.set_xlabel("where the gradient is measured: the top, entering layer 5 .. 1, the input x")
    ax.set_ylabel("|dL/dh| (the gradient's norm)")
    ax.set_yscale("log")
    ax.set_title(f"One gradient on its way down {flow.LAYERS}-layer encoder stacks", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def attention_gradients_figure(path):
    """For the exercise's second sequence (3 symbols, 2 padding positions), each head's
    attention weights P and the gradient of its scaled scores, dL/dS."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ninja = example("backprop_ninja_attention")
    values, grads = ninja.reference("block")
    b = 1                                                        # the padded sequence
    tokens = [ninja.TASK.decode([t])[0] if t else "pad" for t in values["tokens"][b]]
    P, G = values["P"][b], grads["scaled"][b]                    # (heads, T, T) each
    heads = P.shape[0]
    fig, axes = plt.subplots(2, heads, figsize=(2.4 * heads, 5.0))
    g_max = np.abs(G).max()
    for h in range(heads):
        for row, (data, cmap, lo, hi, fmt) in enumerate(((P[h], "viridis", 0, 1, "{:.2f}"),
                                                        (G[h] / g_max, "RdBu_r", -1, 1, "{:+.2f}"))):
            ax = axes[row, h]
            ax.imshow(data, cmap=cmap, vmin=lo, vmax=hi)
            for i in range(data.shape[0]):
                for j in range(data.shape[1]):
                    ax.text(j, i, fmt.format(data[i, j]), ha="center", va="center", fontsize=6,
                            color="white" if (data[i, j] < 0.6 if row == 0 else abs(data[i, j]) > 0.6) else "black")
            ax.set_xticks(range(len(tokens)), tokens, fontsize=7)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
            ax.set_title(f"head {h}: " + ("P" if row == 0 else "dL/dS"), fontsize=9)
            if h == 0:
                ax.set_ylabel("query")
            ax.set_xlabel("key", fontsize=8)
    fig.suptitle(f"Attention weights (top) and the gradients of their scores (bottom, / {g_max:.1e}), "
                 "the exercise's padded sequence", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Draw the docs' figures from the code.")
    parser.add_argument("--out", default=str(HERE), help=f"directory to write into (default {HERE})")
    out = Path(parser.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    dot_text = attention_head_graph()
    (out / "attention_head.dot").write_text(dot_text, encoding="utf-8")
    written.append("attention_head.dot")
    dot = shutil.which("dot")
    if dot:
        subprocess.run([dot, "-Tsvg", "-o", str(out / "attention_head.svg")], input=dot_text.encode(),
                       check=True)
        written.append("attention_head.svg")
    else:
        print("Graphviz's dot is not installed: attention_head.svg not drawn (the .dot has the graph)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: the .png figures not drawn")
    else:
        gradient_flow_figure(out / "gradient_flow.png")
        attention_gradients_figure(out / "attention_gradients.png")
        written += ["gradient_flow.png", "attention_gradients.png"]
    print(f"Wrote {', '.join(written)} in {out}")
    return written


if __name__ == "__main__":
    main()
