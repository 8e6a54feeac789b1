"""The module system: names, traversal, state dicts, modes, dtype, repr,
and the default initialisations (statistics and PyTorch's bounds)."""
import copy
import math
from collections import OrderedDict

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import nn
from tinygrad_attn.nn import init

from .nn_helpers import module_gradcheck


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(np.ones(3, np.float32))
        self.proj = nn.Linear(3, 2)
        self.register_buffer("steps", tg.zeros(1))
        self.register_buffer("cache", tg.zeros(2), persistent=False)

    def forward(self, x):
        return self.proj(x * self.scale)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.heads = nn.ModuleDict({"a": nn.Linear(2, 1), "b": nn.Linear(2, 1, bias=False)})
        self.mlp = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Dropout(0.5))
        self.named = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2), act=nn.GELU()))
        self.not_a_module = [nn.Linear(1, 1)]  # a plain list is not looked into (as in PyTorch)

    def forward(self, x):
        for block in self.blocks:
            x = block(x) @ tg.ones(2, 3) if block is not self.blocks[-1] else block(x)
        return self.heads["a"](self.named(self.mlp(x)))


PARAMS = ["blocks.0.scale", "blocks.0.proj.weight", "blocks.0.proj.bias",
          "blocks.1.scale", "blocks.1.proj.weight", "blocks.1.proj.bias",
          "heads.a.weight", "heads.a.bias", "heads.b.weight",
          "mlp.0.weight", "mlp.0.bias", "named.fc.weight", "named.fc.bias"]


def test_named_parameters_are_dotted_paths_in_definition_order():
    net = Net()
    assert [name for name, _ in net.named_parameters()] == PARAMS
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert [n for n, _ in net.named_parameters(recurse=False)] == []
    assert [n for n, _ in net.blocks[0].named_parameters(prefix="first")] == [
        "first.scale", "first.proj.weight", "first.proj.bias"]


def test_children_modules_and_buffers():
    net = Net()
    assert [n for n, _ in net.named_children()] == ["blocks", "heads", "mlp", "named"]
    names = [n for n, _ in net.named_modules()]
    assert names[:5] == ["", "blocks", "blocks.0", "blocks.0.proj", "blocks.1"]
    assert "mlp.1" in names and "named.act" in names and len(list(net.modules())) == len(names)
    assert net.get_submodule("blocks.1.proj") is net.blocks[1].proj
    with pytest.raises(AttributeError, match="no sub-module 'nope'"):
        net.get_submodule("blocks.nope")
    assert [n for n, _ in net.named_buffers()] == ["blocks.0.steps", "blocks.0.cache",
                                                   "blocks.1.steps", "blocks.1.cache"]


def test_state_dict_holds_parameters_and_persistent_buffers():
    net = Net()
    state = net.state_dict()
    # Per module: own parameters, own persistent buffers, then children (PyTorch's order).
    expected = (PARAMS[:1] + ["blocks.0.steps"] + PARAMS[1:4] + ["blocks.1.steps"] + PARAMS[4:])
    assert list(state) == expected
    assert all(not t.requires_grad for t in state.values())
    assert net.state_dict(keep_vars=True)["heads.a.weight"] is net.heads["a"].weight
    assert state["heads.a.weight"].data is net.heads["a"].weight.data  # shares memory, as in PyTorch


def test_state_dict_round_trip_reproduces_the_model():
    tg.manual_seed(0)
    a = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    tg.manual_seed(1)
    b = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    x = tg.randn(2, 5, 8)
    assert not np.allclose(a(x).data, b(x).data)
    result = b.load_state_dict({k: v.data.copy() for k, v in a.state_dict().items()})
    assert result == ([], []) and result.missing_keys == []
    np.testing.assert_array_equal(a(x).data, b(x).data)
    # Loading copies in place: the Parameter objects an optimizer holds stay valid.
    w = b.linear1.weight
    b.load_state_dict(a.state_dict())
    assert b.linear1.weight is w


def _snapshot(module):
    return {k: v.data.copy() for k, v in module.state_dict().items()}


def test_strict_load_reports_every_problem_by_name_and_loads_nothing():
    net = Net()
    before = _snapshot(net)
    state = {k: np.full(v.shape, 9.0) for k, v in before.items()}
    del state["mlp.0.bias"]
    state["mlp.5.weight"] = np.zeros(2)
    state["heads.a.weight"] = np.zeros((2, 1))
    with pytest.raises(nn.StateDictError) as err:
        net.load_state_dict(state)
    message = str(err.value)
    assert "Net" in message and "nothing was loaded" in message
    assert "'mlp.0.bias'" in message and "'mlp.5.weight'" in message
    assert "shape mismatch for 'heads.a.weight': the state dict has (2, 1), the model (1, 2)" in message
    assert err.value.missing_keys == ["mlp.0.bias"] and err.value.unexpected_keys == ["mlp.5.weight"]
    after = _snapshot(net)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_non_strict_load_skips_missing_and_unexpected_but_not_shape_errors():
    net = Net()
    state = {"heads.a.bias": np.array([5.0]), "extra": np.zeros(1)}
    result = net.load_state_dict(state, strict=False)
    assert result.unexpected_keys == ["extra"] and "heads.a.weight" in result.missing_keys
    assert net.heads["a"].bias.data[0] == 5.0 and net.heads["a"].bias.dtype == np.float32
    with pytest.raises(nn.StateDictError, match="shape mismatch for 'heads.a.bias'"):
        net.load_state_dict({"heads.a.bias": np.zeros(2)}, strict=False)
    with pytest.raises(nn.StateDictError, match="cannot load complex128 into float32"):
        net.load_state_dict({"heads.a.bias": np.zeros(1, complex)}, strict=False)


def test_tied_parameters_are_listed_once_but_saved_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.out = nn.Linear(3, 5, bias=False)
            self.out.weight = self.embed.weight

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["embed.weight"]
    assert m.num_parameters() == 15
    assert list(m.state_dict()) == ["embed.weight", "out.weight"]
    m.load_state_dict({"embed.weight": np.ones((5, 3)), "out.weight": np.ones((5, 3))})


def test_train_eval_propagate_and_switch_dropout():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net and not any(m.training for m in net.modules())
    x = tg.randn(4, 2)
    np.testing.assert_array_equal(net.mlp(x).data, np.maximum(net.mlp[0](x).data, 0))
    net.train()
    assert all(m.training for m in net.modules())


def test_zero_grad_and_requires_grad():
    layer = nn.Linear(3, 2)
    layer(tg.randn(4, 3)).sum().backward()
    assert layer.weight.grad is not None
    layer.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(layer.weight.grad.data, 0)
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None
    layer.requires_grad_(False)
    assert not any(p.requires_grad for p in layer.parameters())
    assert layer.num_parameters(trainable_only=True) == 0 and layer.num_parameters() == 8


def test_to_dtype_converts_parameters_buffers_and_grads_in_place():
    model = nn.Sequential(nn.Linear(3, 3), nn.PositionalEncoding(3, max_len=4))
    weight = model[0].weight
    model[0](tg.randn(2, 3)).sum().backward()
    assert model.double() is model
    assert model[0].weight is weight and weight.dtype == np.float64 and weight.grad.dtype == np.float64
    assert model[1].pe.dtype == np.float64
    assert model(tg.randn(2, 3, dtype="float64")).dtype == np.float64
    model.float()
    assert weight.dtype == np.float32 and model[1].pe.dtype == np.float32
    with pytest.raises(TypeError, match="cannot convert to int64"):
        model.to("int64")


def test_repr_is_a_readable_tree():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Dropout(0.1)))
    assert repr(model) == (
        "Sequential(\n"
        "  (0): Linear(in_features=4, out_features=8, bias=True)\n"
        "  (1): ReLU()\n"
        "  (2): Sequential(\n"
        "    (0): Dropout(p=0.1)\n"
        "  )\n"
        ")")
    text = repr(nn.MultiHeadAttention(4, 8, head_dim=3))
    assert text.startswith("MultiheadAttention(\n  embed_dim=4, num_heads=8, head_dim=3")
    assert "(out_proj): Linear(in_features=24, out_features=4, bias=True)" in text
    assert repr(nn.Parameter(np.zeros(2, np.float32))).startswith("Parameter containing:\ntensor(")


def test_parameter_count_and_summary():
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    # attention 3*8*8 + 3*8 + 8*8 + 8, feed-forward 8*16 + 16 + 16*8 + 8, two norms 2 * 16
    expected = (3 * 64 + 24 + 64 + 8) + (128 + 16 + 128 + 8) + 32
    assert layer.num_parameters() == expected
    table = layer.summary()
    assert "self_attn.in_proj_weight" in table and "(24, 8)" in table
    assert table.splitlines()[-1].split()[-1] == f"{expected:,}"


def test_containers():
    lst = nn.ModuleList([nn.ReLU()])
    lst.append(nn.Linear(1, 1)).extend([nn.GELU()])
    lst.insert(0, nn.Identity())
    assert len(lst) == 4 and isinstance(lst[0], nn.Identity) and isinstance(lst[-1], nn.GELU)
    assert isinstance(lst[1:3], nn.ModuleList) and len(lst[1:3]) == 2
    assert [n for n, _ in lst.named_parameters()] == ["2.weight", "2.bias"]
    with pytest.raises(TypeError, match="ModuleList holds Modules, got int"):
        lst.append(3)
    d = nn.ModuleDict({"train": nn.Linear(1, 1)})  # a key may shadow no method
    assert "train" in d and list(d.keys()) == ["train"] and len(d) == 1
    d.train(False)
    assert not d["train"].training
    with pytest.raises(KeyError, match="without '.'"):
        d["a.b"] = nn.ReLU()
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    seq.append(nn.Linear(3, 1))
    x = tg.randn(5, 2)
    np.testing.assert_allclose(seq(x).data, seq[2](seq[1](seq[0](x))).data)
    assert isinstance(seq[:2], nn.Sequential) and len(seq[:2]) == 2
    named = nn.Sequential(OrderedDict(a=nn.Linear(1, 1)))
    assert [n for n, _ in named.named_parameters()] == ["a.weight", "a.bias"]


def test_apply_visits_every_module_and_deepcopy_is_independent():
    net = Net()
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen.count("Linear") == 6
    clone = copy.deepcopy(net)
    assert clone.blocks[0].proj.weight is not net.blocks[0].proj.weight
    np.testing.assert_array_equal(clone.blocks[0].proj.weight.data, net.blocks[0].proj.weight.data)


def test_module_without_forward_or_init():
    with pytest.raises(NotImplementedError, match="Block2 does not define forward"):
        type("Block2", (nn.Module,), {})()(1)

    class NoInit(nn.Module):
        def __init__(self):
            self.layer = nn.Linear(1, 1)
    with pytest.raises(AttributeError, match="forget to call super"):
        NoInit().state_dict()


def test_module_gradcheck_catches_a_wrong_parameter_gradient():
    """Negative control: a layer whose backward ignores its weight must fail."""
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(np.ones(3))

        def forward(self, x):
            return x * self.w.detach() + self.w * 0

    with pytest.raises(tg.GradcheckError):
        module_gradcheck(Broken(), [tg.Tensor(np.arange(3.0), requires_grad=True)])


# ----------------------------------------------------------------- init

def test_init_functions_statistics_and_bounds():
    tg.manual_seed(0)
    w = tg.zeros(400, 300)
    init.normal_(w, mean=1.0, std=2.0)
    assert abs(w.data.mean() - 1.0) < 0.02 and abs(w.data.std() - 2.0) < 0.02
    init.uniform_(w, -3, 1)
    assert w.data.min() >= -3 and w.data.max() <= 1 and abs(w.data.mean() + 1) < 0.02
    init.xavier_uniform_(w, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 700)
    assert np.abs(w.data).max() <= bound and np.abs(w.data).max() > 0.99 * bound
    init.xavier_normal_(w)
    assert abs(w.data.std() / math.sqrt(2 / 700) - 1) < 0.01
    init.kaiming_uniform_(w, a=0, nonlinearity="relu")
    bound = math.sqrt(2) * math.sqrt(3 / 300)
    assert np.abs(w.data).max() <= bound and np.abs(w.data).max() > 0.99 * bound
    init.kaiming_normal_(w, mode="fan_out", nonlinearity="relu")
    assert abs(w.data.std() / (math.sqrt(2) / math.sqrt(400)) - 1) < 0.01
    init.zeros_(w)
    assert not w.data.any()
    init.ones_(w)
    assert (w.data == 1).all() and w.dtype == np.float32
    assert init.calculate_fan_in_and_fan_out(tg.zeros(5, 4, 3)) == (12, 15)
    assert init.calculate_gain("tanh") == 5 / 3 and init.calculate_gain("leaky_relu", 0) == math.sqrt(2)
    with pytest.raises(ValueError, match="at least 2 dimensions, got shape \\(3,\\)"):
        init.xavier_uniform_(tg.zeros(3))
    with pytest.raises(ValueError, match="mode must be"):
        init.kaiming_uniform_(w, mode="fan")


def test_manual_seed_reproduces_initialisation():
    def build(seed):
        tg.manual_seed(seed)
        return nn.Transformer(d_model=8, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=8).state_dict()
    a, b, c = build(3), build(3), build(4)
    assert all(np.array_equal(a[k].data, b[k].data) for k in a)
    key = "encoder.layers.0.linear1.weight"
    assert not np.array_equal(a[key].data, c[key].data)


def _spans(values, bound):
    """Inside [-bound, bound] and reaching close to both ends (so the bound is not smaller)."""
    return np.abs(values).max() <= bound and values.max() > 0.9 * bound and values.min() < -0.9 * bound


def test_default_inits_use_pytorchs_formulas():
    tg.manual_seed(0)
    lin = nn.Linear(50, 300)
    assert _spans(lin.weight.data, 1 / math.sqrt(50)) and _spans(lin.bias.data, 1 / math.sqrt(50))
    emb = nn.Embedding(200, 100, padding_idx=3)
    rows = np.delete(emb.weight.data, 3, axis=0)
    assert abs(rows.mean()) < 0.01 and abs(rows.std() - 1) < 0.01 and not emb.weight.data[3].any()
    ln = nn.LayerNorm(7)
    assert (ln.weight.data == 1).all() and not ln.bias.data.any()
    mha = nn.MultiHeadAttention(64, 4)
    assert _spans(mha.in_proj_weight.data, math.sqrt(6 / (64 + 3 * 64)))  # xavier over (3E, E)
    assert _spans(mha.out_proj.weight.data, 1 / math.sqrt(64))            # Linear's default
    assert not mha.in_proj_bias.data.any() and not mha.out_proj.bias.data.any()
    cross = nn.MultiHeadAttention(64, 4, kdim=32, vdim=16)
    assert cross.in_proj_weight is None
    assert _spans(cross.k_proj_weight.data, math.sqrt(6 / (32 + 64)))
    assert _spans(cross.v_proj_weight.data, math.sqrt(6 / (16 + 64)))
    # nn.Transformer re-initialises every matrix xavier_uniform; biases keep their layer's init.
    model = nn.Transformer(d_model=64, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                           dim_feedforward=128)
    layer = model.encoder.layers[0]
    assert _spans(layer.linear1.weight.data, math.sqrt(6 / (64 + 128)))
    assert _spans(layer.self_attn.out_proj.weight.data, math.sqrt(6 / 128))
    assert _spans(layer.linear1.bias.data, 1 / math.sqrt(64))
    assert not layer.self_attn.in_proj_bias.data.any()
