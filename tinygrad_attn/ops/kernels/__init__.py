"""Numba kernels for the heavy ops. They know only numpy arrays.

Each kernel is a serial `@njit(nogil=True, cache=True)` function over a
range of items (rows, matrices) given by its last two arguments, writing
into arrays the caller allocated; `parallel_for` (threads.py) spreads the
ranges over threads. The ops in `tinygrad_attn/ops/` check shapes,
allocate and call them. Kernels take float32 or float64 arrays (one
compiled version per dtype, cached on disk): rows as C-contiguous 2-D
arrays, matrices for BLAS as (memory, offsets, row stride). They are
deterministic: the same inputs give bit-identical outputs whatever the
number of threads.

    matmul         batched_matmul
    softmax        softmax_forward, softmax_backward (and log-softmax)
    layernorm      layer_norm_forward, layer_norm_backward
    cross_entropy  cross_entropy_forward, cross_entropy_backward
    attention      attention_forward, attention_backward
    dropout        dropout_apply
    activations    gelu_forward, gelu_backward (normal CDF and logistic on the vectorizable exp)
    mathx          exp (vectorizable), uniform_bits (the dropout hash)
    blas           gemm on strided matrices, with numpy's BLAS (BLAS, BLAS_NAME)
    reductions     fast-math flags; row_sums (max, sum of exp, sum)
    threads        parallel_for, get_num_threads, set_num_threads
    setup          where the compiled kernels are cached, shared by processes
    precompile     a cold cache is filled by a second process in parallel
"""
import os

from . import setup

setup.configure_cache(os.path.dirname(os.path.abspath(__file__)))  # before any kernel is defined

from .activations import gelu_backward, gelu_forward  # noqa: E402
from .attention import attention_backward, attention_forward  # noqa: E402
from .blas import BLAS, BLAS_NAME  # noqa: E402
from .cross_entropy import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from .dropout import dropout_apply  # noqa: E402
from .layernorm import layer_norm_backward, layer_norm_forward  # noqa: E402
from .matmul import batched_matmul  # noqa: E402
from .softmax import softmax_backward, softmax_forward  # noqa: E402
from .threads import get_num_threads, parallel_for, set_num_threads  # noqa: E402
from . import precompile  # noqa: E402

KERNELS = (attention_backward, attention_forward, batched_matmul, cross_entropy_backward,
           cross_entropy_forward, dropout_apply, gelu_backward, gelu_forward, layer_norm_backward,
           layer_norm_forward, softmax_backward, softmax_forward)
# Processes share the compiled kernels safely; then a cold cache is filled by
# a second process while this one works (precompile.py).
if all([setup.share_cache(kernel) for kernel in KERNELS]):  # a list: every kernel gets one
    precompile.start_if_cold(KERNELS)
