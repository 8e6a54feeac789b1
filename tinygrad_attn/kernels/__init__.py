"""Numba kernels for the heavy ops. They know only numpy arrays.

Each module is named after the file that calls it (kernels/layer_norm.py
serves ops/layer_norm.py, kernels/clip.py serves optim/clip.py) and holds
that file's loops, each defined with `@kernel` (registry.py: Numba's njit,
recorded in `KERNELS`) and written over a range of items (rows,
matrices), and below them the plain functions the caller imports: they
take C-contiguous arrays (or matrices as (memory, offsets, row stride)
triples) that the caller allocated, and fill them, spreading the items
over our threads. float32 and float64 (one compiled version per dtype,
cached on disk). Deterministic: the same inputs give bit-identical
outputs whatever the number of threads.

The runtime:
    registry       `@kernel` and KERNELS, the list of every compiled loop; `@kernel_example`
                   and EXAMPLES, the calls of kernels that no op makes
    threads        parallel_for, get_num_threads, set_num_threads: the threading policy
    blas           gemm on strided matrices: the BLAS numpy uses, or loops
    fastmath       fast-math flags and a vectorizable exp
    random_bits    the counter-based random bits of dropout
    numba_cache    where Numba caches the compiled kernels
(tinygrad_attn/warmup.py compiles a step's kernels ahead of time.)

Importing this package compiles nothing and starts nothing; the one piece
of global state it sets is Numba's cache directory, when the package
directory is read-only (numba_cache.py). The kernel modules are imported
by the ops and optimizers that call them, so `KERNELS` is complete once
`tinygrad_attn` is imported.
"""
import os

from . import numba_cache

numba_cache.configure_cache(os.path.dirname(os.path.abspath(__file__)))  # before any kernel is defined

from .blas import library_name as blas_name  # noqa: E402
from .registry import EXAMPLES, KERNELS, kernel, kernel_example  # noqa: E402
from .threads import get_num_threads, parallel_for, set_num_threads  # noqa: E402

__all__ = ["EXAMPLES", "KERNELS", "blas_name", "get_num_threads", "kernel", "kernel_example", "parallel_for",
           "set_num_threads"]
