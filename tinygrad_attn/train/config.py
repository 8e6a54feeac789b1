"""`TrainConfig`: every setting of a training run, with per-task defaults.

A field left at None takes its task's default (`TASK_DEFAULTS`), so
`TrainConfig(task="charlm", text="input.txt").resolved()` is nanoGPT's
CPU configuration and `TrainConfig().resolved()` is the copy task that
`python -m tinygrad_attn train` runs. The resolved config is stored in every
checkpoint as JSON, which is how `resume` rebuilds the run.
"""
import json
from dataclasses import asdict, dataclass, fields, replace

SEQ2SEQ_TASKS = ("copy", "reverse", "sort")
TASKS = SEQ2SEQ_TASKS + ("charlm",)
SCHEDULES = ("cosine", "inverse-sqrt", "constant")

_SEQ2SEQ = dict(layers=2, d_model=64, heads=4, ffn=256, steps=300, batch_size=64, lr=2e-3,
                warmup=30, seq_len=10, vocab=10, eval_every=100, eval_size=1000, weight_decay=0.01)
TASK_DEFAULTS = {
    "copy": _SEQ2SEQ,
    "reverse": _SEQ2SEQ,
    # minGPT's sort demo: sequences of 6 digits 0-2
    "sort": {**_SEQ2SEQ, "seq_len": 6, "vocab": 3},
    # nanoGPT's CPU configuration for shakespeare_char
    "charlm": dict(layers=4, d_model=128, heads=4, ffn=512, steps=2000, batch_size=12, lr=1e-3,
                   warmup=100, seq_len=64, vocab=None, eval_every=250, eval_size=240,
                   weight_decay=0.1),
}


class ConfigError(ValueError):
    """A setting of the run is invalid; the message says which and why."""


@dataclass
class TrainConfig:
    """The settings of one run (see `python -m tinygrad_attn train --help`).

    layers: encoder and decoder layers each (seq2seq) or blocks (charlm).
    seq_len: source length (seq2seq) or context length / block size (charlm).
    vocab: number of distinct symbols of a seq2seq task (charlm: the text's).
    min_seq_len: shortest source of a seq2seq task (default: all seq_len).
    eval_size: held-out sequences (seq2seq) or validation windows (charlm)
        per evaluation.
    min_lr: the schedule's final lr (default lr / 10).
    grad_clip: max global gradient norm (0: no clipping).
    """

    task: str = "copy"
    text: str = None
    layers: int = None
    d_model: int = None
    heads: int = None
    ffn: int = None
    dropout: float = 0.0
    seq_len: int = None
    min_seq_len: int = None
    vocab: int = None
    steps: int = None
    batch_size: int = None
    lr: float = None
    warmup: int = None
    schedule: str = "cosine"
    min_lr: float = None
    weight_decay: float = None
    grad_clip: float = 1.0
    eval_every: int = None
    eval_size: int = None
    seed: int = 0
    out: str = None
    log_grad_norms: bool = False

    @property
    def is_seq2seq(self):
        return self.task in SEQ2SEQ_TASKS

    def resolved(self):
        """A copy with every None replaced by its task default, checked."""
        if self.task not in TASKS:
            raise ConfigError(f"unknown task {self.task!r}; choose one of {', '.join(TASKS)}")
        defaults = TASK_DEFAULTS[self.task]
        values = {k: (defaults[k] if getattr(self, k) is None and k in defaults else getattr(self, k))
                  for k in (f.name for f in fields(self))}
        if values["min_lr"] is None and values["lr"] is not None:
            values["min_lr"] = values["lr"] / 10
        if values["out"] is None:
            values["out"] = f"runs/{self.task}"
        config = replace(self, **values)
        config.validate()
        return config

    def validate(self):
        """Raise ConfigError naming the first invalid setting."""
        def positive(name, allow_zero=False):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
                raise ConfigError(f"--{name.replace('_', '-')} must be a {'non-negative' if allow_zero else 'positive'} "
                                  f"integer, got {value!r}")

        for name in ("layers", "d_model", "heads", "ffn", "seq_len", "steps", "batch_size",
                     "eval_every", "eval_size"):
            positive(name)
        positive("warmup", allow_zero=True)
        if self.d_model % self.heads:
            raise ConfigError(f"--d-model {self.d_model} must be divisible by --heads {self.heads}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        if not self.lr > 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"--min-lr must be in [0, lr = {self.lr}], got {self.min_lr}")
        if not self.weight_decay >= 0 or not self.grad_clip >= 0:
            raise ConfigError("--weight-decay and --grad-clip must be >= 0")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.schedule == "cosine" and self.warmup >= self.steps:
            raise ConfigError(f"--warmup ({self.warmup}) must be smaller than --steps ({self.steps})")
        if self.schedule == "inverse-sqrt" and self.warmup < 1:
            raise ConfigError("the inverse-sqrt schedule needs --warmup >= 1")
        if self.is_seq2seq:
            positive("vocab")
            if self.text is not None:
                raise ConfigError(f"--text is for --task charlm, not {self.task}")
            if self.min_seq_len is not None:
                positive("min_seq_len")
                if self.min_seq_len > self.seq_len:
                    raise ConfigError(f"--min-seq-len ({self.min_seq_len}) is longer than "
                                      f"--seq-len ({self.seq_len})")
        else:
            if self.text is None:
                raise ConfigError("--task charlm needs --text FILE (any UTF-8 text, e.g. tiny Shakespeare)")
            if self.vocab is not None or self.min_seq_len is not None:
                raise ConfigError("--vocab and --min-seq-len are for the seq2seq tasks: charlm's "
                                  "vocabulary is the text's characters")

    def to_json(self):
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        values = json.loads(text)
        known = {f.name for f in fields(cls)}
        if not isinstance(values, dict) or set(values) - known:
            raise ConfigError(f"not a training configuration: {text[:80]!r}")
        return cls(**values)
