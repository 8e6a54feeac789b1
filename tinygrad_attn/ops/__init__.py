"""Every differentiable op, one `Function` subclass each, grouped by kind.

elementwise  arithmetic, activations, where / masked_fill
reduce       sum, mean, max, min, var, logsumexp
movement     reshape, permute, expand, getitem, cat, stack
matmul       batched matrix multiplication, linear (x W^T + b)
softmax      softmax, log_softmax                     (fused Numba kernels)
layer_norm   layer_norm                               (fused Numba kernel)
cross_entropy cross_entropy                           (fused Numba kernel)
attention    scaled dot-product attention, weights    (fused Numba kernel)
dropout      dropout                                  (Numba kernel)
rms_norm     rms_norm                                 (fused Numba kernel)
rotary       rotary position embedding                (fused Numba kernel)

Each op module's kernels are in `tinygrad_attn/kernels/` under the same name
(ops/layer_norm.py calls kernels/layer_norm.py); they know only numpy arrays.
The readable twins of the fused ops (composites of primitive ops, and each
backward in plain numpy) are in `tinygrad_attn/reference/`.
"""
from . import (attention, cross_entropy, dropout, elementwise, layer_norm, matmul, movement,  # noqa: F401
               reduce, softmax)  # imported to register the ops
from . import rms_norm, rotary  # noqa: F401
