"""Adam and AdamW, with PyTorch's update rules (bias correction, amsgrad)."""
import math
import numbers

import numpy as np

from ..kernels.adam import adam_update
from ..kernels.registry import kernel_example
from ..ops.array_views import random_array
from ..tensor import Tensor
from .optimizer import Optimizer, _implementation_options


class Adam(Optimizer):
    """Adam (Kingma & Ba), updating each parameter exactly as torch.optim.Adam does.

    With g the gradient (negated if `maximize`), t the step count (from 1),
    lambda the weight decay:

        g <- g + lambda * p                 (L2 weight decay, added to the gradient)
        m <- beta1 * m + (1 - beta1) * g               (first moment)
        v <- beta2 * v + (1 - beta2) * g^2             (second moment)
        v_max <- max(v_max, v)   with amsgrad; then v_max replaces v below
        p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

    The per-parameter state is `step` (an int), `exp_avg` (m), `exp_avg_sq`
    (v) and, with amsgrad, `max_exp_avg_sq`.

    Arguments and defaults are torch.optim.Adam's; decoupled_weight_decay=True
    makes it AdamW. The update runs as one fused kernel pass over each
    parameter (kernels/adam.py) unless fused=False, which runs the numpy
    version written out below, step by step: the two give the same bits.
    foreach is accepted and changes nothing; capturable=True and
    differentiable=True raise NotImplementedError.

    Example:
        >>> opt = Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        _implementation_options(type(self).__name__, capturable, differentiable)
        self.decoupled_weight_decay = bool(decoupled_weight_decay)
        self.fused = fused is not False
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group):
        name = type(self).__name__
        for key in ("lr", "eps", "weight_decay"):
            self._check_number(group, key)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"{name}: betas must be a pair (beta1, beta2), got {betas!r}")
        group["betas"] = tuple(betas)  # a list (from JSON, or the user's) becomes a tuple
        for i, beta in enumerate(betas):
            if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
                raise TypeError(f"{name}: betas[{i}] must be a number, got {beta!r}")
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name}: invalid beta parameter at index {i}: {beta} "
                                 "(must be in [0, 1))")

    def _state_keys(self, group):
        keys = {"step", "exp_avg", "exp_avg_sq"}
        return keys | {"max_exp_avg_sq"} if group["amsgrad"] else keys

    def _update(self, p, grad, state, group):
        # Python floats keep float32 parameters float32 (numpy's weak scalars).
        lr, eps, weight_decay = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        beta1, beta2 = (float(b) for b in group["betas"])
        if not state:
            state["step"] = 0
            state["exp_avg"] = np.zeros_like(p.data)
            state["exp_avg_sq"] = np.zeros_like(p.data)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = np.zeros_like(p.data)
        state["step"] += 1
        t = state["step"]
        arrays = [p.data, grad, state["exp_avg"], state["exp_avg_sq"]] + \
            ([state["max_exp_avg_sq"]] if group["amsgrad"] else [])
        if self.fused and all(a.flags.c_contiguous for a in arrays):
            flat = [a.reshape(-1) for a in arrays]
            adam_update(*flat[:4], flat[4] if group["amsgrad"] else flat[3], lr, (beta1, beta2), eps,
                        weight_decay, self.decoupled_weight_decay, group["amsgrad"], group["maximize"], t)
            return

        if group["maximize"]:
            grad = -grad
        if weight_decay != 0:
            if self.decoupled_weight_decay:
                p.data *= 1 - lr * weight_decay  # AdamW: shrink the weights themselves
            else:
                grad = grad + weight_decay * p.data  # a new array: p.grad stays untouched

        m, v = state["exp_avg"], state["exp_avg_sq"]
        m += (1 - beta1) * (grad - m)  # = beta1 * m + (1 - beta1) * g (torch's lerp)
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        if group["amsgrad"]:
            v = np.maximum(state["max_exp_avg_sq"], v, out=state["max_exp_avg_sq"])

        step_size = lr / (1 - beta1 ** t)
        denom = np.sqrt(v)
        denom /= math.sqrt(1 - beta2 ** t)
        denom += eps
        update = np.divide(m, denom, out=denom)
        update *= step_size
        p.data -= update


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW.

    The weights shrink directly, p <- p * (1 - lr * lambda), before the Adam
    update; the decay never enters the moments m and v. Default lambda 1e-2.

    Example:
        >>> decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        >>> no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        >>> opt = AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, foreach=foreach,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)


@kernel_example
def _example(dtype, size):
    """The fused update's kernel (kernels/adam.py): one AdamW step on a made-up
    parameter and gradient of `size` elements; returns the new parameter."""
    p = Tensor(random_array(dtype, size))
    p.grad = Tensor(random_array(dtype, size, seed=1))
    AdamW([p]).step()
    return [p.data]
