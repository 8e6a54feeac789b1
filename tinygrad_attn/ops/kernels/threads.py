"""`parallel_for`: run a kernel over ranges of its rows on a few threads.

Every kernel is a serial Numba function compiled with `nogil=True` whose
last two arguments are a range of items (rows, matrices, blocks) to do:
`kernel(*args, start, stop)`. `parallel_for` cuts [0, n) into ranges of
at least `min_items` (callers size them at ~100 us of work), at most four
per thread, and lets the calling thread and the workers take them in turn.
Why not Numba's own `prange`, measured on a 2-core machine:

- compile time: a `parallel=True` kernel compiles 2-3x slower than the same
  serial kernel (attention forward: 7 s against 2.7 s cold), and the first
  training step of a fresh install waits for every kernel it uses;
- no spinning: idle workers block on a queue, so they never take a core
  from OpenBLAS, the pitfall of Numba's default OpenMP layer (a LayerNorm
  kernel alternating with a matmul ran 7x slower);
- a worker that wakes late costs nothing, the other threads take its
  ranges; small inputs run on the calling thread without waking anyone.

Each item is computed by one thread in a fixed order, so results are
bit-identical whatever the number of threads.
"""
import os
import queue
import threading

import numba

_TASKS_PER_THREAD = 4
_num_threads = max(1, int(numba.config.NUMBA_NUM_THREADS))
_queue = queue.SimpleQueue()
_workers = []
_workers_lock = threading.Lock()


def get_num_threads():
    return _num_threads


def set_num_threads(n):
    """Use up to n threads (the calling one included) for kernels."""
    global _num_threads
    if n < 1:
        raise ValueError(f"set_num_threads: need at least one thread, got {n}")
    _num_threads = int(n)


class _Job:
    """One parallel_for call: its ranges, and a count of those not yet done."""

    def __init__(self, kernel, args, bounds):
        self.kernel, self.args, self.bounds = kernel, args, bounds
        self.next_range = iter(range(len(bounds) - 1))  # next() is atomic under the GIL
        self.remaining = len(bounds) - 1
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.error = None

    def work(self):
        for t in self.next_range:
            try:
                self.kernel(*self.args, self.bounds[t], self.bounds[t + 1])
            except BaseException as e:  # re-raised in the calling thread
                self.error = self.error or e
            with self.lock:
                self.remaining -= 1
                if self.remaining == 0:
                    self.done.set()


def _worker_loop():
    while True:
        _queue.get().work()


def _ensure_workers(n):
    with _workers_lock:
        while len(_workers) < n:
            t = threading.Thread(target=_worker_loop, name=f"tinygrad_attn-kernel-{len(_workers)}",
                                 daemon=True)
            t.start()
            _workers.append(t)


def _forget_workers_after_fork():
    # A forked child has only the forking thread: start afresh.
    global _queue, _workers_lock
    _queue = queue.SimpleQueue()
    _workers.clear()
    _workers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


def parallel_for(kernel, n_items, *args, min_items=1):
    """Run kernel(*args, start, stop) over ranges covering [0, n_items).

    Ranges have at least `min_items` items (a kernel's unit of work is
    sized so that one range is worth a thread wake-up, ~30 us).
    """
    n_ranges = min(_num_threads * _TASKS_PER_THREAD, n_items // max(1, min_items))
    if n_ranges <= 1 or _num_threads == 1:
        kernel(*args, 0, n_items)
        return
    bounds = [n_items * t // n_ranges for t in range(n_ranges + 1)]
    job = _Job(kernel, args, bounds)
    helpers = min(_num_threads, n_ranges) - 1
    _ensure_workers(helpers)
    for _ in range(helpers):
        _queue.put(job)
    job.work()
    job.done.wait()
    if job.error is not None:
        raise job.error
