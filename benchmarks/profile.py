"""Where a training step's time goes: tinygrad_attn against PyTorch's profiler.

    PYTHONPATH=. python benchmarks/profile.py [--only W1|W2|copy|llama] [--steps N] [--threads N] [--quick]

For each workload (W1, W2 of cases.py), in two worker processes:

- tinygrad_attn, instrumented from outside the package (instrument.py):
  per step, the time in BLAS (MatMul/Linear ops and BLAS kernel calls), in
  our Numba kernels, in the numpy code of the other ops, in the engine's
  Python (the rest of forward and backward: graph, Tensors, Modules, the
  backward walk), in the optimizer, in clip; the number of ops per step
  (forward Function.apply calls, backward calls) and the engine's time per
  op; the heaviest ops and kernels.
- PyTorch, under torch.profiler (CPU): the same phases, its BLAS self time,
  its op counts, and its key_averages table (grouped by op name).

Each profile first times N plain steps, then N profiled ones: the
difference is what the timers themselves cost.
"""
import argparse
import os
import sys

import cases as C
import harness as H

WORKLOADS = ("W1", "W2", "copy", "llama")
DEFAULT = ("W1", "W2")


def print_ours(p):
    g, phases = p["graph_ms"], p["phases_ms"]
    total = sum(phases.values())
    print(f"  tinygrad_attn: plain step {p['plain_ms']:.2f} ms, instrumented {p['instrumented_ms']:.2f} ms")
    rows = [("forward+backward: BLAS (MatMul and Linear ops, matmul kernel)", g["blas"]),
            ("forward+backward: Numba kernels (inside the kernel calls)", g["kernels"]),
            ("forward+backward: numpy in the other ops' forward/backward", g["numpy"]),
            ("forward+backward: engine and Python (the rest)", g["engine"]),
            ("optimizer step", phases.get("optimizer", 0.0)),
            ("clip_grad_norm_", phases.get("clip")),
            ("zero_grad", phases.get("zero_grad", 0.0))]
    for label, value in rows:
        if value is None:
            print(f"    {label:58s} {'-':>8s}")
        else:
            print(f"    {label:58s} {value:8.2f} ms {value / total * 100:4.0f}%")
    print(f"    {'total (instrumented)':58s} {total:8.2f} ms")
    print(f"    ops per step: {p['applies_per_step']:.0f} forward applies, {p['backward_calls_per_step']:.0f} backward "
          f"calls, {p['kernel_launches_per_step']:.0f} kernel launches; engine {p['engine_us_per_op']:.1f} us per op")
    print("    heaviest ops and kernels (exclusive ms per step, calls per step):")
    for name, value, calls in p["top"]:
        print(f"      {name:54s} {value:8.2f} ms {calls:6.0f}")


def print_torch(p):
    phases = p["phases_ms"]
    print(f"  torch: plain step {p['plain_ms']:.2f} ms, profiled {p['instrumented_ms']:.2f} ms")
    for phase in ("forward", "backward", "clip", "optimizer", "zero_grad"):
        if phase in phases:
            print(f"    {phase:58s} {phases[phase]:8.2f} ms")
    print(f"    {'BLAS (self time of mm, addmm, bmm, baddbmm, mv, dot)':58s} {p['blas_ms']:8.2f} ms")
    print(f"    ops per step: {p['forward_ops_per_step']:.0f} aten ops called by forward, "
          f"{p['backward_nodes_per_step']:.0f} backward nodes, {p['aten_calls_per_step']:.0f} aten calls in all")
    print("    torch.profiler key_averages (all steps, sorted by self CPU time):")
    for line in p["table"].rstrip().splitlines():
        print("      " + line)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=WORKLOADS, help="profile only this workload")
    parser.add_argument("--steps", type=int, default=20, help="steps per profile (default 20)")
    parser.add_argument("--threads", type=int, help="threads of both frameworks")
    parser.add_argument("--quick", action="store_true", help="two steps: checks that it runs")
    args = parser.parse_args(argv)
    steps = 2 if args.quick else args.steps
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, {steps} steps per profile, "
          f"threads {args.threads or 'default'}")
    session = H.Session(args.threads)
    try:
        workers = session.workers("ours", "torch")
        for case in args.only or DEFAULT:
            session.prepare(case, workers)
            print(f"\n{C.WORKLOADS[case]}   [load average {os.getloadavg()[0]:.2f}]")
            for w in workers:
                show = print_ours if w.framework == "ours" else print_torch
                show(w.ask("profile", case=case, steps=steps)["profile"])
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
