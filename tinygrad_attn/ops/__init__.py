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
array_views  how ops hand arrays to kernels (no ops)

Each op module's kernels are in `tinygrad_attn/kernels/` under the same name
(ops/layer_norm.py calls kernels/layer_norm.py); they know only numpy arrays.
The readable twins of the fused ops (composites of primitive ops, and each
backward in plain numpy) are in `tinygrad_attn/reference/`.
"""
import importlib
import pkgutil

# Every module here, so that each op is in Function.registry (a new file needs no entry here).
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
