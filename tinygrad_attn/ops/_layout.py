"""Shared plumbing of the fused ops: dtype checks, row views, batch index
maps, and how much work is worth a thread.

The Numba kernels take C-contiguous float32/float64 arrays of fixed rank
(rows of a matrix, stacks of matrices); these helpers bring any input to
that form, copying only when the input's layout requires it.
"""
import numpy as np

from .kernels import parallel_for

# A range of work handed to a thread should take at least ~30 us, or waking
# the thread costs more than it saves: about this many element operations.
WORK_PER_RANGE = 1 << 15


def float_dtype(op, *arrays):
    """The common float dtype of `arrays` (float32 or float64), or a TypeError naming the op."""
    dtype = np.result_type(*arrays)
    if dtype not in (np.float32, np.float64):
        kinds = ", ".join(str(a.dtype) for a in arrays)
        raise TypeError(f"{op}: expected float32 or float64 tensors, got {kinds}")
    return dtype


def as_rows(x, dtype=None):
    """x as a C-contiguous (rows, n) array, n = its last axis (a 0-d array is one row of one)."""
    n = x.shape[-1] if x.ndim else 1
    return np.ascontiguousarray(x, dtype=dtype).reshape(-1, n)


def run_rows(kernel, n_rows, row_cost, *args):
    """Run a kernel over rows [0, n_rows), `row_cost` element operations each."""
    parallel_for(kernel, n_rows, *args, min_items=max(1, WORK_PER_RANGE // max(1, row_cost)))


def batch_index(part_shape, full_shape):
    """For each index of the flattened batch `full_shape`, the index into the
    flattened `part_shape` that broadcasts to it (numpy broadcasting rules)."""
    size = int(np.prod(part_shape, dtype=np.int64))
    if tuple(part_shape) == tuple(full_shape):
        return np.arange(size, dtype=np.int64)
    return np.ascontiguousarray(
        np.broadcast_to(np.arange(size, dtype=np.int64).reshape(part_shape), full_shape)).reshape(-1)


def matrix_stack(x):
    """x (..., m, k) as a C-contiguous stack (count, rows, cols) plus a flag
    telling whether the stack holds the transposes (x^T stored, as for a
    swapaxes(-1, -2) view of a contiguous array). Copies only when neither
    x nor its transpose is contiguous."""
    m, k = x.shape[-2:]
    if x.flags.c_contiguous:
        return x.reshape(-1, m, k), False
    xt = np.swapaxes(x, -1, -2)
    if xt.flags.c_contiguous:
        return xt.reshape(-1, k, m), True
    return np.ascontiguousarray(x).reshape(-1, m, k), False
