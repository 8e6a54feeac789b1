"""What makes the kernels' loops fast: fast-math flags and a vectorizable exp.

Fast-math flags. A float sum can run in SIMD lanes with several partial
sums only if LLVM may reorder the additions: the flag 'reassoc'. The order
is still fixed by the compiled code, so results stay deterministic. But
'reassoc' also lets LLVM regroup (x - m) - log s into x - (m + log s), and
with logits of 1e4 in float32, m + log s rounds log s away. So kernels
where such a difference matters (log-softmax, cross-entropy) are compiled
with KERNEL_FASTMATH, without 'reassoc'; kernels with nothing to fear
(LayerNorm, attention) use SUM_FASTMATH; softmax too, routing its one
risky difference through memory.

exp. Numba compiles `np.exp` to a call into libm, one element at a time,
and exp dominates softmax. The version here is plain arithmetic that LLVM
turns into SIMD code:

    exp(x) = 2^n * exp(r),   n = round(x / ln 2),   r = x - n ln 2,  |r| <= ln(2)/2

exp(r) is a short polynomial (float32: Cephes' degree-6 minimax, 1 ulp;
float64: Taylor to degree 13, error below 2^-52), and 2^n is built directly
from its exponent bits, (n + bias) << mantissa_bits, reinterpreted as a
float. Arguments below the smallest normal number give exactly 0, so -inf
(a masked score) gives 0; NaN gives NaN.
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

KERNEL_FASTMATH = {"nsz", "contract", "arcp"}
SUM_FASTMATH = KERNEL_FASTMATH | {"reassoc"}


@intrinsic
def int_bits_as_float(typingctx, bits):
    """Reinterpret the bits of an int32 as a float32 (int64 as float64)."""
    float_of = {types.int32: (types.float32, ir.FloatType()),
                types.int64: (types.float64, ir.DoubleType())}
    if bits not in float_of:
        return None
    result, llvm_type = float_of[bits]

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return result(bits), codegen


def _exp32(x):
    x = np.float32(-104.0) if x < np.float32(-104.0) else x  # -inf -> a finite value whose exp is 0
    x = np.float32(88.5) if x > np.float32(88.5) else x
    n = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
    # r = x - n ln2 in two steps: ln2 = 0.693359375 (exact in 9 bits) - 2.12194440e-4
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    n = n if n >= np.float32(-127.0) else np.float32(-127.0)  # also maps NaN to a valid int
    two_n = int_bits_as_float(np.int32(np.int32(n + np.float32(127.0)) << np.int32(23)))  # 2^-127 -> 0.0
    return p * two_n


_INV_FACTORIALS = [1.0 / np.prod(np.arange(1, k + 1, dtype=np.float64)) for k in range(14)]
_F13, _F12, _F11, _F10, _F9, _F8, _F7, _F6, _F5, _F4, _F3, _F2 = _INV_FACTORIALS[13:1:-1]


def _exp64(x):
    x = -760.0 if x < -760.0 else x
    x = 709.5 if x > 709.5 else x
    n = np.floor(x * 1.4426950408889634 + 0.5)
    r = x - n * 0.6931471803691238 - n * 1.9082149292705877e-10  # ln2 split into hi + lo
    p = _F13
    p = p * r + _F12
    p = p * r + _F11
    p = p * r + _F10
    p = p * r + _F9
    p = p * r + _F8
    p = p * r + _F7
    p = p * r + _F6
    p = p * r + _F5
    p = p * r + _F4
    p = p * r + _F3
    p = p * r + _F2
    p = p * r * r + r + 1.0
    n = n if n >= -1023.0 else -1023.0
    # via int32: AVX2 converts doubles to int32 in SIMD, but not to int64
    two_n = int_bits_as_float(np.int64(np.int32(n + 1023.0)) << np.int64(52))
    return p * two_n


def exp(x):
    """e**x for float32 or float64 (the Python body is what Numba replaces)."""
    return np.exp(x)


# Compiled as its own function with only 'contract' (fused multiply-add): the
# kernels' 'reassoc' flag must not regroup x - n*hi - n*lo, the whole point of
# splitting ln 2. LLVM still inlines it into the kernels' loops and vectorizes.
@overload(exp, jit_options={"fastmath": {"contract"}})
def _exp_overload(x):
    if x == types.float32:
        return _exp32
    if x == types.float64:
        return _exp64
    return None
