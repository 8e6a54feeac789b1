"""The small examples run and show what the docs say they show."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name):
    """Import an example as a real module (registered under its name), as
    Numba's on-disk cache needs to find a kernel's module again."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def test_custom_op_example_passes_gradcheck_and_catches_a_wrong_backward(capsys):
    example = load("custom_op")
    assert example.main() is False  # the deliberately wrong backward fails gradcheck
    out = capsys.readouterr().out
    assert "gradcheck: True" in out and "gradcheck of a wrong backward: False" in out


def test_rmsnorm_kernel_example():
    example = load("rmsnorm_kernel")
    ok, err, dtype = example.main(verbose=False)
    assert ok and err < 1e-5 and dtype == np.float32


def test_rmsnorm_kernels_compute_float32_in_float32():
    from numba import types

    from .test_kernels import _float64_variables
    example = load("rmsnorm_kernel")
    example.main(verbose=False)  # compiles the float32 signatures
    for kernel in (example.rms_norm_forward, example.rms_norm_backward):
        sig = next(s for s in kernel.signatures if s[0].dtype == types.float32)
        assert _float64_variables(kernel.py_func, sig) == []


def test_rmsnorm_rejects_a_mismatched_weight():
    import tinygrad_attn as tg
    example = load("rmsnorm_kernel")
    with pytest.raises(tg.ShapeError, match=r"rms_norm: .*\(2, 3\).*\(4,\)"):
        example.rms_norm(tg.Tensor(np.ones((2, 3))), tg.Tensor(np.ones(4)))


def test_quickstart_loss_falls(capsys):
    example = load("quickstart")
    final = example.main(steps=150)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step")]
    first = float(lines[0].split()[-1])
    assert final < first / 10



@pytest.mark.parametrize("name", ["attention_walkthrough", "gradient_flow", "backprop_ninja_attention"])
def test_the_learning_examples_answer_help(name, capsys):
    example = load(name)
    with pytest.raises(SystemExit) as exit_:
        example.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--seed" in out
