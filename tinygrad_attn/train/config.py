"""`TrainConfig`: every setting of a training run, with per-task defaults.

A field left at None takes its task's default (`TASK_DEFAULTS`), so
`TrainConfig(task="charlm", text="input.txt").resolved()` is nanoGPT's
CPU configuration and `TrainConfig().resolved()` is the copy task that
`python -m tinygrad_attn train` runs. The resolved config is stored in every
checkpoint as JSON, which is how `resume` rebuilds the run.

`validate()` is the one place that checks a configuration, with the command
line's option names in its messages, so a run that starts does not fail
later on a setting (only the charlm text's length is checked when the text
is read).
"""
import json
import os
from dataclasses import asdict, dataclass, fields, replace

SEQ2SEQ_TASKS = ("copy", "reverse", "sort")
TASKS = SEQ2SEQ_TASKS + ("charlm",)
SCHEDULES = ("cosine", "inverse-sqrt", "constant")
GELUS = ("exact", "tanh")
ARCHS = ("gpt", "llama")  # charlm's model: nanoGPT's GPT-2 or llama2.c's Llama 2

# bias and gelu are options of the charlm GPT only (None for the seq2seq tasks).
# decay_embeddings: the seq2seq tasks decay only the weight matrices of Linear layers and
# attention (minGPT's rule); charlm decays every 2-D parameter, embedding and position
# tables included (nanoGPT's rule).
_SEQ2SEQ = dict(layers=2, d_model=64, heads=4, ffn=256, steps=300, batch_size=64, lr=2e-3,
                warmup=30, seq_len=10, vocab=10, eval_every=100, eval_size=1000, weight_decay=0.01,
                bias=None, gelu=None, decay_embeddings=False)
TASK_DEFAULTS = {
    "copy": _SEQ2SEQ,
    "reverse": _SEQ2SEQ,
    # minGPT's sort demo: sequences of 6 digits 0-2
    "sort": {**_SEQ2SEQ, "seq_len": 6, "vocab": 3},
    # nanoGPT's CPU configuration for shakespeare_char
    "charlm": dict(layers=4, d_model=128, heads=4, ffn=512, steps=2000, batch_size=12, lr=1e-3,
                   warmup=100, seq_len=64, vocab=None, eval_every=250, eval_size=240,
                   weight_decay=0.1, bias=True, gelu="exact", decay_embeddings=True),
}
# --arch llama: llama2.c's architecture at the charlm CPU size. No biases, no GELU (SwiGLU),
# the SwiGLU width by llama2.c's rule (ffn None: 2/3 of 4 d_model up to a multiple of 32),
# kv_heads None: half the heads share keys and values (heads // 2, or heads if odd).
# The optimiser and schedule stay charlm's, so the two architectures compare step for step.
LLAMA_DEFAULTS = dict(ffn=None, bias=None, gelu=None, kv_heads=None)
LLAMA_MULTIPLE_OF = 32  # llama2.c's train.py
# Settings added after the first checkpoints were written: the value an older
# checkpoint (whose JSON lacks the field) was trained with.
_LEGACY = {"decay_embeddings": False, "arch": None, "kv_heads": None}


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
    text: the charlm text file; stored as an absolute path, so a checkpoint
        does not depend on the directory a command starts in.
    min_lr: the schedule's final lr (default lr / 10).
    beta2: AdamW's second-moment decay (beta1 is 0.9).
    grad_clip: max global gradient norm (0: no clipping).
    bias, gelu: charlm GPT only: biases in the GPT's Linear and LayerNorm
        layers; "exact" or "tanh" GELU.
    arch: charlm only: "gpt" (nanoGPT's GPT-2 layout, the default) or
        "llama" (llama2.c's Llama 2: RMSNorm, rotary positions, SwiGLU,
        grouped-query attention, no biases).
    kv_heads: llama only: key/value heads, each shared by heads / kv_heads
        query heads (default heads // 2, or heads if odd).
    decay_embeddings: weight decay on embedding and position tables too
        (every 2-D parameter, nanoGPT's rule), not only on the weight
        matrices of Linear layers and attention.
    out: the output directory (default runs/TASK).
    """

    task: str = "copy"
    text: str = None
    arch: str = None
    layers: int = None
    d_model: int = None
    heads: int = None
    kv_heads: int = None
    ffn: int = None
    dropout: float = 0.0
    bias: bool = None
    gelu: str = None
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
    decay_embeddings: bool = None
    beta2: float = 0.99
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
        if self.task == "charlm":
            defaults = {**defaults, "arch": "gpt"}
            if self.arch == "llama":
                defaults.update(LLAMA_DEFAULTS)
        values = {k: (defaults[k] if getattr(self, k) is None and k in defaults else getattr(self, k))
                  for k in (f.name for f in fields(self))}
        if values["arch"] == "llama" and isinstance(values["heads"], int) and values["heads"] > 0:
            heads = values["heads"]
            if values["kv_heads"] is None:
                values["kv_heads"] = heads // 2 if heads % 2 == 0 else heads
            if values["ffn"] is None and isinstance(values["d_model"], int):
                from ..models import llama_hidden_dim
                values["ffn"] = llama_hidden_dim(values["d_model"], None, LLAMA_MULTIPLE_OF)
        if values["min_lr"] is None and values["lr"] is not None:
            values["min_lr"] = values["lr"] / 10
        if values["out"] is None:
            values["out"] = f"runs/{self.task}"
        if values["text"] is not None:
            values["text"] = os.path.abspath(os.fspath(values["text"]))
        config = replace(self, **values)
        config.validate()
        return config

    def validate(self):
        """Raise ConfigError naming the first invalid setting (by its
        command-line option): types and ranges, and what the model and the
        task need (a seq2seq task must have sequences both to train on and
        to hold out)."""
        def option(name):
            return "--" + name.replace("_", "-")

        def positive(name, allow_zero=False):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
                raise ConfigError(f"{option(name)} must be a {'non-negative' if allow_zero else 'positive'} "
                                  f"integer, got {value!r}")

        def number(name, low, high, closed_high=False):
            value = getattr(self, name)
            ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value
                  and (value <= high if closed_high else value < high))
            if not ok:
                raise ConfigError(f"{option(name)} must be in [{low}, {high}{']' if closed_high else ')'}, "
                                  f"got {value!r}")

        for name in ("layers", "d_model", "heads", "ffn", "seq_len", "steps", "batch_size",
                     "eval_every", "eval_size"):
            positive(name)
        positive("warmup", allow_zero=True)
        if self.d_model % self.heads:
            raise ConfigError(f"--d-model {self.d_model} must be divisible by --heads {self.heads}")
        number("dropout", 0, 1)
        number("beta2", 0, 1)
        if not self.lr > 0 or self.lr == float("inf"):
            raise ConfigError(f"--lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"--min-lr must be in [0, lr = {self.lr}], got {self.min_lr}")
        number("weight_decay", 0, float("inf"))
        number("grad_clip", 0, float("inf"))
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}")
        if self.schedule == "cosine" and self.warmup >= self.steps:
            raise ConfigError(f"--warmup ({self.warmup}) must be smaller than --steps ({self.steps})")
        if self.schedule == "inverse-sqrt" and self.warmup < 1:
            raise ConfigError("the inverse-sqrt schedule needs --warmup >= 1")
        if not isinstance(self.decay_embeddings, bool):
            raise ConfigError(f"--decay-embeddings must be true or false, got {self.decay_embeddings!r}")
        if self.is_seq2seq:
            self._validate_seq2seq()
        else:
            self._validate_charlm()

    def _validate_seq2seq(self):
        if self.text is not None:
            raise ConfigError(f"--text is for --task charlm, not {self.task}")
        if self.bias is not None or self.gelu is not None:
            raise ConfigError(f"--bias/--no-bias and --gelu are options of the charlm GPT, "
                              f"not of --task {self.task}")
        if self.arch is not None or self.kv_heads is not None:
            raise ConfigError(f"--arch and --kv-heads are options of --task charlm, not of --task {self.task}")
        for name in ("vocab",) + (("min_seq_len",) if self.min_seq_len is not None else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.min_seq_len is not None and self.min_seq_len > self.seq_len:
            raise ConfigError(f"--min-seq-len ({self.min_seq_len}) is longer than "
                              f"--seq-len ({self.seq_len})")
        from ..data import get_task  # the task knows how many sequences it can hold out
        sizes = get_task(self.task, num_symbols=self.vocab, length=self.seq_len,
                         min_length=self.min_seq_len).split_sizes()
        if sizes is not None and min(sizes) == 0:
            train, held_out = sizes
            lengths = (f"--seq-len {self.seq_len}" if self.min_seq_len is None
                       else f"--min-seq-len {self.min_seq_len} --seq-len {self.seq_len}")
            raise ConfigError(f"--vocab {self.vocab} {lengths}: the task has only {train + held_out} "
                              f"distinct sequence{'s' * (train + held_out != 1)}, {held_out} held out for "
                              f"evaluation and {train} to train on; it needs both (use a larger "
                              "--vocab or --seq-len)")

    def _validate_charlm(self):
        if self.text is None:
            raise ConfigError("--task charlm needs --text FILE (any UTF-8 text, e.g. tiny Shakespeare)")
        if self.vocab is not None or self.min_seq_len is not None:
            raise ConfigError("--vocab and --min-seq-len are for the seq2seq tasks: charlm's "
                              "vocabulary is the text's characters")
        if self.arch not in ARCHS:
            raise ConfigError(f"--arch must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        if self.arch == "llama":
            self._validate_llama()
            return
        if self.kv_heads is not None:
            raise ConfigError("--kv-heads is an option of --arch llama (the GPT gives every head its keys)")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"--bias must be true or false, got {self.bias!r}")
        if self.gelu not in GELUS:
            raise ConfigError(f"--gelu must be one of {', '.join(GELUS)}, got {self.gelu!r}")

    def _validate_llama(self):
        if self.bias is not None or self.gelu is not None:
            raise ConfigError("--bias/--no-bias and --gelu are options of --arch gpt: the Llama has no "
                              "biases and a SwiGLU feed-forward")
        kv = self.kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv:
            raise ConfigError(f"--kv-heads must be a positive integer dividing --heads {self.heads}, got {kv!r}")
        if (self.d_model // self.heads) % 2:
            raise ConfigError(f"--arch llama needs an even head size (rotary embeddings turn pairs of "
                              f"features): --d-model {self.d_model} / --heads {self.heads} is odd")

    def to_json(self):
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text):
        """The config of `to_json`; a setting missing from an older
        checkpoint's JSON takes the value that checkpoint was trained with."""
        values = json.loads(text)
        known = {f.name for f in fields(cls)}
        if not isinstance(values, dict) or set(values) - known:
            raise ConfigError(f"not a training configuration: {text[:80]!r}")
        if values.get("task") == "charlm" and "arch" not in values:
            values = {**values, "arch": "gpt"}  # charlm trained only the GPT before --arch
        return cls(**{**_LEGACY, **values})
