"""The parent's side of the benchmark: start one worker process per
framework (worker.py), have them build the same case from the same files,
compare their checks, time them in alternating rounds, and hog a core.

The parent imports no framework (numpy only, to compare the checks), so no
thread pool of its own competes with the workers.
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

import cases as C

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class WorkerError(RuntimeError):
    """A worker failed a request (the message has its traceback) or died."""


# --before DIR (run.py): a second tinygrad_attn worker, "before", runs another
# checkout of the package (an earlier commit) on the same cases.
BEFORE_ROOT = None


def worker_env(root=ROOT):
    """The environment of a worker: the checkout `root` first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return env


class Worker:
    """One framework in its own process. `start` returns at once; `wait_ready`
    reads its first line (so several workers import their framework in parallel)."""

    def __init__(self, framework, directory, threads=None):
        self.framework, self.info, self.error = framework, None, None
        before = framework == "before"  # our implementation, from the other checkout
        command = [sys.executable, os.path.join(HERE, "worker.py"), "ours" if before else framework, directory]
        if threads:
            command += ["--threads", str(threads)]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=worker_env(BEFORE_ROOT if before else ROOT))

    def wait_ready(self):
        hello = self._read()
        self.info, self.error = hello.get("ready"), hello.get("error")
        if self.error and not hello.get("missing"):
            raise WorkerError(f"{self.framework} worker: {self.error}")
        return self

    @property
    def available(self):
        return self.info is not None

    def ask(self, op, **args):
        try:
            self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.proc.stdin.flush()
        except OSError:
            raise WorkerError(f"{self.framework} worker exited (status {self.proc.poll()})") from None
        reply = self._read()
        if "error" in reply:
            raise WorkerError(f"{self.framework} worker, {op} {args.get('case', '')}:\n{reply['error']}")
        return reply

    def _read(self):
        line = self.proc.stdout.readline()
        if not line:
            raise WorkerError(f"{self.framework} worker exited (status {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def start_workers(frameworks, directory, threads=None):
    """Workers for `frameworks`, started together; those whose framework is
    not installed come back with `available` False."""
    workers = []
    try:
        for f in frameworks:
            workers.append(Worker(f, directory, threads))
        for w in workers:
            w.wait_ready()
    except BaseException:
        for w in workers:
            w.close()
        raise
    return workers


class Session:
    """The workers of one benchmark run and the directory of shared files.
    Each framework's worker is started once, on first use, and serves every
    table; `close()` ends them all (and removes the files)."""

    def __init__(self, threads=None):
        self.threads = threads
        self._tmp = tempfile.TemporaryDirectory(prefix="tinygrad_attn-bench-")
        self.directory = self._tmp.name
        self._workers = {}
        self._ready = {}  # framework -> cases set up in its worker
        self._absent = {}  # (framework, case) -> why that worker has no version of the case

    def workers(self, *frameworks):
        """The available workers among `frameworks`, in that order; new ones are announced on stdout."""
        missing = [f for f in frameworks if f not in self._workers]
        for w in start_workers(missing, self.directory, self.threads):
            self._workers[w.framework], self._ready[w.framework] = w, set()
            print(describe(w))
        return [self._workers[f] for f in frameworks if self._workers[f].available]

    def init(self, case):
        """Have our worker write the case's shared inputs and weights (once)."""
        ours = self.workers("ours")
        if not ours:
            raise WorkerError(f"tinygrad_attn's worker is needed to write the inputs: {self._workers['ours'].error}")
        ours[0].ask("init", case=case)

    def prepare(self, case, workers):
        """Write the case's files and build it in each worker; returns the
        workers that have it (`absent` says why the others do not)."""
        self.init(case)
        for w in workers:
            if case not in self._ready[w.framework] and (w.framework, case) not in self._absent:
                reply = w.ask("setup", case=case)
                if "absent" in reply:
                    self._absent[w.framework, case] = reply["absent"]
                else:
                    self._ready[w.framework].add(case)
        return [w for w in workers if case in self._ready[w.framework]]

    def absent(self, case):
        """{framework: why it has no version of `case`}, for the frameworks asked so far."""
        return {f: why for (f, c), why in self._absent.items() if c == case}

    def close(self):
        for w in self._workers.values():
            w.close()
        self._tmp.cleanup()


def describe(worker):
    if not worker.available:
        return f"  {worker.framework}: not available ({worker.error})"
    i = worker.info
    memory = f"; memory {i['memory']}" if "memory" in i else ""
    name = f"{i['name']} (before: {BEFORE_ROOT})" if worker.framework == "before" else i["name"]
    return f"  {name} worker (pid {worker.proc.pid}): {i['versions']}; BLAS {i['blas']}; {i['threads']}{memory}"


# ------------------------------------------------------------ checking

def relative_error(a, b, elementwise=False):
    """max |a - b| / max |b|, or with `elementwise` (losses) the largest |a_i - b_i| / |b_i|."""
    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if not a.size:
        return 0.0
    if elementwise:
        a, b = a.astype(np.float64), b.astype(np.float64)
        return float((np.abs(a - b) / np.maximum(np.abs(b), 1e-30)).max())
    # In the arrays' own precision (float32 mostly): the difference of two close values is exact.
    diff = np.abs(np.subtract(a, b, dtype=np.result_type(a, b, np.float32)))
    return float(diff.max()) / max(float(np.abs(b).max()), 1e-30)


def load_check(path):
    """A worker's check results (name -> array), and the file removed."""
    with np.load(path) as f:
        result = {k: f[k] for k in f.files}
    os.remove(path)
    return result


def compare(case, reference, others):
    """Check `others` (workers) against `reference` on `case`: every value
    present in both must agree (ARRAY_RTOL, LOSS_RTOL for losses), and
    every "?" flag must be True. Returns (largest relative error or None
    when no value was compared, number of flags checked, list of problems)."""
    results = {w.framework: load_check(w.ask("check", case=case)["file"]) for w in [reference, *others]}
    ref = results[reference.framework]
    worst, flags, problems = None, 0, []
    for name, result in results.items():
        for key, value in result.items():
            if key.endswith("?"):
                flags += 1
                if not bool(value):
                    problems.append(f"{name}: {key[:-1]} check failed")
        if name == reference.framework:
            continue
        for key in sorted(set(ref) & set(result) - {k for k in ref if k.endswith("?")}):
            a, b = ref[key], result[key]
            if a.size != b.size:
                problems.append(f"{name}: {key} has shape {b.shape}, {reference.framework} {a.shape}")
                continue
            err = relative_error(b, a, elementwise=key == "losses")
            worst = err if worst is None else max(worst, err)
            if not err <= (C.LOSS_RTOL if key == "losses" else C.ARRAY_RTOL):
                problems.append(f"{name}: {key} differs from {reference.framework}'s by {err:.1e} (relative)")
    return worst, flags, problems


# ------------------------------------------------------------ timing

def alternate(case, workers, rounds, steps, warmup):
    """Time `case` in each worker in turn, A B A B ..., `rounds` times: drift
    in the machine's load then hits every framework alike. Returns
    {framework: [median ms of each round's `steps` steps]}."""
    medians = {w.framework: [] for w in workers}
    for _ in range(rounds):
        for w in workers:
            medians[w.framework].append(round_median(w, case, steps, warmup))
    return medians


def round_median(worker, case, steps, warmup):
    times = worker.ask("time", case=case, steps=steps, warmup=warmup)["times"]
    return statistics.median(times) * 1e3


def summary(round_medians):
    """(median of the rounds' medians, their spread (max - min) / median in %)."""
    m = statistics.median(round_medians)
    return m, (max(round_medians) - min(round_medians)) / m * 100


# Spins until killed, or until its parent is gone (then it is an orphan: its parent id changes).
HOG = """
import os
parent = os.getppid()
while os.getppid() == parent:
    for _ in range(100000):
        pass
"""


@contextlib.contextmanager
def cpu_hog():
    """One other CPU-bound process while inside (yields its pid). It is
    killed on the way out, whatever the way (exception, Ctrl-C, SIGTERM
    turned into SystemExit by run.py); if this process is killed outright,
    the hog notices it has lost its parent and stops."""
    proc = subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
