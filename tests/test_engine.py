"""The autograd engine: backward semantics, graph freeing, grad mode, hooks."""
import gc
import weakref

import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import Tensor


def test_reused_tensor_accumulates_gradient():
    x = Tensor([3.0], requires_grad=True)
    ((x + x) * x).backward()  # d/dx 2x^2 = 4x
    assert x.grad.tolist() == [12.0]


def test_diamond_graph():
    x = Tensor([2.0], requires_grad=True)
    a = x * 3
    b = x.exp()
    (a * b).backward()  # d/dx 3x e^x = 3 e^x (1 + x)
    np.testing.assert_allclose(x.grad.data, 3 * np.exp(2.0) * 3, rtol=1e-6)


def test_grad_accumulates_across_backward_calls_like_pytorch():
    x = Tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (x * x).sum().backward()
    assert x.grad.tolist() == [4.0, 8.0]


def test_grads_of_two_leaves_do_not_share_memory():
    # Add passes the same gradient array to both inputs; accumulating into one
    # leaf's .grad must not change the other's.
    a = Tensor([1.0], requires_grad=True)
    b = Tensor([1.0], requires_grad=True)
    (a + b).sum().backward()
    (a * 3).sum().backward()
    assert a.grad.tolist() == [4.0] and b.grad.tolist() == [1.0]


def test_deep_chain_without_recursion_error():
    x = Tensor(1.0, requires_grad=True, dtype="float64")
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.backward()
    np.testing.assert_allclose(x.grad.item(), 1.0001 ** 10_000, rtol=1e-9)


def test_backward_on_non_scalar_needs_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"one element.*shape \(2,\)"):
        (x * 2).backward()
    (x * 2).backward(Tensor([1.0, 10.0]))
    assert x.grad.tolist() == [2.0, 20.0]
    with pytest.raises(RuntimeError, match="gradient has shape"):
        (x * 2).backward(np.ones(3))


def test_backward_on_tensor_without_graph_is_a_clear_error():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).sum().backward()


def test_second_backward_through_freed_graph_raises():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


def test_freed_op_that_saved_nothing_still_raises_instead_of_dropping_gradients():
    # Add saves no arrays, but freeing drops its inputs: going through it again
    # must be an error, not a silent gradient of zero for x.
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x + 2
    first, second = y.sum(), (y * 3).sum()
    first.backward()
    with pytest.raises(RuntimeError, match="Add: trying to backward through the graph a second time"):
        second.backward()


def test_retain_graph_allows_a_second_backward():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]


def test_saved_arrays_are_freed_after_backward():
    x = Tensor(np.ones(1000), requires_grad=True)
    big = x.exp()
    ref = weakref.ref(big.data)
    loss = (big * 2).sum()
    del big
    gc.collect()
    assert ref() is not None  # kept alive by the graph (Exp and Mul saved it)
    loss.backward()
    gc.collect()
    assert ref() is None


def test_an_intermediate_nobody_holds_is_freed_at_once_and_backward_still_works():
    """The graph links op nodes, not tensors: x @ W's output, read only by
    relu (which saves its own output), dies as soon as the expression is done,
    as in PyTorch; the gradients are unchanged."""
    x = Tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    W = Tensor(np.random.default_rng(1).standard_normal((3, 5)), requires_grad=True)
    outputs = []
    real_make = tg.autograd._make_tensor
    def make(data, requires_grad, ctx):
        t = real_make(data, requires_grad, ctx)
        outputs.append(weakref.ref(t))
        return t
    tg.autograd._make_tensor = make
    try:
        loss = (x @ W).relu().sum()
    finally:
        tg.autograd._make_tensor = real_make
    product, relu, total = (r() for r in outputs)
    assert product is None and relu is None and total is loss  # the graph held neither tensor
    node = loss._ctx.parents[0]  # Sum's input is relu's node, which knows relu's shape, not its tensor
    assert node.fn.__name__ == "Relu" and node.out_shape == (4, 5) and node.output() is None
    loss.backward()
    expected = (x.data.T @ ((x.data @ W.data) > 0).astype(float))
    np.testing.assert_allclose(W.grad.data, expected)


def test_hooks_and_retain_grad_of_intermediates_live_on_the_graph_node():
    x = Tensor([1.0, -2.0], requires_grad=True)
    seen = []
    (x * 3).register_hook(lambda g: seen.append(g.tolist()))  # the tensor is dropped at once
    kept = x * 4
    kept.retain_grad()
    assert kept.retains_grad and not x.retains_grad
    dropped = x * 5
    dropped.retain_grad()
    loss = (kept * 2).sum() + (dropped * 2).sum()
    del dropped  # its gradient has nowhere to go: nothing breaks
    loss.backward()
    assert kept.grad.tolist() == [2.0, 2.0]
    assert x.grad.tolist() == [18.0, 18.0]
    assert seen == []  # that hook's tensor fed nothing into loss
    y = x * 3
    y.register_hook(lambda g: seen.append(g.tolist()))
    z = y.sum()
    del y
    z.backward()
    assert seen == [[1.0, 1.0]]  # fired though the tensor was gone


def test_no_grad_context_and_decorator():
    x = Tensor([1.0], requires_grad=True)
    with tg.no_grad():
        y = x * 2
        assert not tg.is_grad_enabled()
        with tg.enable_grad():
            z = x * 2
    assert not y.requires_grad and y.is_leaf
    assert z.requires_grad

    @tg.no_grad()
    def f(t):
        return t * 3

    assert not f(x).requires_grad and tg.is_grad_enabled()


def test_no_graph_without_inputs_that_require_grad():
    y = Tensor([1.0]) * Tensor([2.0])
    assert y.is_leaf and not y.requires_grad and y._ctx is None


def test_leaf_and_non_leaf_grads_and_retain_grad():
    x = Tensor([2.0], requires_grad=True)
    h = x * 3
    h.retain_grad()
    m = x * 5
    (h * m).backward()
    assert x.is_leaf and not h.is_leaf
    assert h.grad.tolist() == [10.0]  # dL/dh = m = 5x
    assert m.grad is None  # non-leaf without retain_grad keeps no grad
    assert x.grad.tolist() == [60.0]  # d/dx 15x^2


def test_detach_and_requires_grad_():
    x = Tensor([2.0], requires_grad=True)
    d = (x * 2).detach()
    assert not d.requires_grad and d.is_leaf
    w = Tensor([1.0]).requires_grad_()
    assert w.requires_grad
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2).requires_grad_(False)


def test_register_hook_sees_and_can_replace_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    seen = []
    y = x * 2
    y.register_hook(lambda g: seen.append(g.tolist()))
    handle = x.register_hook(lambda g: g * 10)
    y.sum().backward()
    assert seen == [[1.0, 1.0]]
    assert x.grad.tolist() == [20.0, 20.0]
    handle.remove()
    x.grad = None
    (x * 2).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_functional_grad_does_not_touch_dot_grad():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = Tensor([3.0], requires_grad=True)
    gx, gy = tg.grad((x * x).sum(), [x, y], allow_unused=True)
    assert gx.tolist() == [2.0, 4.0] and gy is None and x.grad is None
    with pytest.raises(RuntimeError, match="not used"):
        tg.grad((x * x).sum(), [x, y])


def test_broadcast_gradients_are_reduced_to_input_shape():
    x = Tensor(np.ones((3, 1)), requires_grad=True)
    b = Tensor(np.ones(4), requires_grad=True)
    (x * b).sum().backward()
    assert x.grad.shape == (3, 1) and x.grad.tolist() == [[4.0]] * 3
    assert b.grad.shape == (4,) and b.grad.tolist() == [3.0] * 4


def test_custom_function_with_keyword_params():
    class ScaledSquare(tg.Function):
        """z = k x^2.   dz/dx = 2 k x."""

        @staticmethod
        def forward(ctx, x, k=1.0):
            ctx.save_for_backward(x)
            ctx.k = k
            return k * x * x

        @staticmethod
        def backward(ctx, grad):
            x, = ctx.saved_tensors
            return grad * 2 * ctx.k * x

    x = Tensor([1.0, -2.0], requires_grad=True, dtype="float64")
    y = ScaledSquare.apply(x, k=3.0)
    assert y.grad_fn == "ScaledSquare" and y.tolist() == [3.0, 12.0]
    assert tg.gradcheck(lambda t: ScaledSquare.apply(t, k=3.0), x)
    assert "ScaledSquare" not in tg.Function.registry  # only the framework's own ops are registered


def test_backward_returning_wrong_number_of_gradients_is_reported():
    class Broken(tg.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + y

        @staticmethod
        def backward(ctx, grad):
            return grad

    a, b = Tensor([1.0], requires_grad=True), Tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Broken.backward returned 1 gradients for 2 inputs"):
        Broken.apply(a, b).sum().backward()


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_detect_anomaly_names_the_op_in_forward_and_backward():
    x = Tensor([0.0, 1.0], requires_grad=True)
    with tg.detect_anomaly():
        with pytest.raises(tg.AnomalyError, match=r"Log \(forward\) produced Inf"):
            x.log()
    y = x.sqrt()  # fine forward, 1/(2*0) = inf in backward
    with tg.detect_anomaly():
        with pytest.raises(tg.AnomalyError, match=r"Sqrt \(backward\) produced Inf"):
            y.sum().backward()


def test_grad_arrays_are_never_shared():
    # .grad is updated in place (accumulation, clip_grad_norm_), so no two
    # tensors, and no array of the caller's, may share a .grad's memory.
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([1.0, 2.0], requires_grad=True)
    c = a + b                   # Add hands one array to both inputs
    c.retain_grad()
    seed = np.ones(2, dtype=np.float32)
    c.backward(seed)            # the caller's array
    arrays = [a.grad.data, b.grad.data, c.grad.data, seed]
    for i in range(len(arrays)):
        for j in range(i + 1, len(arrays)):
            assert not np.shares_memory(arrays[i], arrays[j])
    a.grad.data *= 10
    assert b.grad.tolist() == [1.0, 1.0] and c.grad.tolist() == [1.0, 1.0] and seed.tolist() == [1, 1]


def test_leaf_backward_with_gradient_copies_it():
    x = Tensor([1.0, 2.0], requires_grad=True)
    g = np.array([3.0, 4.0], dtype=np.float32)
    x.backward(g)
    x.grad.data += 1
    assert g.tolist() == [3.0, 4.0]


def test_hook_result_and_view_gradients_are_copied():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    kept = np.full((2, 3), 5.0)
    x.register_hook(lambda g: Tensor(kept))
    x.reshape(6).sum().backward()
    x.grad.data += 1
    assert kept[0, 0] == 5.0 and x.grad.data.flags.writeable
    y = Tensor(np.ones(3), requires_grad=True)
    y.expand(4, 3).sum().backward()      # Sum's backward is a read-only broadcast view
    y.grad.data += 1
    assert y.grad.tolist() == [5.0, 5.0, 5.0]


# --------------------------------------- Hooks that change the gradient's size


def test_a_hook_returning_a_wrong_shape_on_a_leaf_raises():
    x = tg.randn(3, requires_grad=True)

    def shrink(g):
        return tg.zeros(2)
    x.register_hook(shrink)
    with pytest.raises(RuntimeError, match=r"hook '.*shrink' has changed the size of the gradient: "
                                           r"it returned shape \(2,\) for a tensor of shape \(3,\)"):
        x.sum().backward()
    assert x.grad is None


def test_a_hook_returning_a_wrong_shape_on_a_non_leaf_names_the_hook():
    x = tg.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: np.zeros(1))  # broadcastable, still refused (as PyTorch)
    with pytest.raises(RuntimeError, match=r"hook '.*<lambda>' has changed the size") as info:
        y.sum().backward()
    assert "unbroadcast" not in str(info.value)


def test_a_hook_returning_the_right_shape_still_replaces_the_gradient():
    x = tg.randn(3, requires_grad=True)
    x.register_hook(lambda g: g * 3)
    (x * 2).sum().backward()
    np.testing.assert_array_equal(x.grad.data, [6.0, 6.0, 6.0])
