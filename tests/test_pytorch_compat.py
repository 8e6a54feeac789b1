"""PyTorch code runs unchanged on our PyTorch-named modules and functions.

Each case is one piece of PyTorch usage, written once against a namespace
`lib` that is either PyTorch (lib.nn = torch.nn, lib.F =
torch.nn.functional, ...) or tinygrad_attn. It runs on both with the same
weights (PyTorch's, loaded into ours) and the same float64 inputs; the
outputs (every element of a returned tuple, None where PyTorch returns
None), the input gradients and every parameter's gradient must agree.

So positional arguments, the default layout (sequence first), the default
masks, need_weights=True, the is_causal hints and PyTorch's errors are
checked against PyTorch itself, not against our reading of its docs.
"""
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as tgF
from tinygrad_attn import nn as tgnn

from .nn_helpers import normal, padding

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning"),
              pytest.mark.filterwarnings("ignore:Implicit dimension choice:UserWarning"),
              pytest.mark.filterwarnings("ignore:Support for mismatched:UserWarning"),
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]

TORCH = SimpleNamespace(name="torch", nn=torch.nn, F=torch.nn.functional, optim=torch.optim,
                        tensor=torch.tensor, no_grad=torch.no_grad, float64=torch.float64)
OURS = SimpleNamespace(name="ours", nn=tgnn, F=tgF, optim=tg.optim, tensor=tg.tensor,
                       no_grad=tg.no_grad, float64=tg.float64)
TOLERANCE = 1e-10  # float64: max |ours - torch| / max |torch|


def _flat(out):
    """The tensors (and Nones) of an output, in order."""
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out]


def _array(t):
    return None if t is None else (t.detach().numpy() if isinstance(t, torch.Tensor) else t.data)


def _close(ours, theirs, what):
    if theirs is None:
        assert ours is None, f"{what}: PyTorch gives None, ours {ours!r}"
        return
    assert ours is not None, f"{what}: ours is None, PyTorch's is not"
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape}, PyTorch's {b.shape}"
    if a.dtype.kind == "b" or np.issubdtype(b.dtype, np.integer):
        np.testing.assert_array_equal(a, b, err_msg=what)
        return
    finite = np.isfinite(b)
    np.testing.assert_array_equal(np.isfinite(a), finite, err_msg=what)
    scale = max(np.abs(b[finite]).max(initial=0.0), 1e-300)
    error = np.abs(a[finite] - b[finite]).max(initial=0.0) / scale
    assert error <= TOLERANCE, f"{what}: relative error {error:.2e}"


class const:
    """An input that does not require grad (a float mask, as PyTorch users pass them)."""

    def __init__(self, array):
        self.array = array


def _make_input(lib, x, grad):
    if isinstance(x, const):
        return lib.tensor(x.array)
    return lib.tensor(x, requires_grad=grad) if x.dtype.kind == "f" else lib.tensor(x)


def run_both(build, use, inputs, grad=True):
    """build(lib) -> module (or None), use(lib, module, *xs) -> outputs, on
    both libraries with PyTorch's weights; compare outputs and gradients."""
    torch.manual_seed(0), tg.manual_seed(0)
    theirs, ours = build(TORCH), build(OURS)
    if theirs is not None:
        theirs.double(), ours.double()
        ours.load_state_dict(theirs.state_dict(), strict=True)
    results = {}
    for lib, module in ((TORCH, theirs), (OURS, ours)):
        xs = [_make_input(lib, x, grad) for x in inputs]
        out = _flat(use(lib, module, *xs))
        grads = {}
        if grad:
            rng = np.random.default_rng(7)
            total = sum((o * lib.tensor(rng.normal(size=tuple(o.shape)))).sum() for o in out
                        if o is not None and o.dtype == lib.float64 and o.requires_grad)
            total.backward()
            grads = {f"input {i}": x.grad for i, x in enumerate(xs) if x.requires_grad}
            if module is not None:
                grads.update({name: p.grad for name, p in module.named_parameters()})
        results[lib.name] = ([_array(o) for o in out], {k: _array(g) for k, g in grads.items()})
    (ours_out, ours_grads), (their_out, their_grads) = results["ours"], results["torch"]
    assert len(ours_out) == len(their_out), (len(ours_out), len(their_out))
    for i, (a, b) in enumerate(zip(ours_out, their_out)):
        _close(a, b, f"output {i}")
    assert ours_grads.keys() == their_grads.keys()
    for name in their_grads:
        _close(ours_grads[name], their_grads[name], f"gradient of {name}")


L, S, B, E = 4, 5, 3, 8  # query length, key length, batch, embedding


# --------------------------------------------------------- MultiheadAttention
# torch.nn.MultiheadAttention's documented usage: (L, N, E) inputs, the
# weights returned averaged over heads unless need_weights=False.

MHA_CASES = {
    "defaults: (L, N, E), weights averaged": (
        lambda lib: lib.nn.MultiheadAttention(E, 2),
        lambda lib, m, q, k, v: m(q, k, v), [normal(L, B, E), normal(S, B, E, seed=1), normal(S, B, E, seed=2)]),
    "positional dropout, bias; forward positional key_padding_mask, need_weights": (
        lambda lib: lib.nn.MultiheadAttention(E, 2, 0.0, False),
        lambda lib, m, q, k, v, kpm: m(q, k, v, kpm, False),
        [normal(L, B, E), normal(S, B, E, seed=1), normal(S, B, E, seed=2), padding(B, S)]),
    "positional attn_mask (6th), average_attn_weights=False": (
        lambda lib: lib.nn.MultiheadAttention(E, 4),
        lambda lib, m, q, k, v, mask: m(q, k, v, None, True, mask, False),
        [normal(L, B, E), normal(S, B, E, seed=1), normal(S, B, E, seed=2), const(normal(L, S, seed=3))]),
    "kdim, vdim (positional 7th and 8th)": (
        lambda lib: lib.nn.MultiheadAttention(E, 2, 0.0, True, False, False, 3, 5),
        lambda lib, m, q, k, v: m(q, k, v), [normal(L, B, E), normal(S, B, 3, seed=1), normal(S, B, 5, seed=2)]),
    "batch_first=True (positional 9th) with a boolean (N*H, L, S) mask": (
        lambda lib: lib.nn.MultiheadAttention(E, 2, 0.0, True, False, False, None, None, True),
        lambda lib, m, q, k, v, mask: m(q, k, v, attn_mask=mask),
        [normal(B, L, E), normal(B, S, E, seed=1), normal(B, S, E, seed=2),
         np.random.default_rng(4).random((B * 2, L, S)) < 0.3 * (np.arange(S) > 0)]),
    "self-attention, is_causal hint with its mask, need_weights=False": (
        lambda lib: lib.nn.MultiheadAttention(E, 2),
        lambda lib, m, x: m(x, x, x, attn_mask=lib.nn.Transformer.generate_square_subsequent_mask(L),
                            need_weights=False, is_causal=True), [normal(L, B, E)]),
    "self-attention, is_causal with padding and weights (the mask is used)": (
        lambda lib: lib.nn.MultiheadAttention(E, 2),
        lambda lib, m, x, kpm: m(x, x, x, kpm, attn_mask=lib.nn.Transformer.generate_square_subsequent_mask(L),
                                 is_causal=True), [normal(L, B, E), padding(B, L)]),
    "unbatched (L, E) with a (S,) padding mask": (
        lambda lib: lib.nn.MultiheadAttention(E, 2),
        lambda lib, m, q, k, v, kpm: m(q, k, v, kpm),
        [normal(L, E), normal(S, E, seed=1), normal(S, E, seed=2), padding(1, S)[0]]),
}


@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multihead_attention_as_pytorch_uses_it(case):
    build, use, inputs = MHA_CASES[case]
    run_both(build, use, inputs)


def test_multihead_attention_raises_where_pytorch_raises():
    for lib in (TORCH, OURS):
        m = lib.nn.MultiheadAttention(E, 2)
        x = lib.tensor(normal(L, B, E))
        with pytest.raises(RuntimeError, match="attn_mask"):  # the hint needs its mask
            m(x, x, x, is_causal=True)
    x = tg.tensor(normal(L, B, E))
    with pytest.raises(tg.ShapeError, match="embed_dim 8"):  # batch_first=False: (L, N, E) expected
        tgnn.MultiheadAttention(E, 2, batch_first=True)(x.transpose(0, 2), x, x)


@pytest.mark.parametrize("kwargs, name", [
    (dict(add_bias_kv=True), "add_bias_kv"), (dict(add_zero_attn=True), "add_zero_attn"),
    (dict(device="cuda"), "device"), (dict(dtype=np.float16), "dtype"), (dict(dtype=torch.int64), "dtype")])
def test_what_we_lack_raises_naming_the_argument(kwargs, name):
    with pytest.raises(NotImplementedError, match=name):
        tgnn.MultiheadAttention(E, 2, **kwargs)


def test_device_and_dtype_arguments_as_pytorch():
    m = tgnn.MultiheadAttention(E, 2, device="cpu", dtype=torch.float64)
    assert m.in_proj_weight.dtype == np.float64 and m.out_proj.weight.dtype == np.float64
    layer = tgnn.TransformerEncoderLayer(E, 2, 16, device=torch.device("cpu"), dtype=np.float64)
    assert all(p.dtype == np.float64 for p in layer.parameters())
    assert tgnn.Linear(2, 3, dtype="float64").weight.dtype == np.float64


# -------------------------------------------------------- Transformer family

def _causal(lib, T):
    return lib.nn.Transformer.generate_square_subsequent_mask(T)


LAYER_CASES = {
    # Default dropout=0.1 is active in training: these run in eval mode, as at inference.
    "TransformerEncoderLayer defaults (dim_feedforward=2048), (S, N, E)": (
        lambda lib: lib.nn.TransformerEncoderLayer(E, 2).eval(),
        lambda lib, m, src: m(src), [normal(S, B, E)]),
    "TransformerEncoderLayer positional masks and is_causal": (
        lambda lib: lib.nn.TransformerEncoderLayer(E, 2, 16, 0.0, "gelu", 1e-6, False, True).eval(),
        lambda lib, m, src, kpm: m(src, _causal(lib, S), kpm, True), [normal(S, B, E), padding(B, S)]),
    "TransformerEncoder(layer, 2) with a causal mask it detects": (
        lambda lib: lib.nn.TransformerEncoder(lib.nn.TransformerEncoderLayer(E, 2, 16, 0.0), 2,
                                              lib.nn.LayerNorm(E)),
        lambda lib, m, src: m(src, _causal(lib, S)), [normal(S, B, E)]),
    "TransformerEncoder batch_first, padding mask, training (no nested tensors)": (
        lambda lib: lib.nn.TransformerEncoder(lib.nn.TransformerEncoderLayer(E, 2, 16, 0.0, batch_first=True), 2),
        lambda lib, m, src, kpm: m(src, src_key_padding_mask=kpm), [normal(B, S, E), padding(B, S)]),
    "TransformerDecoderLayer positional tgt_mask, memory_mask": (
        lambda lib: lib.nn.TransformerDecoderLayer(E, 2, 16, 0.0),
        lambda lib, m, tgt, mem, mm: m(tgt, mem, _causal(lib, L), mm),
        [normal(L, B, E), normal(S, B, E, seed=1), const(normal(L, S, seed=2))]),
    "TransformerDecoder: hints and padding masks": (
        lambda lib: lib.nn.TransformerDecoder(lib.nn.TransformerDecoderLayer(E, 2, 16, 0.0, norm_first=True), 2),
        lambda lib, m, tgt, mem, tkpm, mkpm: m(tgt, mem, _causal(lib, L), None, tkpm, mkpm, True),
        [normal(L, B, E), normal(S, B, E, seed=1), np.zeros((B, L), bool), padding(B, S)]),
    "Transformer: the docs' call, model(src, tgt), (S, N, E) and (T, N, E)": (
        lambda lib: lib.nn.Transformer(E, 2, 2, 2, 16, 0.0),
        lambda lib, m, src, tgt: m(src, tgt), [normal(S, B, E), normal(L, B, E, seed=1)]),
    "Transformer: positional masks, src_mask causal by detection, tgt_is_causal hint": (
        lambda lib: lib.nn.Transformer(E, 2, 1, 1, 16, 0.0, "gelu"),
        lambda lib, m, src, tgt, skpm: m(src, tgt, _causal(lib, S), _causal(lib, L), None, skpm,
                                         tgt_is_causal=True),
        [normal(S, B, E), normal(L, B, E, seed=1), padding(B, S)]),
}


@pytest.mark.parametrize("case", list(LAYER_CASES))
def test_transformer_family_as_pytorch_uses_it(case):
    build, use, inputs = LAYER_CASES[case]
    run_both(build, use, inputs)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_inference_with_padding_matches_pytorchs_nested_tensor_path(norm_first):
    """In eval mode without grad, PyTorch runs a batch_first post-norm encoder
    on nested tensors and returns zeros at padded positions (before the final
    norm); with norm_first it does not. Ours gives the same in both cases."""
    kpm = np.arange(S) >= np.array([[S], [S - 2], [1]])  # padding at the end of each row

    def build(lib):
        layer = lib.nn.TransformerEncoderLayer(E, 2, 16, 0.0, batch_first=True, norm_first=norm_first)
        return lib.nn.TransformerEncoder(layer, 2, lib.nn.LayerNorm(E)).eval()

    def use(lib, m, src, kpm):
        with lib.no_grad():
            return m(src, src_key_padding_mask=kpm)
    run_both(build, use, [normal(B, S, E), kpm], grad=False)


def test_transformer_layers_raise_where_pytorch_raises():
    for lib in (TORCH, OURS):
        x = lib.tensor(normal(S, B, E))
        with pytest.raises(RuntimeError, match="attn_mask"):
            lib.nn.TransformerEncoderLayer(E, 2, 16)(x, is_causal=True)
        with pytest.raises(RuntimeError, match="attn_mask"):
            lib.nn.TransformerDecoderLayer(E, 2, 16)(x, x, tgt_is_causal=True)


def test_pytorch_defaults_of_the_transformer_family():
    for lib in (TORCH, OURS):
        layer = lib.nn.TransformerEncoderLayer(E, 2)
        assert layer.linear1.weight.shape == (2048, E) and layer.dropout.p == 0.1
        assert layer.self_attn.batch_first is False and layer.norm_first is False
        assert layer.norm1.eps == 1e-5 and layer.activation.__name__ == "relu"
        model = lib.nn.Transformer()
        assert (len(model.encoder.layers), len(model.decoder.layers), model.batch_first) == (6, 6, False)
        assert model.encoder.layers[0].self_attn.embed_dim == 512


# ---------------------------------------------------------------- layers

LAYER_BASICS = {
    "Linear(in, out, bias) positional": (
        lambda lib: lib.nn.Linear(E, 3, False), lambda lib, m, x: m(x), [normal(2, E)]),
    "Embedding(num, dim, padding_idx) positional": (
        lambda lib: lib.nn.Embedding(10, 4, 0), lambda lib, m, i: m(i), [np.array([[0, 3, 3], [9, 0, 1]])]),
    "Embedding.from_pretrained": (
        None, lambda lib, m, w, i: lib.nn.Embedding.from_pretrained(w, False)(i),
        [normal(6, 3), np.array([1, 5, 1])]),
    "LayerNorm(shape, eps, elementwise_affine, bias) positional": (
        lambda lib: lib.nn.LayerNorm((3, E), 1e-3, True, False), lambda lib, m, x: m(x), [normal(2, 3, E)]),
    "LayerNorm without affine parameters": (
        lambda lib: lib.nn.LayerNorm(E, elementwise_affine=False), lambda lib, m, x: m(x), [normal(2, E)]),
    "Dropout in eval mode, GELU('tanh'), ReLU()": (
        lambda lib: lib.nn.Sequential(lib.nn.Dropout(), lib.nn.GELU("tanh"), lib.nn.ReLU()).eval(),
        lambda lib, m, x: m(x), [normal(3, E)]),
    "SiLU() between two Linear layers (SwiGLU's activation)": (
        lambda lib: lib.nn.Sequential(lib.nn.Linear(E, 6), lib.nn.SiLU(), lib.nn.Linear(6, E)),
        lambda lib, m, x: m(x), [normal(3, E)]),
}


@pytest.mark.parametrize("case", list(LAYER_BASICS))
def test_basic_layers_as_pytorch_uses_them(case):
    build, use, inputs = LAYER_BASICS[case]
    run_both(build or (lambda lib: None), use, inputs)


def test_layers_raise_for_what_we_lack():
    for make, name in ((lambda: tgnn.Embedding(5, 2, max_norm=1.0), "max_norm"),
                       (lambda: tgnn.Embedding(5, 2, sparse=True), "sparse"),
                       (lambda: tgnn.Embedding(5, 2, scale_grad_by_freq=True), "scale_grad_by_freq"),
                       (lambda: tgnn.Dropout(0.1, True), "inplace"), (lambda: tgnn.ReLU(True), "inplace"),
                       (lambda: tgnn.SiLU(inplace=True), "inplace"),
                       (lambda: tgnn.Linear(2, 3, device="mps"), "device")):
        with pytest.raises(NotImplementedError, match=name):
            make()


# ------------------------------------------------------------- functional

FUNCTIONAL_CASES = {
    "scaled_dot_product_attention positional (mask, dropout_p, is_causal), scale keyword-only": (
        lambda lib, q, k, v, m: lib.F.scaled_dot_product_attention(q, k, v, m, 0.0, False, scale=0.3),
        [normal(2, L, E), normal(2, S, E, seed=1), normal(2, S, 3, seed=2), normal(L, S, seed=3)]),
    "scaled_dot_product_attention boolean mask (True = attend)": (
        lambda lib, q, k, v, m: lib.F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        [normal(2, L, E), normal(2, S, E, seed=1), normal(2, S, 3, seed=2),
         np.random.default_rng(3).random((L, S)) > 0.3 * (np.arange(S) > 0)]),
    "scaled_dot_product_attention is_causal with L != S (top-left aligned)": (
        lambda lib, q, k, v: lib.F.scaled_dot_product_attention(q, k, v, is_causal=True),
        [normal(2, L, E), normal(2, S, E, seed=1), normal(2, S, 3, seed=2)]),
    "scaled_dot_product_attention enable_gqa (4 query heads, 2 key/value heads)": (
        lambda lib, q, k, v: lib.F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        [normal(2, 4, L, E), normal(2, 2, S, E, seed=1), normal(2, 2, S, 3, seed=2)]),
    "scaled_dot_product_attention enable_gqa, key and value head counts of their own (6 query, 3 key, 2 value)": (
        lambda lib, q, k, v: lib.F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        [normal(2, 6, L, E), normal(2, 3, S, E, seed=1), normal(1, 2, S, 3, seed=2)]),
    "softmax / log_softmax positional dim, and dim=None (PyTorch's implicit choice)": (
        lambda lib, x: (lib.F.softmax(x, 1), lib.F.log_softmax(x, 0), lib.F.softmax(x), lib.F.log_softmax(x)),
        [normal(3, 4, 5)]),
    "cross_entropy positional (weight, size_average, ignore_index, reduce, reduction, label_smoothing)": (
        lambda lib, x, t: lib.F.cross_entropy(x, t, None, None, 2, None, "sum", 0.1),
        [normal(6, 5), np.array([0, 2, 4, 1, 2, 3])]),
    "cross_entropy (N, C, d) with defaults": (
        lambda lib, x, t: lib.F.cross_entropy(x, t), [normal(2, 5, 3), np.array([[0, 1, 4], [3, 3, 2]])]),
    "layer_norm positional (shape, weight, bias, eps)": (
        lambda lib, x, w, b: lib.F.layer_norm(x, (E,), w, b, 1e-3), [normal(3, E), normal(E, seed=1),
                                                                     normal(E, seed=2)]),
    "dropout(input, p, training=False) positional is the identity": (
        lambda lib, x: lib.F.dropout(x, 0.5, False), [normal(4, 3)]),
    "silu, positional inplace=False": (lambda lib, x: lib.F.silu(x, False), [normal(4, 3)]),
    "linear, embedding(padding_idx), gelu(approximate), relu": (
        lambda lib, x, w, b, i, table: (lib.F.linear(x, w, b), lib.F.embedding(i, table, 1),
                                         lib.F.gelu(x, approximate="tanh"), lib.F.relu(x)),
        [normal(2, 3), normal(4, 3, seed=1), normal(4, seed=2), np.array([1, 0, 1]), normal(3, 2, seed=3)]),
}


@pytest.mark.parametrize("case", list(FUNCTIONAL_CASES))
def test_functional_as_pytorch_uses_it(case):
    use, inputs = FUNCTIONAL_CASES[case]
    run_both(lambda lib: None, lambda lib, m, *xs: use(lib, *xs), inputs)


def test_functional_raises_where_pytorch_raises():
    q = normal(2, L, E)
    for lib in (TORCH, OURS):
        t = lib.tensor(q)
        with pytest.raises(RuntimeError, match="attn_mask should not be set"):
            lib.F.scaled_dot_product_attention(t, t, t, attn_mask=lib.tensor(np.ones((L, L), bool)),
                                               is_causal=True)
    with warnings.catch_warnings(record=True) as caught:  # PyTorch warns about softmax without dim; so do we
        warnings.simplefilter("always")
        tgF.softmax(tg.tensor(q))
    assert any("Implicit dimension choice for softmax" in str(w.message) for w in caught)
    for call, name in ((lambda: tgF.cross_entropy(tg.tensor(q[0]), np.zeros(L, np.int64), tg.ones(E)), "weight"),
                       (lambda: tgF.cross_entropy(tg.tensor(q[0]), np.zeros(L, np.int64), reduce=False), "reduce"),
                       (lambda: tgF.dropout(tg.tensor(q), 0.1, True, True), "inplace"),
                       (lambda: tgF.relu(tg.tensor(q), True), "inplace"),
                       (lambda: tgF.silu(tg.tensor(q), inplace=True), "inplace")):
        with pytest.raises(NotImplementedError, match=name):
            call()


# ------------------------------------------------------------- Tensor habits

def test_tensor_habits_as_in_pytorch():
    """Each PyTorch habit on a tensor, on both libraries, gives the same."""
    for lib in (TORCH, OURS):
        x = lib.tensor(normal(2, 3, 4))
        assert tuple(x.size()) == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
        assert x.dim() == 3 and x.numel() == 24 and x.shape[2] == 4 and len(x) == 2
        assert tuple(abs(x).shape) == (2, 3, 4) and (abs(x).numpy() >= 0).all()
        y = x.clone()
        assert y is not x and np.array_equal(y.numpy(), x.numpy())
        assert not np.shares_memory(y.numpy(), x.numpy())
        assert x.contiguous().numpy().flags.c_contiguous
        assert x.transpose(0, 2).contiguous().numpy().flags.c_contiguous
        assert x.to("cpu") is x and x.cpu() is x and x.detach().cpu().numpy().shape == (2, 3, 4)
        assert x.device.type == "cpu" and x.to(x.device) is x
        assert x.to(torch.float32).dtype == x.float().dtype
        assert x.to(lib.tensor(np.zeros(1, np.float32))).dtype == x.float().dtype
        assert x.type() == "torch.DoubleTensor" and x.type(torch.float32).type() == "torch.FloatTensor"
        values, indices = x.max(1)
        assert values.shape == (2, 4) and indices.shape == (2, 4)
        assert np.array_equal(x.max(dim=-1).indices.numpy(), x.numpy().argmax(-1))
        assert np.allclose(x.min(0, keepdim=True)[0].numpy(), x.numpy().min(0, keepdims=True))
        assert np.allclose(x.var(0, False).numpy(), x.numpy().var(0))  # var(dim, unbiased)
        assert np.allclose(x.std(1).numpy(), x.numpy().std(1, ddof=1))
        assert np.allclose(x.sum(2, True).numpy(), x.numpy().sum(2, keepdims=True))
        assert np.allclose(x.softmax(0).numpy().sum(0), 1)
        assert x.unsqueeze(1).shape == (2, 1, 3, 4) and x[:, :1].squeeze(1).shape == (2, 4)
        assert x.add(x, alpha=2).numpy() == pytest.approx(3 * x.numpy())
        assert [t.shape[1] for t in x.split(2, 1)] == [2, 1] and len(x.chunk(2, 2)) == 2
        assert lib.tensor([1.0, 2.0], dtype=lib.float64, requires_grad=True).requires_grad

        @lib.no_grad()
        def frozen(t):
            return t * 2
        assert not frozen(lib.tensor([1.0], requires_grad=True)).requires_grad


def test_tensor_gradients_through_the_habits():
    """clone, contiguous, to(dtype), abs and max(dim) pass gradients as PyTorch's do."""
    run_both(lambda lib: None,
             lambda lib, m, x: (x.clone() * 2, x.transpose(0, 1).contiguous(), abs(x), x.max(1).values,
                                x.to(lib.float64).exp()),
             [normal(3, 4)])


def test_module_habits_as_in_pytorch():
    for lib in (TORCH, OURS):
        model = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.ReLU(), lib.nn.Linear(4, 2))
        assert model.to("cpu") is model and model.cpu() is model
        model.to(torch.float64)
        assert all(p.dtype == lib.float64 for p in model.parameters())
        assert [n for n, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        assert len(list(model.modules())) == 4 and model[0].in_features == 3


def test_optimizers_as_pytorch_uses_them():
    """Positional hyper-parameters and the defaults, one step on each library."""
    def step(lib, make):
        torch.manual_seed(0), tg.manual_seed(0)
        w = lib.tensor(normal(3, 2), requires_grad=True)
        opt = make(lib, [w])
        loss = (w * w).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return _array(w)
    for make in (lambda lib, p: lib.optim.SGD(p),  # lr=1e-3 by default
                 lambda lib, p: lib.optim.SGD(p, 0.1, 0.9, 0.0, 0.01, True),
                 lambda lib, p: lib.optim.Adam(p, 0.01, (0.8, 0.9), 1e-6, 0.1, True),
                 lambda lib, p: lib.optim.Adam(p, 0.01, weight_decay=0.1, decoupled_weight_decay=True),
                 lambda lib, p: lib.optim.AdamW(p)):
        _close(step(OURS, make), step(TORCH, make), "parameter after one step")


def test_a_mask_that_requires_grad_is_refused():
    """PyTorch differentiates float masks; ours carry no gradient, so such a mask raises."""
    m = tgnn.MultiheadAttention(E, 2)
    x, mask = tg.tensor(normal(L, B, E)), tg.tensor(normal(L, L), requires_grad=True)
    with pytest.raises(NotImplementedError, match="attn_mask requires grad"):
        m(x, x, x, attn_mask=mask)
    m(x, x, x, attn_mask=mask.detach())
    with tg.no_grad():
        m(x, x, x, attn_mask=mask)


@pytest.mark.parametrize("dim", [0, -1])
def test_max_and_min_of_a_0d_tensor_along_dim_as_pytorch(dim):
    for lib in (TORCH, OURS):
        x = lib.tensor(3.0)
        for method in ("max", "min"):
            values, indices = getattr(x, method)(dim)
            assert tuple(values.shape) == () and values.item() == 3.0 and indices.item() == 0
