"""Elementwise ops: arithmetic, activations, selection.

Each op's backward multiplies the incoming gradient by the local derivative.
Binary ops follow numpy broadcasting; their backward returns gradients of the
broadcast shape and the engine sums them back to each input's shape.
"""
import math

import numpy as np

from ..autograd import Function
from ..shapes import ShapeError, broadcast_shapes
from ..kernels.elementwise import (erfc, gelu_backward, gelu_forward, relu_backward, relu_forward,
                                   silu_backward, silu_forward, swiglu_backward, swiglu_forward)
from .array_views import float_dtype, random_array


def _check_broadcast(op, a, b):
    if a.shape != b.shape:
        broadcast_shapes(op, a.shape, b.shape)


# ----------------------------------------------------------------- arithmetic

class Add(Function):
    """z = x + y.   dz/dx = 1, dz/dy = 1."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("add", x, y)
        return x + y

    @staticmethod
    def backward(ctx, grad):
        return grad, grad


class Sub(Function):
    """z = x - y.   dz/dx = 1, dz/dy = -1."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("sub", x, y)
        return x - y

    @staticmethod
    def backward(ctx, grad):
        return grad, (-grad if ctx.needs_input_grad[1] else None)


class Mul(Function):
    """z = x * y.   dz/dx = y, dz/dy = x."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("mul", x, y)
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return (grad * y if ctx.needs_input_grad[0] else None,
                grad * x if ctx.needs_input_grad[1] else None)


class Div(Function):
    """z = x / y.   dz/dx = 1 / y, dz/dy = -x / y^2 = -z / y."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("div", x, y)
        z = x / y
        ctx.save_for_backward(y, z)
        return z

    @staticmethod
    def backward(ctx, grad):
        y, z = ctx.saved_tensors
        gx = grad / y
        return gx, (-gx * z if ctx.needs_input_grad[1] else None)


class Pow(Function):
    """z = x ** y.   dz/dx = y * x^(y-1), dz/dy = x^y * ln(x).

    As in PyTorch: dz/dx = 0 where y = 0 (x ** 0 is the constant 1, even at
    x = 0, where y * x^(y-1) would be 0 * inf); dz/dy = 0 where x = 0 and
    y >= 0 (x^y = 0 or 1 there, not 0 * ln 0). The exponent's gradient is
    only computed when the exponent requires grad (it is NaN for negative
    bases, as in PyTorch).
    """

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("pow", x, y)
        z = np.power(x, y)
        ctx.save_for_backward(x, y, z)
        return z

    @staticmethod
    def backward(ctx, grad):
        x, y, z = ctx.saved_tensors
        zero = np.zeros((), grad.dtype)
        gx = gy = None
        with np.errstate(divide="ignore", invalid="ignore"):
            if ctx.needs_input_grad[0]:
                gx = np.where(y == 0, zero, grad * y * np.power(x, y - 1))
            if ctx.needs_input_grad[1]:
                gy = np.where((x == 0) & (y >= 0), zero, grad * z * np.log(x))
        return gx, gy


class Neg(Function):
    """z = -x.   dz/dx = -1."""

    @staticmethod
    def forward(ctx, x):
        return -x

    @staticmethod
    def backward(ctx, grad):
        return -grad


class Cast(Function):
    """z = x converted to `dtype`.   dz/dx = 1 (the gradient is cast back)."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        return x.astype(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.astype(ctx.in_dtype)


# ------------------------------------------------------------ unary functions

class Exp(Function):
    """z = e^x.   dz/dx = e^x = z."""

    @staticmethod
    def forward(ctx, x):
        z = np.exp(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad):
        z, = ctx.saved_tensors
        return grad * z


class Log(Function):
    """z = ln(x).   dz/dx = 1 / x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.log(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad / x


class Sqrt(Function):
    """z = sqrt(x).   dz/dx = 1 / (2 sqrt(x)) = 1 / (2 z)."""

    @staticmethod
    def forward(ctx, x):
        z = np.sqrt(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad):
        z, = ctx.saved_tensors
        return grad / (2 * z)


class Tanh(Function):
    """z = tanh(x).   dz/dx = 1 - z^2."""

    @staticmethod
    def forward(ctx, x):
        z = np.tanh(x)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad):
        z, = ctx.saved_tensors
        return grad * (1 - z * z)


def _by_kernel(kernel, x):
    """kernel(x, out) over x's elements as one flat array: the result, shaped as x."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    kernel(flat, out)
    return out.reshape(x.shape)


class Erfc(Function):
    """z = erfc(x) = 1 - erf(x) = (2 / sqrt(pi)) * integral from x to inf of exp(-t^2) dt.

    dz/dx = -(2 / sqrt(pi)) exp(-x^2)

    libm's erfc (kernels/elementwise.py; math.erfc per element for other
    dtypes), accurate to an ulp in float32 and float64, also in the tail,
    where 1 - erf(x) would cancel. With it the reference GELU,
    x * erfc(-x / sqrt 2) / 2, is the fused one to rounding.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        if x.dtype in (np.float32, np.float64):
            return _by_kernel(erfc, x)
        return np.vectorize(math.erfc, otypes=[np.float64])(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * (-2 / np.sqrt(np.pi) * np.exp(-x * x)).astype(grad.dtype, copy=False)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, size),), {}


class Sigmoid(Function):
    """z = 1 / (1 + e^-x).   dz/dx = z (1 - z) = e / (1 + e)^2,  e = e^-|x|.

    Computed from e = e^-|x|, which never overflows: z = 1 / (1 + e) for
    x >= 0 and e / (1 + e) for x < 0. Both keep full relative precision
    (no 1 - tiny, no tanh rounding to -1), so sigmoid(-100) is 3.7e-44 in
    float32, not 0, and log(sigmoid(x)) stays finite. The derivative, being
    symmetric in x, depends on e alone, and so is accurate on both tails
    (z (1 - z) would round to 0 for large positive x).
    """

    @staticmethod
    def forward(ctx, x):
        e = np.exp(-np.abs(x))
        inv = 1 / (1 + e)
        z = np.where(x >= 0, inv, e * inv)
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(e * inv * inv)  # the derivative, ready for backward
        return z

    @staticmethod
    def backward(ctx, grad):
        slope, = ctx.saved_tensors
        return grad * slope


class Relu(Function):
    """z = max(x, 0).   dz/dx = 1 where x > 0, else 0.

    Saves z, not x or a mask: z > 0 exactly where x > 0, and z is what the
    next op (a Linear) saves anyway, so the derivative costs no memory.
    Floats go through one kernel pass each way (kernels/elementwise.py),
    what numpy does below for other dtypes: np.maximum(x, 0), and the
    gradient 0 where z <= 0, else grad (as torch: a NaN input passes it).
    """

    @staticmethod
    def forward(ctx, x):
        if x.dtype in (np.float32, np.float64):
            z = _by_kernel(relu_forward, x)
        else:
            z = np.maximum(x, 0)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx, grad):
        z, = ctx.saved_tensors
        if z.dtype in (np.float32, np.float64) and grad.dtype == z.dtype:
            g = np.ascontiguousarray(np.broadcast_to(grad, z.shape)).reshape(-1)
            dx = np.empty_like(g)
            relu_backward(z.reshape(-1), g, dx)
            return dx.reshape(z.shape)
        return np.where(z <= 0, 0, grad).astype(np.result_type(grad, z), copy=False)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, size),), {}


class Gelu(Function):
    """Gaussian error linear unit, z = x * Phi(x).

    approximate="none":  Phi(x) = (1 + erf(x / sqrt 2)) / 2,
        dz/dx = Phi(x) + x * phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
    approximate="tanh":  z = x/2 (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
        dz/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2).

    Why a kernel (kernels/elementwise.py): each formula is one vectorized
    pass there, where numpy needs a temporary per term and a scalar erf call
    per element. Readable version: tinygrad_attn.reference.numpy_backward.gelu_backward.
    """

    @staticmethod
    def forward(ctx, x, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
        float_dtype("gelu", x)
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty_like(flat)
        ctx.tanh = approximate == "tanh"
        gelu_forward(flat, ctx.tanh, out)
        ctx.save_for_backward(flat)
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        flat, = ctx.saved_tensors
        g = np.ascontiguousarray(grad, dtype=flat.dtype).reshape(-1)
        dx = np.empty_like(flat)
        gelu_backward(flat, g, ctx.tanh, dx)
        return dx.reshape(grad.shape)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, size),), dict(approximate="none")


class Silu(Function):
    """SiLU (swish), z = x * sigmoid(x).

    dz/dx = s + x s (1 - s),   s = sigmoid(x) = 1 / (1 + e^-x)

    (the product rule: sigmoid's own derivative is s (1 - s)). Why a kernel
    (kernels/elementwise.py): one vectorized pass each way, where numpy makes
    a temporary and a pass over memory per term; s comes from e^-|x| there,
    as in Sigmoid, so nothing overflows and both tails keep their digits.
    Readable version: tinygrad_attn.reference.numpy_backward.silu_backward.
    """

    @staticmethod
    def forward(ctx, x):
        float_dtype("silu", x)
        flat = np.ascontiguousarray(x).reshape(-1)
        out = np.empty_like(flat)
        silu_forward(flat, out)
        ctx.save_for_backward(flat)
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        flat, = ctx.saved_tensors
        g = np.ascontiguousarray(grad, dtype=flat.dtype).reshape(-1)
        dx = np.empty_like(flat)
        silu_backward(flat, g, dx)
        return dx.reshape(grad.shape)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, size),), {}


class Swiglu(Function):
    """SwiGLU's gate, z = silu(a) * b, where a and b are the two halves of
    the last axis of h = [a | b] (Llama's feed-forward: h = x [W1; W3]^T, one
    product for both, then w2(swiglu(h))).

    dL/da = g * b * (s + a s (1 - s)),   dL/db = g * silu(a),   s = sigmoid(a)

    (the product rule, and SiLU's derivative). Why fused: one pass reads h
    and writes z, and one writes the whole gradient of h; as separate ops
    the halves' slices, silu and the product each make an array and a pass,
    and the slices' backwards each a zero-filled copy of h. Measured on the
    Llama workload's training step (4 layers of (12, 64, 2 x 352), with w1
    and w3 in one product): about 4% faster (docs/performance.md).
    Readable version: tinygrad_attn.reference.numpy_backward.swiglu_backward.
    """

    @staticmethod
    def forward(ctx, h):
        float_dtype("swiglu", h)
        if h.ndim < 1 or h.shape[-1] % 2:
            raise ShapeError(f"swiglu: the last axis of the input holds the two halves [a | b], so its "
                             f"size must be even; got shape {h.shape}")
        rows, n = math.prod(h.shape[:-1]), h.shape[-1] // 2
        h2 = np.ascontiguousarray(h).reshape(rows, 2 * n)
        out = np.empty((rows, n), h.dtype)
        if out.size:
            swiglu_forward(h2, out)
        ctx.save_for_backward(h2)
        ctx.shape = h.shape
        return out.reshape(h.shape[:-1] + (n,))

    @staticmethod
    def backward(ctx, grad):
        h2, = ctx.saved_tensors
        g = np.ascontiguousarray(grad, dtype=h2.dtype).reshape(h2.shape[0], h2.shape[1] // 2)
        dh = np.empty_like(h2)
        if dh.size:
            swiglu_backward(h2, g, dh)
        return dh.reshape(ctx.shape)

    @staticmethod
    def example(dtype, size):
        return (random_array(dtype, max(1, size // 128), 128),), {}


class Abs(Function):
    """z = |x|.   dz/dx = sign(x) (0 at x = 0, as in PyTorch)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return np.abs(x)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * np.sign(x)


class Clip(Function):
    """z = min(max(x, lo), hi).   dz/dx = 1 where lo <= x <= hi, else 0."""

    @staticmethod
    def forward(ctx, x, min=None, max=None):
        if min is None and max is None:
            raise ValueError("clip: at least one of min and max must be given")
        ctx.save_for_backward(x)
        ctx.bounds = (min, max)
        return np.clip(x, min, max)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        lo, hi = ctx.bounds
        inside = np.ones(x.shape, dtype=bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        return grad * inside


# ------------------------------------------------------------------ selection

class Maximum(Function):
    """z = max(x, y) elementwise.   The gradient goes to the larger input;
    on ties it is split evenly between the two (as PyTorch does)."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("maximum", x, y)
        ctx.save_for_backward(x, y)
        return np.maximum(x, y)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        share_x = (x > y) + 0.5 * (x == y)
        return grad * share_x, grad * (1 - share_x)


class Minimum(Function):
    """z = min(x, y) elementwise.   The gradient goes to the smaller input;
    on ties it is split evenly."""

    @staticmethod
    def forward(ctx, x, y):
        _check_broadcast("minimum", x, y)
        ctx.save_for_backward(x, y)
        return np.minimum(x, y)

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        share_x = (x < y) + 0.5 * (x == y)
        return grad * share_x, grad * (1 - share_x)


class Where(Function):
    """z = x where cond else y.   dz/dx = cond, dz/dy = not cond; cond gets none."""

    @staticmethod
    def forward(ctx, cond, x, y):
        if cond.dtype != np.bool_:
            raise TypeError(f"where: the condition must be a boolean tensor, got {cond.dtype}")
        broadcast_shapes("where", cond.shape, x.shape, y.shape)
        ctx.save_for_backward(cond)
        return np.where(cond, x, y)

    @staticmethod
    def backward(ctx, grad):
        cond, = ctx.saved_tensors
        zero = np.zeros((), dtype=grad.dtype)
        return None, np.where(cond, grad, zero), np.where(cond, zero, grad)


class MaskedFill(Function):
    """z = value where mask else x.   dz/dx = 0 where mask, else 1.

    The mask must broadcast to x's shape without changing it.
    """

    @staticmethod
    def forward(ctx, x, mask, value=0.0):
        if mask.dtype != np.bool_:
            raise TypeError(f"masked_fill: the mask must be a boolean tensor, got {mask.dtype}")
        if broadcast_shapes("masked_fill", x.shape, mask.shape) != x.shape:
            raise ValueError(f"masked_fill: mask of shape {mask.shape} would broadcast the input "
                             f"of shape {x.shape} to a larger shape")
        ctx.save_for_backward(mask)
        return np.where(mask, np.asarray(value, dtype=x.dtype), x)

    @staticmethod
    def backward(ctx, grad):
        mask, = ctx.saved_tensors
        return np.where(mask, np.zeros((), dtype=grad.dtype), grad), None
