"""Optimizers: hand-computed updates, PyTorch trajectories, param groups,
state_dict save/load, gradient clipping and bad input."""
import io
import itertools
import math

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import Tensor, optim
from tinygrad_attn.optim import SGD, Adam, AdamW, clip_grad_norm_, clip_grad_value_

P0 = np.array([1.0, -2.0])


def param(values=P0, dtype=np.float64):
    return Tensor(np.array(values, dtype=dtype), requires_grad=True)


def run(opt, p, grads):
    """Feed the given gradients one step at a time; return p after each step."""
    out = []
    for g in grads:
        p.grad = Tensor(np.array(g, dtype=p.dtype))
        opt.step()
        out.append(p.data.copy())
    return out


def run_quadratic(opt, p, steps):
    """Minimise L = sum(p^2) / 2 (so dL/dp = p) through autograd."""
    out = []
    for _ in range(steps):
        opt.zero_grad()
        ((p * p).sum() * 0.5).backward()
        opt.step()
        out.append(p.data.copy())
    return out


# ----------------------------------------------------- hand-computed updates

def test_sgd_plain_and_maximize_by_hand():
    p = param()
    traj = run_quadratic(SGD([p], lr=0.1), p, 3)
    # p <- p - 0.1 p = 0.9 p each step
    np.testing.assert_allclose(traj, [0.9 * P0, 0.81 * P0, 0.729 * P0], rtol=1e-12)
    p = param()
    traj = run_quadratic(SGD([p], lr=0.1, maximize=True), p, 2)
    np.testing.assert_allclose(traj, [1.1 * P0, 1.21 * P0], rtol=1e-12)


def test_sgd_momentum_dampening_weight_decay_by_hand():
    # lr 0.1, momentum 0.9, dampening 0.1, weight decay 0.1; g = p, so g + wd p = 1.1 p.
    # All values are multiples of p0:
    # step 1: g = 1.1,            b = g = 1.1                     p = 1 - 0.11 = 0.89
    # step 2: g = 1.1*0.89=0.979, b = 0.9*1.1 + 0.9*0.979 = 1.8711 p = 0.89 - 0.18711 = 0.70289
    # step 3: g = 0.773179,       b = 0.9*1.8711 + 0.9*0.773179 = 2.3798511
    #                                                              p = 0.70289 - 0.23798511 = 0.46490489
    p = param()
    opt = SGD([p], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.1)
    traj = run_quadratic(opt, p, 3)
    np.testing.assert_allclose(traj, [0.89 * P0, 0.70289 * P0, 0.46490489 * P0], rtol=1e-12)
    np.testing.assert_allclose(opt.state[p]["momentum_buffer"], 2.3798511 * P0, rtol=1e-12)


def test_sgd_nesterov_by_hand():
    # lr 0.1, momentum 0.5, g = p; the step uses g + 0.5 b.
    # step 1: g = 1,      b = 1                  upd = 1.5       p = 0.85
    # step 2: g = 0.85,   b = 0.5 + 0.85 = 1.35  upd = 1.525     p = 0.6975
    # step 3: g = 0.6975, b = 0.675 + 0.6975 = 1.3725  upd = 1.38375  p = 0.559125
    p = param()
    traj = run_quadratic(SGD([p], lr=0.1, momentum=0.5, nesterov=True), p, 3)
    np.testing.assert_allclose(traj, [0.85 * P0, 0.6975 * P0, 0.559125 * P0], rtol=1e-12)


def test_adam_bias_correction_by_hand_constant_gradient():
    # With a constant gradient g, m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2, so the
    # bias-corrected step is exactly lr * g / (|g| + eps): t * lr after t steps.
    # (Without bias correction, step 1 would move lr * 0.1 / sqrt(0.001) = 3.16 lr.)
    g = np.array([2.0, -0.5])
    p = param()
    traj = run(Adam([p], lr=0.1), p, [g] * 3)
    for t, pt in enumerate(traj, 1):
        np.testing.assert_allclose(pt, P0 - t * 0.1 * g / (np.abs(g) + 1e-8), rtol=1e-12)


def test_adam_two_steps_by_hand():
    # lr 0.1, betas (0.9, 0.999), eps 1e-8, scalar p0 = 1, g = p.
    p = param([1.0])
    traj = run_quadratic(Adam([p], lr=0.1), p, 2)
    p1 = 1 - 0.1 * 1 / (1 + 1e-8)             # step 1: m_hat = g, v_hat = g^2
    m = 0.9 * 0.1 + 0.1 * p1                   # step 2: m_1 = 0.1, v_1 = 0.001
    v = 0.999 * 0.001 + 0.001 * p1 ** 2
    p2 = p1 - 0.1 / (1 - 0.9 ** 2) * m / (math.sqrt(v) / math.sqrt(1 - 0.999 ** 2) + 1e-8)
    np.testing.assert_allclose([traj[0][0], traj[1][0]], [p1, p2], rtol=1e-12)


def test_adam_l2_versus_adamw_decoupled_by_hand():
    g = np.array([2.0, -0.5])
    # Adam: the decay enters the gradient: g' = g + 0.5 p; step 1 moves lr * sign(g').
    p = param()
    (adam1,) = run(Adam([p], lr=0.1, weight_decay=0.5), p, [g])
    g_eff = g + 0.5 * P0
    np.testing.assert_allclose(adam1, P0 - 0.1 * g_eff / (np.abs(g_eff) + 1e-8), rtol=1e-12)
    # AdamW: p <- p (1 - lr wd) first, then the plain Adam step on g.
    p = param()
    traj = run(AdamW([p], lr=0.1, weight_decay=0.5), p, [g] * 2)
    step = 0.1 * g / (np.abs(g) + 1e-8)
    p1 = P0 * 0.95 - step
    np.testing.assert_allclose(traj, [p1, p1 * 0.95 - step], rtol=1e-12)


def test_amsgrad_uses_the_largest_second_moment_by_hand():
    grads = [[10.0], [0.1]]
    # step 1: m = 1, v = 0.1; step 2: m = 0.9 + 0.01 = 0.91, v = 0.0999 + 1e-5 = 0.09991 < 0.1
    step1 = 0.1 * (1 / 0.1) / (math.sqrt(0.1 / 0.001) + 1e-8)
    m2_hat, bc2 = 0.91 / (1 - 0.81), math.sqrt(1 - 0.999 ** 2)
    for amsgrad, v2 in [(True, 0.1), (False, 0.09991)]:
        p = param([0.0])
        traj = run(Adam([p], lr=0.1, amsgrad=amsgrad), p, grads)
        expected = -step1 - 0.1 * m2_hat / (math.sqrt(v2) / bc2 + 1e-8)
        np.testing.assert_allclose(traj[1], [expected], rtol=1e-12)


# ------------------------------------------------------- against PyTorch

def _sgd_cases():
    for momentum, dampening, wd, nesterov, maximize in itertools.product(
            [0.0, 0.9], [0.0, 0.3], [0.0, 0.05], [False, True], [False, True]):
        if nesterov and (momentum == 0 or dampening != 0):
            continue
        yield ("SGD", dict(lr=0.05, momentum=momentum, dampening=dampening, weight_decay=wd,
                           nesterov=nesterov, maximize=maximize))


def _adam_cases():
    for name, wd, amsgrad, maximize, betas in itertools.product(
            ["Adam", "AdamW"], [0.0, 0.1], [False, True], [False, True], [(0.9, 0.999), (0.8, 0.9)]):
        yield (name, dict(lr=0.02, betas=betas, eps=1e-8, weight_decay=wd, amsgrad=amsgrad,
                          maximize=maximize))


CASES = list(_sgd_cases()) + list(_adam_cases())


def _mlp_init(seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(3, 5), (5,), (5, 2), (2,)]
    params = [rng.standard_normal(s) * 0.7 for s in shapes]
    return params, rng.standard_normal((8, 3)), rng.standard_normal((8, 2))


def _mlp_loss(params, x, y):
    """mean((tanh(x W1 + b1) W2 + b2 - y)^2): the same code runs on our tensors and torch's."""
    w1, b1, w2, b2 = params
    h = (x @ w1 + b1).tanh()
    d = h @ w2 + b2 - y
    return (d * d).mean()


def _compare_with_torch(torch, name, group_kwargs, steps=20):
    """Run our optimizer and torch's on the same MLP in float64; both see
    the gradient of their own parameters, computed by their own autograd."""
    arrays, x, y = _mlp_init()
    ours = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
    split = [(0, 2), (2, 4)]  # group 0: layer 1, group 1: layer 2
    ours_groups = [{"params": ours[a:b], **kw} for (a, b), kw in zip(split, group_kwargs)]
    theirs_groups = [{"params": theirs[a:b], **kw} for (a, b), kw in zip(split, group_kwargs)]
    opt = getattr(optim, name)(ours_groups)
    topt = getattr(torch.optim, name)(theirs_groups)
    xt, yt = torch.tensor(x), torch.tensor(y)
    for _ in range(steps):
        opt.zero_grad()
        _mlp_loss(ours, Tensor(x), Tensor(y)).backward()
        opt.step()
        topt.zero_grad()
        _mlp_loss(theirs, xt, yt).backward()
        topt.step()
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.data, b.detach().numpy(), rtol=0, atol=1e-6)
    # the parameters moved (the comparison is not vacuous)
    assert not np.allclose(ours[0].data, arrays[0], atol=1e-3)
    return ours, theirs


@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_trajectory_equals_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    _compare_with_torch(torch, name, [kwargs, kwargs])


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_param_groups_with_different_hyperparameters_equal_torch(name):
    torch = pytest.importorskip("torch")
    if name == "SGD":
        groups = [dict(lr=0.1, momentum=0.9, weight_decay=0.01),
                  dict(lr=0.02, momentum=0.5, nesterov=True)]
    else:
        groups = [dict(lr=0.03, betas=(0.8, 0.99), weight_decay=0.1),
                  dict(lr=0.01, amsgrad=True, weight_decay=0.0)]
    _compare_with_torch(torch, name, groups)


def test_group_defaults_are_filled_and_overridden():
    a, b = param(), param()
    opt = AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0, "lr": 0.5}], lr=0.1)
    g0, g1 = opt.param_groups
    assert g0["lr"] == 0.1 and g0["weight_decay"] == 1e-2 and g0["betas"] == (0.9, 0.999)
    assert g1["lr"] == 0.5 and g1["weight_decay"] == 0.0 and g1["amsgrad"] is False
    c = param()
    opt.add_param_group({"params": c, "lr": 0.2})
    assert opt.param_groups[2]["params"] == [c] and opt.param_groups[2]["eps"] == 1e-8


# ---------------------------------------------------------- step mechanics

@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
                                  lambda ps: Adam(ps, weight_decay=0.1, amsgrad=True),
                                  lambda ps: AdamW(ps)])
def test_float32_stays_float32_and_grads_are_not_modified(make):
    p = param(dtype=np.float32)
    opt = make([p])
    opt.param_groups[0]["lr"] = np.float64(0.01)  # a numpy float lr must not upcast either
    for _ in range(3):
        p.grad = Tensor(np.array([0.5, -1.0], dtype=np.float32))
        before = p.grad.data.copy()
        data_id = id(p.data)
        opt.step()
        np.testing.assert_array_equal(p.grad.data, before)
    assert p.dtype == np.float32 and id(p.data) == data_id  # updated in place
    assert all(v.dtype == np.float32 for v in opt.state[p].values() if isinstance(v, np.ndarray))
    assert p.is_leaf and p.requires_grad


def test_params_without_grad_are_skipped():
    a, b = param(), param()
    opt = Adam([a, b], lr=0.1)
    a.grad = Tensor(np.ones(2))
    opt.step()
    np.testing.assert_array_equal(b.data, P0)
    assert b not in opt.state and opt.state[a]["step"] == 1


def test_step_builds_no_graph_and_closure_returns_loss():
    p = param()
    opt = SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == pytest.approx(5.0)
    assert p.is_leaf and p.grad_fn is None
    np.testing.assert_allclose(p.data, 0.8 * P0)


def test_zero_grad_to_none_or_to_zeros():
    p = param()
    opt = SGD([p], lr=0.1)
    p.grad = Tensor(np.ones(2))
    opt.zero_grad(set_to_none=False)
    np.testing.assert_array_equal(p.grad.data, [0.0, 0.0])
    opt.zero_grad()
    assert p.grad is None


def test_works_with_tensor_subclasses():
    class Parameter(Tensor):
        __slots__ = ()

    p = Parameter(np.array([1.0]), requires_grad=True)
    opt = SGD([p], lr=0.5)
    p.grad = Tensor(np.array([1.0]))
    opt.step()
    np.testing.assert_allclose(p.data, [0.5])


# ---------------------------------------------------------- state dict

def _train(opt, params, steps, start=0):
    """Deterministic gradients that depend on the parameters and the step."""
    for t in range(start, start + steps):
        for i, p in enumerate(params):
            p.grad = Tensor(np.sin(p.data * (i + 1) + t) + 0.1 * p.data)
        opt.step()


@pytest.mark.parametrize("make", [
    lambda ps: SGD([{"params": ps[:1]}, {"params": ps[1:], "lr": 0.05}], lr=0.1, momentum=0.9),
    lambda ps: Adam([{"params": ps[:1], "amsgrad": True}, {"params": ps[1:]}], lr=0.05, weight_decay=0.1),
    lambda ps: AdamW(ps, lr=0.05)])
def test_state_dict_resume_gives_the_identical_trajectory(make):
    init = [np.linspace(-1, 1, 6).reshape(2, 3), np.array([0.5, -0.25])]
    full = [Tensor(a.copy(), requires_grad=True) for a in init]
    opt = make(full)
    _train(opt, full, 20)

    half = [Tensor(a.copy(), requires_grad=True) for a in init]
    opt = make(half)
    _train(opt, half, 10)
    saved = opt.state_dict()
    weights = [p.data.copy() for p in half]
    _train(opt, half, 3, start=10)  # more steps after saving must not change `saved`

    # Through a safetensors file, as a checkpoint would go.
    safetensors = pytest.importorskip("safetensors.numpy")
    blob = safetensors.save(optim.flatten_state_dict(saved, "optimizer."))
    restored = optim.unflatten_state_dict(safetensors.load(blob), "optimizer.")

    resumed = [Tensor(w, requires_grad=True) for w in weights]
    opt2 = make(resumed)
    opt2.load_state_dict(restored)
    _train(opt2, resumed, 10, start=10)
    for a, b in zip(full, resumed):
        np.testing.assert_array_equal(a.data, b.data)
    assert opt2.param_groups[0]["params"][0] is resumed[0]


def test_state_dict_layout_is_torch_like():
    a, b = param(), param([3.0])
    opt = Adam([{"params": [a]}, {"params": [b], "lr": 0.5}])
    a.grad = Tensor(np.ones(2))
    opt.step()
    sd = opt.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [[0], [1]]
    assert sd["param_groups"][1]["lr"] == 0.5
    assert set(sd["state"]) == {0} and sd["state"][0]["step"] == 1
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}


def test_load_state_dict_casts_to_the_parameter_dtype():
    src = param()
    opt = SGD([src], lr=0.1, momentum=0.9)
    src.grad = Tensor(np.ones(2))
    opt.step()
    p32 = param(dtype=np.float32)
    opt32 = SGD([p32], lr=0.1, momentum=0.9)
    opt32.load_state_dict(opt.state_dict())
    assert opt32.state[p32]["momentum_buffer"].dtype == np.float32


def test_load_state_dict_rejects_mismatches_and_leaves_the_optimizer_unchanged():
    a, b = param(), param()
    adam = Adam([a, b], lr=0.1)
    a.grad = b.grad = Tensor(np.ones(2))
    adam.step()
    good = adam.state_dict()

    other = Adam([param(), param()], lr=0.3)
    with pytest.raises(ValueError, match="parameter groups"):
        other.load_state_dict({"state": {}, "param_groups": good["param_groups"] * 2})
    with pytest.raises(ValueError, match="2 parameters in the state and 1"):
        Adam([param()]).load_state_dict(good)
    with pytest.raises(ValueError, match="shape"):
        Adam([param([1.0, 2.0, 3.0]), param()]).load_state_dict(good)
    sgd_state = SGD([param(), param()], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="lacks"):
        other.load_state_dict(sgd_state.state_dict())
    broken = {"state": {0: {"step": 1, "momentum_buffer": np.ones(2)}},
              "param_groups": good["param_groups"]}
    with pytest.raises(ValueError, match="expected"):
        other.load_state_dict(broken)
    with pytest.raises(ValueError, match="keys"):
        other.load_state_dict({"state": {}})
    assert other.param_groups[0]["lr"] == 0.3 and not other.state


def test_flatten_state_dict_round_trip_and_prefix():
    a = param()
    opt = Adam([a], lr=0.1, betas=(0.8, 0.9))
    a.grad = Tensor(np.ones(2))
    opt.step()
    flat = optim.flatten_state_dict(opt.state_dict(), "opt.")
    assert all(k.startswith("opt.") and isinstance(v, np.ndarray) for k, v in flat.items())
    assert "opt.state.0.exp_avg" in flat
    back = optim.unflatten_state_dict({**flat, "model.weight": np.zeros(3)}, "opt.")
    assert back["state"][0]["step"] == 1 and back["param_groups"][0]["lr"] == 0.1
    np.testing.assert_array_equal(back["state"][0]["exp_avg"], opt.state[a]["exp_avg"])
    opt.load_state_dict(back)
    assert opt.param_groups[0]["betas"] == (0.8, 0.9)
    with pytest.raises(KeyError, match="prefix"):
        optim.unflatten_state_dict(flat, "optimizer.")
    with pytest.raises(TypeError, match="cannot store"):
        optim.flatten_state_dict({"f": io.BytesIO()}, "x.")


# ----------------------------------------------------------- bad input

@pytest.mark.parametrize("make,match", [
    (lambda p: SGD(p, lr=-0.1), "invalid lr"),
    (lambda p: SGD(p, lr=float("nan")), "invalid lr"),
    (lambda p: SGD(p, lr=0.1, momentum=-0.5), "invalid momentum"),
    (lambda p: SGD(p, lr=0.1, weight_decay=-1), "invalid weight_decay"),
    (lambda p: SGD(p, lr=0.1, nesterov=True), "Nesterov"),
    (lambda p: SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "Nesterov"),
    (lambda p: Adam(p, lr=-1e-3), "invalid lr"),
    (lambda p: Adam(p, betas=(1.0, 0.999)), "beta parameter at index 0"),
    (lambda p: Adam(p, betas=(0.9, -0.1)), "beta parameter at index 1"),
    (lambda p: Adam(p, betas=(0.9,)), "pair"),
    (lambda p: Adam(p, eps=-1e-8), "invalid eps"),
    (lambda p: AdamW(p, weight_decay=-0.01), "invalid weight_decay"),
])
def test_bad_hyperparameters(make, match):
    with pytest.raises(ValueError, match=match):
        make([param()])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("make", [
    lambda ps, fused: Adam(ps, lr=0.01, fused=fused),
    lambda ps, fused: Adam(ps, lr=0.01, weight_decay=0.1, amsgrad=True, maximize=True, fused=fused),
    lambda ps, fused: AdamW(ps, lr=0.01, betas=(0.8, 0.95), eps=1e-6, fused=fused),
    lambda ps, fused: AdamW(ps, lr=0.05, weight_decay=0.3, amsgrad=True, fused=fused)])
def test_the_fused_kernel_gives_the_bits_of_the_numpy_version(make, dtype):
    """fused=False runs the readable numpy update; the default one kernel pass.
    Same bits, parameters and state, over steps with shrinking gradients
    (so amsgrad's maximum keeps an old value), on a large parameter too."""
    rng = np.random.default_rng(0)
    shapes = [(5,), (3, 4), (70000,)]
    start = [rng.standard_normal(s).astype(dtype) for s in shapes]
    results = []
    for fused in (False, None):
        ps = [Tensor(a.copy(), requires_grad=True) for a in start]
        opt = make(ps, fused)
        for step in range(4):
            for p, a in zip(ps, start):
                p.grad = Tensor((a * 0.5 ** step + 0.1 * np.sin(a * step)).astype(dtype))
            opt.step()
        results.append(([p.data for p in ps], [sorted((k, np.asarray(v).tolist()) for k, v in opt.state[p].items())
                                               for p in ps]))
    for a, b in zip(results[0][0], results[1][0]):
        assert a.dtype == dtype
        np.testing.assert_array_equal(a, b)
    assert results[0][1] == results[1][1]


def test_pytorch_defaults_and_options():
    """torch 2.x's SGD defaults to lr=1e-3; Adam(decoupled_weight_decay=True)
    is AdamW; foreach changes nothing, fused only the implementation;
    capturable/differentiable raise."""
    assert SGD([param()]).param_groups[0]["lr"] == 1e-3
    a, b = param(), param()
    for p in (a, b):
        p.grad = tg.Tensor(np.full(p.shape, 0.5, p.dtype))
    Adam([a], lr=0.1, weight_decay=0.5, decoupled_weight_decay=True, foreach=True).step()
    AdamW([b], lr=0.1, weight_decay=0.5, fused=False).step()
    np.testing.assert_array_equal(a.data, b.data)
    for make, arg in ((lambda p: SGD(p, differentiable=True), "differentiable"),
                      (lambda p: Adam(p, capturable=True), "capturable"),
                      (lambda p: AdamW(p, differentiable=True), "differentiable")):
        with pytest.raises(NotImplementedError, match=f"{arg}=True is not implemented"):
            make([param()])


def test_bad_hyperparameter_in_a_group():
    with pytest.raises(ValueError, match="AdamW: invalid lr -1"):
        AdamW([{"params": [param()]}, {"params": [param()], "lr": -1}])
    with pytest.raises(TypeError, match="lr must be a number"):
        SGD([param()], lr="0.1")


def test_bad_params():
    p = param()
    with pytest.raises(TypeError, match="single Tensor"):
        SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="empty parameter list"):
        SGD([], lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors.*ndarray"):
        SGD([np.zeros(3)], lr=0.1)
    with pytest.raises(TypeError, match="not a set"):
        SGD([{"params": {p}}], lr=0.1)
    with pytest.raises(TypeError, match="floating-point"):
        SGD([Tensor([1, 2])], lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        SGD([p * 2], lr=0.1)
    with pytest.raises(ValueError, match="twice"):
        SGD([p, p], lr=0.1)
    with pytest.raises(ValueError, match="more than one parameter group"):
        SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


def test_gradient_of_the_wrong_shape():
    p = param()
    opt = SGD([p], lr=0.1)
    p.grad = Tensor(np.ones(3))
    with pytest.raises(tg.ShapeError, match=r"gradient of shape \(3,\) for a parameter of shape \(2,\)"):
        opt.step()


# ------------------------------------------------------------- clipping

def _clip_setup(torch, scale):
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s) * scale for s in [(3, 4), (4,), (2, 2)]]
    ours = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in arrays]
    grads = [rng.standard_normal(a.shape) * scale for a in arrays]
    for o, t, g in zip(ours[:2], theirs[:2], grads):  # the last parameter has no gradient
        o.grad, t.grad = Tensor(g.copy()), torch.tensor(g.copy())
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf"), "inf"])
@pytest.mark.parametrize("scale", [0.1, 10.0])  # below and above max_norm
def test_clip_grad_norm_equals_torch(norm_type, scale):
    torch = pytest.importorskip("torch")
    ours, theirs = _clip_setup(torch, scale)
    norm = clip_grad_norm_(ours, max_norm=1.5, norm_type=norm_type)
    tnorm = torch.nn.utils.clip_grad_norm_(theirs, max_norm=1.5, norm_type=norm_type)
    assert isinstance(norm, Tensor) and norm.shape == ()
    np.testing.assert_allclose(norm.item(), tnorm.item(), rtol=1e-12)
    for o, t in zip(ours, theirs):
        if t.grad is None:
            assert o.grad is None
        else:
            np.testing.assert_allclose(o.grad.data, t.grad.numpy(), rtol=1e-12)


def test_clip_grad_norm_by_hand():
    a, b = param(), param([0.0])
    a.grad, b.grad = Tensor(np.array([3.0, 0.0])), Tensor(np.array([4.0]))
    norm = clip_grad_norm_([a, b], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad.data, [3 / (5 + 1e-6), 0.0])
    np.testing.assert_allclose(b.grad.data, [4 / (5 + 1e-6)])
    assert clip_grad_norm_(a, max_norm=10.0).item() == pytest.approx(3 / (5 + 1e-6))  # one tensor
    assert clip_grad_norm_([param()], max_norm=1.0).item() == 0.0  # no gradients
    p32 = param(dtype=np.float32)
    p32.grad = Tensor(np.array([3.0, 4.0], dtype=np.float32))
    norm = clip_grad_norm_([p32], 1.0)
    assert norm.dtype == np.float32 and norm.item() == pytest.approx(5.0)
    assert p32.grad.dtype == np.float32


def test_clip_grad_norm_nonfinite_and_bad_input():
    p = param()
    p.grad = Tensor(np.array([np.nan, 1.0]))
    with pytest.raises(RuntimeError, match="nan"):
        clip_grad_norm_([p], 1.0, error_if_nonfinite=True)
    assert math.isnan(clip_grad_norm_([p], 1.0).item())
    assert np.isnan(p.grad.data).all()  # as PyTorch: NaN spreads
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_([p], -1.0)
    with pytest.raises(ValueError, match="norm_type"):
        clip_grad_norm_([p], 1.0, norm_type=0)
    with pytest.raises(TypeError, match="not a Tensor"):
        clip_grad_norm_([np.ones(2)], 1.0)


def test_clip_grad_value_equals_torch_and_by_hand():
    p = param([0.0, 0.0, 0.0])
    p.grad = Tensor(np.array([-2.0, 0.3, 5.0]))
    clip_grad_value_([p], 0.5)
    np.testing.assert_array_equal(p.grad.data, [-0.5, 0.3, 0.5])
    with pytest.raises(ValueError, match="clip_value"):
        clip_grad_value_([p], -0.5)
    torch = pytest.importorskip("torch")
    ours, theirs = _clip_setup(torch, 3.0)
    clip_grad_value_(ours, 1.0)
    torch.nn.utils.clip_grad_value_(theirs, 1.0)
    for o, t in zip(ours[:2], theirs[:2]):
        np.testing.assert_array_equal(o.grad.data, t.grad.numpy())


def test_the_squared_norm_kernel_sums_in_float64_whatever_the_threads():
    from tinygrad_attn.kernels.clip import sum_of_squares
    rng = np.random.default_rng(3)
    for n in (0, 1, 1000, 3 * 65536 + 17):
        x = (rng.standard_normal(n) * 1e3).astype(np.float32)
        expected = float(np.sum(x.astype(np.float64) ** 2))
        results = []
        for threads in (1, 2, 3):
            tg.set_num_threads(threads)
            try:
                results.append(sum_of_squares(x))
            finally:
                tg.set_num_threads(None)
        assert results[0] == results[1] == results[2]  # bit-identical
        assert results[0] == pytest.approx(expected, rel=1e-13)
    big = np.full(10, 1e30, np.float32)  # float32 squares would overflow
    assert sum_of_squares(big) == pytest.approx(10 * (1e30 ** 2), rel=1e-6)
