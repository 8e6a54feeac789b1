"""The readable twins of the fused ops, in one place.

composites      each fused function of `functional` built from primitive ops
                (matmul, exp, sum, where, ...), and the `reference_ops` switch
                that makes the framework run them instead of the kernels
numpy_backward  each fused op's backward written out in plain numpy, the
                derivative in its docstring (imports nothing of the framework)
numpy_flash     attention the FlashAttention way in plain numpy: an online
                softmax over blocks of keys, a backward that recomputes P
                from the saved log-sum-exp (imports nothing of the framework)

`tinygrad_attn.reference.softmax` and the rest are the composites.
"""
from .composites import (apply_rotary_emb, cross_entropy, dropout, gelu, is_reference_ops_enabled, layer_norm, linear,  # noqa: F401
                         log_softmax, packed_self_attention, reference_ops, scaled_dot_product_attention,
                         rms_norm, set_reference_ops, softmax)
