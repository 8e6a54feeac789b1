"""A kernel row's shared file: what our worker writes (impl_ours.init), what
every worker builds its row from (impl_*.build). Numpy only.

A row is one op applied to (arrays, params), as `Op.apply(*arrays, **params)`
takes them. The file (.npz) holds

    in.0, in.1, ...   the op's arrays, as drawn (before the row's `prep`)
    param.NAME        the parameters that are arrays (a target, an index)
    grad              the fixed random gradient of the output backward starts from
    meta              JSON: "op" (its class name), "names" (forward's names of the
                      arrays), "params" (the other parameters, the op's defaults
                      included), "grads" (which arrays require grad), "prep",
                      "twin" (the numpy twin's name, from the op's docstring, or
                      null) and "random"

A random row is one whose op draws random numbers (dropout): every
framework draws its own, so outputs are not compared; RANDOM_CHECKS
checks each framework's output alone where it can.
"""
import json

import numpy as np

import baselines


def _plain(value):
    """value as JSON can hold it (numpy scalars as Python numbers, tuples as lists)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def save(path, arrays, params, grad, meta):
    """Write a row: `params` splits into array parameters and the rest (into meta)."""
    files = {f"in.{i}": a for i, a in enumerate(arrays)}
    files.update({f"param.{k}": v for k, v in params.items() if isinstance(v, np.ndarray)})
    meta = dict(meta, params={k: _plain(v) for k, v in params.items() if not isinstance(v, np.ndarray)})
    np.savez(path, grad=grad, meta=np.array(json.dumps(meta)), **files)


class Row:
    """A row read back: arrays (list), params (dict, arrays included), grad, meta (dict)."""

    def __init__(self, path):
        with np.load(path) as f:
            self.meta = json.loads(str(f["meta"]))
            self.arrays = [f[f"in.{i}"] for i in range(len(self.meta["names"]))]
            self.params = {k: _tuples(v) for k, v in self.meta["params"].items()}
            self.params.update({k[len("param."):]: f[k] for k in f.files if k.startswith("param.")})
            self.grad = f["grad"]
        self.op, self.grads, self.random = self.meta["op"], self.meta["grads"], self.meta["random"]


# Checks of a random row's output in each framework alone: op -> check(row, out) -> bool.
RANDOM_CHECKS = {
    "DropoutOp": lambda row, out: baselines.dropout_ok(row.arrays[0], out, row.params["p"]),
}


def check(row, out, grads=None):
    """What a worker's check returns for a row: the output, and the gradient
    of each input that requires one (grads: one per input, None where there
    is none; not given in fwd mode). A random row: its RANDOM_CHECKS flag."""
    if row.random:
        checker = RANDOM_CHECKS.get(row.op)
        return {f"{row.op}?": checker(row, np.asarray(out))} if checker else {}
    result = {"out": np.asarray(out)}
    for i, g in enumerate(grads or ()):
        if row.grads[i] and g is not None:
            result[f"grad{i}"] = np.asarray(g)
    return result
