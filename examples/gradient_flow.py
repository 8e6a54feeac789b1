"""Watch the gradient flow back through a stack of Transformer encoder layers.

Three tools, all public API:
- `tensor.register_hook(fn)` sees the gradient of a hidden state as backward
  passes it, here the residual stream between layers;
- `viz.grad_norms(model.named_parameters())` lists every parameter's
  gradient norm after backward;
- `detect_anomaly()` names the op that first produced a NaN or Inf.

It prints the gradient norm of the residual stream entering each layer for
post-norm layers (the paper's Add&Norm, y = LN(x + f(x))) and for pre-norm
layers (y = x + f(LN(x))). In both, the residual connection is an identity
path for the gradient (docs/backprop_through_attention.md, section 8), so it
reaches the bottom layer with its size nearly intact.

    python examples/gradient_flow.py
"""
import numpy as np

import tinygrad_attn as tg
from tinygrad_attn import nn, viz


def stream_gradients(norm_first, layers=6, d_model=32, seed=0):
    """Gradient norm of the residual stream entering each layer, bottom first."""
    tg.manual_seed(seed)
    stack = nn.ModuleList([nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, dropout=0.0,
                                                      batch_first=True, norm_first=norm_first)
                           for _ in range(layers)])
    x = tg.randn(2, 10, d_model, requires_grad=True)  # (batch, T, d_model)
    readout = tg.randn(2, 10, d_model)  # loss = <h, readout>: a fixed random direction
    norms = [None] * layers

    def remember(i):
        def hook(grad):
            norms[i] = float(np.linalg.norm(grad.data))
        return hook

    h = x
    for i, layer in enumerate(stack):
        h.register_hook(remember(i))  # the gradient arriving at layer i's input
        h = layer(h)
    loss = (h * readout).sum()
    loss.backward()
    return norms, viz.grad_norms(stack.named_parameters())


def main():
    for norm_first in (False, True):
        norms, params = stream_gradients(norm_first)
        kind = "pre-norm  (x + f(LN(x)))" if norm_first else "post-norm (LN(x + f(x)))"
        print(f"{kind}: |dL/dh| entering layers 0..5:", " ".join(f"{n:.2e}" for n in norms))
    print("\nPer-parameter gradient norms of the pre-norm stack (first layer):")
    for name, value in params.items():
        if name.startswith("0."):
            print(f"  {name:32s} {value:.3e}")

    print("\ndetect_anomaly names the op that first produced a NaN/Inf:")
    x = tg.tensor([1.0, 0.0, 2.0], requires_grad=True)
    try:
        with tg.detect_anomaly(), np.errstate(divide="ignore"):
            (x.log() * x).sum().backward()
    except tg.AnomalyError as e:
        print("  AnomalyError:", e)
    return norms, params


if __name__ == "__main__":
    main()
