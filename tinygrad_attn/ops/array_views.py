"""How ops hand arrays to kernels: dtype checks, row views, the BLAS view of
stacks of matrices, batch index maps.

The row kernels take C-contiguous (rows, n) float32/float64 arrays; the
matrix kernels take each operand as (memory, offset of each matrix, row
stride), which describes permuted, transposed and broadcast views without
copying them. These helpers bring any input to one of the two forms,
copying only when its layout leaves no choice.
"""
import functools
import math

import numpy as np


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
    rows = math.prod(x.shape[:-1])  # not -1: n may be 0
    return np.ascontiguousarray(x, dtype=dtype).reshape(rows, n)


def batch_index(part_shape, full_shape):
    """For each index of the flattened batch `full_shape`, the index into the
    flattened `part_shape` that broadcasts to it (numpy broadcasting rules)."""
    size = math.prod(part_shape)
    if tuple(part_shape) == tuple(full_shape):
        return np.arange(size, dtype=np.int64)
    return np.array(np.broadcast_to(np.arange(size, dtype=np.int64).reshape(part_shape), full_shape)).reshape(-1)


_ONE_MATRIX = np.zeros(1, np.int64)  # the offsets of a single matrix (writeable: a read-only array would
                                     # be another Numba type, and the kernels another compiled version)


def as_matrices(x, batch, allow_transposed=False):
    """The matrices x[..., :, :] as BLAS sees them, without copying when possible.

    Returns (buffer, offsets, ld, transposed): `buffer` is a 1-D view of x's
    memory from its first element; matrix i of the flattened `batch` (x's
    batch axes broadcast to it: a broadcast axis just has stride 0) starts
    at buffer[offsets[i]] and has row stride `ld`. With `transposed` the
    stored matrices are x's transposes (x's columns are contiguous, as in a
    swapaxes(-1, -2) view); only if `allow_transposed`. x is copied to C
    order when neither fits, or a stride is negative.
    """
    if x.ndim == 2 and not batch:  # one matrix, C-ordered or a transposed C-ordered one: the usual case
        if x.flags.c_contiguous:
            return x.reshape(-1), _ONE_MATRIX, x.shape[1], False
        if allow_transposed and x.flags.f_contiguous:
            return x.T.reshape(-1), _ONE_MATRIX, x.shape[0], True
    item = x.itemsize
    r, c = x.shape[-2:]
    strides = x.strides
    regular = min(strides) >= 0 and not any(s % item for s in strides)
    rows_ok = (c == 1 or strides[-1] == item) and (r == 1 or strides[-2] >= c * item)
    cols_ok = (r == 1 or strides[-2] == item) and (c == 1 or strides[-1] >= r * item)
    transposed = False
    if regular and rows_ok:
        ld = strides[-2] // item if r > 1 else c
    elif regular and allow_transposed and cols_ok:
        transposed, ld = True, (strides[-1] // item if c > 1 else r)
    else:
        x = np.ascontiguousarray(x)
        strides, ld = x.strides, c
    offsets = _batch_offsets(x.shape[:-2], tuple(s // item for s in strides[:-2]), tuple(batch))
    return _memory(x), offsets, ld, transposed


@functools.lru_cache(maxsize=512)
def _batch_offsets(shape, strides, batch):
    """Element offset of each matrix of the flattened `batch`, for batch axes
    of `shape` and `strides` broadcast to it. Cached: a model reuses a few
    layouts, and the kernels only read the result."""
    offsets = np.zeros(shape, np.int64)
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        if size > 1:
            along_axis = (-1,) + (1,) * (len(shape) - 1 - axis)
            offsets += (np.arange(size, dtype=np.int64) * stride).reshape(along_axis)
    # a copy, always writeable: a read-only array is another Numba type (another compiled kernel)
    return np.array(np.broadcast_to(offsets, batch)).reshape(-1)


def _memory(x):
    """A 1-D view of the memory spanned by x (all strides >= 0), starting at x's first element."""
    if x.flags.c_contiguous:
        return x.reshape(-1)
    dense = x.transpose(sorted(range(x.ndim), key=lambda a: -x.strides[a]))
    if dense.flags.c_contiguous:  # a permutation of a contiguous array: the usual case
        return dense.reshape(-1)
    last = sum((size - 1) * (stride // x.itemsize) for size, stride in zip(x.shape, x.strides))
    span = last + 1 if x.size else 0
    return np.lib.stride_tricks.as_strided(x, (span,), (x.itemsize,))


def output_like(x, shape, dtype):
    """An empty array of `shape` laid out in memory like x (a permuted view
    gives a permuted result, so permuting back is free), if its rows are
    contiguous; else C-ordered."""
    out = np.empty_like(x, dtype=dtype, shape=shape)
    r, c = shape[-2:]
    if (c == 1 or out.strides[-1] == out.itemsize) and (r == 1 or out.strides[-2] >= c * out.itemsize):
        return out
    return np.empty(shape, dtype)


def random_array(dtype, *shape, seed=0):
    """Standard normal values of `shape` in `dtype`, the same each call: inputs of the ops' `example`s."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)
