"""Finite-difference gradient checking: the proof that a backward is right.

`gradcheck(fn, inputs)` builds the full Jacobian of `fn` twice: numerically,
by nudging every element of every input that requires grad by +-eps
(central differences, in float64), and analytically, by one backward pass per
output element. It compares the two element by element.
"""
import numpy as np

from .autograd import grad as autograd_grad, no_grad
from .tensor import Tensor


class GradcheckError(AssertionError):
    """The analytic and numerical Jacobians disagree."""


def _outputs(fn, inputs):
    out = fn(*inputs)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return tuple(o for o in outs if isinstance(o, Tensor))


def _flat_outputs(fn, inputs):
    with no_grad():
        return np.concatenate([o.data.astype(np.float64).ravel() for o in _outputs(fn, inputs)])


def _as_float64(x):
    if isinstance(x, Tensor) and x.dtype.kind == "f":
        return Tensor(x.data.astype(np.float64), requires_grad=x.requires_grad)
    return x


def numerical_jacobian(fn, inputs, eps=1e-6):
    """For each input that requires grad, the (n_outputs, n_elements) matrix
    of central differences (f(x + eps e_j) - f(x - eps e_j)) / 2 eps."""
    jacobians = []
    for x in inputs:
        if not (isinstance(x, Tensor) and x.requires_grad):
            continue
        columns = []
        # Index element by element (not through a reshape, which would copy a
        # non-contiguous input and perturb the copy instead of x).
        for idx in np.ndindex(x.shape):
            orig = x.data[idx]
            x.data[idx] = orig + eps
            plus = _flat_outputs(fn, inputs)
            x.data[idx] = orig - eps
            minus = _flat_outputs(fn, inputs)
            x.data[idx] = orig
            columns.append((plus - minus) / (2 * eps))
        n_out = _flat_outputs(fn, inputs).size
        jacobians.append(np.stack(columns, axis=1) if columns else np.zeros((n_out, 0)))
    return jacobians


def analytic_jacobian(fn, inputs):
    """The same matrices from backward: row i is the gradient of output element i.

    Each row's upstream gradient (one-hot: 1 at output element i) is
    read-only: an op whose backward writes into grad_output (which the
    engine may share with other ops) fails the check."""
    wrt = [x for x in inputs if isinstance(x, Tensor) and x.requires_grad]
    outs = _outputs(fn, inputs)
    n_out = sum(o.numel() for o in outs)
    jacobians = [np.zeros((n_out, x.numel())) for x in wrt]
    row = 0
    for o in outs:
        for i in range(o.numel()):
            if o.requires_grad:
                seed = np.zeros(o.shape, dtype=o.dtype)
                seed.reshape(-1)[i] = 1
                seed.flags.writeable = False  # so a backward that writes into it is caught
                try:
                    grads = autograd_grad([o], wrt, [seed], retain_graph=True, allow_unused=True)
                except ValueError as e:
                    if "read-only" not in str(e):
                        raise
                    raise GradcheckError(f"gradcheck: a backward modified its grad_output in place "
                                         f"({e}); backward must return new arrays") from None
                for jac, g in zip(jacobians, grads):
                    if g is not None:
                        jac[row] = g.data.reshape(-1)
            row += 1
    return jacobians


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """Check the gradients of `fn` at `inputs` against finite differences.

    `inputs` is a Tensor or a tuple of them (other values are passed through
    to `fn` unchanged). Floating tensors are copied to float64; those with
    `requires_grad` are checked. `fn` may return a Tensor or a tuple of them.
    Every element of every checked input is compared with every output
    element: |analytic - numerical| <= atol + rtol * |numerical|.

    Returns True when all agree. Otherwise raises `GradcheckError` naming
    the input, the element, the output element and both values, or returns
    False when `raise_exception=False`.
    """
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    inputs = tuple(_as_float64(x) for x in inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check")

    analytic = analytic_jacobian(fn, inputs)
    numerical = numerical_jacobian(fn, inputs, eps)
    for index, a, n in zip(checked, analytic, numerical):
        bad = ~(np.abs(a - n) <= atol + rtol * np.abs(n))
        if bad.any():
            if not raise_exception:
                return False
            err = np.where(bad, np.abs(a - n), -1.0)
            out_i, elem = np.unravel_index(np.argmax(err), err.shape)
            where = np.unravel_index(elem, inputs[index].shape) if inputs[index].ndim else ()
            raise GradcheckError(
                f"gradcheck failed for input {index} (shape {inputs[index].shape}) at element "
                f"{tuple(int(w) for w in where)}, output element {int(out_i)}: numerical "
                f"{n[out_i, elem]:.8g}, analytic {a[out_i, elem]:.8g} "
                f"({int(bad.sum())} of {bad.size} Jacobian entries differ)")
    return True
