"""`gemm`: BLAS matrix multiply callable from kernels, for row-major 2-D views.

    gemm(trans_a, trans_b, alpha, a, b, beta, c):   c = alpha * op(a) @ op(b) + beta * c

op(x) is x or x^T as flagged. Each operand needs contiguous rows (unit
stride along its last axis) but may have any row stride, so a slice like
q[b, :, h, :] of a (B, T, H, E) array is used in place. This is the BLAS
routine numba's np.dot calls (scipy's), reached directly: np.dot wants
contiguous arrays, knows no alpha or beta, and costs about a second of
compile time per layout, while this is a single external call.

Row-major to BLAS's column-major: a row-major (m, n) matrix with row stride
ld is the column-major (n, m) matrix of leading dimension ld, i.e. its
transpose. So c = op(a) op(b) is computed as c^T = op(b)^T op(a)^T with the
operands swapped and the same transpose flags.
"""
import numpy as np
from numba import types
from numba.extending import overload
from numba.np.linalg import _BLAS, get_blas_kind


def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    """Reference behaviour (what the compiled version computes)."""
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    c[...] = alpha * (op_a @ op_b) + beta * c


@overload(gemm)
def _gemm_overload(trans_a, trans_b, alpha, a, b, beta, c):
    if not (isinstance(a, types.Array) and a.dtype in (types.float32, types.float64)):
        return None
    xxgemm = _BLAS().numba_xxgemm(a.dtype)
    kind = ord(get_blas_kind(a.dtype))
    T, N = ord("t"), ord("n")

    def impl(trans_a, trans_b, alpha, a, b, beta, c):
        m, n = c.shape
        k = a.shape[0] if trans_a else a.shape[1]
        if (a.shape[1] if trans_a else a.shape[0]) != m or (b.shape[0] if trans_b else b.shape[1]) != n \
                or (b.shape[1] if trans_b else b.shape[0]) != k:
            raise ValueError("gemm: shapes do not fit")
        if a.strides[1] != a.itemsize or b.strides[1] != b.itemsize or c.strides[1] != c.itemsize:
            raise ValueError("gemm: every operand needs contiguous rows")
        scalars = np.empty(2, c.dtype)
        scalars[0] = alpha
        scalars[1] = beta
        # max(1, ...): BLAS rejects a leading dimension of 0 even for empty matrices
        xxgemm(kind, T if trans_b else N, T if trans_a else N, n, m, k,
               scalars[0:1].ctypes, b.ctypes, max(1, b.strides[0] // b.itemsize),
               a.ctypes, max(1, a.strides[0] // a.itemsize),
               scalars[1:2].ctypes, c.ctypes, max(1, c.strides[0] // c.itemsize))

    return impl
