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
def _adam_update(p, g, m, v, v_max, shrink, weight_decay, decoupled, one_minus_beta1, beta2, one_minus_beta2,
                 amsgrad, maximize, eps, step_size, bias2, start, stop):
    ps, gs, ms, vs, vmaxs = p[start:stop], g[start:stop], m[start:stop], v[start:stop], v_max[start:stop]
    for i in range(ps.shape[0]):
        grad = -gs[i] if maximize else gs[i]
        w = ps[i]
        if weight_decay != 0:
            if decoupled:
                w *= shrink
            else:
                grad = grad + weight_decay * w
        mi = ms[i] + one_minus_beta1 * (grad - ms[i])
        vi = vs[i] * beta2
        vi += one_minus_beta2 * (grad * grad)
        ms[i], vs[i] = mi, vi
        if amsgrad:  # v_max <- max(v_max, v), NaN winning as in np.maximum
            vm = vmaxs[i]
            vi = vm if (vm >= vi or vm != vm) else vi
            vmaxs[i] = vi
        denom = np.sqrt(vi)
        denom /= bias2
        denom += eps
        update = mi / denom
        update *= step_size
        ps[i] = w - update


def adam_update(p, g, m, v, v_max, lr, betas, eps, weight_decay, decoupled, amsgrad, maximize, step):
    """Update the flat arrays p, m, v (and v_max with amsgrad) in place, for gradient g at step `step`.

    The constants are worked out in float64 and rounded once to p's dtype,
    as numpy does with Python floats in the readable version."""
    t = p.dtype.type
    beta1, beta2 = betas
    parallel_for(_adam_update, p.shape[0], p, g, m, v, v_max, t(1 - lr * weight_decay), t(weight_decay), decoupled,
                 t(1 - beta1), t(beta2), t(1 - beta2), amsgrad, maximize, t(eps), t(lr / (1 - beta1 ** step)),
                 t(np.sqrt(1 - beta2 ** step)))
