"""Training runs for the built-in tasks: configuration, loop, checkpoints, report.

    from tinygrad_attn.train import TrainConfig, Trainer
    trainer = Trainer(TrainConfig(task="reverse", steps=500, out="runs/reverse"))
    trainer.fit()
    trainer.report()

The command line (`python -m tinygrad_attn train ...`) is a thin layer over
this package; see docs/training.md.
"""
from .config import SCHEDULES, TASK_DEFAULTS, TASKS, ConfigError, TrainConfig
from .trainer import (CHECKPOINT_NAME, GRAD_NORMS_NAME, Trainer, make_scheduler,
                      model_from_checkpoint, read_checkpoint, weight_decay_groups)

__all__ = ["TrainConfig", "ConfigError", "TASKS", "TASK_DEFAULTS", "SCHEDULES", "Trainer",
           "read_checkpoint", "model_from_checkpoint", "weight_decay_groups", "make_scheduler",
           "CHECKPOINT_NAME", "GRAD_NORMS_NAME"]
