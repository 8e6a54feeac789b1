"""`gemm`: the BLAS matrix product, callable from kernels on strided matrices.

    gemm(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    computes  C = alpha * op(A) @ op(B) + beta * C,  C of shape (m, n)

Each matrix is given as a 1-D array starting at its first element plus its
row stride (ld, in elements); its rows must be contiguous. op(A) is A, or
A^T when trans_a (then A is stored (k, m)); same for B. So a head's slice
q[b, :, h, :] of a (B, T, H, E) array is multiplied in place (row stride
H*E), and K^T is K read transposed: nothing is copied. Callers check the
shapes: BLAS trusts them.

Which BLAS: the one numpy uses, found at import (`BLAS`, passed to every
kernel that multiplies). One library means one pool of BLAS threads in the
process, and numpy's OpenBLAS (0.3.31 here) is ~20% faster on small
matrices than the older one in scipy, which numba's np.dot would call. If
numpy's library cannot be found, scipy's is used. The function addresses
travel as a kernel argument, not as symbols baked into the compiled code,
so a cached kernel is never tied to a library that moved.

Row-major to BLAS's column-major: a row-major (m, n) matrix with row stride
ld is the column-major (n, m) matrix of leading dimension ld, i.e. its
transpose. So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
operands swap places and keep their transpose flags.
"""
import ctypes
import glob
import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload


# ------------------------------------------------------------- finding BLAS

def _address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def _numpy_blas():
    """(sgemm, dgemm, ilp64) from the BLAS library bundled with numpy, or None."""
    root = os.path.dirname(np.__file__)
    candidates = sorted(glob.glob(os.path.join(root + ".libs", "*blas*")) +
                        glob.glob(os.path.join(root, ".dylibs", "*blas*")))
    # scipy-openblas64 (numpy's wheels), plain OpenBLAS ILP64, plain LP64
    for names, ilp64 in ((("scipy_sgemm_64_", "scipy_dgemm_64_"), True),
                         (("sgemm_64_", "dgemm_64_"), True), (("sgemm_", "dgemm_"), False)):
        for path in candidates:
            try:
                lib = ctypes.CDLL(path)
                return _address(getattr(lib, names[0])), _address(getattr(lib, names[1])), ilp64
            except (OSError, AttributeError):
                continue
    return None


def _scipy_blas():
    """(sgemm, dgemm, ilp64=False) from scipy.linalg.cython_blas (what numba's np.dot uses)."""
    from numba.extending import get_cython_function_address
    return (get_cython_function_address("scipy.linalg.cython_blas", "sgemm"),
            get_cython_function_address("scipy.linalg.cython_blas", "dgemm"), False)


def find_blas():
    found = _numpy_blas()
    return ("numpy", *found) if found else ("scipy", *_scipy_blas())


BLAS_NAME, *_found = find_blas()
BLAS = np.array(_found, np.int64)  # [sgemm address, dgemm address, 1 if 64-bit integers]


# ----------------------------------------------------------- calling BLAS

@intrinsic
def _data_pointer(typingctx, array):
    """Pointer to an array's first element (BLAS wants a raw pointer)."""
    def codegen(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, value=args[0]).data
    return types.CPointer(array.dtype)(array), codegen


def _fortran_gemm_intrinsic(int_bits):
    """An intrinsic calling the xGEMM at a runtime address, Fortran style
    (every argument by pointer), with integers of `int_bits` bits."""
    @intrinsic
    def call(typingctx, address, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        def codegen(context, builder, signature, args):
            address, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc = args
            int_t, char_t = ir.IntType(int_bits), ir.IntType(8)
            float_t = context.get_value_type(signature.args[6])

            def by_ref(value, type_):
                return cgutils.alloca_once_value(builder, value if value.type == type_ else
                                                 builder.trunc(value, type_) if value.type.width > type_.width
                                                 else builder.sext(value, type_))
            ptr = ir.PointerType
            fn_t = ir.FunctionType(ir.VoidType(), [
                ptr(char_t), ptr(char_t), ptr(int_t), ptr(int_t), ptr(int_t),  # transa, transb, m, n, k
                ptr(float_t), ptr(float_t), ptr(int_t), ptr(float_t), ptr(int_t),  # alpha, a, lda, b, ldb
                ptr(float_t), ptr(float_t), ptr(int_t)])  # beta, c, ldc
            fn = builder.inttoptr(address, ptr(fn_t))
            builder.call(fn, [by_ref(trans_a, char_t), by_ref(trans_b, char_t), by_ref(m, int_t),
                              by_ref(n, int_t), by_ref(k, int_t), cgutils.alloca_once_value(builder, alpha),
                              a, by_ref(lda, int_t), b, by_ref(ldb, int_t),
                              cgutils.alloca_once_value(builder, beta), c, by_ref(ldc, int_t)])
            return context.get_dummy_value()
        return types.void(*[address, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc]), codegen
    return call


_gemm_lp64 = _fortran_gemm_intrinsic(32)
_gemm_ilp64 = _fortran_gemm_intrinsic(64)


def gemm(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """What the compiled version computes (this body only runs outside Numba)."""
    def matrix(x, rows, cols, ld):
        return np.lib.stride_tricks.as_strided(x, (rows, cols), (ld * x.itemsize, x.itemsize))
    op_a = matrix(a, k, m, lda).T if trans_a else matrix(a, m, k, lda)
    op_b = matrix(b, n, k, ldb).T if trans_b else matrix(b, k, n, ldb)
    out = matrix(c, m, n, ldc)
    out[...] = alpha * (op_a @ op_b) + beta * out


@overload(gemm)
def _gemm_overload(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    if isinstance(trans_a, types.Literal) or isinstance(trans_b, types.Literal):
        return None  # numba retries with plain bools: one compiled version for every call site
    which = {types.float32: 0, types.float64: 1}[a.dtype]
    T, N = np.int8(ord("t")), np.int8(ord("n"))

    def impl(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        tb, ta = T if trans_b else N, T if trans_a else N
        # BLAS rejects a leading dimension of 0 (an empty matrix): use at least 1
        lda, ldb, ldc = lda if lda > 0 else 1, ldb if ldb > 0 else 1, ldc if ldc > 0 else 1
        pa, pb, pc = _data_pointer(a), _data_pointer(b), _data_pointer(c)
        if blas[2]:  # the operands swap places: see the module docstring
            _gemm_ilp64(blas[which], tb, ta, n, m, k, alpha, pb, ldb, pa, lda, beta, pc, ldc)
        else:
            _gemm_lp64(blas[which], tb, ta, n, m, k, alpha, pb, ldb, pa, lda, beta, pc, ldc)

    return impl
