"""Every differentiable op, one `Function` subclass each, grouped by kind.

elementwise  arithmetic, activations, where / masked_fill
reduce       sum, mean, max, min, var, logsumexp
movement     reshape, permute, expand, getitem, cat, stack
matmul       batched matrix multiplication
"""
from . import elementwise, matmul, movement, reduce  # noqa: F401  (imported to register the ops)
