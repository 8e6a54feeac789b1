"""A training checkpoint: what it holds, writing it, reading it back.

A checkpoint is one safetensors file (checkpoint.safetensors in the run's
directory, written atomically by `tinygrad_attn.save`):

    arrays    model.<name>       the model's weights
              optimizer.<...>    the optimizer's state (optim.flatten_state_dict)
              scheduler.<...>    the lr schedule's state
              history.train      (steps, 4): step, loss, lr, gradient norm (NaN if unknown)
    metadata  format, config, model (the model's config as JSON), step,
              train_seconds, rng_state (of the framework's generator),
              history_eval, and what the task adds (the job's metadata)

so a resumed run computes bit for bit what the uninterrupted run would have.
"""
import json
import math
import os

import numpy as np

from .. import optim
from ..checkpoint import CheckpointError, load, save
from ..models import GPT, GPTConfig, Llama, LlamaConfig, Seq2SeqConfig, Seq2SeqTransformer
from ..random import get_generator
from .rundir import CHECKPOINT_NAME

FORMAT = "tinygrad_attn.train/1"  # metadata["format"] of our checkpoints
# the "kind" of a model config's JSON -> (model class, config class)
MODEL_CLASSES = {"Seq2SeqConfig": (Seq2SeqTransformer, Seq2SeqConfig), "GPTConfig": (GPT, GPTConfig),
                 "LlamaConfig": (Llama, LlamaConfig)}


def checkpoint_file(path):
    """The checkpoint file of `path`: the file itself, or a run directory's
    checkpoint.safetensors (CheckpointError if the directory has none,
    FileNotFoundError if nothing is at `path`)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        candidate = os.path.join(path, CHECKPOINT_NAME)
        if not os.path.exists(candidate):
            raise CheckpointError(f"{path} is a directory without a {CHECKPOINT_NAME}")
        path = candidate
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint not found: {path}")
    return path


def read_checkpoint(path):
    """(arrays, metadata) of a training checkpoint (a file or a run
    directory); CheckpointError if the file is not one of ours
    (FileNotFoundError if it does not exist)."""
    path = checkpoint_file(path)
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


def write_checkpoint(path, trainer):
    """Save everything a `Trainer` needs to resume to `path` (atomically)."""
    arrays = {f"model.{k}": v.data for k, v in trainer.model.state_dict().items()}
    arrays.update(optim.flatten_state_dict(trainer.optimizer.state_dict(), "optimizer."))
    arrays.update(optim.flatten_state_dict(trainer.scheduler.state_dict(), "scheduler."))
    # the per-step curve as an array (it grows with the run); the few evaluations as JSON
    arrays["history.train"] = np.array([[s, loss, lr, np.nan if g is None else g]
                                        for s, loss, lr, g in trainer.history["train"]],
                                       dtype=np.float64).reshape(-1, 4)
    metadata = {
        "format": FORMAT,
        "config": trainer.config.to_json(),
        "model": trainer.model.config.to_json(),
        "step": str(trainer.step),
        "train_seconds": repr(trainer.train_seconds),
        "rng_state": json.dumps(trainer._rng_state),
        "history_eval": json.dumps(trainer.history["eval"]),
        **trainer.job.metadata(),
    }
    save(arrays, path, metadata=metadata)


def restore_checkpoint(trainer, arrays, metadata):
    """Put the state `write_checkpoint` saved into `trainer`, freshly built
    from the checkpoint's config: weights, optimizer and schedule, step,
    history, and the framework's generator."""
    trainer.job.check_metadata(metadata)
    prefix = "model."
    trainer.model.load_state_dict({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
    trainer.optimizer.load_state_dict(optim.unflatten_state_dict(arrays, "optimizer."))
    trainer.scheduler.load_state_dict(optim.unflatten_state_dict(arrays, "scheduler."))
    if isinstance(trainer.scheduler, optim.CosineWarmupLR):
        trainer.scheduler.total_steps = trainer.config.steps  # a longer run decays over its new length
    trainer.step = int(metadata["step"])
    trainer.train_seconds = float(metadata.get("train_seconds", 0.0))
    rows = arrays["history.train"].tolist()
    trainer.history = {"train": [[int(r[0]), r[1], r[2], r[3] if len(r) > 3 and math.isfinite(r[3]) else None]
                                 for r in rows],
                       "eval": json.loads(metadata["history_eval"])}
    trainer._rng_state = json.loads(metadata["rng_state"])
    get_generator().bit_generator.state = trainer._rng_state
