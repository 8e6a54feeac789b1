"""Watch the gradient flow back through a stack of 6 Transformer encoder layers.

Four stacks with the same weights, the same input and the same loss: the
framework's TransformerEncoderLayer as post-norm (the default and the
paper's Add&Norm, y = LN(x + f(x))) and as pre-norm (y = x + f(LN(x))), and
each of them with its residual connections removed (y = LN(f(x)) and
y = f(LN(x))). For each it prints the size of the gradient at the top (the
output of the last layer, where a head would read it) and at the bottom (the
input x), and cos(bottom, top): how much of the top's gradient still points
the same way when it arrives.

What to see (docs/backprop_through_attention.md, section 8):
- pre-norm: each layer gives G_x = G_y + J^T G_y, so the top's gradient
  reaches x unchanged as one term of the sum, whatever the sub-layers do;
  the second table shows it exactly, with the sub-layers cut off. Each
  layer adds its J^T G_y, so the whole gradient grows on the way down.
- post-norm: G_x = G_z + J^T G_z with G_z = J_LN^T G_y: the residual path
  goes through each LayerNorm's Jacobian, two per layer, 12 in the stack.
  The gradient is not passed on unchanged, and in the second table it
  shrinks and turns on the way. Stacking blocks does multiply Jacobians
  here, the LayerNorms'; it is the sub-layers' Jacobians the residual
  spares it. Still, at 6 layers the whole gradient's size barely changes:
  nothing vanishes (post-norm's difficulty is another: it needs a
  learning-rate warmup, section 8).
- no residual: the gradient reaches x only through the sub-layers (and
  their LayerNorms). It points elsewhere when it arrives (cos near 0) and,
  here, is much smaller. Its size depends on the draw, as each LayerNorm
  rescales the gradient by 1/sigma of its input: over seeds 0 to 19 the
  post-norm stack without residual ends below both residual stacks in 18,
  the pre-norm one in all 20. Its direction is lost every time.

Then the tools, all public API: `tensor.register_hook(fn)` records the
gradient entering each layer, `viz.grad_norms(model.named_parameters())`
lists every parameter's gradient norm, `detect_anomaly()` names the op that
first produced a NaN or Inf.

    python examples/gradient_flow.py
"""
import argparse

import numpy as np

import tinygrad_attn as tg
from tinygrad_attn import nn, viz

LAYERS, D_MODEL, HEADS, D_FF, BATCH, T = 6, 32, 4, 64, 2, 10
STACKS = {  # name: (norm_first, residual)
    "post-norm": (False, True),
    "pre-norm": (True, True),
    "post-norm, no residual": (False, False),
    "pre-norm, no residual": (True, False),
}


def block(layer, x, residual=True, sublayer_grad=True):
    """layer's forward written out (dropout 0): two sub-layers, each with Add & Norm.

    residual=False drops the additions. sublayer_grad=False feeds each
    sub-layer a detached input, so the gradient can only take the residual
    path. With both True this is exactly layer(x).
    """
    def attention(h):
        return layer.self_attn(h, h, h, need_weights=False)[0]

    def feed_forward(h):
        return layer.linear2(layer.activation(layer.linear1(h)))

    for sublayer, norm in ((attention, layer.norm1), (feed_forward, layer.norm2)):
        h = x if sublayer_grad else x.detach()
        if layer.norm_first:                   # pre-norm: x + f(LN(x))
            out = sublayer(norm(h))
            x = x + out if residual else out
        else:                                  # post-norm: LN(x + f(x))
            out = sublayer(h)
            x = norm(x + out if residual else out)
    return x


def cos(a, b):
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def stack_gradients(norm_first, residual=True, sublayer_grad=True, seed=0):
    """Build the stack, run it, backprop <h_top, readout>. Returns a dict:
    top and bottom gradients, their norms and cosine, the norm of the gradient
    entering each layer (bottom first), and the stack's parameters' grad norms."""
    tg.manual_seed(seed)  # the same weights, input and readout for every stack
    stack = nn.ModuleList([nn.TransformerEncoderLayer(D_MODEL, nhead=HEADS, dim_feedforward=D_FF, dropout=0.0,
                                                      batch_first=True, norm_first=norm_first)
                           for _ in range(LAYERS)])
    x = tg.randn(BATCH, T, D_MODEL, requires_grad=True)  # (B, T, d_model) the embeddings
    readout = tg.randn(BATCH, T, D_MODEL)  # loss = <h_top, readout>: dL/dh_top = readout
    entering = [None] * LAYERS

    def remember(i):
        def hook(grad):
            entering[i] = float(np.linalg.norm(grad.data))
        return hook

    h = x
    for i, layer in enumerate(stack):
        h.register_hook(remember(i))  # the gradient arriving at layer i's input
        h = layer(h) if residual and sublayer_grad else block(layer, h, residual, sublayer_grad)
    h.retain_grad()                   # (B, T, d_model) the top
    (h * readout).sum().backward()
    top, bottom = h.grad.data, x.grad.data
    return {"top": top, "bottom": bottom, "top_norm": float(np.linalg.norm(top)),
            "bottom_norm": float(np.linalg.norm(bottom)), "cos": cos(bottom, top), "entering": entering,
            "params": viz.grad_norms(stack.named_parameters())}


def main(argv=None, seed=0):
    parser = argparse.ArgumentParser(description="Gradient norms at the top and bottom of 6-layer encoder "
                                     "stacks: post-norm, pre-norm, and without residual connections.")
    parser.add_argument("--seed", type=int, default=seed, help=f"seed of weights and data (default {seed})")
    seed = parser.parse_args(argv if argv is not None else []).seed

    print(f"{LAYERS} encoder layers (d_model {D_MODEL}, {HEADS} heads), input x of (B, T, d) = "
          f"({BATCH}, {T}, {D_MODEL}),\nloss = <h_top, r> for a fixed random r: every stack gets the same "
          f"gradient at the top, dL/dh_top = r.\n")
    print(f"{'stack':24s} {'|top|':>7s} {'|bottom|':>9s} {'cos(bottom, top)':>17s}   |dL/dh| entering layers 0..5")
    stacks = {}
    for name, (norm_first, residual) in STACKS.items():
        r = stacks[name] = stack_gradients(norm_first, residual, seed=seed)
        print(f"{name:24s} {r['top_norm']:7.2f} {r['bottom_norm']:9.2f} {r['cos']:17.2f}   "
              + " ".join(f"{n:.2f}" for n in r["entering"]))

    print("\nThe residual path alone (each sub-layer fed a detached input, so only the skips carry gradient):")
    paths = {}
    for name, norm_first in (("pre-norm", True), ("post-norm", False)):
        r = paths[name] = stack_gradients(norm_first, sublayer_grad=False, seed=seed)
        r["max_diff"] = float(np.abs(r["bottom"] - r["top"]).max())
        print(f"  {name:10s} |bottom| {r['bottom_norm']:6.2f}, cos(bottom, top) {r['cos']:.3f}, "
              f"max |bottom - top| {r['max_diff']:.1e}")
    print("  pre-norm: the top's gradient arrives unchanged. post-norm: it went through 12 LayerNorm Jacobians.")

    params = stacks["pre-norm"]["params"]
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
    return stacks, paths


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
