"""PNG outputs of a run: the loss curve and attention heatmaps (matplotlib, Agg).

Imported only when plots are written, so `import tinygrad_attn` never pulls
in matplotlib.
"""
import os

import numpy as np

from .. import viz


def _pyplot():
    import matplotlib
    matplotlib.use("Agg", force=False)  # files only: works without a display
    import matplotlib.pyplot as plt
    return plt


def loss_curve(history, path, title=None):
    """Training loss per step (raw and smoothed) and evaluation loss, plus
    the exact-match accuracy on a second axis when the history has it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    train = np.array([(step, loss) for step, loss, _ in history["train"]], dtype=np.float64).reshape(-1, 2)
    if len(train):
        ax.plot(train[:, 0], train[:, 1], color="tab:blue", alpha=0.25, linewidth=0.8)
        ax.plot(train[:, 0], _ema(train[:, 1]), color="tab:blue", label="train loss (smoothed)")
    evals = [e for e in history["eval"] if "val_loss" in e]
    if evals:
        ax.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", color="tab:orange",
                label="eval loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    if len(train) and train[:, 1].min() > 0 and train[:, 1].max() / train[:, 1].min() > 20:
        ax.set_yscale("log")
    handles, labels = ax.get_legend_handles_labels()
    accuracy = [e for e in history["eval"] if "exact_match" in e]
    if accuracy:
        ax2 = ax.twinx()
        ax2.plot([e["step"] for e in accuracy], [e["exact_match"] for e in accuracy], "s--",
                 color="tab:green", label="eval exact match")
        ax2.set_ylabel("exact match")
        ax2.set_ylim(-0.02, 1.02)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="center right" if accuracy else "upper right")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ema(values, beta=0.9):
    """Exponential moving average with bias correction (as Adam's)."""
    out, avg = np.empty_like(values), 0.0
    for i, v in enumerate(values):
        avg = beta * avg + (1 - beta) * v
        out[i] = avg / (1 - beta ** (i + 1))
    return out


def attention_heatmaps(maps, directory):
    """One PNG per attention layer (a panel per head) in `directory`.

    maps: [(layer name, weights (heads, L, S), key tokens, query tokens, title)].
    Returns the paths written.
    """
    os.makedirs(directory, exist_ok=True)
    plt = _pyplot()
    paths = []
    for name, weights, keys, queries, title in maps:
        path = os.path.join(directory, f"{name}.png")
        viz.attention_heatmap(weights, keys, path, query_tokens=queries, title=title)
        paths.append(path)
    plt.close("all")
    return paths
