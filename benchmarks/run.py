"""Benchmark tinygrad_attn against PyTorch (CPU, eager) and plain numpy.

    PYTHONPATH=. python benchmarks/run.py [--only TABLE ...] [--rounds R] [--repeat N]
                                          [--threads N] [--quick] [--skip-startup] [--kernel-size N]

Each framework runs in a worker process of its own (worker.py): their
thread pools would otherwise compete for the cores and slow each other
down. Every worker builds a case from the same files (inputs and initial
weights drawn once by our worker), the results are checked equal first
(outputs, gradients, the losses of a few training steps), then the workers
are timed in turn, A B A B ..., for --rounds rounds of --repeat steps each
(after a short warm-up in each round). A time is the median of a round's
steps; the table shows the median of the rounds' medians, their spread
((max - min) / median), and the ratios other/ours (above 1: we are faster).

Tables (--only, repeatable; default all):
  kernels      each kernel, forward and forward+backward, against the op's numpy twin and PyTorch:
               rows at chosen shapes (cases.KERNELS), then a row for every op with a kernel,
               from its example (Function.registry)
  alternating  a LayerNorm kernel alternating with a BLAS matmul (ours alone)
  encoder      one post-norm encoder layer, forward+backward, dropout 0 and 0.1
  steps        training steps W1, W2, W3 and the copy model (alias: models)
  optim        an optimizer step on W2's parameter shapes
  busy         W1-W3 with one other CPU-bound process running, against quiet rounds
  rss          peak resident memory of a W1 training process
  startup      `python -m tinygrad_attn train`: process start to the end of its first step,
               with an empty and with a filled Numba cache
  llama        a Llama training step (llama2.c's model at nanoGPT's CPU size) against the PyTorch
               twin of llama2.c's model.py, and its RMSNorm and rotary kernels

Timings on a shared machine are noisy: the header prints the load average;
compare ratios within one run.
"""
import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

import cases as C
import harness as H

TABLES = ("kernels", "alternating", "encoder", "steps", "optim", "busy", "rss", "startup", "llama")
ALIASES = {"models": "steps"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=TABLES + tuple(ALIASES), metavar="TABLE",
                   help=f"run only this table (repeatable): {', '.join(TABLES)}")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per measurement (default 5)")
    p.add_argument("--repeat", type=int, default=20, help="timed steps per round (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each round (default 2)")
    p.add_argument("--threads", type=int, help="threads of every framework: our kernels, BLAS, PyTorch")
    p.add_argument("--quick", action="store_true",
                   help="one round of two steps, a warm start-up run only: checks that everything runs")
    p.add_argument("--skip-startup", action="store_true", help="leave out the start-up table")
    p.add_argument("--kernel-size", type=int, default=C.KERNEL_SIZE, metavar="N",
                   help="elements of the kernel rows built from the ops' examples (default %(default)s)")
    p.add_argument("--before", metavar="DIR",
                   help="also time another checkout of tinygrad_attn (e.g. a worktree of an earlier commit) in "
                        "the steps, encoder, busy and llama tables, interleaved with this one")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.repeat, args.warmup = 1, 2, 0
    if args.rounds < 1 or args.repeat < 1 or args.warmup < 0 or args.kernel_size < 1:
        p.error("--rounds, --repeat and --kernel-size must be >= 1, --warmup >= 0")
    chosen = {ALIASES.get(t, t) for t in args.only or TABLES}
    if args.skip_startup and not args.only:
        chosen.discard("startup")
    args.tables = [t for t in TABLES if t in chosen]
    return args


class Run:
    """One benchmark run: the options, the session's workers, and the
    problems found (frameworks that disagree), reported at the end."""

    def __init__(self, args):
        self.args, self.session, self.problems = args, H.Session(args.threads), []
        self.agreement = {}  # (case, frameworks) -> what checked() returned

    def time(self, case, workers):
        a = self.args
        return H.alternate(case, workers, a.rounds, a.repeat, a.warmup)

    def checked(self, case, workers):
        """Prepare and check `case` in `workers` (the first is the reference):
        the agreement column's text, whether it may be timed, and the workers
        that have the case (those to time). A case is checked once, on its
        initial weights, before any timed step."""
        key = (case, tuple(w.framework for w in workers))
        if key not in self.agreement:
            present = self.session.prepare(case, workers)
            self.agreement[key] = self._check(case, present) + (present,)
        return self.agreement[key]

    def _check(self, case, workers):
        if len(workers) < 2:
            return "-", True
        worst, flags, problems = H.compare(case, workers[0], workers[1:])
        if problems:
            self.problems += [f"{case}: {p}" for p in problems]
            return "DISAGREE", False
        if worst is not None:
            return f"{worst:.0e}", True
        return ("checked" if flags else "not compared"), True  # dropout: each its own mask, checked alone


def title(text):
    print(f"\n{text}   [load average {os.getloadavg()[0]:.2f}]")


def ms(values, digits=2):
    """The median of the rounds' medians and ± half their spread, or "-"."""
    if values is None:
        return f"{'-':>8s} {'':5s}"
    m, spread = H.summary(values)
    return f"{m:8.{digits}f} {'±' + format(spread / 2, '.0f') + '%':>5s}"


def ratio(other, ours):
    if other is None or ours is None:
        return f"{'-':>7s}"
    return f"{H.summary(other)[0] / H.summary(ours)[0]:7.2f}"


# ------------------------------------------------------------ tables

def kernel_groups(run):
    """[(heading, [(key, label, shape)])]: the rows of cases.KERNELS at their
    shapes, then a row for every op with a kernel, from its example at
    --kernel-size elements (our worker lists them, from the registry)."""
    groups = [(heading, [(key, C.KERNELS[key].label, C.KERNELS[key].shape) for key in keys])
              for heading, keys in C.KERNEL_GROUPS]
    (ours,) = run.session.workers("ours")
    size = run.args.kernel_size
    listed = ours.ask("kernel_cases", size=size)["cases"]
    groups.append((f"Every op with a kernel (Function.registry), on its example(float32, {size}); "
                   "numpy: the op's numpy twin", [(c["key"], c["label"], c["shape"]) for c in listed]))
    return groups


def kernels_table(run):
    workers = run.session.workers("ours", "numpy", "torch")
    for heading, rows in kernel_groups(run):
        title(heading)
        width = max([26] + [len(label) + len(" fwd+bwd") for _, label, _ in rows])
        shape_width = max([20] + [len(shape) for _, _, shape in rows])
        print(f"{'kernel':{width}s} {'shape':{shape_width}s} {'ours ms':>14s} {'numpy ms':>14s} {'torch ms':>14s} "
              f"{'np/ours':>7s} {'pt/ours':>7s}  agree")
        for key, label, shape in rows:
            for mode, suffix in (("fwd", " fwd"), ("fwdbwd", " fwd+bwd")):
                case = C.kernel_case(key, mode)
                agree, ok, present = run.checked(case, workers)
                t = run.time(case, present) if ok else {}
                ours, np_, pt = t.get("ours"), t.get("numpy"), t.get("torch")
                absent = "; ".join(run.session.absent(case).values())
                print(f"{label + suffix:{width}s} {shape:{shape_width}s} {ms(ours, 3)} {ms(np_, 3)} {ms(pt, 3)} "
                      f"{ratio(np_, ours)} {ratio(pt, ours)}  {agree}" + (f"  [{absent}]" if absent else ""))


def alternating_table(run):
    (ours,) = run.session.workers("ours")
    a = C.ALTERNATING
    title(f"A kernel alternating with a BLAS matmul ({a['rows']}x{a['n']} @ {a['n']}x{a['n']}), ours, ms")
    print(f"{'op':26s} {'op':>7s} {'matmul':>7s} {'apart':>7s} {'alternating':>12s} {'ratio':>6s}")
    repeat = run.args.repeat * 5  # sub-millisecond ops: more calls per round
    for name, key in (("layer_norm kernel", "ln"), ("numpy x * 2 + 1 (control)", "np")):
        trio = (f"alt:{key}", "alt:mm", f"alt:{key}+mm")
        medians = {case: [] for case in trio}
        for case in trio:
            run.session.prepare(case, [ours])
        for _ in range(run.args.rounds):  # the three in turn, round after round
            for case in trio:
                medians[case].append(H.round_median(ours, case, repeat, run.args.warmup))
        t_op, t_mm, t_both = (H.summary(medians[case])[0] for case in trio)
        print(f"{name:26s} {t_op:7.3f} {t_mm:7.3f} {t_op + t_mm:7.3f} {t_both:12.3f} {t_both / (t_op + t_mm):6.2f}")


def comparison_table(run, heading, rows, first_column, before=False):
    """Rows of (label, case) timed in our worker and PyTorch's (and the
    --before checkout's, when given and `before`)."""
    frameworks = ("ours", "torch") + (("before",) if before and run.args.before else ())
    workers = run.session.workers(*frameworks)
    title(heading)
    width = max(len(label) for label, _ in rows + [(first_column, None)])
    extra = f" {'before ms':>14s} {'bf/ours':>7s}" if "before" in frameworks else ""
    print(f"{first_column:{width}s} {'ours ms':>14s} {'torch ms':>14s} {'pt/ours':>7s}{extra}  agree")
    for label, case in rows:
        agree, ok, present = run.checked(case, workers)
        t = run.time(case, present) if ok else {}
        ours, torch, earlier = t.get("ours"), t.get("torch"), t.get("before")
        extra = f" {ms(earlier)} {ratio(earlier, ours)}" if "before" in frameworks else ""
        print(f"{label:{width}s} {ms(ours)} {ms(torch)} {ratio(torch, ours)}{extra}  {agree}")


def encoder_table(run):
    e = C.ENCODER
    comparison_table(run, f"One post-norm encoder layer, forward+backward (B={e['batch']}, T={e['seq']}, "
                          f"d={e['d_model']}, {e['nhead']} heads, ffn {e['ffn']})",
                     [(f"dropout {case.split(':')[1]}", case) for case in C.ENCODER_CASES], "layer", before=True)


def steps_table(run):
    comparison_table(run, "Training steps (zero_grad, forward, loss, backward, [clip 1.0], update), float32",
                     [(label, case) for case, label in C.WORKLOADS.items() if case != "llama"],  # its own table
                     "workload", before=True)


def optim_table(run):
    comparison_table(run, f"One optimizer step on W2's {len(C.OPTIM_SHAPES)} parameters (fixed gradients)",
                     [(label, f"optim:{key}") for key, (label, _, _) in C.OPTIMIZERS.items()], "optimizer")


BUSY_CASES = ("W1", "W2", "W3")


def busy_table(run):
    """Each round: the frameworks in turn on a quiet machine, then again with
    one other CPU-bound process running (the hog is stopped between rounds)."""
    workers = run.session.workers("ours", "torch", *(("before",) if run.args.before else ()))
    title("One core busy: median ms with one other CPU-bound process running, against quiet rounds")
    names = [w.framework for w in workers]
    width = max(len(C.WORKLOADS[case]) for case in BUSY_CASES)
    print(f"{'workload':{width}s} " + " ".join(f"{n + ' quiet':>14s} {n + ' busy':>14s} {'busy/quiet':>10s}"
                                             for n in names))
    a = run.args
    for case in BUSY_CASES:
        _, ok, _ = run.checked(case, workers)
        if not ok:
            print(f"{C.WORKLOADS[case]:{width}s} DISAGREE")
            continue
        quiet, busy = {n: [] for n in names}, {n: [] for n in names}
        for _ in range(a.rounds):
            for w in workers:
                quiet[w.framework].append(H.round_median(w, case, a.repeat, a.warmup))
            with H.cpu_hog():
                for w in workers:
                    busy[w.framework].append(H.round_median(w, case, a.repeat, max(a.warmup, 1)))
        print(f"{C.WORKLOADS[case]:{width}s} " + " ".join(
            f"{ms(quiet[n])} {ms(busy[n])} {H.summary(busy[n])[0] / H.summary(quiet[n])[0]:10.2f}" for n in names))
    print("(target for tinygrad_attn: busy/quiet <= 1.3)")


def scipy_note():
    """scipy is not our dependency, but Numba imports scipy.linalg at its first
    compile (or cache load) when it is installed: 0.3 s and 17 MB measured
    here. The README's install brings no scipy; the test extra does."""
    import importlib.util
    if importlib.util.find_spec("scipy") is None:
        return "(scipy not installed, as after the README's install)"
    return "(scipy installed here: Numba imports scipy.linalg at its first compile, ~0.3 s and ~17 MB)"


def rss_table(run):
    """Fresh workers (one per framework, side by side) that only build W1 and
    train it: their peak resident memory after import and after the steps."""
    run.session.init("W1")
    steps = max(run.args.repeat, 3)
    title(f"Peak resident memory (VmHWM) of a process training W1 for {steps} steps, MB")
    print(f"{'framework':16s} {'after import':>12s} {'after the steps':>16s}")
    workers = H.start_workers(["ours", "torch"], run.session.directory, run.args.threads)
    try:
        for w in workers:
            if not w.available:
                print(f"{w.framework:16s} not available")
                continue
            before = w.ask("rss")["peak_rss_mb"]
            w.ask("setup", case="W1")
            w.ask("time", case="W1", steps=steps, warmup=0)
            print(f"{w.info['name']:16s} {before:12.0f} {w.ask('rss')['peak_rss_mb']:16.0f}")
    finally:
        for w in workers:
            w.close()
    print(scipy_note())


FIRST_STEP = """
import json, os, sys, time
import tinygrad_attn
imported = time.time()
from tinygrad_attn import cli
from tinygrad_attn.train import trainer

original = trainer.Trainer.train_step


def first_step(self):  # report the end of the first step, then stop the run there
    result = original(self)
    print(json.dumps({"imported": imported, "first_step": time.time()}), flush=True)
    os._exit(0)


trainer.Trainer.train_step = first_step
sys.exit(cli.main(["train", "--no-plots", "--no-progress", "--out", sys.argv[1]]))
"""


def startup_table(run):
    """`python -m tinygrad_attn train` with its defaults (the copy task), run
    through cli.main by a wrapper that stops the process at the end of the
    first training step: seconds from just before the process is spawned to
    the end of `import tinygrad_attn`, and to the end of that step."""
    env = {k: v for k, v in H.worker_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    # Python's bytecode cache on, as in an installed package; written now, compiling no kernel
    subprocess.run([sys.executable, "-c", "import tinygrad_attn"], check=True, env=env)
    title("Start-up of `python -m tinygrad_attn train` (copy task defaults): seconds from process start")
    print(f"{'Numba cache':36s} {'import done':>11s} {'first step done':>16s}")
    with tempfile.TemporaryDirectory() as cache:
        if run.args.quick:
            runs = [("this checkout's cache, as it is", None)]
        else:
            runs = [("cold (empty NUMBA_CACHE_DIR)", cache), ("warm (filled by the cold run)", cache),
                    ("warm again", cache)]
        for label, directory in runs:
            run_env = dict(env) if directory is None else dict(env, NUMBA_CACHE_DIR=directory)
            with tempfile.TemporaryDirectory() as out:
                start = time.time()
                done = subprocess.run([sys.executable, "-c", FIRST_STEP, out], env=run_env, capture_output=True,
                                      text=True, check=False)
            if done.returncode != 0:
                raise H.WorkerError(f"start-up run failed:\n{done.stderr[-3000:]}")
            marks = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"{label:36s} {marks['imported'] - start:11.2f} {marks['first_step'] - start:16.2f}")
    print(scipy_note())


def llama_table(run):
    c = C.LLAMA
    rows = [(C.WORKLOADS["llama"], "llama")]
    for key in C.LLAMA_ROWS:
        label, shape = C.KERNELS[key].label, C.KERNELS[key].shape
        rows += [(f"{label} {shape} fwd", C.kernel_case(key, "fwd")),
                 (f"{label} {shape} fwd+bwd", C.kernel_case(key, "fwdbwd"))]
    comparison_table(run, f"Llama (dim {c['dim']}, {c['n_layers']} layers, {c['n_heads']} heads, {c['n_kv_heads']} "
                          f"key/value heads, {c['batch']}x{c['max_seq_len']}): a training step and its new kernels, "
                          "float32", rows, "case", before=True)


RUNNERS = {"kernels": kernels_table, "alternating": alternating_table, "encoder": encoder_table,
           "steps": steps_table, "optim": optim_table, "busy": busy_table, "rss": rss_table,
           "startup": startup_table, "llama": llama_table}


def _terminate(signum, frame):
    sys.exit(128 + signum)  # SystemExit: the finally blocks stop the workers and the CPU hog


def main(argv=None):
    args = parse_args(argv)
    H.BEFORE_ROOT = os.path.abspath(args.before) if args.before else None
    signal.signal(signal.SIGTERM, _terminate)
    print(f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"threads {args.threads or 'default'}, {args.rounds} rounds of {args.repeat} steps")
    run = Run(args)
    try:
        if any(t != "startup" for t in args.tables):
            run.session.workers("ours", "torch")  # their versions, BLAS and threads head the output
        for table in args.tables:
            RUNNERS[table](run)
    finally:
        run.session.close()
    if run.problems:
        print("\nThe frameworks disagree:\n  " + "\n  ".join(run.problems))
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the workers and the CPU hog are stopped by then
        print("interrupted", file=sys.stderr)
        sys.exit(130)
