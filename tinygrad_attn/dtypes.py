"""The dtypes a tensor can hold and the one device it lives on.

A tensor holds float32 (the default), float64, int64 or bool, as a numpy
array. This file turns what a user passes (np.float32, "double",
torch.float64, a list of Python floats, ...) into one of those, and reads
PyTorch's device arguments, of which "cpu" (or None) is the only one.
It works on numpy values only: `Tensor` (tensor.py) builds on it.
"""
import numpy as np

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

DTYPE_NAMES = {"float32": float32, "float": float32, "float64": float64, "double": float64,
               "int64": int64, "long": int64, "int": int64, "bool": bool_}

# What Tensor.type() returns, PyTorch's names of the tensor types.
TYPE_NAMES = {float32: "torch.FloatTensor", float64: "torch.DoubleTensor", int64: "torch.LongTensor",
              bool_: "torch.BoolTensor"}

_INT64_MAX = np.iinfo(np.int64).max


def canonical_dtype(dtype):
    """Map a user's dtype (np.float32, "float64", torch.float64, ...) to one we support."""
    if type(dtype).__module__ == "torch":  # a torch.dtype: by its name, torch.float64 -> "float64"
        dtype = str(dtype).removeprefix("torch.")
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"Tensor: unsupported dtype {dtype!r}") from None
    if dt in (float32, float64, int64, bool_):
        return dt
    if dt.kind in "iu":
        return int64
    if dt == np.float16:
        return float32
    raise TypeError(f"Tensor: unsupported dtype {dt} (use float32, float64, int64 or bool)")


def to_array(data, dtype):
    """Convert user data (an array, nested lists, a scalar) to an array of a supported dtype.

    numpy arrays keep their dtype (float64 stays float64, as in PyTorch);
    Python floats and lists of floats become float32, Python ints int64.
    """
    if dtype is not None:
        dtype = canonical_dtype(dtype)
    if isinstance(data, np.ndarray):
        arr = data
    else:
        if isinstance(data, (str, bytes)):
            raise TypeError(f"Tensor: cannot make a tensor from a {type(data).__name__}")
        try:
            arr = np.asarray(data)
        except ValueError as e:
            raise ValueError(f"Tensor: cannot make a tensor from this data: {e}") from None
        # numpy holds Python ints beyond int64 as objects, uint64 or (mixed with others) floats
        if dtype is not None and dtype.kind == "f":
            if arr.dtype.kind == "O":
                arr = _as_float64(data, arr)
        elif arr.dtype.kind in "Ou" or (arr.dtype.kind == "f" and (np.abs(arr) >= 2.0 ** 63).any()):
            _check_python_ints(data)
        if arr.dtype == float64 and not isinstance(data, np.generic) and dtype is None:
            dtype = float32  # Python floats default to float32
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"Tensor: unsupported data of dtype {arr.dtype} "
                        "(tensors hold floats, integers or booleans)")
    target = dtype if dtype is not None else canonical_dtype(arr.dtype)
    if target == int64 and arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
        raise OverflowError(f"Tensor: uint64 value {arr.max()} does not fit in int64, the integer "
                            f"dtype of tensors (range [-2**63, 2**63 - 1])")
    return arr if arr.dtype == target else arr.astype(target)


def _as_float64(data, arr):
    """Huge Python ints asked for as floats: convert them (anything else stays an object array)."""
    try:
        return np.asarray(data, dtype=float64)
    except (TypeError, ValueError):
        return arr


def _check_python_ints(data):
    """Raise OverflowError for a Python int outside int64 in `data` (rare:
    only called when numpy found values that large)."""
    for v in np.asarray(data, dtype=object).flat:
        if isinstance(v, int) and not isinstance(v, bool) and not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise OverflowError(f"Tensor: integer {v} does not fit in int64, the integer dtype of "
                                "tensors (range [-2**63, 2**63 - 1])")


# ------------------------------------------------------------------ the device
class _Device(str):
    """What Tensor.device returns: equal to "cpu", with torch.device's `type`."""

    type = "cpu"
    index = None


CPU = _Device("cpu")


def is_device(x):
    """A device argument of `to`: a string that names no dtype, or a torch.device."""
    return (isinstance(x, str) and x not in DTYPE_NAMES) or type(x).__name__ == "device"


def check_device(device, op):
    """NotImplementedError naming `op` unless `device` is None or the CPU."""
    if device is not None and str(device).split(":")[0] != "cpu":
        raise NotImplementedError(f"{op}: device {str(device)!r} is not supported: everything "
                                  "lives on the CPU (device='cpu' or None)")


def _is_tensor(x):
    """A Tensor (or anything else with a numpy dtype that is not itself a
    numpy value): told apart by duck typing, as this file sits below tensor.py."""
    return isinstance(getattr(x, "dtype", None), np.dtype) and not isinstance(x, (np.ndarray, np.generic))


def to_args(args, kwargs, op):
    """(dtype or None, copy) from PyTorch's `to` overloads: to(dtype),
    to(device, dtype), to(other tensor), with keywords device=, dtype=,
    copy=, non_blocking= and memory_format= (the last two change nothing here)."""
    dtype, device = kwargs.pop("dtype", None), kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"{op}: unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if _is_tensor(a):
            dtype = a.dtype
        elif is_device(a):
            device = a
        elif a is not None:
            dtype = a
    check_device(device, op)
    return (None if dtype is None else canonical_dtype(dtype)), bool(copy)
