"""Compile a training step's kernels ahead of time: `python -m tinygrad_attn warmup`.

Numba compiles a kernel the first time it is called with new argument
types (0.3-2 s each; a Transformer step uses a dozen) and caches it on
disk, so only the first run after installing (or after editing a kernel)
pays. Nothing happens at import; this module is for the programs that
prefer to pay up front and say so:

1. `signatures_of(step)` runs a training step as a dry run
   (`threads.dry_run`: no kernel runs) and lists which kernels it calls with
   which argument types, in the order of first use (`kernel_signatures()`
   does it for every op's `example` call, which together run every kernel;
   the `train` command for its own model's step);
2. `compile_kernels(calls)` compiles them (or loads them from the cache)
   in this process, with a progress line. With `helper=True` (the `train`
   command on a cold cache, on a machine with two cores or more) a second
   process shares the work: Numba's compiler holds a global lock, so
   threads cannot share it, processes can. Both take the next kernel nobody
   has claimed, the biggest first (`_work_order`), so that the last ones
   left are small and neither process waits long for the other. Each
   kernel goes to one process only, claimed by creating a file in a
   private directory, so no two processes ever write the same kernel's
   cache files (no locks on Numba's cache needed); this process then waits
   for the helper and loads its kernels.
3. a marker file in the cache (named after the kernels' sources, the
   Numba, Python and machine versions and a key naming the calls: the
   `train` command uses its settings) records that these calls were
   compiled, so later runs neither dry-run their step nor start a helper.
"""
import contextlib
import glob
import hashlib
import os
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numba
import numpy as np

from .autograd import Function
from .kernels import EXAMPLES, KERNELS, threads


EXAMPLE_SIZE = 64  # elements in the main input of each op's example: tiny, a dry run computes nothing anyway


def ops_with_kernels():
    """The registered ops that run a kernel: those that declare an `example` (autograd.Function)."""
    return [op for op in Function.registry.values() if op.example is not None]


def run_example(op, dtype=np.float32, size=EXAMPLE_SIZE):
    """Forward and backward of op's example (`op.example(dtype, size)`) on
    tensors: (output, input tensors). Floating inputs require grad; the
    gradient from above is a fixed pattern, not ones (softmax's gradient of
    ones is 0)."""
    import tinygrad_attn as tg
    arrays, params = op.example(dtype, size)
    tensors = [tg.Tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = op.apply(*tensors, **params)
    out.backward(np.cos(np.arange(out.data.size)).reshape(out.shape).astype(out.dtype))
    return out, tensors


def kernel_examples(dtype=np.float32):
    """Every kernel in `dtype`, with the argument types a training step of any
    size gives them: each op's example forward and backward, and the examples
    of the code outside the ops that runs kernels (`non_op_examples`)."""
    for op in ops_with_kernels():
        run_example(op, dtype)
    non_op_examples(dtype)


def non_op_examples(dtype=np.float32, size=EXAMPLE_SIZE):
    """Run every `@kernel_example` (kernels/registry.py's EXAMPLES: the
    optimizers' update, clipping's norm), each on throwaway tensors of its
    own; a list of the arrays each computed."""
    return [example(dtype, size) for example in EXAMPLES]


def signatures_of(step):
    """[(kernel, argument types)] that step() calls, first use first, from a dry run
    (no kernel runs; step's results are garbage and must be thrown away)."""
    with threads.dry_run() as calls, np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dry run computes on uninitialised arrays
        step()
    return calls


def kernel_signatures(dtypes=(np.float32,)):
    """[(kernel, argument types)] of `kernel_examples` in each dtype, first use first."""
    return signatures_of(lambda: [kernel_examples(dtype) for dtype in dtypes])


def calls_key(calls):
    """A name for a list of calls (the default key of `compile_kernels`'s marker)."""
    return repr(sorted(f"{kernel.__name__}{signature}" for kernel, signature in calls))


def _state_key(key):
    """Names a cache holding the compiled calls named `key`: the source code of
    the kernels and of the ops calling them, the versions, and the key."""
    digest = hashlib.sha256()
    package = os.path.dirname(os.path.abspath(__file__))
    sources = glob.glob(os.path.join(package, "kernels", "*.py")) + glob.glob(os.path.join(package, "ops", "*.py"))
    for path in sorted(sources):
        with open(path, "rb") as f:
            digest.update(f.read())
    digest.update(f"{numba.__version__} {sys.version} {platform.machine()} {key}".encode())
    return digest.hexdigest()[:20]


def cache_dir():
    """Where Numba keeps the compiled kernels."""
    return KERNELS[0].stats.cache_path


def _marker(key):
    return os.path.join(cache_dir(), f"tinygrad_attn-compiled-{_state_key(key)}")


def is_warm(key):
    """True if `compile_kernels` compiled the calls named `key` (see calls_key) into this cache before."""
    return os.path.exists(_marker(key))


def _by_kernel(calls):
    """[(kernel, [signatures])] in order of first use."""
    grouped = {}
    for kernel, signature in calls:
        grouped.setdefault(kernel, []).append(signature)
    return list(grouped.items())


def _code_size(kernel, seen=None):
    """The bytecode length of a kernel and of the Numba functions it calls
    (compiled into it: `_matmul`'s body is `_product_items`)."""
    py_func = getattr(kernel, "py_func", None)
    seen = set() if seen is None else seen
    if py_func is None or id(py_func) in seen:
        return 0
    seen.add(id(py_func))
    callees = (py_func.__globals__.get(name) for name in py_func.__code__.co_names)
    return len(py_func.__code__.co_code) + sum(_code_size(f, seen) for f in callees if hasattr(f, "py_func"))


def _work_order(calls):
    """[(kernel, [signatures])], the biggest kernel first. Size is the length
    of the kernel's bytecode, a stand-in for its compile time that no machine
    changes: the two attention kernels (the longest, 1.5-2 s each here) go
    first, the one-line loops (0.2 s) last. Ties keep the order of first use."""
    return sorted(_by_kernel(calls), key=lambda item: -_code_size(item[0]))


def _claim(claims, index):
    """Take kernel `index` for this process; False if the other one has it."""
    try:
        os.close(os.open(os.path.join(claims, str(index)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def _start_helper(claims, calls):
    """The helper process, given the calls (pickled in the claims directory)."""
    with open(os.path.join(claims, "calls.pickle"), "wb") as f:
        pickle.dump([(KERNELS.index(kernel), signature) for kernel, signature in calls], f)
    env = dict(os.environ)
    if numba.config.CACHE_DIR:  # chosen by numba_cache.py or the user: the helper must use the same
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, env.get("PYTHONPATH")]))
    # os._exit once done: a normal exit spends ~0.5 s tearing down Numba's and LLVM's
    # objects while the main process waits for it (measured here: 0.42-0.64 s against 0.02 s);
    # the kernels are in the cache by then, each written whole by Numba's compile
    code = f"from tinygrad_attn import warmup; warmup._helper_main({claims!r}); import os; os._exit(0)"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _helper_main(claims):
    """The helper process: compile each kernel of the list the main process has not claimed."""
    with open(os.path.join(claims, "calls.pickle"), "rb") as f:
        kernels = _work_order([(KERNELS[index], signature) for index, signature in pickle.load(f)])
    for index, (kernel, signatures) in enumerate(kernels):
        if _claim(claims, index):
            for signature in signatures:
                kernel.compile(signature)


def compile_kernels(calls, progress=None, helper=False, key=None):
    """Compile (or load from the cache) the kernels of `calls` ([(kernel,
    argument types)], from `signatures_of` or `kernel_signatures`); returns
    the seconds it took. progress(done, total, name) is called before each
    kernel. helper: share the work with a second process when these calls
    were never compiled here and there are two cores (module docstring).
    key names the calls for `is_warm` (default: calls_key(calls))."""
    start = time.perf_counter()
    key = calls_key(calls) if key is None else key
    kernels = _work_order(calls)
    use_helper = helper and len(kernels) > 1 and threads._usable_cores() >= 2 and not is_warm(key)
    claims = tempfile.mkdtemp(prefix="tinygrad_attn-warmup-") if use_helper else None
    process = _start_helper(claims, calls) if use_helper else None
    try:
        for index, (kernel, signatures) in enumerate(kernels):
            if claims is not None and not _claim(claims, index):
                continue  # the helper has this one
            if progress is not None:
                progress(index, len(kernels), kernel.__name__.lstrip("_"))
            for signature in signatures:
                kernel.compile(signature)
        if process is not None:
            process.wait(timeout=300)  # its kernels are in the cache now; the first call loads them
    except subprocess.TimeoutExpired:
        process.kill()  # what it did not compile, the first call here compiles
    finally:
        if claims is not None:
            shutil.rmtree(claims, ignore_errors=True)
    if progress is not None:
        progress(len(kernels), len(kernels), "")
    with contextlib.suppress(OSError):
        open(_marker(key), "w").close()
    return time.perf_counter() - start
