"""Checkpoints: state dicts saved in the safetensors format.

A safetensors file is an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, byte offsets, plus an optional "__metadata__" dict of
strings) and the raw array bytes. Nothing in it is executed on load (no
pickle), so opening a file from a stranger is safe, and PyTorch, JAX or
anything else with a safetensors reader can open ours.

    tg.save(model.state_dict(), "model.safetensors", metadata={"config": json.dumps(cfg)})
    state, meta = tg.load("model.safetensors", with_metadata=True)
    model.load_state_dict(state)
"""
import json
import os
import secrets

import numpy as np
from safetensors.numpy import load as _safetensors_load
from safetensors.numpy import save as _safetensors_save

from .tensor import Tensor


class CheckpointError(ValueError):
    """The file is not a readable checkpoint: truncated, or not safetensors."""


def _to_arrays(state_dict):
    arrays = {}
    for name, value in state_dict.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise TypeError(f"save: keys must be strings other than '__metadata__', got {name!r}")
        array = value.data if isinstance(value, Tensor) else np.asarray(value)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"save: {name!r} has dtype {array.dtype}, which a checkpoint cannot hold "
                            "(numeric and boolean arrays only)")
        arrays[name] = np.asarray(array, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    return arrays


def _check_metadata(metadata):
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError("save: metadata must be a dict of str -> str "
                        "(encode other values, e.g. with json.dumps)")
    return metadata


def save(state_dict, path, metadata=None):
    """Write `state_dict` (name -> Tensor or numpy array, any shape, numeric
    or bool dtype) to `path` in the safetensors format, with optional
    `metadata` (a dict of str -> str, e.g. a JSON-encoded config).

    The bytes go to a temporary file in the same directory, which is synced
    and then renamed over `path` in one step (os.replace): a crash or an
    error mid-save leaves any earlier file at `path` intact.
    """
    payload = _safetensors_save(_to_arrays(state_dict), metadata=_check_metadata(metadata))
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # including KeyboardInterrupt: never leave the temp file behind
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_header(raw, path):
    """Parse and sanity-check the header, telling a truncated checkpoint from
    a file that is not one at all."""
    not_ours = f"{path} is not a safetensors checkpoint"
    if len(raw) <= 8:
        raise CheckpointError(f"{not_ours} (or it is truncated): it has only {len(raw)} bytes")
    header_len = int.from_bytes(raw[:8], "little")
    if raw[8:9] != b"{":
        raise CheckpointError(f"{not_ours}: it does not start with a safetensors header")
    if header_len > len(raw) - 8:
        raise CheckpointError(f"{path} is truncated: its header needs {header_len} bytes, "
                              f"the file has {len(raw) - 8} after the length field")
    try:
        header = json.loads(raw[8:8 + header_len])
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        raise CheckpointError(f"{not_ours}: its header is not a valid safetensors header") from None
    expected = 8 + header_len + max(ends, default=0)
    if len(raw) < expected:
        raise CheckpointError(f"{path} is truncated: it has {len(raw)} bytes, its header "
                              f"describes {expected}")
    return header


def load(path, with_metadata=False):
    """Read a safetensors file: a dict name -> numpy array (dtypes kept
    exactly), or (that dict, metadata dict) with `with_metadata=True`.

    Pass the dict to `Module.load_state_dict`. A truncated file or a file in
    another format raises `CheckpointError` saying which.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    header = _read_header(raw, path)
    try:
        arrays = _safetensors_load(raw)
    except Exception as e:  # safetensors raises its own SafetensorError
        raise CheckpointError(f"{path} is not a valid safetensors checkpoint: {e}") from None
    if with_metadata:
        return arrays, dict(header.get("__metadata__") or {})
    return arrays
