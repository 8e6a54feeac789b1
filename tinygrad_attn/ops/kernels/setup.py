"""Where Numba caches our compiled kernels, and how processes share the cache.

Compiling a kernel costs ~0.3-1 s, loading it from the on-disk cache a few
ms, so every kernel uses `cache=True`. Numba caches next to the source
(`__pycache__`); when the package directory is read-only (a system-wide
install, a container) and the user has not chosen a directory with
NUMBA_CACHE_DIR, we point `numba.config.CACHE_DIR` at a writable per-user
directory. This must run before the kernels are defined.

Several processes may compile into one cache at once (precompile.py starts
one on purpose; parallel test workers or training runs do it too). Numba
keeps one index file per kernel, mapping each compiled signature to a data
file, and updates it by read-modify-write: two processes saving two
signatures of one kernel at the same moment can lose an entry, or pair one
signature with the other's code, and a lookup between a save's index and
data writes can read stale code. `share_cache` guards each kernel's cache
with a file lock: loads take it shared, saves exclusive (both for
milliseconds; compiling happens outside it).

(Threads are ours, not Numba's: see `threads.py`.)
"""
import contextlib
import os
import tempfile
import time

from numba.core.caching import FunctionCache

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so no sharing (see precompile.py)
    fcntl = None


def _is_writable(directory):
    """True if a file can be created in `directory` (creating it if needed).

    Tried rather than checked with os.access, which says yes to root on a
    read-only file system."""
    try:
        os.makedirs(directory, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
        return True
    except OSError:
        return False


def choose_cache_dir(kernel_dir):
    """Where Numba should cache our kernels: None for its default (the
    kernels' own `__pycache__`, when writable), otherwise the first writable
    of ~/.cache/tinygrad_attn/numba and a per-user temporary directory."""
    if _is_writable(os.path.join(kernel_dir, "__pycache__")):
        return None
    candidates = [os.path.join(os.path.expanduser("~"), ".cache", "tinygrad_attn", "numba"),
                  os.path.join(tempfile.gettempdir(), f"tinygrad_attn-numba-{os.getuid()}")]
    for directory in candidates:
        if _is_writable(directory):
            return directory
    return None  # nothing writable: Numba will compile in memory (and warn)


def configure_cache(kernel_dir):
    """Set numba.config.CACHE_DIR if our package directory is read-only."""
    import numba
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # the user's choice wins
    directory = choose_cache_dir(kernel_dir)
    if directory is not None:
        numba.config.CACHE_DIR = directory


@contextlib.contextmanager
def file_lock(path, exclusive, timeout=None):
    """Hold an advisory lock on `path` (created if needed) while inside.
    Yields True once it holds it, or False if `timeout` seconds passed first.
    Without fcntl, or if the file cannot be created, yields True without
    locking. The operating system drops the lock if the process dies."""
    fd = None
    if fcntl is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            pass
    try:
        locked = True
        if fd is not None:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, mode | (fcntl.LOCK_NB if deadline is not None else 0))
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        locked = False
                        break
                    time.sleep(0.001)
        yield locked
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


class SharedCache(FunctionCache):
    """Numba's on-disk cache of one kernel, with the lock described above.

    Nobody waits long for it: the background compile of precompile.py runs
    at the lowest priority, and could be preempted while it holds the lock.
    After 50 ms a lookup counts as a miss (the kernel gets compiled) and a
    save is skipped (the kernel stays out of the cache)."""

    WAIT = 0.05

    def __init__(self, py_func):
        super().__init__(py_func)
        self.lock = os.path.join(self.cache_path, f"{py_func.__module__}.{py_func.__qualname__}.lock")

    def load_overload(self, sig, target_context):
        with file_lock(self.lock, exclusive=False, timeout=self.WAIT) as locked:
            return super().load_overload(sig, target_context) if locked else None

    def save_overload(self, sig, data):
        with file_lock(self.lock, exclusive=True, timeout=self.WAIT) as locked:
            if locked:
                super().save_overload(sig, data)


def share_cache(kernel):
    """Give `kernel` a SharedCache; False if it cannot be shared safely (no
    fcntl, or a Numba whose dispatchers keep their cache differently)."""
    # `_cache` is where a Numba dispatcher keeps its cache (a FunctionCache with cache=True).
    if fcntl is None or type(getattr(kernel, "_cache", None)) is not FunctionCache:
        return False
    kernel._cache = SharedCache(kernel.py_func)
    return True
