"""docs/backprop_through_attention.md, section 14 "Stepping through the code":
with NUMBA_DISABLE_JIT=1 the kernels run as plain Python (so a debugger can
stop in them) and give the compiled kernels' results; `reference_ops()`
puts every primitive op in the graph.

The child processes get NUMBA_DISABLE_JIT=1 in their environment; this
process keeps the compiled kernels, and is the negative control: traced in
the same way, it enters no kernel loop.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

import tinygrad_attn as tg
import tinygrad_attn.functional as F
from tinygrad_attn import kernels, warmup

from .nn_helpers import ops_in_graph

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "backprop_through_attention.md"
LOOPS = {getattr(k, "py_func", k).__name__ for k in kernels.KERNELS}  # the loops, by name (plain functions without JIT)


def compute():
    """Forward and backward of kernel-backed ops on small float64 inputs, traced:
    (gradients and outputs by name, names of the kernel loops entered as Python frames)."""
    entered = set()

    def trace(frame, event, arg):
        if event == "call" and frame.f_code.co_name in LOOPS:
            entered.add(frame.f_code.co_name)

    rng = np.random.default_rng(0)
    q, k, v = (tg.Tensor(rng.normal(size=(2, 2, 4, 3)), requires_grad=True) for _ in range(3))
    x = tg.Tensor(rng.normal(size=(4, 5)), requires_grad=True)
    w = tg.Tensor(rng.normal(size=(5, 5)), requires_grad=True)
    sys.settrace(trace)
    try:
        tg.manual_seed(0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.25)
        h = F.gelu(F.layer_norm(F.linear(x, w), 5))
        y = F.softmax(F.dropout(h, 0.25), dim=-1)
        loss = (o * o).sum() + (y * y).sum() + F.cross_entropy(h, np.array([1, 0, 4, 2]))
        loss.backward()
    finally:
        sys.settrace(None)
    results = {"o": o.data, "y": y.data, "loss": loss.data}
    results.update({f"grad_{n}": t.grad.data for n, t in (("q", q), ("k", k), ("v", v), ("x", x), ("w", w))})
    return results, entered


CHILD = """
import sys
import numpy as np
from numba.core import config
import tinygrad_attn as tg
from tests.test_doc_stepping import compute
assert config.DISABLE_JIT
tg.set_num_threads(1)
results, entered = compute()
np.savez(sys.argv[1], entered=np.array(sorted(entered)), **results)
"""


def _env():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", TINYGRAD_ATTN_PRECOMPILE="0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_with_numba_disable_jit_the_kernels_run_as_python_and_agree_with_the_compiled_ones(tmp_path):
    out = tmp_path / "nojit.npz"
    subprocess.run([sys.executable, "-c", CHILD, str(out)], cwd=ROOT, env=_env(), check=True, timeout=120)
    child = np.load(out)
    expected = {getattr(k, "py_func", k).__name__ for k, _ in warmup.signatures_of(compute)}  # the loops it calls
    assert len(expected) >= 12 and set(child["entered"]) >= expected  # each loop ran as a Python function
    jitted, entered_here = compute()
    assert not entered_here & LOOPS                    # compiled: no Python frame to stop in
    for name, value in jitted.items():
        np.testing.assert_allclose(child[name], value, rtol=1e-10, atol=1e-12, err_msg=name)


def _doc_snippet():
    """The step.py script of section 14."""
    section = DOC.read_text().split("## 14.")[1]
    return re.search(r"```python\n(# step\.py\n.*?)```", section, re.S).group(1)


def test_pdb_stops_inside_a_kernel_as_the_document_says(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(_doc_snippet())
    kernel = ROOT / "tinygrad_attn" / "kernels" / "layer_norm.py"
    line = next(i for i, text in enumerate(kernel.read_text().splitlines(), 1) if "dr[j] = rs *" in text)
    commands = f"b {kernel}:{line}\nc\np 'row', r, 'column', j\nwhere\nclear\ny\nc\n"
    run = subprocess.run([sys.executable, "-m", "pdb", str(script)], input=commands, capture_output=True,
                         text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert f"layer_norm.py({line})_layer_norm_backward()" in run.stdout, run.stdout[-2000:] + run.stderr
    assert "('row', 0, 'column', 0)" in run.stdout
    assert "ops/layer_norm.py" in run.stdout                 # `where`: the way down through LayerNormOp.backward
    assert "tensor([[" in run.stdout.split("column', 0)")[-1]   # then the script ran on to its print


def test_the_document_names_the_debugging_switches():
    text = DOC.read_text()
    assert "NUMBA_DISABLE_JIT=1" in text and "with tinygrad_attn.reference_ops():" in text


def test_reference_ops_puts_every_primitive_op_in_the_graph():
    x = tg.Tensor(np.random.default_rng(1).normal(size=(3, 4)), requires_grad=True)
    w = tg.Tensor(np.random.default_rng(2).normal(size=(5, 4)), requires_grad=True)

    fused = F.cross_entropy(F.layer_norm(F.linear(x, w), 5), np.array([0, 4, 2]))
    with tg.reference_ops():
        loss = F.cross_entropy(F.layer_norm(F.linear(x, w), 5), np.array([0, 4, 2]))
    assert {"CrossEntropy", "LayerNormOp", "LinearOp"} <= ops_in_graph(fused)
    ops = ops_in_graph(loss)
    assert {"MatMul", "Mean", "Sqrt", "Exp", "Log"} <= ops and not ops & {"CrossEntropy", "LayerNormOp", "LinearOp"}
    loss.backward()
    np.testing.assert_allclose(loss.item(), fused.item(), rtol=1e-12)
