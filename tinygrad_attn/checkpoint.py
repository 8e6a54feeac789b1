"""Checkpoints: state dicts saved in the safetensors format.

A safetensors file is an 8-byte little-endian header length, a JSON header
(name -> dtype, shape, byte offsets, plus an optional "__metadata__" dict of
strings) and the raw array bytes. Nothing in it is executed on load (no
pickle), so opening a file from a stranger is safe, and PyTorch, JAX or
anything else with a safetensors reader can open ours.

    tg.save(model.state_dict(), "model.safetensors", metadata={"config": json.dumps(cfg)})
    state, meta = tg.load("model.safetensors", with_metadata=True)
    model.load_state_dict(state)

`load` also reads PyTorch's half-precision files: BF16 and F16 tensors come
back as float32 (exactly: every bfloat16 and float16 value is a float32).
It holds files to the format's rules as its reference reader does (the
header at most 100,000,000 bytes; the tensors tiling the data buffer),
checked from the header before any tensor data is read.
"""
import contextlib
import json
import math
import os
import re
import secrets

import numpy as np
from safetensors.numpy import save as _safetensors_save

from .tensor import Tensor

try:
    import fcntl
except ImportError:  # not POSIX (Windows): no advisory locks
    fcntl = None


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
    error mid-save leaves any earlier file at `path` intact. A save killed
    before the rename (SIGKILL, power loss) leaves its temporary file; the
    next save to `path` removes it.
    """
    payload = _safetensors_save(_to_arrays(state_dict), metadata=_check_metadata(metadata))
    write_files({path: [payload]}, "save")


def write_files(files, op):
    """Write {path: chunks of bytes} so that each path holds either its old
    file or the whole new one: every file is first written to a temporary
    file beside its path (synced; `save`'s naming, so a later save or
    write_files to the same path removes the leftover of a killed one),
    and only when all are written are they renamed over their paths
    (os.replace). On an error or an interrupt while writing, every
    temporary file is removed and no path has changed (only a rename
    failing after the writes succeeded, rare in one directory, would leave
    the earlier renames done). `op` names the caller in the error of a
    path that cannot be written."""
    temps = {}
    try:
        for path, chunks in files.items():
            path = os.fspath(path)
            directory, name = os.path.split(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise FileNotFoundError(f"{op}: cannot write {path}: the directory {directory} does not exist")
            _remove_stale_temp_files(directory, name)
            tmp = os.path.join(directory, f".{name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
            with _naming(op, tmp, path), open(tmp, "xb") as f:
                temps[tmp] = path
                _lock_while_writing(f)
                for chunk in chunks:
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        for tmp, path in temps.items():
            with _naming(op, tmp, path):
                os.replace(tmp, path)
    finally:  # including KeyboardInterrupt: never leave a temp file behind
        for tmp in temps:
            if os.path.exists(tmp):
                os.unlink(tmp)


@contextlib.contextmanager
def _naming(op, tmp, path):
    """An OSError about the temporary file names the file the user asked to write."""
    try:
        yield
    except OSError as e:
        if e.filename != tmp:
            raise
        raise type(e)(e.errno, f"{op}: cannot write {path}: {e.strerror}") from None


# Leftovers of killed saves. A save writes `.NAME.<pid>-<random>.tmp`; the
# next save to NAME removes the files of that pattern whose writer is gone,
# and no others: a `-` before the random part makes the pattern match no
# other file's temp files. "Gone" takes two tests, because a temp file of a
# save in progress in another live process must survive:
#  - the pid in the name is not a live process here (os.kill(pid, 0));
#    that alone would do on one machine (a reused pid only delays cleanup),
#  - and the file's flock is free: a live save holds it while it writes.
#    This covers a writer on another machine sharing the directory, where
#    the pid means nothing (locks are released when a process dies).
# `.NAME.<random>.tmp` (no pid) is the name earlier versions used; those are
# removed on the lock test alone. Without POSIX (Windows) nothing is removed:
# os.kill there would not test, it would signal.

def _lock_while_writing(f):
    """Hold an exclusive flock on our temp file: "a save is writing this"."""
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: the pid test alone protects the file
            pass


def _temp_file_pattern(name):
    return re.compile(re.escape(f".{name}.") + r"(?:(\d+)-)?[0-9a-f]{8}\.tmp\Z")


def _pid_alive(pid):
    if os.name != "posix":
        return True
    if pid == os.getpid():
        return True  # another thread of this process may be saving
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, owned by another user
        return True
    return True


def _remove_stale_temp_files(directory, name):
    if os.name != "posix" or fcntl is None:
        return
    pattern = _temp_file_pattern(name)
    for entry in os.listdir(directory):
        match = pattern.match(entry)
        if match is None or (match.group(1) is not None and _pid_alive(int(match.group(1)))):
            continue
        candidate = os.path.join(directory, entry)
        try:
            with open(candidate, "rb") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live writer
                os.unlink(candidate)
        except OSError:  # locked (BlockingIOError), already gone, or not ours to remove
            continue


MAX_HEADER_SIZE = 100_000_000  # bytes: the format's limit on the JSON header

# safetensors dtype -> the numpy dtype of its bytes (little-endian, as the format is)
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "C64": "<c8",
           "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
           "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def _is_index(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _read_header(f, size, path):
    """Read and sanity-check the header of the open file `f` of `size` bytes,
    telling a truncated checkpoint from a file that is not one at all; returns
    (header, data buffer size). Reads nothing beyond the header."""
    not_ours = f"{path} is not a safetensors checkpoint"
    if size <= 8:
        raise CheckpointError(f"{not_ours} (or it is truncated): it has only {size} bytes")
    first = f.read(9)  # the length field and the header's first byte
    header_len = int.from_bytes(first[:8], "little")
    if first[8:9] != b"{":
        raise CheckpointError(f"{not_ours}: it does not start with a safetensors header")
    invalid = f"{path} is not a valid safetensors checkpoint"
    if header_len > MAX_HEADER_SIZE:
        raise CheckpointError(f"{invalid}: its header length field says {header_len:,} bytes, beyond the "
                              f"format's limit of {MAX_HEADER_SIZE:,}")
    if header_len > size - 8:
        raise CheckpointError(f"{path} is truncated: its header needs {header_len} bytes, "
                              f"the file has {size - 8} after the length field")
    try:
        header = json.loads((first[8:] + f.read(max(header_len - 1, 0)))[:header_len])
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CheckpointError(f"{not_ours}: its header is not a valid safetensors header")
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise CheckpointError(f"{invalid}: its __metadata__ is not a dict of strings")
            continue
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
            raise CheckpointError(f"{invalid}: the entry of tensor {name!r} needs dtype, shape and "
                                  f"data_offsets, got {entry!r}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
            raise CheckpointError(f"{invalid}: tensor {name!r} has shape {shape!r} "
                                  "(expected a list of non-negative integers)")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_index(o) for o in offsets) \
                or offsets[0] > offsets[1]:
            raise CheckpointError(f"{invalid}: tensor {name!r} has data_offsets {offsets!r} "
                                  "(expected [begin, end], two integers with 0 <= begin <= end)")
    buffer_size = size - 8 - header_len
    _check_tiling(header, buffer_size, header_len, path)
    return header, buffer_size


def _check_tiling(header, buffer_size, header_len, path):
    """The format's layout rule: sorted by their offsets, the tensors cover
    the data buffer one after the other, without a gap, an overlap or
    anything after the last (empty tensors may share an offset)."""
    rule = "the offsets must tile the data buffer in order, without gaps or overlaps"
    spans = sorted((entry["data_offsets"][0], entry["data_offsets"][1], name)
                   for name, entry in header.items() if name != "__metadata__")
    position = 0
    for begin, end, name in spans:
        if begin != position:
            what = ("overlaps the one before" if begin < position
                    else f"leaves {begin - position} bytes unused before it")
            raise CheckpointError(f"{path} is not a valid safetensors checkpoint: tensor {name!r} at "
                                  f"data_offsets [{begin}, {end}] {what} ({rule})")
        position = end
    if position > buffer_size:
        raise CheckpointError(f"{path} is truncated: it has {8 + header_len + buffer_size} bytes, its "
                              f"header describes {8 + header_len + position}")
    if position < buffer_size:
        raise CheckpointError(f"{path} is not a valid safetensors checkpoint: {buffer_size - position} "
                              f"bytes after the last tensor ({rule})")


def _read_tensor(data, name, entry, path):
    """One tensor's bytes as a new (writable, aligned) array; BF16 and F16 as float32."""
    dtype, shape = entry["dtype"], tuple(entry["shape"])
    if dtype not in _DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype!r}, which load cannot read "
                              f"(it reads {', '.join(_DTYPES)})")
    stored = np.dtype(_DTYPES[dtype])
    begin, end = entry["data_offsets"]
    count = math.prod(shape)
    if end - begin != count * stored.itemsize:
        raise CheckpointError(f"{path} is not a valid safetensors checkpoint: tensor {name!r} of dtype "
                              f"{dtype} and shape {list(shape)} needs {count * stored.itemsize} bytes, "
                              f"its data_offsets give {end - begin}")
    values = np.frombuffer(data, dtype=stored, count=count, offset=begin)
    if dtype == "BF16":  # bfloat16 is the top half of a float32: shift its bits back into place
        array = (values.astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F16":
        array = values.astype(np.float32)
    else:
        array = values.astype(stored.newbyteorder("="))  # a copy, in native byte order
    return array.reshape(shape)


def load(path, with_metadata=False):
    """Read a safetensors file: a dict name -> numpy array, or (that dict,
    metadata dict) with `with_metadata=True`.

    Dtypes are kept, except half precision: BF16 (PyTorch's usual dtype for
    large-model weights, which numpy lacks) and F16 tensors are converted to
    float32, exactly, as tensors hold them. Pass the dict to
    `Module.load_state_dict`. A truncated file, a file in another format or
    a tensor of a dtype load cannot read (such as 8-bit floats) raises
    `CheckpointError` saying which; so does a file that breaks the format's
    rules (a header beyond 100,000,000 bytes, tensors that overlap or leave
    gaps), found before its tensor data is read.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        header, buffer_size = _read_header(f, os.fstat(f.fileno()).st_size, path)
        data = f.read(buffer_size)
    arrays = {name: _read_tensor(data, name, entry, path)
              for name, entry in header.items() if name != "__metadata__"}
    if with_metadata:
        return arrays, dict(header.get("__metadata__") or {})
    return arrays
