"""The path you read is the path that runs: inside `with tinygrad_attn.reference_ops():`
every fused op (and so every layer) runs its composite twin of
tinygrad_attn/reference/composites.py, a composition of primitive ops, with the same
results: each fused op on its gradcheck cases, and a model, which trains the
same, step for step, to rounding."""
import sys
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn, optim, warmup

from . import references as ref
from .nn_helpers import ops_in_graph
from .test_ops import CASES

# Every fused op: those with a composite twin, from the registry (a new one is picked up).
FUSED = {name for name, op in tg.Function.registry.items() if op.composite is not None}
# The ops with a kernel that the twins are built of: they have no twin. This list
# and PRIMITIVE below name primitives, so adding a fused op changes neither.
KERNEL_PRIMITIVES = {"MatMul", "Relu", "Erfc", "GetItem"}
FUSED_CASE_IDS = [(name, i) for name in sorted(FUSED) for i in range(len(CASES.get(name, ())))]
# Some of the primitive steps the reference versions are made of.
PRIMITIVE = {"MatMul", "Exp", "Sum", "Div", "Log", "Sqrt", "Where", "Erfc", "Sigmoid", "Mul", "Permute"}
VOCAB, D_MODEL = 11, 16


def test_every_op_with_a_kernel_has_a_composite_twin_or_is_a_primitive():
    """A new op with a kernel is picked up: it needs a twin, registered with
    @composite_of in reference/composites.py, unless the twins are built of it."""
    with_kernel = {op.__name__ for op in warmup.ops_with_kernels()}
    assert len(FUSED) >= 10
    assert with_kernel - KERNEL_PRIMITIVES == FUSED, \
        f"ops with a kernel and no composite twin: {sorted(with_kernel - KERNEL_PRIMITIVES - FUSED)}"


@pytest.mark.parametrize("name,i", FUSED_CASE_IDS, ids=[f"{n}-{i}" for n, i in FUSED_CASE_IDS])
@given(data=st.data())
def test_each_fused_op_equals_its_composite_twin(name, i, data):
    """The op's gradcheck cases (tests/test_ops.py), fused and inside
    reference_ops(): the fused graph holds the op, the reference graph
    primitive ops only, with the same values and gradients (float64, 1e-10
    on the scale of each array)."""
    case = data.draw(CASES[name][i])
    results = []
    for reference in (False, True):
        tensors = [tg.Tensor(a, requires_grad=True) for a in case.arrays]
        with tg.reference_ops(reference):
            out = case.fn(*tensors)
        names = ops_in_graph(out)
        assert not names & FUSED if reference else name in names, sorted(names)
        out.backward(np.cos(np.arange(out.numel())).reshape(out.shape))
        results.append([out.data] + [t.grad.data for t in tensors])
    for fused, twin in zip(*results):
        np.testing.assert_allclose(twin, fused, rtol=1e-10, atol=1e-10 * max(1.0, np.abs(fused).max(initial=0)))


@pytest.mark.parametrize("name", sorted(FUSED))
def test_each_fused_op_example_runs_on_primitive_ops_only_inside_reference_ops(name):
    """Every fused op of the registry, on its `example` (the call the warm-up
    makes): applied as is, the graph holds the op; inside reference_ops(),
    primitive ops only, and backward runs through them. No model has to call
    a new fused op for this to be checked."""
    op = tg.Function.registry[name]
    arrays, params = op.example(np.float64, 64)
    for reference in (False, True):
        tensors = [tg.Tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
        with tg.reference_ops(reference):
            out = op.apply(*tensors, **params)
        names = ops_in_graph(out)
        if reference:
            assert names and not names & FUSED, f"{name}'s twin puts {sorted(names & FUSED)} in the graph"
        else:
            assert name in names, sorted(names)
        out.backward(np.cos(np.arange(out.numel())).reshape(out.shape))
        assert all(t.grad is not None for t in tensors if t.requires_grad)


class Translator(nn.Module):
    """A 1-layer encoder-decoder Transformer on tokens (exact GELU, dropout),
    a cross-attention probe that returns its weights, an RMSNorm and a rotary
    embedding of its output (Llama's), a tanh-GELU and SiLU head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.transformer = nn.Transformer(d_model=D_MODEL, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=24, dropout=0.1, activation="gelu", batch_first=True)
        self.probe = nn.MultiheadAttention(D_MODEL, 2, dropout=0.1, batch_first=True)
        self.norm = nn.RMSNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, src, tgt, padding):
        s, t = self.embed(src), self.embed(tgt)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=np.float64)
        out = self.transformer(s, t, tgt_mask=causal, src_key_padding_mask=padding,
                               memory_key_padding_mask=padding, tgt_is_causal=True)
        seen, weights = self.probe(out, s, s, key_padding_mask=padding)  # need_weights: the weights op
        B, T, _ = out.shape
        cos, sin = nn.precompute_freqs_cis(D_MODEL // 2, T)  # two "heads" of D_MODEL / 2
        out = F.apply_rotary_emb(self.norm(out + seen).reshape(B, T, 2, D_MODEL // 2), cos, sin).reshape(B, T, D_MODEL)
        return self.head(F.silu(F.gelu(out, approximate="tanh"))), weights


def loss_of(model, batch):
    """Label-smoothed cross-entropy (one target ignored), an entropy bonus
    on the predictions (softmax, log_softmax) and a penalty on the weights."""
    src, tgt, target, padding = batch
    logits, weights = model(src, tgt, padding)
    logits = logits.reshape(-1, VOCAB)
    entropy = -(F.softmax(logits, dim=-1) * logits.log_softmax(-1)).sum(axis=-1).mean()
    loss = F.cross_entropy(logits, target, label_smoothing=0.1) - 0.01 * entropy
    return loss + 0.1 * (weights * weights).sum()


def make_batch():
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(0, VOCAB, (2, 5)), rng.integers(0, VOCAB, (2, 4))
    target = rng.integers(0, VOCAB, 8)
    target[3] = -100  # ignored
    padding = np.array([[False] * 4 + [True], [False] * 5])
    return src, tgt, target, padding


def train(reference, steps=3):
    """[(loss, gradients, op names)] of each of `steps` Adam steps, in float64, from seed 0."""
    tg.manual_seed(0)
    model = Translator().double()
    optimizer = optim.Adam(model.parameters(), lr=1e-2)
    batch, record = make_batch(), []
    for _ in range(steps):
        optimizer.zero_grad()
        with tg.reference_ops(reference):
            loss = loss_of(model, batch)
        names = ops_in_graph(loss)
        loss.backward()
        record.append((loss.item(), {n: p.grad.data.copy() for n, p in model.named_parameters()}, names))
        optimizer.step()
    return record


def max_relative_difference(a, b):
    """max |a - b| / max |b|: the difference on the scale of the array (b = 0: the absolute one)."""
    scale = np.abs(b).max()
    return np.abs(a - b).max() / (scale if scale > 0 else 1.0)


def test_a_model_trains_the_same_through_the_reference_ops():
    """Three Adam steps of an encoder-decoder with masks and dropout, fused and
    reference, from the same seed: the same loss and gradients at every step
    (float64; measured 2e-16 and 3e-15), the same dropout masks, and the
    reference graph holds primitive ops only.

    (The parameters themselves are not compared: the gradient of the key
    projection's bias is 0 in exact arithmetic, softmax being blind to a
    shift of a row, so both paths give rounding noise there, which Adam
    turns into steps of 1e-11 that differ. The losses and the other
    gradients of the later steps show the two runs stay together.)"""
    fused, ref = train(reference=False), train(reference=True)
    for step, ((loss_f, grads_f, ops_f), (loss_r, grads_r, ops_r)) in enumerate(zip(fused, ref)):
        assert ops_f & FUSED, f"step {step}: the fused graph holds no fused op"
        assert not ops_r & FUSED, f"step {step}: the reference graph holds {sorted(ops_r & FUSED)}"
        assert ops_r >= PRIMITIVE, sorted(PRIMITIVE - ops_r)
        assert loss_r == pytest.approx(loss_f, rel=1e-12, abs=0)
        assert grads_r.keys() == grads_f.keys()
        worst = max((max_relative_difference(grads_r[n], grads_f[n]), n) for n in grads_f)
        assert worst[0] <= 1e-10, f"step {step}: {worst[1]} differs by {worst[0]:.1e}"


def test_the_comparison_sees_a_different_dropout_mask():
    """Negative control: reference and fused with different seeds differ far beyond the tolerance."""
    batch = make_batch()
    losses = []
    for reference, seed in ((False, 0), (True, 1)):
        tg.manual_seed(0)
        model = Translator().double()
        tg.manual_seed(seed)
        with tg.reference_ops(reference):
            losses.append(loss_of(model, batch).item())
    assert abs(losses[0] - losses[1]) > 1e-6 * abs(losses[0])


def test_the_decorator_form_runs_the_reference_ops_in_the_function_only():
    tg.manual_seed(0)
    model = Translator().double()

    @tg.reference_ops()
    def reference_loss(batch):
        """A docstring that stays."""
        assert tg.is_reference_ops_enabled()
        return loss_of(model, batch)

    assert reference_loss.__name__ == "reference_loss" and reference_loss.__doc__ == "A docstring that stays."
    for _ in range(2):  # the same decorated function, called again
        names = ops_in_graph(reference_loss(make_batch()))
        assert not names & FUSED and "MatMul" in names
        assert not tg.is_reference_ops_enabled()
    assert ops_in_graph(loss_of(model, make_batch())) & FUSED


def test_set_reference_ops_returns_the_previous_setting_and_the_context_restores_it():
    assert tg.set_reference_ops(True) is False
    assert tg.set_reference_ops(False) is True
    with pytest.raises(RuntimeError):
        with tg.reference_ops():
            assert tg.is_reference_ops_enabled()
            raise RuntimeError("inside")
    assert not tg.is_reference_ops_enabled()


def test_reference_ops_nest_and_an_instance_can_be_reentered():
    outer, inner = tg.reference_ops(), tg.reference_ops(False)
    with outer:
        with inner:
            assert not tg.is_reference_ops_enabled()
            with outer:  # the same object, entered again inside itself
                assert tg.is_reference_ops_enabled()
            assert not tg.is_reference_ops_enabled()
        assert tg.is_reference_ops_enabled()
        x = tg.Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)  # Tensor methods too:
        assert ops_in_graph(x.softmax(-1)) == {"Sub", "Exp", "Sum", "Div"}  # (the shift by the max is detached)
        assert ops_in_graph(x.log_softmax(-1)) == {"Sub", "Exp", "Sum", "Log"}
        assert ops_in_graph(x.gelu()) == {"Mul", "Erfc"}
    assert not tg.is_reference_ops_enabled()


def test_the_setting_is_per_thread_and_one_instance_serves_several_threads():
    """A thread inside reference_ops() changes nothing for another; the same
    instance entered in two threads at once leaves each in its own order;
    a new thread starts in a fresh context, with the fused ops (unless this
    Python makes threads inherit the context: 3.14's free-threaded build)."""
    shared = tg.reference_ops()
    worker_in, main_in, worker_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def worker():
        with shared:
            worker_in.set()
            main_in.wait(10)
            seen["worker inside"] = tg.is_reference_ops_enabled()
        seen["worker after"] = tg.is_reference_ops_enabled()  # exits first although it entered first
        worker_out.set()

    thread = threading.Thread(target=worker)
    thread.start()
    assert worker_in.wait(10)
    seen["main before"] = tg.is_reference_ops_enabled()
    with shared:
        main_in.set()
        assert worker_out.wait(10)
        seen["main inside"] = tg.is_reference_ops_enabled()
        child = threading.Thread(target=lambda: seen.setdefault("child", tg.is_reference_ops_enabled()))
        child.start()
        child.join(10)
    thread.join(10)
    seen["main after"] = tg.is_reference_ops_enabled()
    inherits = bool(getattr(sys.flags, "thread_inherit_context", False))
    assert seen == {"main before": False, "worker inside": True, "worker after": False, "main inside": True,
                    "child": inherits, "main after": False}


# float32: the kernel's erfc (Numerical Recipes', in float32) and exp lose a few ulps in the tails.
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float32, 2e-5)])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_the_reference_gelu_is_the_fused_one(approximate, dtype, rtol):
    """Over both tails (where gelu is tiny or x): erfc in the reference as in the kernel."""
    x = np.concatenate([np.linspace(-12, 12, 2001), [0.0]]).astype(dtype)
    values = []
    for reference in (False, True):
        t = tg.Tensor(x, requires_grad=True)
        with tg.reference_ops(reference):
            y = F.gelu(t, approximate=approximate)
        y.sum().backward()
        values.append((y.data, t.grad.data))
    floor = 1e-300 if dtype == np.float64 else 1e-30  # below it float32's exp flushes to 0
    np.testing.assert_allclose(values[1][0], values[0][0], rtol=rtol, atol=floor)
    np.testing.assert_allclose(values[1][1], values[0][1], rtol=rtol, atol=floor)


@pytest.mark.parametrize("dtype,big,rtol", [(np.float32, 1e30, 1e-5), (np.float64, 1e200, 1e-12)])
def test_the_reference_layer_norm_is_right_on_rows_too_large_to_square(dtype, big, rtol):
    """As the kernel: rows whose squares overflow give their finite, right
    values and gradients (torch in float64 on the same rows)."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = ref.huge_rows(dtype, big)
    w, b, g = rng.standard_normal(16).astype(dtype), rng.standard_normal(16).astype(dtype), \
        rng.standard_normal(x.shape).astype(dtype)
    xt, wt, bt = (tg.Tensor(a, requires_grad=True) for a in (x, w, b))
    with tg.reference_ops():
        y = F.layer_norm(xt, 16, wt, bt)
    assert "LayerNormOp" not in ops_in_graph(y)
    y.backward(tg.Tensor(g))
    for ours, expected in zip((y.data, xt.grad.data, wt.grad.data, bt.grad.data), ref.torch_layer_norm(x, w, b, g)):
        ref.assert_rows_close(ours, expected, rtol)
