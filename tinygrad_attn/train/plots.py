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
    """Save `loss_figure(history, title)` to `path`; returns the path."""
    plt = _pyplot()
    fig = loss_figure(history, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def loss_figure(history, title=None):
    """Three panels sharing the step axis: the training loss per step (raw
    and smoothed) and the evaluation loss, with the exact-match accuracy on
    a second axis when the history has it; the learning rate; and the
    global gradient norm before clipping (when the history has it).
    history: a Trainer's ({"train": [[step, loss, lr, grad_norm], ...], "eval": [...]})."""
    plt = _pyplot()
    rows = np.array([[np.nan if v is None else v for v in row[:4]] + [np.nan] * (4 - len(row))
                     for row in history["train"]], dtype=np.float64).reshape(-1, 4)
    steps, losses, lrs, norms = rows.T
    fig, (ax, ax_lr, ax_norm) = plt.subplots(3, 1, figsize=(7, 6.4), sharex=True,
                                             gridspec_kw={"height_ratios": [3, 1, 1]})
    if len(rows):
        ax.plot(steps, losses, color="tab:blue", alpha=0.25, linewidth=0.8)
        ax.plot(steps, _ema(losses), color="tab:blue", label="train loss (smoothed)")
    evals = [e for e in history["eval"] if "val_loss" in e]
    if evals:
        ax.plot([e["step"] for e in evals], [e["val_loss"] for e in evals], "o-", color="tab:orange",
                label="eval loss")
    ax.set_ylabel("cross-entropy loss")
    if len(rows) and losses.min() > 0 and losses.max() / losses.min() > 20:
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

    ax_lr.plot(steps, lrs, color="tab:purple")
    ax_lr.set_ylabel("learning rate")
    ax_lr.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax_lr.grid(alpha=0.3)

    known = ~np.isnan(norms)
    if known.any():
        ax_norm.plot(steps[known], norms[known], color="tab:red", linewidth=0.8)
        if norms[known].min() > 0:
            ax_norm.set_yscale("log")
    else:
        ax_norm.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax_norm.transAxes)
    ax_norm.set_ylabel("grad norm")
    ax_norm.set_xlabel("step")
    ax_norm.grid(alpha=0.3)
    fig.align_ylabels([ax, ax_lr, ax_norm])
    viz.tight_layout(fig)
    return fig


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
        fig = heatmap_figure(weights, keys, queries, title)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def heatmap_figure(weights, keys, queries, title=None):
    """`viz.attention_heatmap`'s figure; short token labels (one or two
    characters, as charlm's) are drawn larger and upright."""
    _pyplot()
    fig = viz.attention_heatmap(weights, keys, None, query_tokens=queries, title=title)
    if max(len(str(t)) for t in list(keys) + list(queries)) <= 2:
        width, height = fig.get_size_inches()
        fig.set_size_inches(width * 1.3, height * 1.3)
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                continue
            ax.tick_params(axis="x", labelrotation=0, labelsize=11)
            ax.tick_params(axis="y", labelsize=11)
        viz.tight_layout(fig)
    return fig
