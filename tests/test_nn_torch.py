"""Equivalence with PyTorch: the same state dict loads both ways with
strict=True, and both frameworks give the same forward and backward (the
input gradients and every parameter's gradient, matched by name).

Relative error = max |ours - torch| / max |torch| over an array; the bound
is 1e-10 in float64 and 1e-5 in float32. The worst error of each case is
printed at the end of the module (run with -s to see the table).
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinygrad_attn as tg
from tinygrad_attn import nn

from .nn_helpers import attention_cases, normal, padding

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings("ignore:enable_nested_tensor:UserWarning"),
              # mixing a float attn_mask with a boolean padding mask is tested on purpose
              pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask:UserWarning")]

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
TORCH_DTYPE = {"float64": torch.float64, "float32": torch.float32}
WORST = {}  # (case, dtype) -> worst relative error seen (forward, backward)


@pytest.fixture(scope="module", autouse=True)
def print_worst_errors():
    yield
    if WORST:
        print("\n\nPyTorch equivalence, worst relative errors (max|ours - torch| / max|torch|)")
        print(f"{'case':<48} {'dtype':<8} {'forward':>10} {'backward':>10}")
        for (case, dtype), (fwd, bwd) in sorted(WORST.items()):
            print(f"{case:<48} {dtype:<8} {fwd:>10.2e} {bwd:>10.2e}")


def relative_error(ours, theirs):
    a = np.asarray(ours, dtype=np.float64)
    b = theirs.detach().numpy().astype(np.float64)
    assert a.shape == b.shape
    if b.size == 0:
        return 0.0
    scale = np.abs(b).max()
    diff = np.abs(a - b).max()
    return float(diff / scale) if scale > 0 else float(diff)


def move_weights(ours, theirs, direction):
    """Export one model's state dict as numpy arrays and load it into the other, strictly."""
    if direction == "torch->ours":
        ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()}, strict=True)
    else:
        theirs.load_state_dict({k: torch.from_numpy(v.data.copy()) for k, v in ours.state_dict().items()},
                               strict=True)


def call(model, *inputs, **extras):
    return model(*inputs, **extras)


def to_torch(extras, dtype):
    """numpy arrays as torch tensors, the float ones in the model's dtype (PyTorch wants that)."""
    def convert(v):
        if not isinstance(v, np.ndarray):
            return v
        t = torch.from_numpy(v)
        return t.to(dtype) if t.is_floating_point() else t
    return {k: convert(v) for k, v in extras.items()}


def check_equivalence(case, ours, theirs, inputs, dtype, direction, extras=None, run=call):
    """Run `run(model, *inputs, **extras)` on both models and compare the
    outputs, the input gradients and every parameter's gradient. Float
    `inputs` are differentiated; `extras` (masks, indices: numpy arrays)
    are not. Records the worst errors under (case, dtype)."""
    ours.to(dtype)
    theirs.to(TORCH_DTYPE[dtype])
    ours.zero_grad(), theirs.zero_grad()
    ours.train(), theirs.train()  # dropout is 0; train mode keeps PyTorch off its inference fast path
    move_weights(ours, theirs, direction)
    ours_params, their_params = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert list(ours_params) == list(their_params)

    def prepare(x, make):
        return make(x) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x
    ours_in = [prepare(x, lambda a: tg.Tensor(a.astype(dtype), requires_grad=True)) for x in inputs]
    their_in = [prepare(x, lambda a: torch.tensor(a.astype(dtype), requires_grad=True)) for x in inputs]
    extras = extras or {}
    ours_out = run(ours, *ours_in, **extras)
    their_out = run(theirs, *their_in, **to_torch(extras, TORCH_DTYPE[dtype]))
    ours_out = ours_out if isinstance(ours_out, tuple) else (ours_out,)
    their_out = their_out if isinstance(their_out, tuple) else (their_out,)
    assert len(ours_out) == len(their_out)
    fwd = max(relative_error(o.data, t) for o, t in zip(ours_out, their_out))

    rng = np.random.default_rng(0)
    cotangents = [rng.normal(size=t.shape).astype(dtype) for t in their_out]
    sum((o * tg.Tensor(g)).sum() for o, g in zip(ours_out, cotangents)).backward()
    sum((t * torch.from_numpy(g)).sum() for t, g in zip(their_out, cotangents)).backward()
    errors = [relative_error(o.grad.data, t.grad) for o, t in zip(ours_in, their_in)
              if isinstance(o, tg.Tensor) and o.requires_grad]
    for name, p in ours_params.items():
        assert (p.grad is None) == (their_params[name].grad is None), name
        if p.grad is not None:
            errors.append(relative_error(p.grad.data, their_params[name].grad))
    bwd = max(errors)
    prev = WORST.get((case, dtype), (0.0, 0.0))
    WORST[(case, dtype)] = (max(prev[0], fwd), max(prev[1], bwd))
    assert fwd <= TOLERANCE[dtype] and bwd <= TOLERANCE[dtype], (case, dtype, fwd, bwd)


both_ways = pytest.mark.parametrize("direction", ["torch->ours", "ours->torch"])
dtypes = pytest.mark.parametrize("dtype", ["float64", "float32"])


def causal(T):
    return np.triu(np.ones((T, T), dtype=bool), 1)


# ------------------------------------------------------------ basic layers

@dtypes
@both_ways
@pytest.mark.parametrize("bias", [True, False])
def test_linear(dtype, direction, bias):
    tg.manual_seed(0), torch.manual_seed(0)
    check_equivalence(f"Linear(bias={bias})", nn.Linear(5, 3, bias=bias), torch.nn.Linear(5, 3, bias=bias),
                      [normal(2, 4, 5)], dtype, direction)


@dtypes
@both_ways
def test_embedding_with_padding(dtype, direction):
    tg.manual_seed(0), torch.manual_seed(0)
    idx = np.array([[1, 0, 3], [3, 3, 2]])
    check_equivalence("Embedding(padding_idx=3)", nn.Embedding(6, 4, padding_idx=3),
                      torch.nn.Embedding(6, 4, padding_idx=3), [], dtype, direction, extras=dict(indices=idx),
                      run=lambda m, indices: m(indices))


@dtypes
@both_ways
@pytest.mark.parametrize("shape", [(6,), (3, 4)])
def test_layer_norm(dtype, direction, shape):
    ours, theirs = nn.LayerNorm(shape), torch.nn.LayerNorm(shape)
    source = theirs if direction == "torch->ours" else ours
    for name, p in source.named_parameters():  # move away from the ones/zeros init
        shift = normal(*p.shape, seed=len(name)) * 0.5
        if source is theirs:
            with torch.no_grad():
                p.add_(torch.from_numpy(shift).to(p.dtype))
        else:
            p.data += shift.astype(p.dtype)
    check_equivalence(f"LayerNorm{shape}", ours, theirs, [normal(2, 3, *shape) * 3 + 1], dtype, direction)


def test_load_accepts_torch_parameters_that_require_grad():
    theirs = torch.nn.Linear(3, 2).double()
    ours = nn.Linear(3, 2)
    ours.load_state_dict(dict(theirs.named_parameters()))  # Parameters, not state_dict()'s detached tensors
    np.testing.assert_array_equal(ours.weight.data, theirs.weight.detach().numpy().astype(np.float32))
    assert ours.weight.dtype == np.float32


@dtypes
@both_ways
def test_sequential_of_activations_dropout_and_plain_layer_norms(dtype, direction):
    """Sequential's names ("0.weight", "2.bias", ...), ReLU, both GELUs,
    Dropout(0), and LayerNorm without affine parameters or without bias."""
    tg.manual_seed(0), torch.manual_seed(0)

    def build(lib):
        return lib.Sequential(lib.Linear(5, 6), lib.ReLU(), lib.Linear(6, 6), lib.GELU(),
                              lib.LayerNorm(6, bias=False), lib.Linear(6, 4), lib.GELU(approximate="tanh"),
                              lib.Dropout(0.0), lib.LayerNorm(4, elementwise_affine=False))
    check_equivalence("Sequential(Linear, ReLU, GELU, LayerNorm variants)", build(nn), build(torch.nn),
                      [normal(2, 3, 5) * 2], dtype, direction)


# ------------------------------------------------------------ attention

def run_attention(self_attention):
    def run(m, *xs, **masks):
        q, k, v = (xs * 3) if self_attention else xs
        out, weights = m(q, k, v, **masks)  # the same call for both: need_weights=True by default
        return out if weights is None else (out, weights)
    return run


def check_attention(case, kwargs, inputs, masks, dtype, direction, self_attention=False):
    tg.manual_seed(0), torch.manual_seed(0)
    torch_kwargs = {k: v for k, v in kwargs.items() if k != "head_dim"}
    check_equivalence(case, nn.MultiHeadAttention(**kwargs), torch.nn.MultiheadAttention(**torch_kwargs),
                      inputs, dtype, direction, masks, run_attention(self_attention))


ATTENTION_CASES = {  # name: (constructor arguments, self-attention?, masks(L, S))
    "MHA self-attn + key_padding_mask": (dict(), True, lambda L, S: dict(key_padding_mask=padding(2, L))),
    "MHA cross-attn, kdim/vdim": (dict(kdim=3, vdim=5), False, lambda L, S: {}),
    "MHA bool attn_mask (L, S)": (dict(), False, lambda L, S: dict(
        attn_mask=np.random.default_rng(1).random((L, S)) < 0.3 * (np.arange(S) > 0))),
    "MHA float attn_mask (B*H, L, S) + float padding": (dict(), False, lambda L, S: dict(
        attn_mask=normal(2 * 2, L, S), key_padding_mask=np.where(padding(2, S), -np.inf, 0.0))),
    "MHA is_causal hint + causal attn_mask": (dict(), True, lambda L, S: dict(
        is_causal=True, attn_mask=causal(L), need_weights=False)),
    "MHA is_causal + attn_mask + key_padding_mask": (dict(), True, lambda L, S: dict(
        is_causal=True, attn_mask=causal(L), key_padding_mask=padding(2, L))),
    "MHA need_weights averaged": (dict(), False, lambda L, S: dict(need_weights=True)),
    "MHA need_weights per head + masks": (dict(kdim=3, vdim=3), False, lambda L, S: dict(
        need_weights=True, average_attn_weights=False, key_padding_mask=padding(2, S))),
    "MHA batch_first=False, no bias": (dict(batch_first=False, bias=False), False, lambda L, S: {}),
}


@dtypes
@both_ways
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_cases(case, dtype, direction):
    extra, self_attention, masks = ATTENTION_CASES[case]
    kwargs = dict(embed_dim=8, num_heads=2, batch_first=True)
    kwargs.update(extra)
    L, S = 4, 5
    shape = (lambda T, d: (2, T, d)) if kwargs["batch_first"] else (lambda T, d: (T, 2, d))
    if self_attention:
        inputs = [normal(*shape(L, 8))]
    else:
        inputs = [normal(*shape(L, 8)), normal(*shape(S, kwargs.get("kdim", 8)), seed=1),
                  normal(*shape(S, kwargs.get("vdim", 8)), seed=2)]
    check_attention(case, kwargs, inputs, masks(L, S), dtype, direction, self_attention)


@given(case=attention_cases(torch_compatible=True, max_side=4),
       direction=st.sampled_from(["torch->ours", "ours->torch"]))
def test_attention_drawn_by_hypothesis(case, direction):
    """float64 only: with random shapes, some gradients nearly cancel (the key
    projection under a nearly uniform softmax, say) and in float32 their
    relative error is rounding noise over a tiny value (5e-6 seen); the
    fixed cases above cover float32."""
    masks = dict(key_padding_mask=case.key_padding_mask, attn_mask=case.attn_mask,
                 need_weights=case.need_weights, average_attn_weights=case.average_attn_weights,
                 is_causal=case.is_causal)
    inputs = [case.query] if case.self_attention else [case.query, case.key, case.value]
    check_attention("MHA (hypothesis: shapes, masks, unbatched)", case.kwargs, inputs, masks, "float64",
                    direction, case.self_attention)


# ----------------------------------------------------- transformer layers

def layer_kwargs(activation, norm_first):
    return dict(d_model=8, nhead=2, dim_feedforward=12, dropout=0.0, activation=activation,
                norm_first=norm_first, batch_first=True)


layer_variants = pytest.mark.parametrize("activation, norm_first", [
    ("relu", False), ("relu", True), ("gelu", False), ("gelu", True)])


@dtypes
@both_ways
@layer_variants
def test_encoder_layer(dtype, direction, activation, norm_first):
    tg.manual_seed(0), torch.manual_seed(0)
    kw = layer_kwargs(activation, norm_first)
    check_equivalence(f"EncoderLayer({activation}, norm_first={norm_first})",
                      nn.TransformerEncoderLayer(**kw), torch.nn.TransformerEncoderLayer(**kw),
                      [normal(2, 5, 8)], dtype, direction,
                      extras=dict(src_mask=causal(5), src_key_padding_mask=padding(2, 5)))


@dtypes
@both_ways
@layer_variants
def test_decoder_layer(dtype, direction, activation, norm_first):
    tg.manual_seed(0), torch.manual_seed(0)
    kw = layer_kwargs(activation, norm_first)
    masks = dict(tgt_mask=causal(4), tgt_key_padding_mask=padding(2, 4),
                 memory_key_padding_mask=padding(2, 5), memory_mask=normal(4, 5, seed=3))
    check_equivalence(f"DecoderLayer({activation}, norm_first={norm_first})",
                      nn.TransformerDecoderLayer(**kw), torch.nn.TransformerDecoderLayer(**kw),
                      [normal(2, 4, 8), normal(2, 5, 8, seed=1)], dtype, direction, masks)


@dtypes
@both_ways
def test_encoder_and_decoder_stacks(dtype, direction):
    tg.manual_seed(0), torch.manual_seed(0)
    kw = layer_kwargs("gelu", False)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(**kw), 2, nn.LayerNorm(8))
    enc_t = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(**kw), 2, torch.nn.LayerNorm(8),
                                        enable_nested_tensor=False)
    check_equivalence("TransformerEncoder(2 layers + norm)", enc, enc_t, [normal(2, 5, 8)], dtype, direction,
                      extras=dict(src_key_padding_mask=padding(2, 5)))
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), 2, nn.LayerNorm(8))
    dec_t = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(**kw), 2, torch.nn.LayerNorm(8))
    masks = dict(tgt_mask=nn.Transformer.generate_square_subsequent_mask(4).data,
                 memory_key_padding_mask=padding(2, 5))
    check_equivalence("TransformerDecoder(2 layers + norm)", dec, dec_t,
                      [normal(2, 4, 8), normal(2, 5, 8, seed=1)], dtype, direction, masks)


@dtypes
@both_ways
@pytest.mark.parametrize("norm_first", [False, True])
def test_full_transformer(dtype, direction, norm_first):
    tg.manual_seed(0), torch.manual_seed(0)
    kw = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16,
              dropout=0.0, norm_first=norm_first, batch_first=True)
    masks = dict(tgt_mask=nn.Transformer.generate_square_subsequent_mask(4).data,
                 src_key_padding_mask=padding(2, 5), memory_key_padding_mask=padding(2, 5),
                 tgt_key_padding_mask=np.zeros((2, 4), dtype=bool))
    check_equivalence(f"Transformer(2+2, norm_first={norm_first})", nn.Transformer(**kw),
                      torch.nn.Transformer(**kw), [normal(2, 5, 8), normal(2, 4, 8, seed=1)],
                      dtype, direction, masks)


# ------------------------------------------------------------ default init

INIT_CASES = {  # the same call builds our layer (lib=nn) and PyTorch's (lib=torch.nn)
    "Transformer": lambda lib: lib.Transformer(d_model=64, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                               dim_feedforward=256, batch_first=True),
    "TransformerEncoderLayer": lambda lib: lib.TransformerEncoderLayer(64, 4, 1024, batch_first=True),
    "TransformerDecoderLayer": lambda lib: lib.TransformerDecoderLayer(64, 4, 1024, batch_first=True),
    "MultiheadAttention(kdim, vdim)": lambda lib: lib.MultiheadAttention(64, 4, kdim=96, vdim=80,
                                                                         batch_first=True),
    "Embedding(padding_idx)": lambda lib: lib.Embedding(300, 64, padding_idx=0),
    "Linear": lambda lib: lib.Linear(40, 1000),
    "LayerNorm": lambda lib: lib.LayerNorm(64),
}


@pytest.mark.parametrize("case", list(INIT_CASES))
def test_default_inits_match_pytorchs_distributions(case):
    """Each parameter is drawn from the same distribution as PyTorch's:
    constant ones are equal; on those with 1000+ entries the standard
    deviations agree to 5% (a wrong scale fails) and a two-sample
    Kolmogorov-Smirnov test does not tell ours from theirs, p > 1e-4 (a
    normal in place of a uniform of the same std gives p ~ 1e-7 on the
    4000+-entry matrices)."""
    from scipy.stats import ks_2samp
    tg.manual_seed(0), torch.manual_seed(0)
    ours, theirs = INIT_CASES[case](nn), dict(INIT_CASES[case](torch.nn).named_parameters())
    assert [name for name, _ in ours.named_parameters()] == list(theirs)
    for name, p in ours.named_parameters():
        t = theirs[name].detach().numpy()
        if t.std() == 0:
            np.testing.assert_array_equal(p.data, t, err_msg=name)  # zeros, ones, a zero padding row
        elif t.size >= 1000:
            assert ks_2samp(p.data.ravel(), t.ravel()).pvalue > 1e-4, name
            assert abs(p.data.std() / t.std() - 1) < 0.05, name
