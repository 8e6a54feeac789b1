"""Learning-rate schedules, used as in torch.optim.lr_scheduler:

    opt = AdamW(model.parameters(), lr=1e-3)
    sched = CosineWarmupLR(opt, warmup_steps=100, total_steps=2000, min_lr=1e-4)
    for step in range(2000):
        ...; opt.step(); sched.step()

Creating a scheduler records each group's `lr` as its `initial_lr` (the base
learning rate) and sets the lr for step 0; every `sched.step()` advances one
step and sets the lr from a closed form of the step count, so the schedule
never drifts and a loaded state gives exactly the same learning rates.
"""
import math
import numbers

from .optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses define `lr_at(base_lr, step)` (or `get_lr()`).

    Attributes as in torch: `optimizer`, `base_lrs` (one per group),
    `last_epoch` (the step count, 0 after construction).
    """

    def __init__(self, optimizer, last_epoch=-1):
        name = type(self).__name__
        _check_optimizer(name, optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"{name}: param_groups[{i}] has no 'initial_lr'; resuming with "
                                   f"last_epoch={last_epoch} needs the optimizer's state loaded first")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.step()

    def lr_at(self, base_lr, step):
        """The learning rate of a group with base lr `base_lr` at `step`."""
        raise NotImplementedError

    def get_lr(self):
        """The learning rates of all groups at the current step."""
        return [self.lr_at(base_lr, self.last_epoch) for base_lr in self.base_lrs]

    def step(self, epoch=None):
        """Advance one step and set every group's lr. (PyTorch's deprecated
        step(epoch) is not implemented.)"""
        if epoch is not None:
            raise NotImplementedError(f"{type(self).__name__}.step: the epoch argument (deprecated "
                                      "in PyTorch) is not implemented; call step() once per step")
        self.last_epoch += 1
        self._set_lrs(self.get_lr())

    def _set_lrs(self, lrs):
        for group, lr in zip(self.optimizer.param_groups, lrs):
            group["lr"] = lr
        self._last_lr = list(lrs)

    def get_last_lr(self):
        """The learning rates set by the last `step()`, one per group."""
        return list(self._last_lr)

    def state_dict(self):
        """The scheduler's state: plain Python numbers (functions are not saved)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self.__dict__.items()
                if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state_dict):
        """Restore a saved state and set the optimizer's lrs to the saved ones
        (so the order of loading optimizer and scheduler does not matter)."""
        name = type(self).__name__
        expected = set(self.state_dict())
        if not isinstance(state_dict, dict) or set(state_dict) != expected:
            got = sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{name}.load_state_dict: expected keys {sorted(expected)}, got {got} "
                             "(was the state saved by another scheduler?)")
        n_groups = len(self.optimizer.param_groups)
        for key in ("base_lrs", "_last_lr"):
            if key in state_dict and len(state_dict[key]) != n_groups:
                raise ValueError(f"{name}.load_state_dict: {key} has {len(state_dict[key])} entries "
                                 f"but the optimizer has {n_groups} parameter groups")
        self.__dict__.update({k: (list(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in state_dict.items()})
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base_lr
        self._set_lrs(self._last_lr)


def _check_optimizer(name, optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"{name}: {type(optimizer).__name__} is not an Optimizer")


def _check_steps(name, **values):
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise ValueError(f"{name}: {key} must be a non-negative integer, got {value!r}")


def _check_min_lr(name, optimizer, min_lr):
    _check_optimizer(name, optimizer)
    if isinstance(min_lr, bool) or not isinstance(min_lr, numbers.Real) or not min_lr >= 0:
        raise ValueError(f"{name}: min_lr must be a number >= 0, got {min_lr!r}")
    for i, group in enumerate(optimizer.param_groups):
        if min_lr > group.get("initial_lr", group["lr"]):
            raise ValueError(f"{name}: min_lr {min_lr} is above the learning rate "
                             f"{group.get('initial_lr', group['lr'])} of parameter group {i}")


class LambdaLR(LRScheduler):
    """lr = base_lr * lr_lambda(step), as torch.optim.lr_scheduler.LambdaLR.

    `lr_lambda` is one function, or a list with one per parameter group.
    The functions are not part of `state_dict()`: re-create the scheduler
    with the same functions before loading its state.

    Example (halve the lr every 100 steps):
        >>> sched = LambdaLR(opt, lambda step: 0.5 ** (step // 100))
    """

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer("LambdaLR", optimizer)
        n_groups = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n_groups:
                raise ValueError(f"LambdaLR: expected {n_groups} lr_lambdas (one per parameter "
                                 f"group), got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n_groups
        for f in self.lr_lambdas:
            if not callable(f):
                raise TypeError(f"LambdaLR: lr_lambda must be callable, got {f!r}")
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base_lr * f(self.last_epoch) for f, base_lr in zip(self.lr_lambdas, self.base_lrs)]


def _check_decay_after_warmup(name, warmup_steps, total_steps):
    if total_steps <= warmup_steps:
        raise ValueError(f"{name}: total_steps ({total_steps}) must be greater than "
                         f"warmup_steps ({warmup_steps})")


def _decay_progress(step, warmup_steps, total_steps):
    """How far `step` is from the end of warmup to `total_steps`, in [0, 1]."""
    return min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))


class LinearWarmupLR(LRScheduler):
    """Linear warmup from 0 to the base lr, then constant or a linear decay.

        lr(step) = base_lr * step / warmup_steps                       step < warmup_steps
                 = base_lr                          no total_steps, afterwards
                 = base_lr + (min_lr - base_lr) * min(1, (step - warmup_steps)
                                                     / (total_steps - warmup_steps))

    With min_lr=0 this is Hugging Face's `get_linear_schedule_with_warmup`
    (the first step has lr 0 when warmup_steps > 0). After `total_steps`
    the lr stays at `min_lr`.

    Example:
        >>> sched = LinearWarmupLR(opt, warmup_steps=100, total_steps=1000)
    """

    def __init__(self, optimizer, warmup_steps, total_steps=None, min_lr=0.0, last_epoch=-1):
        _check_steps("LinearWarmupLR", warmup_steps=warmup_steps)
        if total_steps is not None:
            _check_steps("LinearWarmupLR", total_steps=total_steps)
            _check_decay_after_warmup("LinearWarmupLR", warmup_steps, total_steps)
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        _check_min_lr(type(self).__name__, optimizer, min_lr)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, step):
        if step < self.warmup_steps:
            return base_lr * step / self.warmup_steps
        if self.total_steps is None:
            return base_lr
        return base_lr + (self.min_lr - base_lr) * _decay_progress(step, self.warmup_steps, self.total_steps)


class InverseSqrtLR(LRScheduler):
    """The Transformer paper's schedule: warmup, then decay as 1/sqrt(step).

        lr(step) = base_lr * scale * d_model^-0.5 * min(s^-0.5, s * warmup_steps^-1.5),
        s = max(step, 1)

    It rises linearly for `warmup_steps` steps, peaks at
    base_lr * scale / sqrt(d_model * warmup_steps), then falls as 1/sqrt(s).
    Build the optimizer with lr=1.0 to get the paper's formula exactly
    (the paper: d_model=512, warmup 4000, Adam betas (0.9, 0.98), eps 1e-9);
    `scale` is the Annotated Transformer's `factor`. Step 0 uses s = 1, as
    the Annotated Transformer does, so the first update is not zero.

    Example:
        >>> opt = Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        >>> sched = InverseSqrtLR(opt, d_model=512, warmup_steps=4000)
    """

    def __init__(self, optimizer, d_model, warmup_steps, scale=1.0, last_epoch=-1):
        _check_steps("InverseSqrtLR", d_model=d_model, warmup_steps=warmup_steps)
        if d_model == 0 or warmup_steps == 0:
            raise ValueError(f"InverseSqrtLR: d_model and warmup_steps must be positive, got "
                             f"d_model={d_model}, warmup_steps={warmup_steps}")
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not scale > 0:
            raise ValueError(f"InverseSqrtLR: scale must be a number > 0, got {scale!r}")
        self.d_model, self.warmup_steps, self.scale = d_model, warmup_steps, scale
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, step):
        s = max(step, 1)
        return base_lr * self.scale * self.d_model ** -0.5 * min(s ** -0.5, s * self.warmup_steps ** -1.5)


class CosineWarmupLR(LRScheduler):
    """Linear warmup, then a half cosine from the base lr down to `min_lr`.

        lr(step) = base_lr * step / warmup_steps                      step < warmup_steps
                 = min_lr + (base_lr - min_lr) * (1 + cos(pi * p)) / 2   afterwards,
        p = min(1, (step - warmup_steps) / (total_steps - warmup_steps))

    After `total_steps` the lr stays at `min_lr` (as nanoGPT's schedule).
    With min_lr=0 and step <= total_steps this is Hugging Face's
    `get_cosine_schedule_with_warmup`.

    Example:
        >>> sched = CosineWarmupLR(opt, warmup_steps=100, total_steps=2000, min_lr=1e-4)
    """

    def __init__(self, optimizer, warmup_steps, total_steps, min_lr=0.0, last_epoch=-1):
        _check_steps("CosineWarmupLR", warmup_steps=warmup_steps, total_steps=total_steps)
        _check_decay_after_warmup("CosineWarmupLR", warmup_steps, total_steps)
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        _check_min_lr(type(self).__name__, optimizer, min_lr)
        super().__init__(optimizer, last_epoch)

    def lr_at(self, base_lr, step):
        if step < self.warmup_steps:
            return base_lr * step / self.warmup_steps
        progress = _decay_progress(step, self.warmup_steps, self.total_steps)
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
