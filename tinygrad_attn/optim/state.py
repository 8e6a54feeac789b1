"""Optimizer and scheduler states as flat {name: ndarray} dicts, for safetensors.

A checkpoint is a safetensors file: a flat mapping from names to arrays, no
pickle. `flatten_state_dict` splits a nested state (like an optimizer's
`state_dict()`) into its arrays, each under a dotted name
(`optimizer.state.3.exp_avg`), and one JSON document holding everything
else (hyper-parameters, step counts, where each array goes), stored as a
uint8 array under `<prefix>json`. `unflatten_state_dict` puts it back
together exactly (floats survive JSON exactly; integer-like dict keys come
back as ints, tuples as lists).

    tensors = {**model_arrays, **flatten_state_dict(opt.state_dict(), "optimizer.")}
    safetensors.numpy.save_file(tensors, path)
    ...
    opt.load_state_dict(unflatten_state_dict(safetensors.numpy.load_file(path), "optimizer."))
"""
import json

import numpy as np

_ARRAY = "__array__"  # marks, in the JSON, where an array goes back


def flatten_state_dict(state_dict, prefix):
    """Split `state_dict` into {prefix + dotted path: ndarray} plus {prefix + "json": ...}.

    Leaves may be numpy arrays, Python/numpy scalars, strings, None, lists
    and tuples; dict keys must be strings or ints.
    """
    arrays = {}

    def strip(obj, path):
        if isinstance(obj, np.ndarray):
            arrays[prefix + path] = np.ascontiguousarray(obj)
            return {_ARRAY: path}
        if isinstance(obj, dict):
            for k in obj:
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise TypeError(f"flatten_state_dict: keys must be strings or ints, got {k!r} at {path!r}")
            return {str(k): strip(v, f"{path}.{k}" if path else str(k)) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [strip(v, f"{path}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, np.generic):
            return obj.item()
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        raise TypeError(f"flatten_state_dict: cannot store a {type(obj).__name__} (at {path!r})")

    skeleton = strip(state_dict, "")
    arrays[prefix + "json"] = np.frombuffer(json.dumps(skeleton).encode("utf-8"), dtype=np.uint8)
    return arrays


def unflatten_state_dict(arrays, prefix):
    """Rebuild the state that `flatten_state_dict(state, prefix)` split up.

    `arrays` may hold other entries too (a whole checkpoint): only names
    starting with `prefix` are read.
    """
    key = prefix + "json"
    if key not in arrays:
        raise KeyError(f"unflatten_state_dict: no {key!r} entry (was this state saved with prefix {prefix!r}?)")
    skeleton = json.loads(np.asarray(arrays[key], dtype=np.uint8).tobytes().decode("utf-8"))

    def build(obj):
        if isinstance(obj, dict):
            if set(obj) == {_ARRAY}:
                name = prefix + obj[_ARRAY]
                if name not in arrays:
                    raise KeyError(f"unflatten_state_dict: the array {name!r} is missing")
                return np.array(arrays[name])  # a writable copy
            return {(int(k) if k.isascii() and k.isdigit() else k): build(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [build(v) for v in obj]
        return obj

    return build(skeleton)
