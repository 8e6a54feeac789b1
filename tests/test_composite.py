"""The path you read is the path that runs: `with tinygrad_attn.composite():`
makes every fused function (and so every layer) run its composite twin of
tinygrad_attn/reference.py, with the same results."""
import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn

FUSED = {"LinearOp", "Softmax", "LogSoftmax", "LayerNormOp", "CrossEntropy", "DropoutOp",
         "ScaledDotProductAttention", "PackedSelfAttention", "AttentionWeights", "Gelu"}


def ops_in_graph(out):
    """Names of the ops that made `out`, walking its graph."""
    seen, stack, names = set(), [out], set()
    while stack:
        t = stack.pop()
        if id(t) in seen or t._ctx is None:
            continue
        seen.add(id(t))
        names.add(t._ctx.fn.__name__)
        stack.extend(t._ctx.parents)
    return names


def _step(composite):
    """Loss and gradients of a small encoder-decoder (masks, dropout) and a
    pre-norm GELU block, in float64, with or without the composite path."""
    tg.manual_seed(0)
    model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=24,
                           dropout=0.1, batch_first=True).double()
    block = nn.TransformerEncoderLayer(16, 2, 24, dropout=0.1, activation="gelu", norm_first=True,
                                       batch_first=True).double()
    head = nn.Linear(16, 7).double()
    rng = np.random.default_rng(1)
    src = tg.Tensor(rng.standard_normal((2, 5, 16)), requires_grad=True)
    tgt = tg.Tensor(rng.standard_normal((2, 4, 16)))
    padding = np.array([[False] * 4 + [True], [False] * 5])
    params = list(model.parameters()) + list(block.parameters()) + list(head.parameters())
    with tg.composite(composite):
        out = model(src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4, dtype=np.float64),
                    src_key_padding_mask=padding, memory_key_padding_mask=padding, tgt_is_causal=True)
        out = block(out)
        loss = F.cross_entropy(head(out).reshape(-1, 7), np.arange(8) % 7, label_smoothing=0.1)
    names = ops_in_graph(loss)
    loss.backward()
    return loss.item(), [src.grad.data] + [p.grad.data for p in params], names


def test_a_model_gives_the_same_loss_and_gradients_through_the_composite_path():
    fused_loss, fused_grads, fused_ops = _step(False)
    loss, grads, ops = _step(True)
    assert fused_ops & FUSED and not ops & FUSED, sorted(ops & FUSED)  # the composite graph has no fused op
    assert {"Exp", "Sum", "MatMul"} <= ops
    assert loss == pytest.approx(fused_loss, rel=1e-7)  # exact GELU's erfc: 1.2e-7 apart
    for a, b in zip(grads, fused_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_set_composite_returns_the_previous_setting_and_the_context_restores_it():
    assert tg.set_composite(True) is False
    assert tg.set_composite(False) is True
    with pytest.raises(RuntimeError):
        with tg.composite():
            assert F._composite
            raise RuntimeError("inside")
    assert not F._composite
    with tg.composite(False):
        assert not F._composite


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_composite_gelu_is_the_fused_one(approximate):
    x = np.concatenate([np.linspace(-12, 12, 2001), [0.0]])
    values = []
    for composite in (False, True):
        t = tg.Tensor(x, requires_grad=True)
        with tg.composite(composite):
            y = F.gelu(t, approximate=approximate)
        y.sum().backward()
        values.append((y.data, t.grad.data))
    np.testing.assert_allclose(values[1][0], values[0][0], rtol=2e-7, atol=1e-12)
    np.testing.assert_allclose(values[1][1], values[0][1], rtol=1e-6, atol=1e-7)
