"""`Trainer`: the training loop, evaluation and the run's report.

    trainer = Trainer(TrainConfig(task="reverse", steps=500, out="runs/rev"))
    trainer.fit()          # progress bar, evaluations, checkpoints; Ctrl-C and SIGTERM save
    trainer.report()       # final evaluation, examples, loss curve and attention PNGs

    trainer = Trainer.from_checkpoint("runs/rev")
    trainer.fit()          # continues exactly where the checkpoint left off, in runs/rev

One step: draw a batch, forward, loss, backward, clip the global gradient
norm, AdamW step (weight decay on weight matrices), schedule step. A step
whose loss or gradient norm is not finite is not applied: training stops
with `TrainingDiverged`, and the last checkpoint (always finite) is kept.
A checkpoint holds the model weights, the optimizer and scheduler states,
the step, the random generator's state and the configuration, so a resumed
run computes bit for bit what the uninterrupted run would have.

A fresh run refuses an output directory that holds another run's files
(`RunExistsError`) unless built with overwrite=True, which deletes those
files (only those: see `rundir`). Metrics go to metrics.jsonl as they
happen.

Around the loop, each in its own file: signals.py (Ctrl-C and SIGTERM save,
never half an update), checkpoints.py (what a checkpoint holds, writing and
reading it), metrics.py (metrics.jsonl and metrics.json).
"""
import math
import os
import time
from dataclasses import replace

import numpy as np

from .. import nn, optim, viz
from ..random import get_generator, manual_seed
from .checkpoints import checkpoint_file, read_checkpoint, restore_checkpoint, write_checkpoint
from .config import ConfigError, TrainConfig
from .jobs import make_job
from .metrics import eval_record, finite_json, format_metrics, train_record, write_metrics_log, write_summary
from .rundir import (ATTENTION_DIR, CHECKPOINT_NAME, GRAD_NORMS_NAME, LOSS_PLOT_NAME, METRICS_LOG_NAME,
                     METRICS_NAME, append_jsonl, clear_run, json_number, keep_jsonl_until, run_files)
from .signals import Terminated, interrupts_deferred, sigterm_as_interrupt

BETA1 = 0.9  # beta2 is a setting (default 0.99, nanoGPT's for small models: faster than 0.999)


class RunExistsError(ConfigError):
    """The output directory already holds a run, and overwriting was not asked for."""


class TrainingDiverged(RuntimeError):
    """A step gave a non-finite loss or gradient norm; it was not applied.
    Attributes: step (the step that failed), loss, grad_norm."""

    def __init__(self, message, step=None, loss=None, grad_norm=None):
        super().__init__(message)
        self.step, self.loss, self.grad_norm = step, loss, grad_norm


def weight_decay_groups(model, weight_decay, decay_embeddings=False):
    """AdamW parameter groups [decayed, not decayed] (empty groups dropped).

    By default (minGPT's rule) only the matrices of Linear layers and
    attention projections decay; biases, LayerNorm weights, embeddings and
    position tables do not. A tied weight (an embedding shared with the
    output layer) is a Linear weight and decays.
    decay_embeddings=True (nanoGPT's rule): every parameter with two or more
    dimensions decays, embedding and position tables included; biases and
    LayerNorm weights (1-D) still do not.
    """
    params = list(model.parameters())
    decayed = set()
    if decay_embeddings:
        decayed.update(id(p) for p in params if p.ndim >= 2)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            decayed.add(id(module.weight))
        elif isinstance(module, nn.MultiHeadAttention):
            decayed.update(id(w) for w in (module.in_proj_weight, module.q_proj_weight,
                                           module.k_proj_weight, module.v_proj_weight) if w is not None)
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


# --------------------------------------------------------------------------- the trainer
class Trainer:
    """Runs one training configuration (see the module docstring).

    config: a TrainConfig (resolved here); progress: show a tqdm bar (when
    tqdm is installed); log: where text lines go (default print);
    overwrite: a fresh run may replace the run files already in config.out
    (otherwise it raises RunExistsError before training).
    Building a Trainer seeds the framework's generator with config.seed,
    then initialises the model from it.
    Attributes: model, optimizer, scheduler, job, step, saved_step (of the
    last checkpoint written or loaded, None before the first), history
    ({"train": [[step, loss, lr, grad_norm], ...], "eval": [{"step": s, metric: value}, ...]};
    grad_norm is the global gradient norm before clipping, None in the
    history of checkpoints older than that column).
    """

    def __init__(self, config, progress=True, log=print, overwrite=False):
        self.config = config = config.resolved()
        manual_seed(config.seed)
        self.job = make_job(config)
        self.model = self.job.model
        self.optimizer = optim.AdamW(weight_decay_groups(self.model, config.weight_decay,
                                                         config.decay_embeddings),
                                     lr=config.lr, betas=(BETA1, config.beta2))
        self.scheduler = make_scheduler(self.optimizer, config, config.d_model)
        self.step = 0
        self.train_seconds = 0.0  # wall time of fit() (evaluations included), over all sessions
        self.history = {"train": [], "eval": []}
        self.progress, self.log, self.overwrite = progress, log, overwrite
        self.grad_norm = None  # of the last step, before clipping
        self._params = list(self.model.parameters())
        self._rng_state = get_generator().bit_generator.state  # as of the last completed step
        self._bar = None
        self._resumed_from = None  # the directory of the checkpoint this trainer was loaded from
        self.saved_step = None     # the step of the last checkpoint written (or loaded)
        self._output_ready = False
        self._rows_logged = 0      # history["train"] rows already in metrics.jsonl

    @property
    def checkpoint_path(self):
        return os.path.join(self.config.out, CHECKPOINT_NAME)

    def _path(self, name):
        return os.path.join(self.config.out, name)

    # ------------------------------------------------------------ the output directory
    def prepare_output(self):
        """Make config.out ready for this run (fit() calls it first; calling
        it earlier reports a problem before anything else happens).

        A fresh run needs a directory without another run's files: with
        overwrite=True those files are deleted (`rundir.run_files`: nothing
        else), otherwise RunExistsError. A resumed run writes into the
        directory of its checkpoint, or into another one under the same
        rule. metrics.jsonl then starts afresh, or, for a resumed run, holds
        the history up to the checkpoint.
        """
        if self._output_ready:
            return
        out = self.config.out
        try:
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {out}: cannot create the output directory ({e.strerror})") from None
        own = self._resumed_from is not None and os.path.realpath(self._resumed_from) == os.path.realpath(out)
        if not own:
            existing = run_files(out)
            if existing and not self.overwrite:
                names = ", ".join(os.path.relpath(p, out) for p in existing[:3])
                more = f" and {len(existing) - 3} more" if len(existing) > 3 else ""
                raise RunExistsError(f"--out {out} already holds a run ({names}{more}); pass --overwrite "
                                     "to replace it, or choose another --out")
            clear_run(out)
        self._rewrite_metrics_log()
        if own:
            keep_jsonl_until(self._path(GRAD_NORMS_NAME), self.step)
        self._output_ready = True

    def _rewrite_metrics_log(self):
        """metrics.jsonl from the history: empty for a fresh run."""
        write_metrics_log(self._path(METRICS_LOG_NAME), self.history)
        self._rows_logged = len(self.history["train"])

    def _log_metrics(self, record):
        append_jsonl(self._path(METRICS_LOG_NAME), record)

    def _log_new_steps(self):
        """Write the history's steps that metrics.jsonl does not have yet.
        Signals wait meanwhile: one landing between a line's write and the
        count below would have the interrupt handler write that line again."""
        with interrupts_deferred():
            for row in self.history["train"][self._rows_logged:]:
                self._log_metrics(train_record(*row))
            self._rows_logged = len(self.history["train"])

    # ------------------------------------------------------------ one step
    def kernel_calls(self):
        """The kernels, with their argument types, that a training step of this
        run calls (for `tinygrad_attn.warmup.compile_kernels`): a dry run of
        the forward and backward that leaves no trace (no kernel runs, the
        generator's state is put back, the gradients are dropped)."""
        from ..warmup import non_op_examples, signatures_of
        state = get_generator().bit_generator.state
        was_training = self.model.training

        def step():
            self.job.loss(self.job.train_batch(self.config.batch_size)).backward()
            non_op_examples(np.float32)  # optimizer and clipping, on tensors of their own: the run's are untouched
        try:
            self.model.train()
            return signatures_of(step)
        finally:
            get_generator().bit_generator.state = state
            self.model.train(was_training)
            for p in self._params:
                p.grad = None

    def train_step(self):
        """One optimisation step; returns (loss, number of target tokens).

        The step is recorded in history["train"]; the global gradient norm
        (before clipping) also goes to self.grad_norm.
        If the loss or that norm is not finite the update is not applied and
        TrainingDiverged is raised (self.step and the weights stay as they were).
        """
        self.model.train()
        batch = self.job.train_batch(self.config.batch_size)
        loss = self.job.loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        next_step = self.step + 1
        if self.config.log_grad_norms and (next_step == 1 or next_step % self.config.eval_every == 0):
            self._log_grad_norms(next_step)
        loss_value = loss.item()
        # max_norm inf: only measure the norm (nothing to clip when --grad-clip is 0)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        grad_norm = float(optim.clip_grad_norm_(self._params, max_norm).item())
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            raise TrainingDiverged(f"training diverged at step {next_step}: the loss is {loss_value:g} and "
                                   f"the gradient norm {grad_norm:g}; that step was not applied",
                                   step=next_step, loss=loss_value, grad_norm=grad_norm)
        with interrupts_deferred():  # the update and its bookkeeping happen entirely or not at all
            self.optimizer.step()
            self.scheduler.step()
            self.step = next_step
            self.grad_norm = grad_norm
            self._rng_state = get_generator().bit_generator.state
            self.history["train"].append([self.step, loss_value, self.scheduler.get_last_lr()[0], grad_norm])
        return loss_value, self.job.num_tokens(batch)

    def _log_grad_norms(self, step):
        """Append {"step", "total", "norms": {name: ||grad||}} (before clipping) to grad_norms.jsonl."""
        norms = viz.grad_norms(self.model.named_parameters())
        total = math.sqrt(sum(n * n for n in norms.values()))
        append_jsonl(self._path(GRAD_NORMS_NAME),
                     {"step": step, "total": json_number(total), "norms": finite_json(norms)})

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
        Ctrl-C, SIGTERM (in the main thread) or a KeyboardInterrupt raised by
        a callback saves a checkpoint of the last completed step, writes
        metrics.json, then the KeyboardInterrupt (`Terminated` for SIGTERM)
        propagates; so does a BrokenPipeError from `log` (the output was
        closed). A non-finite loss or gradient norm raises TrainingDiverged
        without saving: the last checkpoint stays. Returns the last
        evaluation's metrics (or None).
        """
        until = self.config.steps if until is None else until
        self.prepare_output()
        metrics, smoothed, tokens = None, None, 0
        bar = self._bar = _progress_bar(until, self.step, self.progress)
        seconds_before, session_start = self.train_seconds, time.perf_counter()
        started = session_start  # of the current throughput measurement

        def clock():
            self.train_seconds = seconds_before + time.perf_counter() - session_start

        try:
            with sigterm_as_interrupt():
                while self.step < until:
                    loss, n_tokens = self.train_step()
                    lr = self.scheduler.get_last_lr()[0]
                    self._log_new_steps()
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
                        self._log_metrics(eval_record(self.history["eval"][-1]))
                        if not math.isfinite(metrics["val_loss"]):  # finite weights, but not a usable model
                            raise TrainingDiverged(
                                f"training diverged at step {self.step}: the evaluation loss is "
                                f"{metrics['val_loss']:g}", step=self.step, loss=metrics["val_loss"])
                        clock()
                        self.save_checkpoint()
                        self._write(f"step {self.step:>{len(str(until))}}/{until} | train loss {smoothed:.4f} | "
                                    f"lr {lr:.2e} | {tokens_per_s:,.0f} tok/s | " + format_metrics(metrics))
                        tokens, started = 0, time.perf_counter()  # throughput without the evaluation
        except TrainingDiverged as e:
            clock()
            self._stop_diverged(e)
            raise
        except (KeyboardInterrupt, BrokenPipeError) as e:
            clock()
            self._stop_interrupted(e)
            raise
        self._close_bar()
        return metrics

    def _stop_diverged(self, e):
        """fit() ends with TrainingDiverged `e`: log it, write metrics.json,
        and say in `e` which checkpoint is kept (none is written)."""
        self._close_bar()
        self._log_new_steps()
        self._log_metrics({"type": "diverged", "step": e.step, "loss": json_number(e.loss),
                           "grad_norm": json_number(e.grad_norm)})
        self.write_metrics("diverged")
        kept = (f"the checkpoint of step {self.saved_step} ({self.checkpoint_path}) is kept"
                if self.saved_step is not None and os.path.exists(self.checkpoint_path)
                else "no checkpoint was saved")
        e.args = (f"{e.args[0]}; {kept}. Try a smaller --lr (or --grad-clip)",)

    def _stop_interrupted(self, e):
        """fit() ends with KeyboardInterrupt (or Terminated) or BrokenPipeError
        `e`: save the last completed step, log how it ended, write metrics.json."""
        self._close_bar()
        self._log_new_steps()  # a step that completed just before the interrupt
        path = self.save_checkpoint()
        how = ("terminated (SIGTERM)" if isinstance(e, Terminated)
               else "output closed" if isinstance(e, BrokenPipeError) else "interrupted")
        self._log_metrics({"type": "interrupted", "step": self.step, "by": how})
        self.write_metrics("interrupted")
        if not isinstance(e, BrokenPipeError):  # the log may be what was closed
            self.log(f"{how}: saved step {self.step} to {path}; continue with "
                     f"`python -m tinygrad_attn resume {self.config.out}`")

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
        """Save everything needed to resume (atomically); returns the path.
        Refuses (TrainingDiverged) to save weights that are not finite."""
        path = self.checkpoint_path if path is None else os.fspath(path)
        bad = [name for name, p in self.model.named_parameters() if not np.isfinite(p.data).all()]
        if bad:
            raise TrainingDiverged(f"not saving a checkpoint of step {self.step}: {len(bad)} parameters "
                                   f"are not finite (the first: {bad[0]})", step=self.step)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_checkpoint(path, self)
        if path == self.checkpoint_path:
            self.saved_step = self.step
        return path

    @classmethod
    def from_checkpoint(cls, path, steps=None, out=None, text=None, progress=True, log=print,
                        overwrite=False):
        """A Trainer in the state saved at `path` (a checkpoint file or a run
        directory). It writes into the checkpoint's directory, or into `out`
        (a directory holding another run needs overwrite=True). `steps`
        changes the total number of steps (the cosine schedule then ends at
        the new total); `text` points a charlm run at its text file moved
        elsewhere (its contents must be the same)."""
        path = checkpoint_file(path)
        arrays, metadata = read_checkpoint(path)
        config = TrainConfig.from_json(metadata["config"])
        step = int(metadata["step"])
        run_dir = os.path.dirname(path) or "."
        changes = {"out": run_dir if out is None else os.fspath(out)}
        if steps is not None:
            changes["steps"] = steps
        if text is not None:
            if config.is_seq2seq:
                raise ConfigError(f"--text is for charlm runs; {path} is a {config.task} run")
            changes["text"] = os.fspath(text)
        config = replace(config, **changes)
        if config.steps <= step:
            raise ConfigError(f"the checkpoint is at step {step} of {config.steps}: nothing to do "
                              f"(pass --steps N with N > {step} to train longer)")
        try:
            trainer = cls(config, progress=progress, log=log, overwrite=overwrite)
        except FileNotFoundError as e:
            if config.is_seq2seq or text is not None:
                raise
            raise FileNotFoundError(f"{e}; if the text moved, pass --text PATH (resume "
                                    "checks that its contents are the same)") from None
        restore_checkpoint(trainer, arrays, metadata)
        trainer._resumed_from, trainer.saved_step = run_dir, step
        return trainer

    # ------------------------------------------------------------ the report
    def report(self, plots=True):
        """Final evaluation, a summary, examples, and (with matplotlib) the
        loss curve and attention heatmaps in the output directory. Returns
        the final metrics."""
        metrics = self.job.final_evaluate()
        train = self.history["train"]
        recent = [row[1] for row in train[-50:]]
        lines = [f"done: {self.step} steps in {self.train_seconds:.1f} s "
                 f"({self.model.num_parameters():,} parameters)"]
        if recent:
            lines.append(f"final train loss {sum(recent) / len(recent):.4f} (mean of the last {len(recent)} steps)")
        what = (f"{len(self.job.held_out)} held-out sequences, greedy decoding" if self.config.is_seq2seq
                else f"{self.config.eval_size} validation windows")
        lines.append(f"final {format_metrics(metrics)} ({what})")
        lines += self.job.examples()
        for line in lines:  # the results first: drawing the plots takes seconds (6 s for the copy task's)
            self.log(line)
        if plots:
            for line in self.write_plots():
                self.log(line)
        os.makedirs(self.config.out, exist_ok=True)
        self._log_metrics({"type": "final", "step": self.step, **finite_json(metrics)})
        self.write_metrics("done", final=metrics)
        self.log(f"checkpoint: {self.checkpoint_path}")
        return metrics

    def write_metrics(self, status, final=None):
        """Write metrics.json: {"status", "step", "train_seconds", "final", "history"}
        (status "done", "interrupted" or "diverged"; final: the final
        evaluation, None unless done)."""
        write_summary(self._path(METRICS_NAME), status, self.step, self.train_seconds, self.history, final)

    def write_plots(self):
        """Write loss.png and attention/<layer>.png; returns lines saying what was written
        (and says first that it is drawing: a few seconds without output otherwise)."""
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return ["plots skipped: matplotlib is not installed (pip install 'tinygrad_attn[train]')"]
        self.log("drawing the loss curve and the attention heatmaps ...")
        from .plots import attention_heatmaps, loss_curve
        loss_path = loss_curve(self.history, self._path(LOSS_PLOT_NAME),
                               title=f"{self.config.task}: training and evaluation")
        paths = attention_heatmaps(self.job.attention_example(), self._path(ATTENTION_DIR))
        return [f"loss curve: {loss_path}",
                f"attention heatmaps ({len(paths)} layers, one panel per head): "
                f"{os.path.dirname(paths[0]) if paths else '-'}"]


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
