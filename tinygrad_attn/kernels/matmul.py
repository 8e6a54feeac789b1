"""Matrix products: our threads share out the work, BLAS computes each piece.

One kernel serves every product of the framework, from a stack of small
matrices (attention heads) to one large matrix (a Linear layer over all
tokens): the work is cut into items and `parallel_for` hands them to the
threads, which call BLAS on one thread each (threads.py says why). A large
product is cut

- by rows, when it has at least 2 * _MIN_ROWS of them:
  out[i][r0:r1] = op(A_i)[r0:r1] @ op(B_i)  (+ bias)
- otherwise along the sum, when that is long (the weight gradient of a
  narrow layer, summed over every token):
  partial[i, c] = op(A_i)[:, k0:k1] @ op(B_i)[k0:k1], then out[i] = the
  sum of the partials in chunk order.

Cutting the rows makes every piece pack all of op(B) for BLAS again;
cutting the sum packs nothing twice, but writes a partial product per
piece and adds them up on one thread after the parallel part. Measured
on the weight gradients of W1/W2's Linear layers (2 threads), the row cut
is 11% faster in all and 20-25% faster at 768 tokens, so rows come first.
A product is cut into 1, 2 or 4 pieces (never 3: on two threads one
would idle for a third of the product). How a product is cut depends on
its shape alone, so a result never depends on the number of threads. A
hand-written GEMM in Numba is slower than BLAS (blas.py's loops, the
route when no BLAS is found: ~5.5x).

Operands are read where they are: each is one (buffer, offsets, row
stride) triple, matrix i starting at buffer[offsets[i]], so permuted
views, transposed views (K^T: the flag tells BLAS to read it
transposed) and broadcast batch axes (repeated offsets) need no copy.
Rows r0:r1 of op(A) start r0 rows into A, or r0 columns into it when A
is read transposed (and likewise for a slice of the sum).
"""
import numpy as np
from numba import njit

from .blas import gemm, library
from .registry import kernel
from .threads import GRAIN, parallel_for

MACS_PER_ELEMENT = 32  # a multiply-add in BLAS costs ~1/32 of an element of the other kernels' work
_MAX_PIECES = 4  # a product in at most this many pieces
_MIN_ROWS, _MIN_DEPTH = 64, 256  # the smallest piece worth a BLAS call, along m and along k


@njit(nogil=True, cache=True)
def _product_items(blas, a, trans_a, b, trans_b, m, n, k, block_rows, chunk, bias, out, start, stop):
    """Items [start, stop): item j is rows [r0, r0 + block_rows) of product i, over
    [k0, k0 + chunk) of the sum; written to out[i * chunks + c] (out: (count * chunks, m, n)).
    a, b: (buffer, offsets, row stride) of each stack of matrices."""
    a_memory, a_off, lda = a
    b_memory, b_off, ldb = b
    one, zero = out.dtype.type(1), out.dtype.type(0)
    blocks, chunks = (m + block_rows - 1) // block_rows, (k + chunk - 1) // chunk
    flat = out.reshape(out.size)
    for j in range(start, stop):
        i, rest = j // (blocks * chunks), j % (blocks * chunks)
        r0, c = (rest // chunks) * block_rows, rest % chunks
        k0 = c * chunk
        rows, depth = min(block_rows, m - r0), min(chunk, k - k0)
        first_a = a_off[i] + (r0 + k0 * lda if trans_a else r0 * lda + k0)
        first_b = b_off[i] + (k0 if trans_b else k0 * ldb)
        o = ((i * chunks + c) * m + r0) * n
        # out[i * chunks + c][r0:r0 + rows] = op(A_i)[r0:r0 + rows, k0:k0 + depth] op(B_i)[k0:k0 + depth]
        gemm(blas, trans_a, trans_b, rows, n, depth, one, a_memory[first_a:], lda, b_memory[first_b:], ldb, zero,
             flat[o:], n)
        if bias.shape[0]:  # added while the block is in cache (only when the sum is not cut)
            for r in range(rows):
                row = flat[o + r * n:o + (r + 1) * n]  # indices from range(n): the loop vectorizes
                for col in range(n):
                    row[col] += bias[col]


@kernel
def _matmul(blas, a, trans_a, b, trans_b, m, n, k, block_rows, chunk, bias, out, start, stop):
    """Items [start, stop) of one stack of products (`_product_items`)."""
    _product_items(blas, a, trans_a, b, trans_b, m, n, k, block_rows, chunk, bias, out, start, stop)


@kernel
def _matmul_pair(blas, first, second, split, start, stop):
    """Items [start, stop) of two independent products in one job: items below
    `split` are the first's, the others the second's (each product the
    arguments of `_product_items` between blas and start)."""
    if start < split:
        _product_items(blas, *first, start, min(stop, split))
    if stop > split:
        _product_items(blas, *second, max(start, split) - split, stop - split)


def _power_of_two(count):
    """The largest power of two <= count (>= 1): 1, 2 or 4 pieces share out
    evenly on 1, 2 or 4 threads, where 3 pieces on 2 threads would leave one
    core idle for a third of the product."""
    return 1 << (count.bit_length() - 1)


def pieces(m, n, k):
    """(block_rows, chunk): how an (m, k) @ (k, n) product, m, n, k >= 1, is cut (the
    module docstring): into 1, 2 or 4 (at most _MAX_PIECES), each at least GRAIN
    elements of work."""
    count = min(_MAX_PIECES, max(1, m * n * k // (MACS_PER_ELEMENT * GRAIN)))
    if m < 2 * _MIN_ROWS and k >= 2 * _MIN_DEPTH:
        return m, -(-k // _power_of_two(min(count, k // _MIN_DEPTH)))
    return -(-m // _power_of_two(min(count, max(1, m // _MIN_ROWS)))), k


class _Plan:
    """How one stack of products out[i] = op(A_i) @ op(B_i) (+ bias) is cut
    (`pieces`): its items, the array the items write (out, or the partial
    products of a cut sum), and the arguments of `_product_items`."""

    def __init__(self, a, trans_a, b, trans_b, m, n, k, out, bias):
        self.out, self.bias, self.count = out, bias, len(a[1])
        rows, chunk = pieces(m, n, k)
        blocks, self.chunks = -(-m // rows), -(-k // chunk)
        self.target = out if self.chunks == 1 else np.empty((self.count * self.chunks, m, n), out.dtype)
        self.n_items = self.count * blocks * self.chunks
        self.work = self.n_items * rows * n * chunk // MACS_PER_ELEMENT
        self.args = (a, trans_a, b, trans_b, m, n, k, rows, chunk,
                     _NO_BIAS[out.dtype.type] if bias is None or self.chunks > 1 else bias, self.target)
        self.shape = (m, n)

    def finish(self):
        """Add the partial products of a cut sum in chunk order (and then the bias)."""
        if self.chunks > 1:
            m, n = self.shape
            np.sum(self.target.reshape(self.count, self.chunks, m, n), axis=1, out=self.out.reshape(self.count, m, n))
            if self.bias is not None:
                self.out += self.bias


_NO_BIAS = {np.float32: np.zeros(0, np.float32), np.float64: np.zeros(0, np.float64)}


def _trivial(out, k, bias):
    """Fill out for an empty product or an empty sum; True if it was one."""
    if out.size == 0:
        return True
    if k == 0:  # an empty sum
        out[...] = 0 if bias is None else bias
        return True
    return False


def batched_matmul(a, trans_a, b, trans_b, m, n, k, out, bias=None):
    """out[i] = op(A_i) @ op(B_i) (+ bias, shape (n,)) for every i; out: C-ordered (count, m, n).

    a and b are (buffer, offsets, row stride) triples: a 1-D buffer, an int64
    array of one start per product, and the row stride."""
    if _trivial(out, k, bias):
        return
    plan = _Plan(a, trans_a, b, trans_b, m, n, k, out, bias)
    parallel_for(_matmul, plan.n_items, library(), *plan.args, item_size=plan.work // plan.n_items, blas=True)
    plan.finish()


def batched_matmul_pair(first, second):
    """Two independent stacks of products in one parallel job, each given as
    the arguments of `batched_matmul` (a, trans_a, b, trans_b, m, n, k, out,
    bias): a Linear layer's two gradient products, dx = g W and dW = g^T x.

    Why one job: each `parallel_for` wakes the other threads and waits for
    the last piece; for the small products of a CPU-sized model that start
    and wait (tens of microseconds) is a sizeable part of the product
    itself. One job for both pays it once, and the threads take the pieces
    of both in turn. Measured on whole training steps, one interleaved run
    each: Llama 1.09x, W1 1.07x, W2 1.18x, W3 1.07x, copy 1.14x faster
    (spreads 12-40%: docs/performance.md). Each piece is the same
    BLAS call as in `batched_matmul`, so the results are bit-identical to
    two separate calls, whatever the number of threads."""
    a_out, a_k, a_bias = first[7], first[6], first[8]
    b_out, b_k, b_bias = second[7], second[6], second[8]
    if _trivial(a_out, a_k, a_bias):
        return batched_matmul(*second)
    if _trivial(b_out, b_k, b_bias):
        return batched_matmul(*first)
    p, q = _Plan(*first), _Plan(*second)
    n_items = p.n_items + q.n_items
    parallel_for(_matmul_pair, n_items, library(), p.args, q.args, p.n_items,
                 item_size=(p.work + q.work) // n_items, blas=True)
    p.finish()
    q.finish()
