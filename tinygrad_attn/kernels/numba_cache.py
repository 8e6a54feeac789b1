"""Where Numba caches our compiled kernels.

Compiling a kernel costs ~0.3-2 s, loading it from the on-disk cache a
few ms, so every kernel uses `cache=True`. Numba caches next to the source
(`__pycache__`); when the package directory is read-only (a system-wide
install, a container) and the user has not chosen a directory with
NUMBA_CACHE_DIR, `configure_cache` points `numba.config.CACHE_DIR` at a
writable per-user directory. It must run before the kernels are defined;
it is the one piece of global state importing tinygrad_attn sets.
"""
import os
import tempfile


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
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    candidates = [os.path.join(os.path.expanduser("~"), ".cache", "tinygrad_attn", "numba"),
                  os.path.join(tempfile.gettempdir(), f"tinygrad_attn-numba-{user}")]
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
