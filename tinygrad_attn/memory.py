"""`keep_freed_memory()`: let a training process reuse its freed memory (glibc).

A training step allocates the same few dozen arrays of one to a few MB every
time (activations, gradients) and frees them by the end of the step. glibc's
malloc serves blocks that large with mmap, or from the top of its heap, and
hands them back to the system when they are freed (munmap, or trimming the
heap above 128 KB-64 MB of free space). The next step then faults the same
memory back in page by page, zero-filled by the kernel: measured here 12,000
faults and 35-45 ms of a 100 ms encoder training step (benchmarks/run.py
--only steps compares the two settings), ~3 us per 4 KB page in a VM.

Raising the mmap threshold to its maximum (32 MB) and the trim threshold to
256 MB keeps freed blocks in the heap for reuse instead. The price: the
process holds on to its peak memory until it exits, and the setting covers
the whole process (every library's mallocs), so it is a choice for the
program, not something a library should make behind its back. Importing
tinygrad_attn never calls it; the `train`, `resume`, `sample` and `decode`
commands do (they are programs); call it at the top of your own training
script for the same effect. There is no undo: glibc's adaptive thresholds
cannot be switched back on.
"""
import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_applied = False


def keep_freed_memory(mmap_threshold=32 << 20, trim_threshold=256 << 20):
    """Keep freed memory in the heap for reuse (see above); True if it applied
    (glibc), False where malloc is another one (macOS, Windows, musl)."""
    global _applied
    if _applied:
        return True
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc: nothing to do
        return False
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold) and mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    return _applied
