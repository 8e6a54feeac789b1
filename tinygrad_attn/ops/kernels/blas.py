"""`gemm`: the BLAS matrix product, callable from kernels on strided matrices.

    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    computes  C = alpha * op(A) @ op(B) + beta * C,  C of shape (m, n)

Each matrix is given as a 1-D array starting at its first element plus its
row stride (ld, in elements); its rows must be contiguous. op(A) is A, or
A^T when trans_a (then A is stored (k, m)); same for B. So a head's slice
q[b, :, h, :] of a (B, T, H, E) array is multiplied in place (row stride
H*E), and K^T is K read transposed: nothing is copied. Callers check the
shapes: BLAS trusts them.

This is the BLAS routine numba's np.dot calls (scipy's), reached directly:
np.dot wants contiguous 2-D arrays, knows no alpha, beta or row stride, and
each layout costs compile time; here one small function serves every call.

Row-major to BLAS's column-major: a row-major (m, n) matrix with row stride
ld is the column-major (n, m) matrix of leading dimension ld, i.e. its
transpose. So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
operands swap places and keep their transpose flags.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from numba.np.linalg import _BLAS, get_blas_kind


@intrinsic
def _data_pointer(typingctx, array):
    """Pointer to an array's first element (BLAS wants a raw pointer)."""
    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, value=args[0]).data
    return types.CPointer(array.dtype)(array), codegen


@intrinsic
def _pointer_to(typingctx, value):
    """Pointer to a copy of a scalar on the stack (BLAS takes alpha and beta by reference)."""
    def codegen(context, builder, signature, args):
        return cgutils.alloca_once_value(builder, args[0])
    return types.CPointer(value)(value), codegen


def gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """What the compiled version computes (this body only runs outside Numba)."""
    import numpy as np

    def matrix(x, rows, cols, ld):
        return np.lib.stride_tricks.as_strided(x, (rows, cols), (ld * x.itemsize, x.itemsize))
    op_a = matrix(a, k, m, lda).T if trans_a else matrix(a, m, k, lda)
    op_b = matrix(b, n, k, ldb).T if trans_b else matrix(b, k, n, ldb)
    out = matrix(c, m, n, ldc)
    out[...] = alpha * (op_a @ op_b) + beta * out


@overload(gemm)
def _gemm_overload(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    if isinstance(trans_a, types.Literal) or isinstance(trans_b, types.Literal):
        return None  # numba retries with plain bools: one compiled version for every call site
    xxgemm = _BLAS().numba_xxgemm(a.dtype)
    kind = ord(get_blas_kind(a.dtype))
    T, N = ord("t"), ord("n")

    def impl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        # BLAS rejects a leading dimension of 0 (an empty matrix): use at least 1
        xxgemm(kind, T if trans_b else N, T if trans_a else N, n, m, k,
               _pointer_to(alpha), _data_pointer(b), ldb if ldb > 0 else 1,
               _data_pointer(a), lda if lda > 0 else 1,
               _pointer_to(beta), _data_pointer(c), ldc if ldc > 0 else 1)

    return impl
