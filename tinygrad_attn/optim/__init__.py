"""Optimizers, learning-rate schedules and gradient clipping.

    from tinygrad_attn import optim
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    sched = optim.CosineWarmupLR(opt, warmup_steps=100, total_steps=2000)
    opt.zero_grad(); loss.backward()
    optim.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); sched.step()

See docs/training.md.
"""
from .adam import Adam, AdamW
from .clip import clip_grad_norm_, clip_grad_value_
from .lr_scheduler import (CosineWarmupLR, InverseSqrtLR, LambdaLR, LinearWarmupLR, LRScheduler)
from .optimizer import Optimizer
from .sgd import SGD
from .state import flatten_state_dict, unflatten_state_dict
from . import lr_scheduler  # noqa: F401  (torch-style access: optim.lr_scheduler.LambdaLR)

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LRScheduler", "LambdaLR", "LinearWarmupLR",
           "InverseSqrtLR", "CosineWarmupLR", "clip_grad_norm_", "clip_grad_value_",
           "flatten_state_dict", "unflatten_state_dict"]
