"""Where a training step's time goes in tinygrad_attn, measured from outside
the package (profile.py asks our worker for it).

While `Instrumented` is active, this process's copy of the package is
patched: every op's `forward` and `backward` (each Function subclass), the
kernel launcher `parallel_for` (wherever a module of the package holds it)
and `Function.apply_with_ctx` (to count ops) are wrapped with timers. On
exit the originals are put back. The package itself has no profiling hooks.

Times are exclusive: a region's time minus the time of the regions inside
it, so an op whose forward launches a kernel counts the kernel under
"kernels" and only the rest under its own name. Categories:

    blas     forward/backward of the ops in ops/matmul.py (MatMul, Linear),
             and the matmul kernel's launches (BLAS called from our threads)
    kernels  every other parallel_for launch (softmax, LayerNorm, attention,
             which calls BLAS inside, cross-entropy, dropout, GELU)
    numpy    the rest of the ops' forward/backward bodies (elementwise numpy)
    engine   what is left of the forward and backward phases: building the
             graph, Tensor wrappers, Module calls, the backward walk, and the
             timers' own cost (about the instrumented minus the plain step)
"""
import collections
import statistics
import sys
import time

from tinygrad_attn import autograd

import cases as C

BLAS_OPS_MODULE = "tinygrad_attn.ops.matmul"  # MatMul and Linear: their products are BLAS calls
PHASES = ("zero_grad", "forward", "backward", "clip", "optimizer")


class Timers:
    """Exclusive wall time per (phase, category, name), and call counts."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.Counter()
        self.phase_seconds = collections.defaultdict(float)
        self.phase = None
        self._children = []  # per open region: time spent in regions inside it

    def timed(self, category, name, fn, *args, **kwargs):
        self._children.append(0.0)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            inner = self._children.pop()
            self.seconds[self.phase, category, name] += elapsed - inner
            self.calls[self.phase, category, name] += 1
            if self._children:
                self._children[-1] += elapsed

    def run_phase(self, phase, fn, *args):
        self.phase = phase
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.phase_seconds[phase] += time.perf_counter() - start
            self.phase = None


def _function_classes():
    todo, found = [autograd.Function], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


class Instrumented:
    """A context manager: the package's ops and kernel launches timed by `timers`."""

    def __init__(self, timers):
        self.timers, self._undo = timers, []

    def _patch(self, owner, name, value):
        self._undo.append((owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)))
        setattr(owner, name, value)

    def __enter__(self):
        timers = self.timers
        for cls in _function_classes():
            category = "blas" if cls.__module__ == BLAS_OPS_MODULE else "numpy"
            for method in ("forward", "backward"):
                if method in cls.__dict__ and cls is not autograd.Function:
                    fn = cls.__dict__[method].__func__
                    self._patch(cls, method, staticmethod(self._wrap(category, f"{cls.__name__}.{method}", fn)))

        apply_with_ctx = autograd.Function.__dict__["apply_with_ctx"].__func__

        def counted_apply(cls, *inputs, **params):
            timers.calls[timers.phase, "apply", cls.__name__] += 1
            return apply_with_ctx(cls, *inputs, **params)
        self._patch(autograd.Function, "apply_with_ctx", classmethod(counted_apply))

        from tinygrad_attn import kernels
        original = kernels.parallel_for

        def timed_launch(kernel, n_items, *args, **kwargs):
            source = getattr(kernel, "py_func", kernel)  # a Numba dispatcher's Python function
            name = getattr(source, "__name__", str(kernel))
            category = "blas" if getattr(source, "__module__", "").endswith("kernels.matmul") else "kernels"
            return timers.timed(category, name, original, kernel, n_items, *args, **kwargs)
        for module in [m for name, m in sys.modules.items() if name.startswith("tinygrad_attn") and m]:
            if getattr(module, "parallel_for", None) is original:
                self._patch(module, "parallel_for", timed_launch)
        return self

    def _wrap(self, category, name, fn):
        timers = self.timers

        def wrapper(*args, **kwargs):
            return timers.timed(category, name, fn, *args, **kwargs)
        return wrapper

    def __exit__(self, *exc):
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()
        return False


def timed_step(train, timers):
    """One TrainStep, phase by phase."""
    timers.run_phase("zero_grad", train.zero_grad)
    loss = timers.run_phase("forward", train.loss_fn)
    timers.run_phase("backward", loss.backward)
    if train.clip is not None:
        timers.run_phase("clip", train.clip, train.params, C.CLIP_NORM)
    timers.run_phase("optimizer", train.update)


def _median_ms(fn, steps):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def profile(train, steps):
    """Plain and instrumented step times (medians), and where the
    instrumented steps' time goes, per step, for profile.py to print."""
    for _ in range(2):  # warm-up
        train()
    plain = _median_ms(train, steps)
    timers = Timers()
    with Instrumented(timers):
        instrumented = _median_ms(lambda: timed_step(train, timers), steps)

    def per_step(seconds):
        return seconds / steps * 1e3

    def count(keep):
        return sum(n for key, n in timers.calls.items() if keep(*key)) / steps

    in_graph = ("forward", "backward")
    by_category, by_name = collections.defaultdict(float), collections.defaultdict(float)
    for (phase, category, name), seconds in timers.seconds.items():
        if phase in in_graph:
            by_category[category] += seconds
            by_name[category, name] += seconds
    engine = sum(timers.phase_seconds[p] for p in in_graph) - sum(by_category.values())
    applies = count(lambda phase, cat, name: phase == "forward" and cat == "apply")
    backwards = count(lambda phase, cat, name: phase == "backward" and name.endswith(".backward"))
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "plain_ms": plain, "instrumented_ms": instrumented,
        "phases_ms": {p: per_step(timers.phase_seconds[p]) for p in PHASES if p in timers.phase_seconds},
        "graph_ms": {c: per_step(by_category[c]) for c in ("blas", "kernels", "numpy")} | {"engine": per_step(engine)},
        "applies_per_step": applies, "backward_calls_per_step": backwards,
        "kernel_launches_per_step": count(lambda phase, cat, name: phase in in_graph and "." not in name
                                          and cat in ("blas", "kernels")),
        "engine_us_per_op": per_step(engine) * 1e3 / max(applies + backwards, 1),
        "top": [(f"{name} [{cat}]", per_step(seconds),
                 count(lambda ph, c, n, cat=cat, name=name: ph in in_graph and c == cat and n == name))
                for (cat, name), seconds in top],
    }
