"""Keep freed memory for the next array (glibc only), called once at import.

A training step allocates the same few dozen arrays of a few MB every time
(activations, gradients). glibc's malloc serves blocks that large with
mmap and returns them to the system when freed, so every step faults the
same memory back in page by page, zero-filled: in a VM 2-5 us per 4 KB
page, measured as 40% of a batched matmul's forward+backward on (32, 8,
64, 64). Raising the mmap threshold to its maximum (32 MB) and the trim
threshold keeps freed blocks in the heap for reuse instead; the price is a
process that holds on to its peak memory.

Set TINYGRAD_ATTN_KEEP_MEMORY=0 to leave malloc alone.
"""
import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold=32 << 20, trim_threshold=256 << 20):
    """Tune glibc's malloc as described above; True if it applied."""
    if os.environ.get("TINYGRAD_ATTN_KEEP_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows, musl): nothing to do
        return False
    applied = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    return bool(applied)
