"""The kernel rows in plain numpy, run in a worker of their own like the
other frameworks, on the files impl_ours.init wrote.

A row's numpy version is the op's numpy twin, the functions its docstring
names ("Readable version: tinygrad_attn.reference.numpy_backward.silu_backward":
silu_forward and silu_backward), called as written: each takes, by name,
the op's arrays and parameters it names (forward's names: x, weight, axis,
...), the gradient `grad`, and `y`, the forward's output. An op's argument
the twin does not name is not passed (`seed`: the twins draw no random
numbers); an argument the twin needs and the op does not have (the masks
of dropout, `keep`) leaves the row without numpy, saying why, unless
NUMPY_TWINS gives the op's numpy version by hand. The outputs and input
gradients are checked against ours before anything is timed.
"""
import importlib.util
import inspect
import os

import numpy as np

import baselines
import cases as C
import kernel_rows

NAME = "numpy"


def set_threads(n):
    pass  # BLAS reads OPENBLAS_NUM_THREADS, which worker.py sets before numpy loads


def info():
    return {"name": NAME, "versions": f"numpy {np.__version__}", "blas": baselines.numpy_blas(), "threads": "-"}


def _numpy_backward():
    """tinygrad_attn/reference/numpy_backward.py, loaded from its file: it
    imports numpy alone, where importing the package would load Numba and
    the kernels into this worker."""
    package = os.path.dirname(importlib.util.find_spec("tinygrad_attn").origin)
    spec = importlib.util.spec_from_file_location("numpy_backward", os.path.join(package, "reference",
                                                                                 "numpy_backward.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NB = _numpy_backward()


def _arguments(fn, values, at_call=()):
    """The keyword arguments of `fn` that `values` holds; a parameter with
    no default that is neither there nor given at the call makes the row Absent."""
    found = {}
    for name, p in inspect.signature(fn).parameters.items():
        if name in values:
            found[name] = values[name]
        elif name not in at_call and p.default is inspect.Parameter.empty:
            raise C.Absent(f"numpy twin {fn.__name__} needs {name}")
    return found


def _from_twin(row):
    """(forward(arrays) -> out, forward_backward(arrays) -> (out, gradients))
    from the op's numpy twin."""
    if row.meta["twin"] is None:
        raise C.Absent("no numpy twin named in its docstring")
    if row.random:
        raise C.Absent("random: its numpy twin takes the random numbers as an argument")
    forward, backward = (getattr(NB, f"{row.meta['twin']}_{part}") for part in ("forward", "backward"))
    names = row.meta["names"]
    values = dict(row.params)
    forward_args = _arguments(forward, dict(values, **dict.fromkeys(names)))
    backward_args = _arguments(backward, dict(values, **dict.fromkeys(names)), at_call=("grad", "y"))
    takes_y = "y" in inspect.signature(backward).parameters

    def fwd(*arrays):
        out = forward(**dict(forward_args, **{n: a for n, a in zip(names, arrays) if n in forward_args}))
        return out[0] if isinstance(out, tuple) else out  # attention's twin returns (O, P)

    def fwd_bwd(*arrays):
        out = fwd(*arrays)
        extra = dict(grad=row.grad, **({"y": out} if takes_y else {}))
        grads = backward(**dict(backward_args, **{n: a for n, a in zip(names, arrays) if n in backward_args}),
                         **extra)
        return out, list(grads) if isinstance(grads, tuple) else [grads]
    return fwd, fwd_bwd


def _matmul(row):
    """MatMul is a primitive the twins are built of: it has none; numpy's @ is its version."""
    def fwd(a, b):
        return a @ b

    def fwd_bwd(a, b):
        return a @ b, [row.grad @ np.swapaxes(b, -1, -2), np.swapaxes(a, -1, -2) @ row.grad]
    return fwd, fwd_bwd


def _dropout(row):
    """The dropout twin takes its mask (`keep`): numpy draws one at each call, as its dropout would."""
    p, rng = row.params["p"], np.random.default_rng(0)

    def fwd(x):
        return NB.dropout_forward(x, rng.random(x.shape, dtype=np.float32) >= p, p)

    def fwd_bwd(x):
        keep = rng.random(x.shape, dtype=np.float32) >= p
        return NB.dropout_forward(x, keep, p), [NB.dropout_backward(row.grad, keep, p)]
    return fwd, fwd_bwd


# The ops whose numpy version the docstring's twin cannot give, by hand (module docstring).
NUMPY_TWINS = {"MatMul": _matmul, "DropoutOp": _dropout}


def _transpose_b(arrays):
    return [arrays[0], np.swapaxes(arrays[1], -1, -2), *arrays[2:]]


def _transpose_b_grads(arrays, grads):
    return [grads[0], np.swapaxes(grads[1], -1, -2), *grads[2:]]


def _repeat_kv(arrays):
    q, k, v, *rest = arrays
    groups = q.shape[-3] // k.shape[-3]
    return [q, np.repeat(k, groups, axis=-3), np.repeat(v, groups, axis=-3), *rest]


def _repeat_kv_grads(arrays, grads):
    """Each shared head's gradient: the sum of its repeated copies'."""
    def summed(g, kv):
        return g.reshape(kv.shape[:-2] + (-1,) + kv.shape[-2:]).sum(axis=-3)
    return [grads[0], summed(grads[1], arrays[1]), summed(grads[2], arrays[2]), *grads[3:]]


# How a row's arrays reach the op (cases.Row.prep): the arrays, and the gradients back to the drawn arrays.
PREP = {None: (lambda arrays: arrays, lambda arrays, grads: grads), "transpose_b": (_transpose_b, _transpose_b_grads),
        "repeat_kv": (_repeat_kv, _repeat_kv_grads)}


def build(case, path):
    kind, _, rest = case.partition(":")
    if kind != "kernel":
        raise KeyError(f"case {case!r} has no numpy version")
    mode = rest.split(":")[1]
    row = kernel_rows.Row(path)
    fwd, fwd_bwd = NUMPY_TWINS.get(row.op, _from_twin)(row)
    prep, grads_back = PREP[row.meta["prep"]]
    arrays = prep(row.arrays)

    def check():
        if mode == "fwd":
            return kernel_rows.check(row, fwd(*arrays))
        out, grads = fwd_bwd(*arrays)
        return kernel_rows.check(row, out, grads_back(row.arrays, grads[:len(arrays)]))
    return C.Built((lambda: fwd(*arrays)) if mode == "fwd" else (lambda: fwd_bwd(*arrays)), check)
