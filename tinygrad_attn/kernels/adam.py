"""One pass of Adam / AdamW over a parameter: the update of optim/adam.py, fused.

The readable version in `tinygrad_attn/optim/adam.py` makes about ten numpy
passes over each parameter, each with a temporary (the weight decay, two
moments, a square root, a division...). Here every element is read once
and p, m, v (and v_max) are written once, on our threads:

    g <- -g if maximize;   g <- g + lambda p      (Adam's L2 decay)
    p <- p (1 - lr lambda)                         (AdamW's decoupled decay)
    m <- m + (1 - beta1) (g - m)
    v <- beta2 v + (1 - beta2) g^2;   v_max <- max(v_max, v) with amsgrad
    p <- p - step_size * m / (sqrt(v) / bias2 + eps)

with step_size = lr / (1 - beta1^t) and bias2 = sqrt(1 - beta2^t). Each
element sees the same operations in the same order as in the numpy
version (no fast-math: no fused multiply-adds), so both give the same bits.
"""
import numpy as np

from .registry import kernel
from .threads import parallel_for


# error_model="numpy": a division follows IEEE instead of raising ZeroDivisionError,
# so the loop needs no check per element and vectorizes (no fast-math otherwise).
# The arrays are sliced to [start, stop) and indexed from 0 (no negative-index
# checks), each element loaded once into a local: the loop then runs ~7x faster.
@kernel(error_model="numpy")
def _adam_update(p, g, moments, constants, rules, start, stop):
    """One Adam / AdamW step on elements [start, stop) of the flat arrays p
    (updated in place) and g, the gradient:
    moments    (m, v, v_max), the state, updated in place (v_max is v without amsgrad)
    constants  (lambda, 1 - lr lambda, 1 - beta1, beta2, 1 - beta2,
                step_size = lr / (1 - beta1^t), bias2 = sqrt(1 - beta2^t), eps), in p's dtype
    rules      (decoupled: AdamW's decay, amsgrad, maximize)"""
    m, v, v_max = moments
    weight_decay, shrink, one_minus_beta1, beta2, one_minus_beta2, step_size, bias2, eps = constants
    decoupled, amsgrad, maximize = rules
    ps, gs, ms, vs, vmaxs = p[start:stop], g[start:stop], m[start:stop], v[start:stop], v_max[start:stop]
    for i in range(ps.shape[0]):
        grad = -gs[i] if maximize else gs[i]  # g <- -g if maximize
        w = ps[i]
        if weight_decay != 0:
            if decoupled:
                w *= shrink  # p <- p (1 - lr lambda)             (AdamW's decoupled decay)
            else:
                grad = grad + weight_decay * w  # g <- g + lambda p  (Adam's L2 decay)
        mi = ms[i] + one_minus_beta1 * (grad - ms[i])  # m <- m + (1 - beta1) (g - m)
        vi = vs[i] * beta2
        vi += one_minus_beta2 * (grad * grad)  # v <- beta2 v + (1 - beta2) g^2
        ms[i], vs[i] = mi, vi
        if amsgrad:  # v_max <- max(v_max, v), NaN winning as in np.maximum; v_max stands for v below
            vm = vmaxs[i]
            vi = vm if (vm >= vi or vm != vm) else vi
            vmaxs[i] = vi
        denom = np.sqrt(vi)
        denom /= bias2
        denom += eps  # sqrt(v) / bias2 + eps
        update = mi / denom
        update *= step_size  # step_size * m / (sqrt(v) / bias2 + eps)
        ps[i] = w - update  # p <- p - update


def adam_update(p, g, m, v, v_max, lr, betas, eps, weight_decay, decoupled, amsgrad, maximize, step):
    """Update the flat arrays p, m, v (and v_max with amsgrad) in place, for gradient g at step `step`.

    The constants are worked out in float64 and rounded once to p's dtype,
    as numpy does with Python floats in the readable version."""
    t = p.dtype.type
    beta1, beta2 = betas
    constants = (t(weight_decay), t(1 - lr * weight_decay), t(1 - beta1), t(beta2), t(1 - beta2),
                 t(lr / (1 - beta1 ** step)), t(np.sqrt(1 - beta2 ** step)), t(eps))
    rules = (bool(decoupled), bool(amsgrad), bool(maximize))
    parallel_for(_adam_update, p.shape[0], p, g, (m, v, v_max), constants, rules)
