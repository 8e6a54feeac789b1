"""examples/gradient_flow.py: hooks record the residual-stream gradients,
viz.grad_norms names every parameter, detect_anomaly names the op."""
import importlib.util
from pathlib import Path

import numpy as np

PATH = Path(__file__).resolve().parents[1] / "examples" / "gradient_flow.py"


def load():
    spec = importlib.util.spec_from_file_location("gradient_flow", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gradient_flow_example(capsys):
    example = load()
    norms, params = example.main()
    out = capsys.readouterr().out
    assert len(norms) == 6 and all(np.isfinite(n) and n > 0 for n in norms)
    assert "0.self_attn.in_proj_weight" in params and len(params) == 6 * 12
    assert "AnomalyError: Log (forward) produced Inf" in out


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
