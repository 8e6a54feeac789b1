"""Stochastic gradient descent, with PyTorch's momentum, dampening, Nesterov
and weight decay."""
from .optimizer import Optimizer, _implementation_options


class SGD(Optimizer):
    """SGD, updating each parameter exactly as torch.optim.SGD does.

    With g the gradient (negated if `maximize`), mu the momentum, tau the
    dampening and lambda the weight decay, one step is:

        g <- g + lambda * p                        (weight decay, L2)
        b <- g                    on the first step (momentum != 0)
        b <- mu * b + (1 - tau) * g   afterwards
        g <- g + mu * b   if nesterov,   else  g <- b
        p <- p - lr * g

    Nesterov needs a positive momentum and zero dampening. Arguments and
    defaults are torch.optim.SGD's (lr=1e-3 as in torch 2.x); foreach and
    fused are accepted and change nothing, differentiable=True raises.

    Example:
        >>> opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
        >>> opt.zero_grad(); loss.backward(); opt.step()
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False, fused=None):
        _implementation_options("SGD", differentiable=differentiable)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def _check_group(self, group):
        for key in ("lr", "momentum", "weight_decay"):
            self._check_number(group, key)
        self._check_number(group, "dampening", low=float("-inf"))
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError(f"SGD: Nesterov momentum requires a momentum > 0 and zero dampening "
                             f"(got momentum={group['momentum']}, dampening={group['dampening']})")

    def _state_keys(self, group):
        return {"momentum_buffer"} if group["momentum"] != 0 else set()

    def _update(self, p, grad, state, group):
        # Python floats keep float32 parameters float32 (numpy's weak scalars).
        lr, momentum = float(group["lr"]), float(group["momentum"])
        dampening, weight_decay = float(group["dampening"]), float(group["weight_decay"])
        if group["maximize"]:
            grad = -grad
        if weight_decay != 0:
            grad = grad + weight_decay * p.data  # a new array: p.grad stays untouched
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.copy()
            else:
                buf *= momentum
                buf += (1 - dampening) * grad
            grad = grad + momentum * buf if group["nesterov"] else buf
        p.data -= lr * grad
