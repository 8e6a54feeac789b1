"""Learning-rate schedules: closed forms, PyTorch's LambdaLR equivalents,
state_dict resume and bad input."""
import math

import numpy as np
import pytest

from tinygrad_attn import Tensor, optim
from tinygrad_attn.optim import (SGD, AdamW, CosineWarmupLR, InverseSqrtLR, LambdaLR,
                                 LinearWarmupLR)


def two_groups(lrs=(0.1, 0.02)):
    params = [Tensor(np.zeros(2), requires_grad=True) for _ in lrs]
    return SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=1.0)


def lrs_over(sched, steps):
    """The lr of every group at steps 0..steps-1 (read from the optimizer)."""
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in sched.optimizer.param_groups])
        assert sched.get_last_lr() == out[-1]
        sched.step()
    return np.array(out)


def torch_scheduler_lrs(torch, lrs, make, steps):
    """The lrs of the torch.optim.lr_scheduler make(optimizer) builds over
    groups with these lrs, read as lrs_over reads ours."""
    params = [torch.zeros(2, requires_grad=True) for _ in lrs]
    opt = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=1.0)
    sched = make(opt)
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    return np.array(out)


def torch_lambda_lrs(torch, lrs, lr_lambda, steps):
    """The lrs torch.optim.lr_scheduler.LambdaLR gives with the same groups."""
    return torch_scheduler_lrs(torch, lrs, lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda), steps)


# ------------------------------------------------- reference schedules

def hf_linear(warmup, total):
    """Hugging Face's get_linear_schedule_with_warmup multiplier."""
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return f


def hf_cosine(warmup, total):
    """Hugging Face's get_cosine_schedule_with_warmup multiplier (half a cycle)."""
    def f(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return f


def annotated_transformer_rate(d_model, warmup, factor):
    """The Annotated Transformer's `rate`, used with LambdaLR and lr=1."""
    def f(step):
        step = 1 if step == 0 else step
        return factor * (d_model ** (-0.5) * min(step ** (-0.5), step * warmup ** (-1.5)))
    return f


# ----------------------------------------------------------- equivalence

def test_lambda_lr_equals_torch_with_one_function_per_group():
    torch = pytest.importorskip("torch")
    lambdas = [lambda s: 0.5 ** (s // 3), lambda s: 1.0 / (1 + s)]
    ours = lrs_over(LambdaLR(two_groups(), lambdas), 12)
    np.testing.assert_allclose(ours, torch_lambda_lrs(torch, (0.1, 0.02), lambdas, 12), rtol=1e-15)


def test_linear_warmup_decay_equals_torch_lambda_lr():
    torch = pytest.importorskip("torch")
    ours = lrs_over(LinearWarmupLR(two_groups(), warmup_steps=5, total_steps=20), 25)
    theirs = torch_lambda_lrs(torch, (0.1, 0.02), hf_linear(5, 20), 25)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)


def test_cosine_warmup_equals_torch_lambda_lr():
    torch = pytest.importorskip("torch")
    ours = lrs_over(CosineWarmupLR(two_groups(), warmup_steps=4, total_steps=30), 31)
    theirs = torch_lambda_lrs(torch, (0.1, 0.02), hf_cosine(4, 30), 31)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)


def test_cosine_without_warmup_equals_torch_cosine_annealing_with_eta_min():
    torch = pytest.importorskip("torch")
    ours = lrs_over(CosineWarmupLR(two_groups(), warmup_steps=0, total_steps=25, min_lr=0.005), 26)
    theirs = torch_scheduler_lrs(torch, (0.1, 0.02), lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=25, eta_min=0.005), 26)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-15)


def test_linear_decay_without_warmup_equals_torch_linear_lr():
    torch = pytest.importorskip("torch")
    ours = lrs_over(LinearWarmupLR(two_groups((0.1,)), warmup_steps=0, total_steps=12, min_lr=0.025), 16)
    theirs = torch_scheduler_lrs(torch, (0.1,), lambda opt: torch.optim.lr_scheduler.LinearLR(
        opt, start_factor=1.0, end_factor=0.25, total_iters=12), 16)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-15)


def test_inverse_sqrt_equals_the_annotated_transformers_rate():
    torch = pytest.importorskip("torch")
    sched = InverseSqrtLR(two_groups((1.0, 0.5)), d_model=64, warmup_steps=10, scale=2.0)
    ours = lrs_over(sched, 40)
    theirs = torch_lambda_lrs(torch, (1.0, 0.5), annotated_transformer_rate(64, 10, 2.0), 40)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


# ------------------------------------------------------------ closed forms

def test_linear_warmup_by_hand():
    lrs = lrs_over(LinearWarmupLR(two_groups(), warmup_steps=4), 7)[:, 0]
    np.testing.assert_allclose(lrs, [0.0, 0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    # decay to min_lr over steps 4..8, then stay there
    lrs = lrs_over(LinearWarmupLR(two_groups(), warmup_steps=4, total_steps=8, min_lr=0.02), 11)[:, 0]
    np.testing.assert_allclose(lrs, [0, 0.025, 0.05, 0.075, 0.1, 0.08, 0.06, 0.04, 0.02, 0.02, 0.02])


def test_cosine_warmup_by_hand_with_min_lr():
    sched = CosineWarmupLR(two_groups((0.1, 0.05)), warmup_steps=2, total_steps=10, min_lr=0.01)
    lrs = lrs_over(sched, 14)
    np.testing.assert_allclose(lrs[:3, 0], [0.0, 0.05, 0.1])           # warmup to the base lr
    np.testing.assert_allclose(lrs[6], [0.055, 0.03])                   # halfway: (base + min) / 2
    np.testing.assert_allclose(lrs[10:], 0.01)                          # min_lr from total_steps on
    assert np.all(np.diff(lrs[2:11, 0]) < 0)


def test_inverse_sqrt_peaks_at_warmup():
    sched = InverseSqrtLR(two_groups((1.0, 1.0)), d_model=512, warmup_steps=4000)
    lr = [sched.lr_at(1.0, s) for s in (0, 1, 2000, 4000, 16000)]
    assert lr[0] == lr[1] == pytest.approx(512 ** -0.5 * 4000 ** -1.5)
    assert lr[2] == pytest.approx(lr[3] / 2)                   # linear rise
    assert lr[3] == pytest.approx(1 / math.sqrt(512 * 4000))   # the peak
    assert lr[4] == pytest.approx(lr[3] / 2)                   # 1/sqrt decay


# ------------------------------------------------------- state and resume

@pytest.mark.parametrize("make", [
    lambda opt: CosineWarmupLR(opt, warmup_steps=3, total_steps=20, min_lr=1e-3),
    lambda opt: LinearWarmupLR(opt, warmup_steps=3, total_steps=20),
    lambda opt: InverseSqrtLR(opt, d_model=32, warmup_steps=5),
    lambda opt: LambdaLR(opt, lambda s: 0.9 ** s),
])
@pytest.mark.parametrize("optimizer_first", [True, False])
def test_resume_from_state_dicts_gives_the_same_lrs(make, optimizer_first):
    def build():
        p = Tensor(np.ones(3), requires_grad=True)
        opt = AdamW([p], lr=0.05)
        return p, opt, make(opt)

    p, opt, sched = build()
    for _ in range(7):
        p.grad = Tensor(np.ones(3))
        opt.step()
        sched.step()
    expected = lrs_over(sched, 8)
    p, opt, sched = build()
    for _ in range(7):
        p.grad = Tensor(np.ones(3))
        opt.step()
        sched.step()
    flat = {**optim.flatten_state_dict(opt.state_dict(), "optimizer."),
            **optim.flatten_state_dict(sched.state_dict(), "scheduler.")}

    p2, opt2, sched2 = build()  # a fresh run: lr is back at step 0
    if optimizer_first:
        opt2.load_state_dict(optim.unflatten_state_dict(flat, "optimizer."))
        sched2.load_state_dict(optim.unflatten_state_dict(flat, "scheduler."))
    else:
        sched2.load_state_dict(optim.unflatten_state_dict(flat, "scheduler."))
        opt2.load_state_dict(optim.unflatten_state_dict(flat, "optimizer."))
    assert sched2.last_epoch == 7 and sched2.base_lrs == [0.05]
    np.testing.assert_array_equal(lrs_over(sched2, 8), expected)


def test_scheduler_records_initial_lr_and_resumes_with_last_epoch():
    opt = two_groups()
    sched = LinearWarmupLR(opt, warmup_steps=10)
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02] == sched.base_lrs
    for _ in range(4):
        sched.step()
    again = LinearWarmupLR(opt, warmup_steps=10, last_epoch=sched.last_epoch)
    assert again.last_epoch == 5 and again.get_last_lr() == pytest.approx([0.05, 0.01])
    with pytest.raises(KeyError, match="initial_lr"):
        LinearWarmupLR(two_groups(), warmup_steps=10, last_epoch=3)


# ------------------------------------------------------------- bad input

@pytest.mark.parametrize("make,error,match", [
    (lambda o: LinearWarmupLR(o, warmup_steps=-1), ValueError, "warmup_steps"),
    (lambda o: LinearWarmupLR(o, warmup_steps=5, total_steps=5), ValueError, "greater"),
    (lambda o: CosineWarmupLR(o, warmup_steps=10, total_steps=3), ValueError, "greater"),
    (lambda o: CosineWarmupLR(o, warmup_steps=1, total_steps=3, min_lr=0.05), ValueError,
     "above the learning rate 0.02 of parameter group 1"),
    (lambda o: CosineWarmupLR(o, warmup_steps=1.5, total_steps=3), ValueError, "integer"),
    (lambda o: InverseSqrtLR(o, d_model=0, warmup_steps=10), ValueError, "positive"),
    (lambda o: InverseSqrtLR(o, d_model=8, warmup_steps=10, scale=-1), ValueError, "scale"),
    (lambda o: LambdaLR(o, [lambda s: 1.0]), ValueError, "expected 2 lr_lambdas"),
    (lambda o: LambdaLR(o, 0.5), TypeError, "callable"),
    (lambda o: LinearWarmupLR("adam", warmup_steps=3), TypeError, "not an Optimizer"),
])
def test_bad_schedule_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make(two_groups())


def test_load_state_dict_of_another_scheduler_is_rejected():
    cos = CosineWarmupLR(two_groups(), warmup_steps=1, total_steps=5)
    inv = InverseSqrtLR(two_groups(), d_model=8, warmup_steps=4)
    with pytest.raises(ValueError, match="another scheduler"):
        cos.load_state_dict(inv.state_dict())
    other = CosineWarmupLR(SGD([Tensor(np.zeros(1), requires_grad=True)], lr=0.1),
                           warmup_steps=1, total_steps=5)
    with pytest.raises(ValueError, match="parameter groups"):
        cos.load_state_dict(other.state_dict())
