"""Training runs for the built-in tasks: configuration, loop, checkpoints,
report, and using a trained run.

    from tinygrad_attn.train import TrainConfig, Trainer, load_run
    trainer = Trainer(TrainConfig(task="reverse", steps=500, out="runs/reverse"))
    trainer.fit()
    trainer.report()

    model, meta = load_run("runs/reverse")     # the model in eval mode, and what it needs
    model.greedy_decode(meta.encode([3, 1, 4]))

The command line (`python -m tinygrad_attn train ...`) is a thin layer over
this package; see docs/training.md.
"""
from .config import GELUS, SCHEDULES, TASK_DEFAULTS, TASKS, ConfigError, TrainConfig
from .rundir import (CHECKPOINT_NAME, GRAD_NORMS_NAME, METRICS_LOG_NAME, METRICS_NAME, clear_run,
                     run_files)
from .run import RunInfo, export_torch, load_run, torch_state_dict
from .checkpoints import checkpoint_file, model_from_checkpoint, read_checkpoint
from .signals import Terminated
from .trainer import RunExistsError, Trainer, TrainingDiverged, make_scheduler, weight_decay_groups

__all__ = ["TrainConfig", "ConfigError", "TASKS", "TASK_DEFAULTS", "SCHEDULES", "GELUS", "Trainer",
           "RunExistsError", "TrainingDiverged", "Terminated", "load_run", "RunInfo", "export_torch",
           "torch_state_dict", "read_checkpoint", "checkpoint_file", "model_from_checkpoint",
           "weight_decay_groups", "make_scheduler", "run_files", "clear_run", "CHECKPOINT_NAME",
           "METRICS_LOG_NAME", "METRICS_NAME", "GRAD_NORMS_NAME"]
