"""`gemm`: the BLAS matrix product, callable from kernels on strided matrices.

    gemm(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    computes  C = alpha * op(A) @ op(B) + beta * C,  C of shape (m, n)

Each matrix is given as a 1-D array starting at its first element plus its
row stride (ld, in elements); its rows must be contiguous. op(A) is A, or
A^T when trans_a (then A is stored (k, m)); same for B. So a head's slice
q[b, :, h, :] of a (B, T, H, E) array is multiplied in place (row stride
H*E), and K^T is K read transposed: nothing is copied. Callers check the
shapes: BLAS trusts them.

Which BLAS (`library()`, passed to every kernel that multiplies), the first
of three routes that works:
1. "numpy's": the BLAS numpy itself loaded, as threadpoolctl reports it
   (OpenBLAS in numpy's wheels, MKL, BLIS or a system OpenBLAS), so the
   process has one BLAS and one set of BLAS threads. Its sgemm/dgemm are
   looked up under the names these libraries export, and a candidate is
   used only after it multiplied a small test product correctly through the
   same calling convention.
2. "scipy's": if none qualifies (Accelerate, an unknown build) and scipy is
   installed, scipy.linalg.cython_blas (what numba's np.dot calls).
3. "loops": neither; `_gemm_loops`, the product written as plain loops
   that Numba compiles (~5.5x slower, but it runs anywhere).
scipy is a dependency only on macOS, where numpy may use Accelerate,
which threadpoolctl does not list: Numba itself imports scipy.linalg the
first time it compiles or loads a kernel when scipy is installed (0.3 s
and 17 MB measured here), so a process without it starts faster and smaller.
The function addresses travel as a kernel argument, not as symbols baked
into the compiled code, so a cached kernel is never tied to a library that
moved; None in their place selects the loops.

Row-major to BLAS's column-major: a row-major (m, n) matrix with row stride
ld is the column-major (n, m) matrix of leading dimension ld, i.e. its
transpose. So C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the
operands swap places and keep their transpose flags.
"""
import ctypes
import functools
import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import threads
from .fastmath import SUM_FASTMATH


# ------------------------------------------------------------- finding BLAS

# (sgemm, dgemm, 64-bit integers) under the names BLAS libraries export them:
# numpy's OpenBLAS (scipy-openblas64), OpenBLAS built for ILP64, then the plain
# Fortran names of LP64 builds (system OpenBLAS, MKL's mkl_rt, BLIS).
_GEMM_NAMES = (("scipy_sgemm_64_", "scipy_dgemm_64_", True), ("sgemm_64_", "dgemm_64_", True),
               ("scipy_sgemm_", "scipy_dgemm_", False), ("sgemm_", "dgemm_", False))


def _address(function):
    return ctypes.cast(function, ctypes.c_void_p).value


def _multiplies_correctly(sgemm_address, ilp64):
    """Call sgemm at this address on a 2x3 @ 3x2 product the way the kernels
    will (Fortran convention, integers of the given width), check the result."""
    int_t = ctypes.c_int64 if ilp64 else ctypes.c_int32
    ref = ctypes.POINTER
    fn = ctypes.CFUNCTYPE(None, ref(ctypes.c_char), ref(ctypes.c_char), ref(int_t), ref(int_t), ref(int_t),
                          ref(ctypes.c_float), ref(ctypes.c_float), ref(int_t), ref(ctypes.c_float),
                          ref(int_t), ref(ctypes.c_float), ref(ctypes.c_float), ref(int_t))(sgemm_address)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2) - 2
    c = np.zeros((2, 2), np.float32)
    floats = lambda x: x.ctypes.data_as(ref(ctypes.c_float))
    by_ref = ctypes.byref
    n, two, three, one, zero = ctypes.c_char(b"n"), int_t(2), int_t(3), ctypes.c_float(1), ctypes.c_float(0)
    # row-major C = A B is column-major C^T = B^T A^T (module docstring)
    fn(by_ref(n), by_ref(n), by_ref(two), by_ref(two), by_ref(three), by_ref(one), floats(b), by_ref(two),
       floats(a), by_ref(three), by_ref(zero), floats(c), by_ref(two))
    return np.array_equal(c, a @ b)


def _numpy_blas():
    """(sgemm, dgemm, ilp64) of the BLAS numpy loaded, or None."""
    try:
        import threadpoolctl
        controllers = threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers
    except Exception:  # threadpoolctl missing or failing: use the fallback
        return None
    root = os.path.dirname(np.__file__)
    own = (root + os.sep, root + ".libs" + os.sep)  # where numpy's wheels keep their library
    for controller in sorted(controllers, key=lambda c: not c.filepath.startswith(own)):
        for s_name, d_name, ilp64 in _GEMM_NAMES:
            try:
                sgemm, dgemm = getattr(controller.dynlib, s_name), getattr(controller.dynlib, d_name)
            except AttributeError:
                continue
            if _multiplies_correctly(_address(sgemm), ilp64):
                return _address(sgemm), _address(dgemm), ilp64
    return None


def _scipy_blas():
    """(sgemm, dgemm, ilp64=False) from scipy.linalg.cython_blas (what numba's np.dot uses)."""
    from numba.extending import get_cython_function_address
    return (get_cython_function_address("scipy.linalg.cython_blas", "sgemm"),
            get_cython_function_address("scipy.linalg.cython_blas", "dgemm"), False)


ROUTES = ("numpy's", "scipy's", "loops")  # in the order they are tried


def _scipy_found():
    try:
        import scipy.linalg.cython_blas  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _choose(route):
    """(name, addresses) of the first route from `route` on that works."""
    if route == "numpy's":
        found = _numpy_blas()
        if found:
            return route, np.array(found, np.int64)
        route = "scipy's"
    if route == "scipy's" and _scipy_found():
        addresses = np.array(_scipy_blas(), np.int64)
        threads.blas_library_loaded()  # scipy's library is new to the thread policy: one thread on ours too
        return route, addresses
    return "loops", None


def library(route="numpy's"):
    """The BLAS the kernels call, found on first use (see above): an int64 array
    [sgemm address, dgemm address, 1 if its integers are 64-bit], or None for
    the loops (another argument type: a kernel compiles them only when given
    None). route: the first route to try (the tests pick each)."""
    if route not in ROUTES:
        raise ValueError(f"blas.library: route must be one of {ROUTES}, got {route!r}")
    return _choose(route)[1]


def library_name(route="numpy's"):
    """Which route `library(route)` took: "numpy's", "scipy's" or "loops"."""
    return _choose(route)[0]


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


@njit(nogil=True, cache=True, fastmath=SUM_FASTMATH)
def _gemm_loops(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """C = alpha op(A) op(B) + beta C as loops (the route when no BLAS is
    found), row by row of C: C[i, :] gathers op(A)[i, p] times row p of
    op(B). With B not transposed that row is contiguous; with B transposed
    each C[i, j] is a dot product of two contiguous rows instead. Rows are
    slices, so the inner loops vectorize: ~5.5x BLAS's time (512x128 @
    128x384 on one thread: 2.5 against 0.45 ms; 60x with plain indexing).
    beta == 0 overwrites C, as BLAS does (whatever C held, NaN too)."""
    zero = c.dtype.type(0)
    for i in range(m):
        row = c[i * ldc:i * ldc + n]
        for j in range(n):
            row[j] = zero if beta == zero else beta * row[j]
        if trans_b:
            a_row = a[i * lda:i * lda + k]  # op(A)'s row i when A is not transposed
            for j in range(n):
                b_row = b[j * ldb:j * ldb + k]
                total = zero
                for p in range(k):
                    total += (a[p * lda + i] if trans_a else a_row[p]) * b_row[p]
                row[j] += alpha * total
        else:
            for p in range(k):
                a_ip = alpha * (a[p * lda + i] if trans_a else a[i * lda + p])
                b_row = b[p * ldb:p * ldb + n]
                for j in range(n):
                    row[j] += a_ip * b_row[j]


def gemm(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """What the compiled version computes (this body only runs outside Numba).
    beta == 0 overwrites C without reading it, as BLAS does (C may hold NaN)."""
    def matrix(x, rows, cols, ld):
        return np.lib.stride_tricks.as_strided(x, (rows, cols), (ld * x.itemsize, x.itemsize))
    op_a = matrix(a, k, m, lda).T if trans_a else matrix(a, m, k, lda)
    op_b = matrix(b, n, k, ldb).T if trans_b else matrix(b, k, n, ldb)
    out = matrix(c, m, n, ldc)
    # beta == 0 overwrites C, as BLAS does: 0 * C would keep a NaN that C's fresh memory held
    out[...] = alpha * (op_a @ op_b) + (beta * out if beta else 0)


@overload(gemm)
def _gemm_overload(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    if isinstance(trans_a, types.Literal) or isinstance(trans_b, types.Literal):
        return None  # numba retries with plain bools: one compiled version for every call site
    if isinstance(blas, types.NoneType):  # no BLAS found: the loops (compiled only where that is so)
        def loops(blas, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            _gemm_loops(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        return loops
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
