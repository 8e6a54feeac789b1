"""`@kernel`: compile a loop with Numba and record it where it is defined.

    @kernel(fastmath=SUM_FASTMATH)
    def _softmax_forward(x, out, log, start, stop): ...

is `numba.njit(nogil=True, cache=True, fastmath=SUM_FASTMATH)` on the loop,
and appends the compiled loop to `KERNELS`, in the order the modules
define them. Nothing else lists the kernels: the warm-up compiles the
ones a step calls, and the tests walk `KERNELS` (every loop is called by
some op's `example`, type-checks in float32, ...). Defining a kernel
compiles nothing; Numba compiles it on its first call with new argument
types, or `warmup.compile_kernels` does, ahead of time.

The kernels that no op calls (an optimizer's update, gradient clipping's
norm) are exercised by functions registered with `@kernel_example` next
to the code that calls them, recorded in `EXAMPLES`: the warm-up runs
them with the ops' examples (autograd.Function's `example`), and the tests
check that these together call every kernel.

nogil=True lets `threads.parallel_for` run ranges of items on several
threads; cache=True keeps each compiled version on disk (numba_cache.py
says where), so only a kernel's first run after an edit pays for it.
"""
from numba import njit

KERNELS = []  # every compiled loop, in the order defined
EXAMPLES = []  # example(dtype, size) of each caller of kernels that is not an op, in the order defined


def kernel(loop=None, **options):
    """`@kernel` or `@kernel(**numba_options)`: njit(nogil=True, cache=True, **options), recorded in KERNELS."""
    def register(loop):
        compiled = njit(nogil=True, cache=True, **options)(loop)
        KERNELS.append(compiled)
        return compiled
    return register if loop is None else register(loop)


def kernel_example(example):
    """Record `example(dtype, size)`: a call, on made-up inputs of about `size`
    elements in `dtype`, of code outside the ops that runs kernels (an
    optimizer's step, clipping), returning the arrays it computed. As an op's
    `example`, it teaches the warm-up which kernels to compile with which
    argument types; the tests run it to check every kernel."""
    EXAMPLES.append(example)
    return example
