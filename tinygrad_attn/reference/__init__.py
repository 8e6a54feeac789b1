"""The readable twins of the fused ops, in one place.

composites      each fused op built from primitive ops (matmul, exp, sum,
                where, ...), registered on its op: inside
                `tinygrad_attn.reference_ops()` the op runs it instead of its
                kernel
numpy_backward  each fused op's backward written out in plain numpy, the
                derivative in its docstring (imports nothing of the framework)

`tinygrad_attn.reference.softmax` and the rest are the composites, each
named after its op and taking what the op's `apply` takes.
"""
from .composites import (attention_weights, cross_entropy, dropout, gelu, layer_norm, linear,  # noqa: F401
                         log_softmax, packed_self_attention, repeat_kv_heads, scaled_dot_product_attention,
                         silu, softmax)
