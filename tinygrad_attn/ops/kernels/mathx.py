"""Scalar helpers the kernels inline: a vectorizable exp and a counter-based
random number generator.

Why our own exp: Numba compiles `np.exp` to a call into libm, one element at
a time (SVML, which used to vectorize it, is gone), and exp dominates
softmax. The version here is plain arithmetic that LLVM turns into SIMD code:

    exp(x) = 2^n * exp(r),   n = round(x / ln 2),   r = x - n ln 2,  |r| <= ln(2)/2

exp(r) is a short polynomial (float32: Cephes' degree-6 minimax, 1 ulp;
float64: Taylor to degree 13, error below 2^-52), and 2^n is built directly
from its exponent bits, (n + bias) << mantissa_bits, reinterpreted as a
float. Arguments below the smallest normal number give exactly 0, so -inf
(a masked score) gives 0; NaN gives NaN.

Why our own RNG: dropout needs one uniform number per element, decided by
(seed, element index) alone, so a mask is the same whatever the number of
threads, can be regenerated in backward instead of stored, and the loop
vectorizes. `uniform_bits` hashes the index with a 32-bit integer mixer
(lowbias32, by C. Wellons), keyed by the seed.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

# ------------------------------------------------------------------ bit casts


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


# ----------------------------------------------------------------------- exp

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


# ----------------------------------------------------------------------- RNG

@njit(inline="always")
def mix32(x):
    """lowbias32: a bijection of uint32 with good avalanche (Wellons)."""
    # Numba widens integer arithmetic to 64 bits; np.uint32(...) keeps the low 32.
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * np.uint32(0x7FEB352D))
    x = np.uint32(x ^ (x >> np.uint32(15)))
    x = np.uint32(x * np.uint32(0x846CA68B))
    return np.uint32(x ^ (x >> np.uint32(16)))


@njit(inline="always")
def uniform_bits(key, index):
    """32 random bits for element `index` of the stream named by `key`.

    Two rounds of the mixer over (index, key): neighbouring indices give
    unrelated bits, and the same (key, index) always gives the same bits.
    """
    return mix32(np.uint32(mix32(np.uint32(index) ^ key) + key))


def uniform_bits_numpy(key, indices):
    """`uniform_bits` for a numpy array of indices (the readable reference
    implementations and the tests use it to rebuild a kernel's mask)."""
    def mix(x):
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)  # uint32 arithmetic wraps modulo 2^32, as in the kernel
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))
    key = np.uint32(key)
    return mix(mix(np.asarray(indices).astype(np.uint32) ^ key) + key)
