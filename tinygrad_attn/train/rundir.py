"""A run's output directory: the files a training run writes, and which of
them `--overwrite` may delete.

    runs/copy/
        checkpoint.safetensors   weights, optimizer, schedule, step, random state, config, history
        metrics.jsonl            one JSON line per step and per evaluation, written as they happen
        metrics.json             the summary at the end (or at an interruption or divergence)
        grad_norms.jsonl         with --log-grad-norms: per-parameter gradient norms
        loss.png                 loss, learning rate and gradient norm per step
        attention/<layer>.png    attention heatmaps of one example

Nothing else in the directory is ever touched.
"""
import json
import math
import os
import re

CHECKPOINT_NAME = "checkpoint.safetensors"
METRICS_LOG_NAME = "metrics.jsonl"
METRICS_NAME = "metrics.json"
GRAD_NORMS_NAME = "grad_norms.jsonl"
LOSS_PLOT_NAME = "loss.png"
ATTENTION_DIR = "attention"
RUN_FILES = (CHECKPOINT_NAME, METRICS_LOG_NAME, METRICS_NAME, GRAD_NORMS_NAME, LOSS_PLOT_NAME)
# the names of the heatmaps we write: encoder.0.self_attn.png, decoder.1.cross_attn.png, layer.3.self_attn.png
_HEATMAP = re.compile(r"(encoder|decoder|layer)\.\d+\.(self|cross)_attn\.png")


def run_files(directory):
    """The paths of the files of a run in `directory` (empty if it holds none)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    found = [os.path.join(directory, name) for name in RUN_FILES
             if os.path.isfile(os.path.join(directory, name))]
    attention = os.path.join(directory, ATTENTION_DIR)
    if os.path.isdir(attention):
        found += [os.path.join(attention, name) for name in sorted(os.listdir(attention))
                  if _HEATMAP.fullmatch(name)]
    return found


def clear_run(directory):
    """Delete the files of a run in `directory` (`run_files`), and the
    attention directory if that leaves it empty; nothing else. Returns the
    paths deleted."""
    paths = run_files(directory)
    for path in paths:
        os.unlink(path)
    attention = os.path.join(os.fspath(directory), ATTENTION_DIR)
    if os.path.isdir(attention) and not os.listdir(attention):
        os.rmdir(attention)
    return paths


def json_number(value):
    """A float for JSON: None for NaN and infinities (which strict JSON lacks)."""
    return float(value) if value is not None and math.isfinite(value) else None


def append_jsonl(path, record):
    """Append one JSON line and flush it to the OS, so a crash loses no line."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def keep_jsonl_until(path, step):
    """Drop the lines of a JSON-lines log whose "step" is beyond `step` (a
    resumed run recomputes those steps); a missing file stays missing."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except ValueError:  # a line cut short by a crash
                pass
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(kept)
