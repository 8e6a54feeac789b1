"""A new op with its own Numba kernel: RMSNorm, forward and backward.

RMSNorm (used by LLaMA and T5 instead of LayerNorm) scales each row by its
root mean square, without subtracting the mean:

    r = sqrt(mean(x^2) + eps),   xhat = x / r,   y = xhat * w

With g = dL/dy and gw = g * w (per row of n values):

    dL/dx = (gw - xhat * mean(gw * xhat)) / r
    dL/dw = sum over rows of g * xhat

The kernels know only numpy arrays; the `Function` wraps them; gradcheck
proves the backward; a numpy version is the reference and the baseline.

    python examples/rmsnorm_kernel.py
"""
import time

import numpy as np
from numba import njit

import tinygrad_attn as tg
from tinygrad_attn import kernels


# ---- 1. Kernels: one row at a time, over rows [start, stop) -------------------
# cache=True: compiled once, then loaded from disk in milliseconds.
# nogil=True: kernels.parallel_for can run ranges of rows on several threads
# (item_size= the elements one row is; the thread layer decides how to split).
# fastmath "reassoc" lets LLVM split a sum over SIMD lanes (a fixed order: still
# deterministic). Constants are made in x's dtype: `total / n` with an int n,
# or a Python float literal, would compute in float64 at half the speed.
FASTMATH = {"nsz", "contract", "arcp", "reassoc"}


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def rms_norm_forward(x, weight, eps, out, inv_rms, start, stop):
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)
    for r in range(start, stop):
        total = x.dtype.type(0)
        for j in range(n):
            total += x[r, j] * x[r, j]
        inv = x.dtype.type(1) / np.sqrt(total * inv_n + eps)
        inv_rms[r] = inv
        for j in range(n):
            out[r, j] = x[r, j] * inv * weight[j]


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def rms_norm_backward(x, weight, inv_rms, grad, dx, dweight_rows, start, stop):
    n = x.shape[1]
    inv_n = x.dtype.type(1.0 / n)
    for r in range(start, stop):
        inv = inv_rms[r]
        dot = x.dtype.type(0)  # sum of gw * xhat over the row
        for j in range(n):
            dot += grad[r, j] * weight[j] * (x[r, j] * inv)
        mean_dot = dot * inv_n
        for j in range(n):
            xhat = x[r, j] * inv
            dx[r, j] = (grad[r, j] * weight[j] - xhat * mean_dot) * inv
            dweight_rows[r, j] = grad[r, j] * xhat  # summed over rows by the caller


# ---- 2. The op: forward and backward side by side ---------------------------

class RMSNorm(tg.Function):
    """y = x / sqrt(mean(x^2) + eps) * w over the last axis.

    dL/dx = (gw - xhat * mean(gw * xhat)) / r,   dL/dw = sum over rows of g * xhat
    (gw = g * w, xhat = x / r, r = sqrt(mean(x^2) + eps)).
    """

    @staticmethod
    def forward(ctx, x, weight, eps=1e-6):
        if x.shape[-1:] != weight.shape:
            raise tg.ShapeError(f"rms_norm: input of shape {x.shape} does not end with the "
                                f"weight's shape {weight.shape}")
        rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])   # kernels want C-order rows
        weight = np.ascontiguousarray(weight, dtype=rows.dtype)
        out = np.empty_like(rows)
        inv_rms = np.empty(rows.shape[0], rows.dtype)
        kernels.parallel_for(rms_norm_forward, rows.shape[0], rows, weight, rows.dtype.type(eps),
                             out, inv_rms, item_size=rows.shape[1])
        ctx.save_for_backward(rows, weight, inv_rms)
        return out.reshape(x.shape)

    @staticmethod
    def backward(ctx, grad):
        rows, weight, inv_rms = ctx.saved_tensors
        g = np.ascontiguousarray(grad, dtype=rows.dtype).reshape(rows.shape)
        dx, dweight_rows = np.empty_like(rows), np.empty_like(rows)
        kernels.parallel_for(rms_norm_backward, rows.shape[0], rows, weight, inv_rms, g, dx,
                             dweight_rows, item_size=rows.shape[1])
        return dx.reshape(grad.shape), dweight_rows.sum(axis=0)


def rms_norm(x, weight, eps=1e-6):
    return RMSNorm.apply(x, weight, eps=eps)


# ---- 3. A numpy reference (also the speed baseline) -------------------------

def rms_norm_numpy(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def main(verbose=True):
    rng = np.random.default_rng(0)
    # The proof, in float64 on small shapes: full Jacobians against central differences.
    x = tg.Tensor(rng.normal(size=(3, 5)), requires_grad=True)
    w = tg.Tensor(rng.normal(size=5), requires_grad=True)
    ok = tg.gradcheck(rms_norm, (x, w))
    # The forward against numpy, and a backward, in float32 at a Transformer's size.
    xs = rng.normal(size=(2048, 128)).astype(np.float32)
    ws = rng.normal(size=128).astype(np.float32)
    x32 = tg.Tensor(xs, requires_grad=True)
    y32 = rms_norm(x32, tg.Tensor(ws))
    y32.sum().backward()  # float32 all the way through
    ours = y32.data
    err = float(np.abs(ours - rms_norm_numpy(xs, ws)).max())

    def best_of(fn, n=20):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    t_ours = best_of(lambda: rms_norm(tg.Tensor(xs), tg.Tensor(ws)))
    t_numpy = best_of(lambda: rms_norm_numpy(xs, ws))
    if verbose:
        print(f"gradcheck (float64, full Jacobian): {ok}")
        print(f"float32 forward vs numpy: max abs difference {err:.1e}; output {ours.dtype}, "
              f"gradient {x32.grad.dtype}")
        print(f"forward on (2048, 128): kernel {t_ours:.3f} ms, numpy {t_numpy:.3f} ms")
    return ok, err, x32.grad.dtype


if __name__ == "__main__":
    main()
