"""The readable twins of the fused ops, in one place.

composites      each fused op built from primitive ops (matmul, exp, sum,
                where, ...), registered on its op: inside
                `tinygrad_attn.reference_ops()` the op runs it instead of its
                kernel
numpy_backward  each fused op's backward written out in plain numpy, the
                derivative in its docstring (imports nothing of the framework)
numpy_flash     attention the FlashAttention way in plain numpy: an online
                softmax over blocks of keys, a backward that recomputes P
                from the saved log-sum-exp (imports nothing of the framework)

`tinygrad_attn.reference.softmax` and the rest are the composites, each
named after its op and taking what the op's `apply` takes.
"""
from .composites import (apply_rotary_emb, attention_weights, cross_entropy, dropout, gelu,  # noqa: F401
                         layer_norm, linear, log_softmax, packed_self_attention, rms_norm,
                         scaled_dot_product_attention, silu, softmax, swiglu)
