"""Time one optimizer step on the parameter shapes of a small GPT, against PyTorch.

The shapes are those of nanoGPT's CPU configuration (4 layers, n_embd 128,
block 64, 65 characters; about 0.8M float32 parameters). Prints the median
milliseconds per step over several repeats, and the ratio to torch.optim
when PyTorch is installed. torch runs on one thread, as numpy's elementwise
ops do: on a shared 2-core machine its thread pool otherwise makes the
timings swing by 10x.

    PYTHONPATH=. python benchmarks/bench_optim.py
"""
import time

import numpy as np

import tinygrad_attn as tg
from tinygrad_attn import optim

D, LAYERS, VOCAB, BLOCK = 128, 4, 65, 64
LAYER = [(D,), (D,), (3 * D, D), (3 * D,), (D, D), (D,), (D,), (D,), (4 * D, D), (4 * D,), (D, 4 * D), (D,)]
SHAPES = [(VOCAB, D), (BLOCK, D)] + LAYER * LAYERS + [(D,), (D,)]


def median_ms(step, steps=100, repeats=7):
    for _ in range(5):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return float(np.median(times))


def ours(make, arrays, grads):
    params = [tg.Tensor(a.copy(), requires_grad=True) for a in arrays]
    for p, g in zip(params, grads):
        p.grad = tg.Tensor(g)
    return median_ms(make(params).step)


def theirs(torch, make, arrays, grads):
    params = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    return median_ms(make(params).step)


def main():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    print(f"{len(SHAPES)} parameters, {sum(a.size for a in arrays):,} float32 values")
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    cases = [("SGD momentum 0.9", lambda ps, lib: lib.SGD(ps, lr=1e-3, momentum=0.9)),
             ("Adam", lambda ps, lib: lib.Adam(ps, lr=1e-3)),
             ("AdamW", lambda ps, lib: lib.AdamW(ps, lr=1e-3)),
             ("AdamW amsgrad", lambda ps, lib: lib.AdamW(ps, lr=1e-3, amsgrad=True))]
    for name, make in cases:
        ms = ours(lambda ps: make(ps, optim), arrays, grads)
        line = f"{name:18s} tinygrad_attn {ms:6.2f} ms/step"
        if torch is not None:
            tms = theirs(torch, lambda ps: make(ps, torch.optim), arrays, grads)
            line += f"   torch {tms:6.2f} ms/step   torch/ours {tms / ms:4.2f}x"
        print(line)


if __name__ == "__main__":
    main()
