"""`gemm`: BLAS matrix multiply callable from kernels, for row-major 2-D views.

    gemm(trans_a, trans_b, alpha, a, b, beta, c):   c = alpha * op(a) @ op(b) + beta * c

op(x) is x or x^T as flagged. Each operand needs contiguous rows (unit
stride along its last axis) but may have any row stride, so a slice like
q[b, :, h, :] of a (B, T, H, E) array can be used in place. Callers check
the shapes: BLAS trusts them.

This is the BLAS routine numba's np.dot calls (scipy's), reached directly:
np.dot wants contiguous arrays, knows no alpha or beta, and each layout
costs compile time; here one small function serves every call.

Row-major to BLAS's column-major: a row-major (m, n) matrix with row
stride ld is the column-major (n, m) matrix of leading dimension ld, i.e.
its transpose. So c = op(a) op(b) is computed as c^T = op(b)^T op(a)^T:
the operands swap places and keep their transpose flags.
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


def gemm(trans_a, trans_b, alpha, a, b, beta, c):
    """What the compiled version computes (this body only runs outside Numba)."""
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b
    c[...] = alpha * (op_a @ op_b) + beta * c


@overload(gemm)
def _gemm_overload(trans_a, trans_b, alpha, a, b, beta, c):
    if isinstance(trans_a, types.Literal) or isinstance(trans_b, types.Literal):
        return None  # numba retries with plain bools: one compiled version for every call site
    xxgemm = _BLAS().numba_xxgemm(a.dtype)
    kind = ord(get_blas_kind(a.dtype))
    T, N = ord("t"), ord("n")

    def impl(trans_a, trans_b, alpha, a, b, beta, c):
        m, n = c.shape
        k = a.shape[0] if trans_a else a.shape[1]
        size = a.itemsize
        # BLAS rejects a leading dimension of 0 (an empty matrix): use at least 1
        lda, ldb, ldc = a.strides[0] // size, b.strides[0] // size, c.strides[0] // size
        xxgemm(kind, T if trans_b else N, T if trans_a else N, n, m, k,
               _pointer_to(alpha), _data_pointer(b), ldb if ldb > 0 else 1,
               _data_pointer(a), lda if lda > 0 else 1,
               _pointer_to(beta), _data_pointer(c), ldc if ldc > 0 else 1)

    return impl
