"""What a run writes about itself as it goes: metrics.jsonl and metrics.json.

metrics.jsonl holds one JSON object a line, appended as it happens:

    {"type": "train", "step", "loss", "lr", "grad_norm"}   every step
    {"type": "eval", "step", <metric>: value, ...}          every evaluation
    {"type": "interrupted" | "diverged" | "final", "step", ...}   how the session ended

metrics.json is the summary, rewritten when a session ends:
{"status", "step", "train_seconds", "final", "history"}. Both are strict
JSON: NaN and infinities are written as null.
"""
import json

from .rundir import json_number


def finite_json(value):
    """`value` with every NaN or infinity replaced by None (for strict JSON)."""
    if isinstance(value, float):
        return json_number(value)
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def train_record(step, loss, lr, grad_norm):
    """The metrics.jsonl line of one training step (a row of history["train"])."""
    return {"type": "train", "step": step, "loss": json_number(loss), "lr": lr,
            "grad_norm": json_number(grad_norm)}


def eval_record(record):
    """The metrics.jsonl line of one evaluation (a record of history["eval"])."""
    return {"type": "eval", **finite_json(record)}


def write_metrics_log(path, history):
    """Write metrics.jsonl afresh from a run's history: each step's line,
    followed by the evaluations at that step (empty for a fresh run)."""
    evals = {}
    for record in history["eval"]:
        evals.setdefault(record["step"], []).append(record)
    with open(path, "w", encoding="utf-8") as f:
        for row in history["train"]:
            f.write(json.dumps(train_record(*row)) + "\n")
            for record in evals.get(row[0], []):
                f.write(json.dumps(eval_record(record)) + "\n")


def write_summary(path, status, step, train_seconds, history, final=None):
    """Write metrics.json: {"status", "step", "train_seconds", "final", "history"}."""
    summary = {"status": status, "step": step, "train_seconds": train_seconds,
               "final": final, "history": history}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(finite_json(summary), f)


def format_metrics(metrics):
    """One log line's worth: "val_loss 0.1234 | exact_match 98.00%"."""
    parts = []
    for name, value in metrics.items():
        parts.append(f"{name} {value:.2%}" if name == "exact_match" else f"{name} {value:.4f}")
    return " | ".join(parts)
