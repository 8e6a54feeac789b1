"""Compile the kernels of a training step in a second process, on a cold cache.

The first run after installing tinygrad_attn (or after editing a kernel)
compiles each kernel it uses, 0.3-1.3 s apiece, one after the other:
Numba's compiler holds a global lock, so threads cannot share the work.
Another process can. When the kernels of a float32 Transformer training
step are not in the cache yet, importing tinygrad_attn starts, in the
background, a process (`main` below) that

1. runs a tiny training step as a dry run (`threads.dry_run`): no kernel
   runs, but we learn which kernels a step calls and with which argument
   types, in order of first call;
2. compiles them in the reverse order, into the same cache: the program
   that started it needs the first ones first, so the two meet in the
   middle and each compiles about half;
3. leaves a marker file (named after the kernels' sources and the Numba,
   Python and machine versions), so later imports start nothing.

The two processes share the cache safely (setup.py). The background one
runs at the lowest priority (nice 19): on an idle second core it works at
full speed, but it never takes CPU time the program could use. Neither
waits for the other: if both reach the same kernel, both compile it.

It starts only on a machine with at least two cores, only one at a time
(the process inherits a lock and holds it until it exits), and not at all
with TINYGRAD_ATTN_PRECOMPILE=0. It prints nothing; if it fails, the
program compiles what it needs itself, as it would without it.
"""
import glob
import hashlib
import os
import platform
import subprocess
import sys
import warnings

import numba

from . import setup, threads

_process = None  # the background process this one started, if any


def _state_key():
    """Names what a cache full of our kernels depends on: the source code of
    the kernels and of the ops calling them, and the versions."""
    digest = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    ops = os.path.dirname(here)
    for path in sorted(glob.glob(os.path.join(here, "*.py")) + glob.glob(os.path.join(ops, "*.py"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(f"{numba.__version__} {sys.version} {platform.machine()}".encode())
    return digest.hexdigest()[:20]


def _usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def start_if_cold(kernels):
    """Start the background compile unless the cache of `kernels` (all in one
    directory, each with a setup.SharedCache) has a float32 training step's."""
    global _process
    if os.environ.get("TINYGRAD_ATTN_PRECOMPILE", "1") == "0" or _usable_cores() < 2 or setup.fcntl is None \
            or not all(isinstance(k._cache, setup.SharedCache) for k in kernels):
        return
    cache_dir = kernels[0].stats.cache_path
    marker = os.path.join(cache_dir, f"tinygrad_attn-precompiled-{_state_key()}")
    if os.path.exists(marker):
        return
    try:  # one background compile at a time: it inherits this lock and holds it until it exits
        os.makedirs(cache_dir, exist_ok=True)
        lock = os.open(os.path.join(cache_dir, "tinygrad_attn-precompile.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return
    try:
        setup.fcntl.flock(lock, setup.fcntl.LOCK_EX | setup.fcntl.LOCK_NB)
    except OSError:  # another process is already compiling
        os.close(lock)
        return
    # The child imports this package from the same place, with the same Numba cache.
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = dict(os.environ, TINYGRAD_ATTN_PRECOMPILE="0",  # and it starts no other
               PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))
    if numba.config.CACHE_DIR:  # set by setup.configure_cache or by the user: the same cache
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    code = f"import os; os.nice(19); from tinygrad_attn.ops.kernels import precompile; precompile.main({marker!r})"
    try:
        _process = subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=(lock,),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        pass
    finally:
        os.close(lock)  # the child's copy keeps it locked


def wait():
    """Wait for the background compile this process started, if any (the benchmarks use it)."""
    if _process is not None:
        _process.wait()


def training_step():
    """A tiny float32 training step: an encoder-decoder Transformer with
    padding and causal masks and dropout, and a cross-entropy loss. It calls
    every kernel a Transformer step calls, with the argument types a step of
    any size gives them. GELU (the GPT model's activation) comes first: the
    background compiles it last, after the kernels every model needs."""
    import numpy as np

    import tinygrad_attn as tg
    from tinygrad_attn import functional as F
    from tinygrad_attn import nn
    model = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=16, dropout=0.1, batch_first=True)
    head = nn.Linear(8, 5)
    F.gelu(tg.randn(3, requires_grad=True)).sum().backward()
    src, tgt = tg.randn(2, 3, 8), tg.randn(2, 4, 8)
    padding = np.array([[False, False, True], [False, False, False]])
    out = model(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4),
                src_key_padding_mask=padding, memory_key_padding_mask=padding)
    loss = F.cross_entropy(head(out).reshape(-1, 5), np.arange(8) % 5, label_smoothing=0.1)
    loss.backward()


def main(marker):
    """The background process: learn what a step compiles, compile it last first, leave the marker."""
    import numpy as np
    with threads.dry_run() as calls, np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dry run computes on uninitialised arrays
        training_step()
    for kernel, arg_types in reversed(calls):
        kernel.compile(arg_types)  # loads it instead if the program compiled it first
    with open(marker, "w"):
        pass
