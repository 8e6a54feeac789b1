"""Numba kernels for the heavy ops. They know only numpy arrays.

Each module holds the loops of one op, compiled with `@njit(nogil=True,
cache=True)` and written over a range of items (rows, matrices), and below
them the plain functions the ops call: they take C-contiguous arrays (or
BLAS views: memory, offsets, row stride) that the caller allocated, and
fill them, spreading the items over our threads. float32 and float64 (one
compiled version per dtype, cached on disk). Deterministic: the same inputs
give bit-identical outputs whatever the number of threads.

The math:
    matmul         batched_matmul (stacks and single products, optional bias)
    softmax        softmax_forward, softmax_backward (and log-softmax)
    layer_norm     layer_norm_forward, layer_norm_backward
    rms_norm       rms_norm_forward, rms_norm_backward
    rotary         rotary_forward, rotary_backward (rotary position embedding)
    clip           sum_of_squares (float64 sums: clip_grad_norm_)
    cross_entropy  cross_entropy_forward, cross_entropy_backward
    attention      attention_forward, attention_backward
    dropout        dropout_apply
    elementwise    gelu_forward, gelu_backward, relu_forward, relu_backward, erfc
    adam           adam_update (one pass of Adam / AdamW over a parameter)
    movement       scatter_add_runs (the gradient of a row lookup: an embedding's)
The runtime:
    fastmath       fast-math flags and a vectorizable exp
    random_bits    the counter-based random bits of dropout
    blas           gemm on strided matrices: the BLAS numpy uses, or loops
    threads        parallel_for, get_num_threads, set_num_threads: the threading policy
    numba_cache    where Numba caches the compiled kernels
(tinygrad_attn/warmup.py compiles a training step's kernels ahead of time.)

Importing this package compiles nothing and starts nothing; the one piece
of global state it sets is Numba's cache directory, when the package
directory is read-only (numba_cache.py).
"""
import os

from . import numba_cache

numba_cache.configure_cache(os.path.dirname(os.path.abspath(__file__)))  # before any kernel is defined

from . import adam, attention, clip, cross_entropy, dropout, elementwise, layer_norm, matmul, movement, softmax  # noqa: E402
from . import rms_norm, rotary  # noqa: E402
from .elementwise import erfc, gelu_backward, gelu_forward, relu_backward, relu_forward  # noqa: E402
from .attention import attention_backward, attention_forward  # noqa: E402
from .blas import library_name as blas_name  # noqa: E402
from .cross_entropy import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from .dropout import dropout_apply  # noqa: E402
from .layer_norm import layer_norm_backward, layer_norm_forward  # noqa: E402
from .matmul import batched_matmul  # noqa: E402
from .movement import scatter_add_runs  # noqa: E402
from .rms_norm import rms_norm_backward, rms_norm_forward  # noqa: E402
from .rotary import rotary_backward, rotary_forward  # noqa: E402
from .softmax import softmax_backward, softmax_forward  # noqa: E402
from .threads import get_num_threads, parallel_for, set_num_threads  # noqa: E402

# Every compiled loop (warmup.py and the tests walk them).
KERNELS = (elementwise._erfc, elementwise._gelu_forward, elementwise._gelu_backward, elementwise._relu_forward,
           elementwise._relu_backward, adam._adam_update, attention._attention_forward,
           attention._attention_backward, cross_entropy._cross_entropy_forward,
           cross_entropy._cross_entropy_backward, dropout._dropout_apply, layer_norm._layer_norm_forward,
           layer_norm._layer_norm_backward, matmul._matmul, clip._sum_of_squares, movement._scatter_add_runs,
           softmax._softmax_forward,
           softmax._softmax_backward,
           rms_norm._rms_norm_forward, rms_norm._rms_norm_backward, rotary._rotary)

__all__ = ["KERNELS", "attention_backward", "attention_forward", "batched_matmul", "blas_name",
           "cross_entropy_backward", "cross_entropy_forward", "dropout_apply", "erfc", "gelu_backward", "gelu_forward",
           "get_num_threads", "layer_norm_backward", "layer_norm_forward", "parallel_for", "relu_backward",
           "relu_forward", "rms_norm_backward", "rms_norm_forward", "rotary_backward", "rotary_forward",
           "scatter_add_runs", "set_num_threads",
           "softmax_backward", "softmax_forward"]
