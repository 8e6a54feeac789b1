"""`Trainer`: the training loop, evaluation, checkpoints and the run's report.

    trainer = Trainer(TrainConfig(task="reverse", steps=500, out="runs/rev"))
    trainer.fit()          # progress bar, evaluations, checkpoints; Ctrl-C saves
    trainer.report()       # final evaluation, examples, loss curve and attention PNGs

    trainer = Trainer.from_checkpoint("runs/rev/checkpoint.safetensors")
    trainer.fit()          # continues exactly where the checkpoint left off

One step: draw a batch, forward, loss, backward, clip the global gradient
norm, AdamW step (weight decay on weight matrices only), schedule step.
A checkpoint holds the model weights, the optimizer and scheduler states,
the step, the random generator's state and the configuration, so a resumed
run computes bit for bit what the uninterrupted run would have.
"""
import json
import math
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from .. import nn, optim, viz
from ..checkpoint import CheckpointError, load, save
from ..models import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from ..random import get_generator, manual_seed
from .config import ConfigError, TrainConfig
from .jobs import make_job

CHECKPOINT_NAME = "checkpoint.safetensors"
GRAD_NORMS_NAME = "grad_norms.jsonl"
FORMAT = "tinygrad_attn.train/1"  # metadata["format"] of our checkpoints
BETAS = (0.9, 0.99)  # nanoGPT's for small models: beta2 0.99 adapts faster than 0.999
# the "kind" of a model config's JSON -> (model class, config class)
MODEL_CLASSES = {"Seq2SeqConfig": (Seq2SeqTransformer, Seq2SeqConfig), "GPTConfig": (GPT, GPTConfig)}


def weight_decay_groups(model, weight_decay):
    """AdamW parameter groups: weight decay on the matrices of Linear layers
    and attention projections only; biases, LayerNorm weights, embeddings
    and position tables are not decayed (minGPT's rule). A tied weight (an
    embedding shared with the output layer) is a Linear weight and decays."""
    decayed = set()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            decayed.add(id(module.weight))
        elif isinstance(module, nn.MultiHeadAttention):
            decayed.update(id(w) for w in (module.in_proj_weight, module.q_proj_weight,
                                           module.k_proj_weight, module.v_proj_weight) if w is not None)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
              {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_scheduler(optimizer, config, d_model):
    """The lr schedule of `config`; `--lr` is the peak lr for every schedule.

    cosine: linear warmup, then cosine decay to min_lr at the last step.
    inverse-sqrt: the paper's d_model^-0.5 min(s^-0.5, s warmup^-1.5),
        scaled so that its peak (at s = warmup) is lr.
    constant: linear warmup, then lr.
    """
    if config.schedule == "cosine":
        return optim.CosineWarmupLR(optimizer, config.warmup, config.steps, min_lr=config.min_lr)
    if config.schedule == "inverse-sqrt":
        return optim.InverseSqrtLR(optimizer, d_model, config.warmup,
                                   scale=math.sqrt(d_model * config.warmup))
    return optim.LinearWarmupLR(optimizer, config.warmup)


@contextmanager
def _interrupts_deferred():
    """Hold back Ctrl-C (SIGINT) until the block ends, so that an optimizer
    update is never left half applied (in the main thread; elsewhere
    signals cannot be caught and the block runs as is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt
        elif received and previous == signal.SIG_DFL:
            raise KeyboardInterrupt


# --------------------------------------------------------------------------- checkpoints
def read_checkpoint(path):
    """(arrays, metadata) of a training checkpoint; CheckpointError if the
    file is not one of ours (FileNotFoundError if it does not exist)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, CHECKPOINT_NAME)
        if not os.path.exists(candidate):
            raise CheckpointError(f"{path} is a directory without a {CHECKPOINT_NAME}")
        path = candidate
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    arrays, metadata = load(path, with_metadata=True)
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a safetensors file but not a tinygrad_attn training "
                              "checkpoint (it has no training metadata)")
    return arrays, metadata


def model_from_checkpoint(arrays, metadata):
    """The model stored in a checkpoint, with its weights, in eval mode."""
    spec = json.loads(metadata["model"])
    kind = spec.get("kind")
    if kind not in MODEL_CLASSES:
        raise CheckpointError(f"unknown model kind {kind!r} in the checkpoint")
    model_class, config_class = MODEL_CLASSES[kind]
    model = model_class(config_class.from_json(metadata["model"]))
    prefix = "model."
    model.load_state_dict({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
    return model.eval()


# --------------------------------------------------------------------------- the trainer
class Trainer:
    """Runs one training configuration (see the module docstring).

    config: a TrainConfig (resolved here); progress: show a tqdm bar (when
    tqdm is installed); log: where text lines go (default print).
    Building a Trainer seeds the framework's generator with config.seed,
    then initialises the model from it.
    Attributes: model, optimizer, scheduler, job, step, history
    ({"train": [[step, loss, lr], ...], "eval": [{"step": s, metric: value}, ...]}).
    """

    def __init__(self, config, progress=True, log=print):
        self.config = config = config.resolved()
        manual_seed(config.seed)
        self.job = make_job(config)
        self.model = self.job.model
        self.optimizer = optim.AdamW(weight_decay_groups(self.model, config.weight_decay),
                                     lr=config.lr, betas=BETAS)
        self.scheduler = make_scheduler(self.optimizer, config, config.d_model)
        self.step = 0
        self.train_seconds = 0.0  # wall time of fit() (evaluations included), over all sessions
        self.history = {"train": [], "eval": []}
        self.progress, self.log = progress, log
        self._params = list(self.model.parameters())
        self._rng_state = get_generator().bit_generator.state  # as of the last completed step
        self._bar = None

    @property
    def checkpoint_path(self):
        return os.path.join(self.config.out, CHECKPOINT_NAME)

    # ------------------------------------------------------------ one step
    def train_step(self):
        """One optimisation step; returns (loss, number of target tokens)."""
        self.model.train()
        batch = self.job.train_batch(self.config.batch_size)
        loss = self.job.loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        next_step = self.step + 1
        if self.config.log_grad_norms and (next_step == 1 or next_step % self.config.eval_every == 0):
            self._log_grad_norms(next_step)
        if self.config.grad_clip > 0:
            optim.clip_grad_norm_(self._params, self.config.grad_clip)
        with _interrupts_deferred():  # the update and its bookkeeping happen entirely or not at all
            self.optimizer.step()
            self.scheduler.step()
            self.step = next_step
            self._rng_state = get_generator().bit_generator.state
        return loss.item(), self.job.num_tokens(batch)

    def _log_grad_norms(self, step):
        """Append {"step", "total", "norms": {name: ||grad||}} (before clipping) to grad_norms.jsonl."""
        norms = viz.grad_norms(self.model.named_parameters())
        record = {"step": step, "total": math.sqrt(sum(n * n for n in norms.values())), "norms": norms}
        with open(os.path.join(self.config.out, GRAD_NORMS_NAME), "a") as f:
            f.write(json.dumps(record) + "\n")

    def evaluate(self):
        """The job's periodic evaluation, recorded in the history."""
        metrics = self.job.evaluate()
        self.history["eval"].append({"step": self.step, **metrics})
        return metrics

    # ------------------------------------------------------------ the loop
    def fit(self, until=None, callbacks=()):
        """Train up to step `until` (default: config.steps), evaluating and
        saving a checkpoint every eval_every steps and at the end.

        callbacks: functions called as cb(trainer) after every step.
        Ctrl-C (or a KeyboardInterrupt raised by a callback) saves a
        checkpoint of the last completed step, then the KeyboardInterrupt
        propagates. Returns the last evaluation's metrics (or None).
        """
        until = self.config.steps if until is None else until
        os.makedirs(self.config.out, exist_ok=True)
        if self.step == 0:  # a fresh run: start its log files afresh
            grad_log = os.path.join(self.config.out, GRAD_NORMS_NAME)
            if os.path.exists(grad_log):
                os.unlink(grad_log)
        metrics, smoothed, tokens = None, None, 0
        bar = self._bar = _progress_bar(until, self.step, self.progress)
        seconds_before, session_start = self.train_seconds, time.perf_counter()
        started = session_start  # of the current throughput measurement
        try:
            while self.step < until:
                loss, n_tokens = self.train_step()
                lr = self.scheduler.get_last_lr()[0]
                self.history["train"].append([self.step, loss, lr])
                smoothed = loss if smoothed is None else 0.9 * smoothed + 0.1 * loss
                tokens += n_tokens
                tokens_per_s = tokens / max(time.perf_counter() - started, 1e-9)
                if bar is not None:
                    bar.set_postfix_str(f"loss {smoothed:.4f} | lr {lr:.2e} | {tokens_per_s:,.0f} tok/s",
                                        refresh=False)
                    bar.update(1)
                for callback in callbacks:
                    callback(self)
                if self.step % self.config.eval_every == 0 or self.step == until:
                    metrics = self.evaluate()
                    self._write(f"step {self.step:>{len(str(until))}}/{until} | train loss {smoothed:.4f} | "
                                f"lr {lr:.2e} | {tokens_per_s:,.0f} tok/s | " + _format_metrics(metrics))
                    self.train_seconds = seconds_before + time.perf_counter() - session_start
                    self.save_checkpoint()
                    tokens, started = 0, time.perf_counter()  # throughput without the evaluation
        except KeyboardInterrupt:
            self.train_seconds = seconds_before + time.perf_counter() - session_start
            self._close_bar()
            path = self.save_checkpoint()
            self.log(f"interrupted: saved step {self.step} to {path}; continue with "
                     f"`python -m tinygrad_attn resume {path}`")
            raise
        self._close_bar()
        return metrics

    def _write(self, line):
        if self._bar is None:
            self.log(line)
            return
        with self._bar.external_write_mode():  # clear the bar, print, redraw it
            self.log(line)

    def _close_bar(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path=None):
        """Save everything needed to resume (atomically); returns the path."""
        path = self.checkpoint_path if path is None else os.fspath(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        arrays = {f"model.{k}": v.data for k, v in self.model.state_dict().items()}
        arrays.update(optim.flatten_state_dict(self.optimizer.state_dict(), "optimizer."))
        arrays.update(optim.flatten_state_dict(self.scheduler.state_dict(), "scheduler."))
        # the per-step curve as an array (it grows with the run); the few evaluations as JSON
        arrays["history.train"] = np.array(self.history["train"], dtype=np.float64).reshape(-1, 3)
        metadata = {
            "format": FORMAT,
            "config": self.config.to_json(),
            "model": self.model.config.to_json(),
            "step": str(self.step),
            "train_seconds": repr(self.train_seconds),
            "rng_state": json.dumps(self._rng_state),
            "history_eval": json.dumps(self.history["eval"]),
            **self.job.metadata(),
        }
        save(arrays, path, metadata=metadata)
        return path

    @classmethod
    def from_checkpoint(cls, path, steps=None, out=None, progress=True, log=print):
        """A Trainer in the state saved at `path`. `steps` changes the total
        number of steps (the cosine schedule then ends at the new total);
        `out` sends the outputs to another directory."""
        arrays, metadata = read_checkpoint(path)
        config = TrainConfig.from_json(metadata["config"])
        step = int(metadata["step"])
        changes = {}
        if steps is not None:
            changes["steps"] = steps
        if out is not None:
            changes["out"] = os.fspath(out)
        config = replace(config, **changes)
        if config.steps <= step:
            raise ConfigError(f"the checkpoint is at step {step} of {config.steps}: nothing to do "
                              f"(pass --steps N with N > {step} to train longer)")
        trainer = cls(config, progress=progress, log=log)
        trainer.job.check_metadata(metadata)
        prefix = "model."
        trainer.model.load_state_dict({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        trainer.optimizer.load_state_dict(optim.unflatten_state_dict(arrays, "optimizer."))
        trainer.scheduler.load_state_dict(optim.unflatten_state_dict(arrays, "scheduler."))
        if isinstance(trainer.scheduler, optim.CosineWarmupLR):
            trainer.scheduler.total_steps = config.steps  # a longer run decays over its new length
        trainer.step = step
        trainer.train_seconds = float(metadata.get("train_seconds", 0.0))
        trainer.history = {"train": [[int(step), loss, lr] for step, loss, lr in arrays["history.train"].tolist()],
                           "eval": json.loads(metadata["history_eval"])}
        trainer._rng_state = json.loads(metadata["rng_state"])
        get_generator().bit_generator.state = trainer._rng_state
        return trainer

    # ------------------------------------------------------------ the report
    def report(self, plots=True):
        """Final evaluation, a summary, examples, and (with matplotlib) the
        loss curve and attention heatmaps in the output directory. Returns
        the final metrics."""
        metrics = self.job.final_evaluate()
        train = self.history["train"]
        recent = [loss for _, loss, _ in train[-50:]]
        lines = [f"done: {self.step} steps in {self.train_seconds:.1f} s "
                 f"({self.model.num_parameters():,} parameters)"]
        if recent:
            lines.append(f"final train loss {sum(recent) / len(recent):.4f} (mean of the last {len(recent)} steps)")
        what = (f"{len(self.job.held_out)} held-out sequences, greedy decoding" if self.config.is_seq2seq
                else f"{self.config.eval_size} validation windows")
        lines.append(f"final {_format_metrics(metrics)} ({what})")
        lines += self.job.examples()
        if plots:
            lines += self.write_plots()
        lines.append(f"checkpoint: {self.checkpoint_path}")
        for line in lines:
            self.log(line)
        with open(os.path.join(self.config.out, "metrics.json"), "w") as f:
            json.dump({"step": self.step, "train_seconds": self.train_seconds, "final": metrics,
                       "history": self.history}, f)
        return metrics

    def write_plots(self):
        """Write loss.png and attention/<layer>.png; returns lines saying what was written."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return ["plots skipped: matplotlib is not installed (pip install 'tinygrad_attn[train]')"]
        from .plots import attention_heatmaps, loss_curve
        loss_path = loss_curve(self.history, os.path.join(self.config.out, "loss.png"),
                               title=f"{self.config.task}: training and evaluation loss")
        paths = attention_heatmaps(self.job.attention_example(), os.path.join(self.config.out, "attention"))
        return [f"loss curve: {loss_path}",
                f"attention heatmaps ({len(paths)} layers, one panel per head): "
                f"{os.path.dirname(paths[0]) if paths else '-'}"]


def _format_metrics(metrics):
    parts = []
    for name, value in metrics.items():
        parts.append(f"{name} {value:.2%}" if name == "exact_match" else f"{name} {value:.4f}")
    return " | ".join(parts)


def _progress_bar(total, initial, enabled):
    """A tqdm bar, or None when disabled or tqdm is not installed."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    # disable=None: no bar when stderr is not a terminal (logs stay readable); write() still prints.
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=False, disable=None)
