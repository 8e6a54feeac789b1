"""examples/gradient_flow.py: post-norm, pre-norm and no-residual stacks, the
residual path alone, hooks on the residual stream, viz.grad_norms naming every
parameter, detect_anomaly naming the op."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[1] / "examples" / "gradient_flow.py"


def load():
    spec = importlib.util.spec_from_file_location("gradient_flow", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load()


@pytest.fixture(scope="module")
def run(example):
    import contextlib
    import io
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        stacks, paths = example.main()
    return stacks, paths, buffer.getvalue()


def test_every_stack_gets_the_same_gradient_at_the_top(run):
    stacks, _, _ = run
    tops = [r["top"] for r in stacks.values()]
    assert all(np.array_equal(t, tops[0]) for t in tops)
    for r in stacks.values():
        assert len(r["entering"]) == 6 and all(np.isfinite(n) and n > 0 for n in r["entering"])
        assert r["entering"][0] == pytest.approx(r["bottom_norm"], rel=1e-6)  # the hook at layer 0 sees dL/dx


def test_the_no_residual_stacks_bottom_norm_is_the_smallest(run):
    stacks, _, _ = run
    bottoms = {name: r["bottom_norm"] for name, r in stacks.items()}
    residual = min(bottoms["post-norm"], bottoms["pre-norm"])
    assert bottoms["post-norm, no residual"] < residual / 1.5
    assert bottoms["pre-norm, no residual"] < residual / 5
    assert min(bottoms, key=bottoms.get) == "pre-norm, no residual"


def test_the_residual_keeps_the_direction_and_without_it_it_is_lost(run):
    stacks, _, _ = run
    assert stacks["post-norm"]["cos"] > 0.5 and stacks["pre-norm"]["cos"] > 0.5
    assert abs(stacks["post-norm, no residual"]["cos"]) < 0.2
    assert abs(stacks["pre-norm, no residual"]["cos"]) < 0.2


def test_along_the_residual_path_pre_norm_passes_the_gradient_unchanged_and_post_norm_does_not(run):
    _, paths, out = run
    pre, post = paths["pre-norm"], paths["post-norm"]
    np.testing.assert_array_equal(pre["bottom"], pre["top"])
    # post-norm: 12 LayerNorm Jacobians on the way: shorter and turned
    assert post["bottom_norm"] < 0.95 * post["top_norm"] and post["cos"] < 0.99
    assert "12 LayerNorm Jacobians" in out


def test_block_written_out_is_the_layer_forward(example):
    import tinygrad_attn as tg
    from tinygrad_attn import nn
    for norm_first in (False, True):
        tg.manual_seed(0)
        layer = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True,
                                           norm_first=norm_first)
        x = tg.randn(2, 3, 8)
        np.testing.assert_allclose(example.block(layer, x).data, layer(x).data, rtol=0, atol=1e-6)


def test_grad_norms_and_detect_anomaly(run):
    stacks, _, out = run
    params = stacks["pre-norm"]["params"]
    assert "0.self_attn.in_proj_weight" in params and len(params) == 6 * 12
    assert "AnomalyError: Log (forward) produced Inf" in out
    assert "post-norm, no residual" in out and "cos(bottom, top)" in out


def test_hook_sees_the_gradient_that_retain_grad_keeps():
    import tinygrad_attn as tg
    from tinygrad_attn import nn
    tg.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, nhead=2, dim_feedforward=16, dropout=0.0)
    h = layer(tg.randn(1, 3, 8, requires_grad=True))
    h.retain_grad()
    seen = []
    h.register_hook(lambda g: seen.append(g.data.copy()))
    (h * tg.randn(1, 3, 8)).sum().backward()
    assert np.array_equal(seen[0], h.grad.data)
