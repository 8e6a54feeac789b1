"""Every differentiable op, one `Function` subclass each, grouped by kind.

elementwise  arithmetic, activations, where / masked_fill
reduce       sum, mean, max, min, var, logsumexp
movement     reshape, permute, expand, getitem, cat, stack
matmul       batched matrix multiplication, linear (x W^T + b)
softmax      softmax, log_softmax                     (fused Numba kernels)
norm         layer_norm                               (fused Numba kernel)
loss         cross_entropy                            (fused Numba kernel)
attention    scaled dot-product attention, weights    (fused Numba kernel)
dropout      dropout                                  (Numba kernel)

numpy_backward holds no op: the backward of each fused op above written out
in plain numpy, to read beside it (not imported here).

The Numba kernels themselves live in `kernels/` and know only numpy arrays.
"""
from . import (attention, dropout, elementwise, loss, matmul, movement, norm,  # noqa: F401
               reduce, softmax)  # imported to register the ops
