"""The one threading policy of tinygrad_attn: `parallel_for` and the thread count.

Every kernel is a serial Numba function compiled with `nogil=True` whose
last two arguments are a range of items (rows, matrices, blocks) to do:
`kernel(*args, start, stop)`. `parallel_for(kernel, n_items, *args,
item_size=...)` cuts [0, n_items) into ranges and lets the calling thread
and a few workers take them in turn. The rule, the same for every kernel:

- a range holds at least GRAIN elements of work (`item_size` says how
  many one item is: a row's length, a matrix's multiply-adds / 32), so
  small inputs run on the calling thread without waking anyone;
- at most four ranges per thread, so a thread that starts late (another
  process had its core) leaves its share to the others instead of making
  them wait: the work flows to whichever cores are free;
- more ranges than threads come in a multiple of the threads (3 ranges
  on 2 threads would leave one idle for a third of the job);
- idle workers sleep on a queue; nothing spins, so nothing competes with
  the computing threads or other programs for a core.

BLAS is part of the policy. The kernels that multiply (matmul, attention)
call BLAS on one thread from each of our threads, and cut large products
into blocks themselves: BLAS's own pool would split a product statically
and wait at a barrier for its slowest thread (on a machine whose other core
is busy, a scheduler tick per product), and its idle threads spin for a
while after each call, taking the cores our kernels need next. Where the
library can set its thread count for one thread (OpenBLAS >= 0.3.27, MKL),
only our threads are set so, and numpy code elsewhere in the process keeps
BLAS's own threads; otherwise the process-wide count is lowered during each
job. `set_num_threads(n)` sets both our pool and BLAS's.

Each item is computed by one thread in a fixed order, so results are
bit-identical whatever the number of threads.

Why not Numba's `prange`: a `parallel=True` kernel compiles 2-3x slower
(cold start counts), and its OpenMP or TBB workers spin between loops,
taking the cores that BLAS and other work need.
"""
import contextlib
import itertools
import os
import queue
import threading

GRAIN = 1 << 16  # elements of work in a range: ~20-80 us for the kernels here
_RANGES_PER_THREAD = 4

_num_threads = None  # None: as many as this process may use (set_num_threads)
_queue = queue.SimpleQueue()
_workers = []
_workers_lock = threading.Lock()
_dry_run_calls = None  # a dict while `dry_run()` is active


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_default_threads = None  # the cores this process may use, read once (on the first kernel call)


def get_num_threads():
    """Threads tinygrad_attn computes with (the calling one included)."""
    global _default_threads
    if _num_threads:
        return _num_threads
    if _default_threads is None:
        _default_threads = _usable_cores()
    return _default_threads


def set_num_threads(n):
    """Compute with n threads: our kernels' pool and BLAS (numpy's library,
    through threadpoolctl) both use n. n=None goes back to the defaults: the
    cores this process may use for our pool, and for BLAS the count it had
    before the first set_num_threads call."""
    global _num_threads
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"set_num_threads: need a positive integer (or None), got {n!r}")
    _num_threads = n
    for controller in _blas.controllers():
        original = _blas.original.setdefault(id(controller), controller.get_num_threads())
        controller.set_num_threads(original if n is None else n)


class _BlasThreads:
    """Runs BLAS single-threaded on our threads while our jobs run (module docstring).

    Where the library can set its thread count for one calling thread
    (OpenBLAS >= 0.3.27: openblas_set_num_threads_local; MKL:
    mkl_set_num_threads_local), a job sets it on the calling thread and puts
    it back after, and each worker sets it once: no other thread of the
    process is affected. Otherwise the process-wide count is lowered for the
    duration of the job (jobs may overlap when kernels are called from several
    Python threads: set when the first starts, restored when the last ends)."""

    LOCAL_SETTERS = ("openblas_set_num_threads_local", "mkl_set_num_threads_local")

    def __init__(self):
        self.lock = threading.Lock()
        self.active = 0
        self.saved = {}
        self.original = {}  # each library's thread count before set_num_threads first changed it
        self._controllers = None
        self._local = None
        self.generation = 0  # how many times the libraries were listed again (library_loaded)

    def controllers(self):
        """threadpoolctl's controllers of the BLAS libraries loaded (none without threadpoolctl)."""
        if self._controllers is None:
            try:
                import threadpoolctl
                self._controllers = threadpoolctl.ThreadpoolController().select(user_api="blas").lib_controllers
            except Exception:  # no threadpoolctl, or a library it cannot handle: leave BLAS alone
                self._controllers = []
        return self._controllers

    def local_setters(self):
        """The per-thread setters, one per library, or None unless every library has one."""
        if self._local is None:
            import ctypes
            setters = []
            for controller in self.controllers():
                fn = next((getattr(controller.dynlib, name) for name in self.LOCAL_SETTERS
                           if hasattr(controller.dynlib, name)), None)
                if fn is None:
                    setters = None
                    break
                # called holding the GIL (PYFUNCTYPE): the setter is a few instructions, and
                # releasing the GIL around it would let a waking worker take it first
                address = ctypes.cast(fn, ctypes.c_void_p).value
                setters.append(ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int)(address))
            self._local = setters if setters else False
        return self._local or None

    def library_loaded(self):
        """A BLAS library was loaded after the list above was made (blas.py's
        fallback loads scipy's): list the libraries again, and give the new
        ones the count set_num_threads asked for."""
        known = {id(c.dynlib) for c in self._controllers or ()}
        self._controllers, self._local = None, None
        self.generation += 1  # each worker sets BLAS to one thread again before its next job
        if _num_threads is not None:
            for controller in self.controllers():
                if id(controller.dynlib) not in known:
                    self.original.setdefault(id(controller), controller.get_num_threads())
                    controller.set_num_threads(_num_threads)

    def on_worker(self):
        """A worker thread of ours: BLAS single-threaded on it for good."""
        for fn in self.local_setters() or ():
            fn(1)

    def enter(self):
        """BLAS single-threaded on the calling thread until exit(token)."""
        local = self.local_setters()
        if local is not None:
            return [fn(1) for fn in local]
        with self.lock:
            self.active += 1
            if self.active == 1:
                for c in self.controllers():
                    self.saved[id(c)] = c.get_num_threads()
                    if self.saved[id(c)] != 1:
                        c.set_num_threads(1)
        return None

    def exit(self, token):
        local = self.local_setters()
        if local is not None:
            for fn, n in zip(local, token):
                fn(n)
            return
        with self.lock:
            self.active -= 1
            if self.active == 0:
                for c in self.controllers():
                    if self.saved[id(c)] != 1:
                        c.set_num_threads(self.saved[id(c)])


_blas = _BlasThreads()


class _Job:
    """One parallel_for call: its ranges, and a count of those done.

    next() on an iterator is atomic under the GIL, so taking a range and
    counting a finished one need no lock of their own; `done` is a lock
    held from the start and released by whichever thread finishes the last
    range (lighter than an Event, and released exactly once)."""

    def __init__(self, kernel, args, bounds):
        self.kernel, self.args, self.bounds = kernel, args, bounds
        self.n_ranges = len(bounds) - 1
        self.next_range = iter(range(self.n_ranges))
        self.finished = itertools.count(1)
        self.done = threading.Lock()
        self.done.acquire()
        self.error = None

    def work(self):
        for t in self.next_range:
            try:
                self.kernel(*self.args, self.bounds[t], self.bounds[t + 1])
            except BaseException as e:  # re-raised in the calling thread
                self.error = self.error or e
            if next(self.finished) == self.n_ranges:
                self.done.release()


def blas_library_loaded():
    """Call after loading a BLAS library: its threads follow the policy too."""
    _blas.library_loaded()


def _worker_loop():
    generation = None
    while True:
        job = _queue.get()
        if generation != _blas.generation:  # first job, or a BLAS library loaded since
            generation = _blas.generation
            _blas.on_worker()
        job.work()


def _ensure_workers(n):
    if len(_workers) >= n:  # the usual case: no lock needed to see it
        return
    with _workers_lock:
        while len(_workers) < n:
            t = threading.Thread(target=_worker_loop, name=f"tinygrad_attn-kernel-{len(_workers)}",
                                 daemon=True)
            t.start()
            _workers.append(t)


def _forget_workers_after_fork():
    # A forked child has only the forking thread: start afresh.
    global _queue, _workers_lock, _blas
    _queue = queue.SimpleQueue()
    _workers.clear()
    _workers_lock = threading.Lock()
    _blas = _BlasThreads()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers_after_fork)


def parallel_for(kernel, n_items, *args, item_size=1, blas=False):
    """Run kernel(*args, start, stop) over ranges covering [0, n_items).

    item_size: the elements of work one item is (the module docstring);
    blas: the kernel calls BLAS, which must then run single-threaded on the
    calling thread too (the workers always have it so).
    """
    if _dry_run_calls is not None:
        _dry_run_calls.setdefault((kernel, tuple(kernel.typeof_pyval(a) for a in args + (0, n_items))))
        return
    threads = get_num_threads()
    n_ranges = min(threads * _RANGES_PER_THREAD, n_items, n_items * item_size // GRAIN)
    if n_ranges > threads:  # a multiple of the threads: 3 ranges on 2 threads would idle one for a third
        n_ranges -= n_ranges % threads
    token = _blas.enter() if blas else None
    try:
        if n_ranges <= 1 or threads == 1:
            kernel(*args, 0, n_items)
            return
        bounds = [n_items * t // n_ranges for t in range(n_ranges + 1)]
        job = _Job(kernel, args, bounds)
        helpers = min(threads, n_ranges) - 1
        _ensure_workers(helpers)
        for _ in range(helpers):
            _queue.put(job)
        job.work()
        job.done.acquire()
    finally:
        if blas:
            _blas.exit(token)
    if job.error is not None:
        raise job.error


@contextlib.contextmanager
def dry_run():
    """Inside, `parallel_for` runs nothing: it notes which kernel would run with
    which Numba argument types. Yields a list of (kernel, argument types),
    first calls first, each once; it is filled when the block ends. Outputs
    stay uninitialised (tinygrad_attn/warmup.py uses this to learn what a step compiles)."""
    global _dry_run_calls
    _dry_run_calls, calls = {}, []
    try:
        yield calls
    finally:
        calls.extend(_dry_run_calls)
        _dry_run_calls = None
