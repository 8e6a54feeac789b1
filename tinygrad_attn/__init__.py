"""tinygrad_attn: a small deep-learning framework on numpy, built to train and
to explain Transformers on a CPU.

    import tinygrad_attn as tg
    x = tg.tensor([[1.0, 2.0]], requires_grad=True)
    (x * x).sum().backward()
    x.grad  # tensor([[2., 4.]])
"""
from . import functional, kernels, nn, ops, reference  # noqa: F401
from .autograd import (AnomalyError, Function, detect_anomaly, enable_grad, grad, is_grad_enabled,
                       is_reference_ops_enabled, no_grad, reference_ops, set_grad_enabled, set_reference_ops)
from .checkpoint import CheckpointError, load, save
from .kernels.threads import get_num_threads, set_num_threads
from .gradcheck import GradcheckError, gradcheck
from .memory import keep_freed_memory
from .random import get_generator, manual_seed
from .shapes import ShapeError
from .tensor import Tensor, cat, concatenate, matmul, maximum, minimum, stack, where
from .dtypes import bool_, float32, float64, int64
from .creation import (arange, full, ones, ones_like, rand, randint, randn, tensor, zeros,
                       zeros_like)
from . import data, optim  # noqa: F401  (after Tensor: they build on it)

__version__ = "0.1.0"

__all__ = [
    "Tensor", "tensor", "Function", "gradcheck", "GradcheckError", "grad", "no_grad",
    "enable_grad", "set_grad_enabled", "is_grad_enabled", "detect_anomaly", "AnomalyError",
    "manual_seed", "get_generator", "ShapeError", "functional", "nn", "optim", "data",
    "save", "load", "CheckpointError",
    "cat", "concatenate", "stack", "where", "maximum", "minimum", "matmul",
    "zeros", "ones", "full", "zeros_like", "ones_like", "arange", "randn", "rand", "randint",
    "float32", "float64", "int64", "bool_",
    "set_num_threads", "get_num_threads", "keep_freed_memory",
    "reference_ops", "set_reference_ops", "is_reference_ops_enabled",
]
