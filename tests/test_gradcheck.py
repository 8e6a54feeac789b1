"""gradcheck itself: it passes right gradients and catches wrong ones."""
import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import Tensor


class WrongSquare(tg.Function):
    """z = x^2 with a deliberately wrong backward (forgets the factor 2)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * x


class WrongOnOneElement(tg.Function):
    """z = 3x, but the gradient of the last element is off by 1e-3."""

    @staticmethod
    def forward(ctx, x):
        return 3 * x

    @staticmethod
    def backward(ctx, grad):
        g = 3 * grad
        g.reshape(-1)[-1] += 1e-3
        return g


class InPlaceDouble(tg.Function):
    """z = 2x with a correct value but a backward that doubles grad_output in
    place (the engine hands one gradient array to several ops, e.g. Add's two
    inputs, so this corrupts the others' gradients)."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        grad *= 2
        return grad


def test_negative_control_wrong_backward_fails():
    x = Tensor(np.random.default_rng(0).normal(size=(3, 2)), requires_grad=True)
    with pytest.raises(tg.GradcheckError) as err:
        tg.gradcheck(WrongSquare.apply, x)
    message = str(err.value)
    assert "input 0" in message and "numerical" in message and "analytic" in message
    assert tg.gradcheck(WrongSquare.apply, x, raise_exception=False) is False


def test_backward_that_modifies_grad_output_in_place_fails():
    x = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(tg.GradcheckError, match="modified its grad_output in place"):
        tg.gradcheck(InPlaceDouble.apply, x)


def test_full_jacobian_catches_a_single_wrong_element():
    x = Tensor(np.ones((4, 5)), requires_grad=True)
    with pytest.raises(tg.GradcheckError, match=r"element \(3, 4\)"):
        tg.gradcheck(WrongOnOneElement.apply, x)


def test_reports_which_input_is_wrong():
    a = Tensor(np.ones(3), requires_grad=True)
    b = Tensor(np.ones(3), requires_grad=True)
    with pytest.raises(tg.GradcheckError, match="input 1"):
        tg.gradcheck(lambda x, y: x * WrongSquare.apply(y), (a, b))


def test_checks_every_output_of_a_tuple():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    assert tg.gradcheck(lambda t: (t * 2, t.exp()), x)
    with pytest.raises(tg.GradcheckError):
        tg.gradcheck(lambda t: (t * 2, WrongSquare.apply(t)), x)


def test_float32_inputs_are_checked_in_float64_and_left_untouched():
    data = np.array([0.5, 1.5], dtype=np.float32)
    x = Tensor(data.copy(), requires_grad=True)
    assert tg.gradcheck(lambda t: t.tanh(), x)
    assert x.dtype == np.float32 and np.array_equal(x.data, data) and x.grad is None


def test_non_tensor_and_constant_inputs_pass_through():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    c = Tensor(np.array([3.0, 4.0]))
    assert tg.gradcheck(lambda t, k, s: t * k * s, (x, c, 2.0))


def test_nothing_to_check_is_an_error():
    with pytest.raises(ValueError, match="no input requires grad"):
        tg.gradcheck(lambda t: t * 2, Tensor([1.0]))
