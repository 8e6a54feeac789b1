"""Matrix products: our threads share out the work, BLAS computes each piece.

One kernel serves every product of the framework, from a stack of small
matrices (attention heads) to one large matrix (a Linear layer over all
tokens): the work is cut into items, each a block of rows of one product,

    out[i][r0:r1] = op(A_i)[r0:r1] @ op(B_i)  (+ bias)

and `parallel_for` hands the items to the threads, which call BLAS on one
thread each (threads.py says why). A product is cut into row blocks only
when it is large, by a rule of its shape alone, so a result never depends
on the number of threads. A hand-written GEMM in Numba would be 2.5-5x
slower than BLAS.

Operands are read where they are: matrix i of a starts at a[a_off[i]] with
row stride lda, so permuted views, transposed views (K^T: the flag tells
BLAS to read it transposed) and broadcast batch axes (repeated offsets)
need no copy. Rows r0:r1 of op(A) start r0 rows into A, or r0 columns into
it when A is read transposed.
"""
import numpy as np
from numba import njit

from .blas import gemm, library
from .threads import GRAIN, parallel_for

MACS_PER_ELEMENT = 32  # a multiply-add in BLAS costs ~1/32 of an element of the other kernels' work
_MIN_BLOCK_ROWS = 64
_MAX_BLOCKS = 8


@njit(nogil=True, cache=True)
def _matmul(blas, a, a_off, lda, trans_a, b, b_off, ldb, trans_b, m, n, k, block_rows, bias, out,
            start, stop):
    """Items [start, stop): item j is rows [r0, r0 + block_rows) of product j // blocks."""
    one, zero = out.dtype.type(1), out.dtype.type(0)
    blocks = (m + block_rows - 1) // block_rows
    flat = out.reshape(out.size)
    for j in range(start, stop):
        i, r0 = j // blocks, (j % blocks) * block_rows
        rows = min(block_rows, m - r0)
        first = a_off[i] + (r0 if trans_a else r0 * lda)
        c = i * m * n + r0 * n
        gemm(blas, trans_a, trans_b, rows, n, k, one, a[first:], lda, b[b_off[i]:], ldb, zero, flat[c:], n)
        if bias.shape[0]:  # added while the block is in cache
            for r in range(rows):
                for col in range(n):
                    flat[c + r * n + col] += bias[col]


def block_rows(m, n, k):
    """Rows per item of an (m, k) @ (k, n) product: all m unless the product is large."""
    blocks = min(_MAX_BLOCKS, max(1, m // _MIN_BLOCK_ROWS), max(1, m * n * k // (MACS_PER_ELEMENT * GRAIN)))
    return -(-m // blocks)


def batched_matmul(a, a_off, lda, trans_a, b, b_off, ldb, trans_b, m, n, k, out, bias=None):
    """out[i] = op(A_i) @ op(B_i) (+ bias, shape (n,)) for every i; out: C-ordered (count, m, n).

    a and b are 1-D buffers, the offsets int64 arrays of one start per product."""
    if out.size == 0:
        return
    rows = block_rows(m, n, k)
    blocks = -(-m // rows)
    bias = np.zeros(0, out.dtype) if bias is None else bias
    parallel_for(_matmul, len(a_off) * blocks, library(), a, a_off, lda, trans_a, b, b_off, ldb, trans_b,
                 m, n, k, rows, bias, out, item_size=rows * n * k // MACS_PER_ELEMENT, blas=True)
