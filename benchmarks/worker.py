"""A benchmark worker: one framework in a process of its own, answering
requests from the parent (harness.py) on stdin/stdout, one JSON object a line.

    python benchmarks/worker.py FRAMEWORK DIR [--threads N]

FRAMEWORK is ours (tinygrad_attn), torch or numpy (impl_FRAMEWORK.py);
DIR holds the cases' shared files. Frameworks never share a process: their
thread pools would compete for the cores and slow each other down.

The worker first writes {"ready": info} (versions, BLAS, threads), or
{"error": ...} when the framework cannot be imported. Then, per request:

    {"op": "init", "case": C}       (ours) draw C's inputs and weights into its file
    {"op": "setup", "case": C}      build C from its file; {"absent": why} if this
                                    framework has no version of C (cases.Absent)
    {"op": "check", "case": C}      run C's check; results to DIR/check/C.FRAMEWORK.npz
    {"op": "time", "case": C, "steps": N, "warmup": W}
                                    W untimed steps, then N timed: {"times": [s, ...]}
    {"op": "profile", "case": C, "steps": N}   where C's step spends its time
    {"op": "rss"}                   {"peak_rss_mb": peak resident memory so far}
    {"op": "kernel_cases", "size": N}
                                    (ours) {"cases": a row for every op with a kernel,
                                    from its example at N elements (impl_ours.kernel_cases)}
    {"op": "quit"}

A failed request answers {"error": traceback}; the worker carries on.
"""
import argparse
import json
import os
import resource
import sys
import time
import traceback

# Our directory goes last on the path: its modules import each other, but
# must not shadow the standard library (profile.py is also a stdlib name).
sys.path.append(sys.path.pop(0))
import cases

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def time_steps(step, steps, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def peak_rss_mb():
    """This process's peak resident memory in MB: VmHWM from /proc on Linux.
    (getrusage's ru_maxrss starts from the parent's peak at fork and keeps it
    across exec, so a worker of a parent that once held big arrays would
    report the parent's peak.) Elsewhere ru_maxrss, in bytes on macOS."""
    try:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 2**20 if sys.platform == "darwin" else rss / 1024


class Server:
    def __init__(self, impl, directory):
        self.impl, self.directory, self.built = impl, directory, {}

    def path(self, case):
        return os.path.join(self.directory, cases.files_of(case) + ".npz")

    def handle(self, request):
        op, case = request["op"], request.get("case")
        if op == "init":
            if not os.path.exists(self.path(case)):
                self.impl.init(case, self.path(case))
            return {}
        if op == "setup":
            if case not in self.built:
                try:
                    self.built[case] = self.impl.build(case, self.path(case))
                except cases.Absent as absent:
                    return {"absent": str(absent)}
            return {}
        if op == "check":
            return {"file": self.save_check(case, self.built[case].check())}
        if op == "time":
            return {"times": time_steps(self.built[case].step, request["steps"], request.get("warmup", 0))}
        if op == "profile":
            return {"profile": self.impl.profile(self.built[case], request["steps"])}
        if op == "rss":
            return {"peak_rss_mb": peak_rss_mb()}
        if op == "kernel_cases":
            return {"cases": self.impl.kernel_cases(request["size"])}
        raise ValueError(f"unknown request {op!r}")

    def save_check(self, case, result):
        import numpy as np
        folder = os.path.join(self.directory, "check")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{case.replace(':', '-')}.{self.impl.NAME}.npz")
        np.savez(path, **{k: np.asarray(v) for k, v in result.items()})
        return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("framework", choices=("ours", "torch", "numpy"))
    parser.add_argument("directory")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    replies = os.fdopen(os.dup(1), "w")  # the protocol's channel; anything else printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message):
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    if args.threads:  # BLAS and OpenMP read these when they load: before any framework is imported
        for name in THREAD_VARIABLES:
            os.environ[name] = str(args.threads)
    try:
        impl = __import__(f"impl_{args.framework}")
        if args.threads:
            impl.set_threads(args.threads)
        reply({"ready": impl.info()})
    except ImportError as e:
        reply({"error": f"cannot import {args.framework}: {e}", "missing": True})
        return 1
    server = Server(impl, args.directory)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        try:
            reply(server.handle(request))
        except Exception:
            reply({"error": traceback.format_exc()})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        sys.exit(130)
