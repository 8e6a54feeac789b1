"""Ctrl-C and SIGTERM during training: a checkpoint, never half an update.

`Trainer.fit` runs inside `sigterm_as_interrupt()`, so SIGTERM (what `kill`,
schedulers and containers send) raises `Terminated`, a KeyboardInterrupt,
and saves like Ctrl-C. The optimizer update and its bookkeeping run inside
`interrupts_deferred()`: a signal arriving then waits for the block to end,
so the checkpoint written on the way out holds a whole step. Outside the
main thread Python cannot catch signals, and both blocks run as they are.
"""
import signal
import threading
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM, received during `Trainer.fit`: handled like Ctrl-C."""


def _in_main_thread():
    return threading.current_thread() is threading.main_thread()


@contextmanager
def interrupts_deferred():
    """Hold back Ctrl-C (SIGINT) and SIGTERM until the block ends, so that an
    optimizer update is never left half applied; then act on the first one
    received as its handler would have (in the main thread; elsewhere
    signals cannot be caught and the block runs as is)."""
    if not _in_main_thread():
        yield
        return
    received = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum))
                for signum in _SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if received:
            signum = received[0]
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)  # Python's SIGINT handler raises KeyboardInterrupt
            elif handler in (signal.SIG_DFL, None):
                if signum == signal.SIGINT:
                    raise KeyboardInterrupt
                signal.raise_signal(signum)  # SIGTERM's default: the process ends


def _raise_terminated(signum, frame):
    raise Terminated("SIGTERM")


@contextmanager
def sigterm_as_interrupt():
    """Within the block SIGTERM (what `kill`, schedulers and containers send)
    raises `Terminated`, a KeyboardInterrupt, so it saves like Ctrl-C."""
    if not _in_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
