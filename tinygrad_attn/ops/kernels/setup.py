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
signature with the other's code. `share_cache` guards each kernel's cache
with a file lock: loads take it shared, saves exclusive (both for
milliseconds). A second lock, "busy", is held by precompile.py while it
compiles a kernel; a process about to look a kernel up first waits for it,
then loads the result instead of compiling the same kernel a second time.

(Threads are ours, not Numba's: see `threads.py`.)
"""
import contextlib
import os
import tempfile

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
def file_lock(path, exclusive):
    """Hold an advisory lock on `path` (created if needed) while inside;
    blocks until it is free. Without fcntl, or if the file cannot be
    created, does nothing. The operating system drops it if the process dies."""
    fd = None
    if fcntl is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            pass
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing releases the lock


class SharedCache(FunctionCache):
    """Numba's on-disk cache of one kernel, with the locks described above."""

    def __init__(self, py_func):
        super().__init__(py_func)
        base = os.path.join(self.cache_path, f"{py_func.__module__}.{py_func.__qualname__}")
        self.index_lock, self.busy_lock = base + ".lock", base + ".busy"
        self.busy_here = False

    @contextlib.contextmanager
    def busy(self):
        """Hold the busy lock while inside: others wanting this kernel wait for us."""
        with file_lock(self.busy_lock, exclusive=True):
            self.busy_here = True
            try:
                yield
            finally:
                self.busy_here = False

    def load_overload(self, sig, target_context):
        if not self.busy_here:
            with file_lock(self.busy_lock, exclusive=False):
                pass  # another process is compiling this kernel: wait, then load its result
        with file_lock(self.index_lock, exclusive=False):
            return super().load_overload(sig, target_context)

    def save_overload(self, sig, data):
        with file_lock(self.index_lock, exclusive=True):
            super().save_overload(sig, data)


def share_cache(kernel):
    """Give `kernel` a SharedCache; False if it cannot be shared safely (no
    fcntl, or a Numba whose dispatchers keep their cache differently)."""
    # `_cache` is where a Numba dispatcher keeps its cache (a FunctionCache with cache=True).
    if fcntl is None or type(getattr(kernel, "_cache", None)) is not FunctionCache:
        return False
    kernel._cache = SharedCache(kernel.py_func)
    return True
