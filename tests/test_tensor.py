"""The Tensor class: construction, dtypes, properties, methods and bad input."""
import numpy as np
import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import Tensor


# ------------------------------------------------------------- construction

def test_python_floats_default_to_float32():
    assert Tensor(1.5).dtype == np.float32
    assert Tensor([[1.0, 2.0], [3.0, 4.0]]).dtype == np.float32
    assert Tensor([1.0, 2.0], dtype="float64").dtype == np.float64
    assert Tensor([1.0], dtype=tg.float64).dtype == np.float64


def test_numpy_arrays_keep_float_dtypes_and_ints_become_int64():
    assert Tensor(np.zeros(3, dtype=np.float64)).dtype == np.float64
    assert Tensor(np.zeros(3, dtype=np.float32)).dtype == np.float32
    assert Tensor(np.zeros(3, dtype=np.int32)).dtype == np.int64
    assert Tensor([1, 2, 3]).dtype == np.int64
    assert Tensor(np.zeros(2, dtype=np.float16)).dtype == np.float32
    assert Tensor([True, False]).dtype == np.bool_


def test_nested_lists_and_scalars():
    t = Tensor([[1, 2, 3], [4, 5, 6]], dtype="float32")
    assert t.shape == (2, 3) and t.ndim == 2 and t.numel() == 6 and len(t) == 2
    assert Tensor(3.0).shape == () and Tensor(3.0).item() == 3.0


@pytest.mark.parametrize("bad", ["hello", np.array(["a", "b"]), np.array([object()]), [1, "a"]])
def test_unsupported_data_raises_type_error(bad):
    with pytest.raises(TypeError):
        Tensor(bad)


def test_unsupported_dtype_argument_raises_type_error():
    with pytest.raises(TypeError, match="dtype"):
        Tensor([1.0], dtype=np.complex64)


def test_ragged_lists_raise_value_error():
    with pytest.raises(ValueError, match="Tensor"):
        Tensor([[1.0, 2.0], [3.0]])


def test_only_float_tensors_can_require_grad():
    with pytest.raises(RuntimeError, match="floating point"):
        Tensor([1, 2], requires_grad=True)


def test_numpy_item_tolist_len_and_iteration():
    a = np.arange(6.0).reshape(2, 3)
    t = Tensor(a)
    assert t.numpy() is a  # shared, like torch.from_numpy
    assert t.tolist() == a.tolist()
    assert [row.tolist() for row in t] == a.tolist()
    with pytest.raises(ValueError, match="one element"):
        t.item()
    with pytest.raises(TypeError):
        len(Tensor(1.0))
    assert np.asarray(t) is a


def test_repr_shows_values_dtype_and_grad_state():
    assert repr(Tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert "requires_grad=True" in repr(Tensor([1.0], requires_grad=True))
    assert "dtype=float64" in repr(Tensor(np.zeros(2)))
    y = Tensor([1.0], requires_grad=True) * 2
    assert "grad_fn=<Mul>" in repr(y)


def test_factories():
    tg.manual_seed(0)
    a = tg.randn(2, 3)
    tg.manual_seed(0)
    b = tg.randn((2, 3))
    assert a.shape == (2, 3) and a.dtype == np.float32 and np.array_equal(a.data, b.data)
    assert tg.zeros(2, 2).data.sum() == 0 and tg.ones(3).data.sum() == 3
    assert tg.full((2,), 7.0).tolist() == [7.0, 7.0]
    assert tg.arange(4).tolist() == [0, 1, 2, 3] and tg.arange(4).dtype == np.int64
    assert tg.arange(0, 1, 0.25).tolist() == [0, 0.25, 0.5, 0.75] and tg.arange(0, 1, 0.25).dtype == np.float32
    assert tg.arange(3, dtype="float64").dtype == np.float64
    assert tg.zeros_like(a).shape == a.shape
    r = tg.rand(100)
    assert 0 <= r.data.min() and r.data.max() < 1
    i = tg.randint(0, 5, (10,))
    assert i.dtype == np.int64 and i.data.max() < 5


# ---------------------------------------------------------------- operators

def test_reflected_operators_with_python_scalars_keep_dtype():
    x = Tensor([1.0, 2.0])
    for y, expected in [(2 + x, [3, 4]), (2 - x, [1, 0]), (2 * x, [2, 4]), (2 / x, [2, 1]),
                        (2 ** x, [2, 4]), (x ** 2, [1, 4]), (-x, [-1, -2])]:
        assert y.dtype == np.float32
        np.testing.assert_allclose(y.data, expected)


def test_numpy_array_on_the_left_gives_a_tensor():
    y = np.array([1.0, 2.0], dtype=np.float32) + Tensor([1.0, 1.0], requires_grad=True)
    assert isinstance(y, Tensor) and y.requires_grad


def test_mixed_float_dtypes_promote_like_numpy():
    assert (Tensor(np.ones(2)) + Tensor([1.0, 2.0])).dtype == np.float64


@pytest.mark.parametrize("expr, dtype", [
    (lambda i, f: i * 0.5, np.float32), (lambda i, f: 0.5 - i, np.float32),
    (lambda i, f: i / 2, np.float32), (lambda i, f: 1 / i, np.float32), (lambda i, f: i / i, np.float32),
    (lambda i, f: i + f, np.float32), (lambda i, f: f * np.array([1, 2]), np.float32),
    (lambda i, f: np.array([1, 2]) - f, np.float32), (lambda i, f: i ** 0.5, np.float32),
    (lambda i, f: f * (f > 1), np.float32), (lambda i, f: i * (f + np.zeros(2)), np.float64),
    (lambda i, f: i + 1, np.int64), (lambda i, f: i * i, np.int64), (lambda i, f: 2 ** i, np.int64),
])
def test_integers_meeting_floats_promote_like_pytorch(expr, dtype):
    """An integer tensor with a float gives the float's dtype (float32 for a
    Python float), not numpy's float64; integers alone stay int64."""
    i, f = Tensor([1, 2]), Tensor([1.0, 2.0])
    assert expr(i, f).dtype == dtype
    np.testing.assert_allclose(expr(i, f).data, expr(i.data, f.data.astype(np.float64)), rtol=1e-6)


def test_where_maximum_minimum_promote_like_pytorch():
    i, f = Tensor([1, 2]), Tensor([1.5, 0.5])
    cases = [(tg.maximum(i, f), np.float32, [1.5, 2]), (i.maximum(0.5), np.float32, [1, 2]),
             (tg.minimum(f, i), np.float32, [1, 0.5]), (i.minimum(Tensor(np.ones(2))), np.float64, [1, 1]),
             (tg.minimum(i, 1), np.int64, [1, 1]), (tg.where(i > 1, i, 0.5), np.float32, [0.5, 2]),
             (tg.where(f > 1, f, i), np.float32, [1.5, 2]), (tg.where(i > 1, i, 0), np.int64, [0, 2])]
    for result, dtype, expected in cases:
        assert result.dtype == dtype
        np.testing.assert_array_equal(result.data, expected)


def test_comparisons_return_boolean_tensors_without_grad():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    for mask in (x > 1, x >= 2, x < 2, x <= 2, x == 2, x != 2):
        assert mask.dtype == np.bool_ and not mask.requires_grad
    assert (x > 1).tolist() == [False, True, True]
    assert (~(x > 1)).tolist() == [True, False, False]
    assert ((x > 1) & (x < 3)).tolist() == [False, True, False]
    assert x[x > 1].tolist() == [2.0, 3.0]


def test_tensors_are_hashable_despite_elementwise_eq():
    x = Tensor([1.0])
    assert {x: 1}[x] == 1


def test_reductions_accept_pytorch_names():
    x = Tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(x.sum(dim=1, keepdim=True).data, [[3.0], [12.0]])
    np.testing.assert_array_equal(x.mean(axis=(0, 1)).data, 2.5)
    with pytest.raises(TypeError, match="unexpected"):
        x.sum(dims=1)


def test_var_and_std_correction():
    a = np.random.default_rng(0).normal(size=(4, 5))
    x = Tensor(a)
    np.testing.assert_allclose(x.var(axis=1).data, a.var(axis=1, ddof=1))
    np.testing.assert_allclose(x.var(axis=1, correction=0).data, a.var(axis=1))
    np.testing.assert_allclose(x.std(axis=(0, 1)).data, a.std(ddof=1))


def test_argmax_argmin():
    x = Tensor([[1.0, 5.0, 2.0], [7.0, 0.0, 3.0]])
    assert x.argmax(axis=1).tolist() == [1, 0] and x.argmin(axis=1).tolist() == [0, 1]
    assert x.argmax().item() == 3


# ----------------------------------------------------------------- movement

def test_movement_methods_match_numpy():
    a = np.arange(24.0).reshape(2, 3, 4)
    x = Tensor(a)
    np.testing.assert_array_equal(x.transpose(0, 2).data, a.swapaxes(0, 2))
    np.testing.assert_array_equal(x.transpose().data, a.transpose())
    np.testing.assert_array_equal(x.transpose(1, 2, 0).data, a.transpose(1, 2, 0))
    np.testing.assert_array_equal(x.permute(2, 0, 1).data, a.transpose(2, 0, 1))
    np.testing.assert_array_equal(x.swapaxes(-1, 0).data, a.swapaxes(-1, 0))
    np.testing.assert_array_equal(x.T.data, a.T)
    np.testing.assert_array_equal(x.reshape(6, -1).data, a.reshape(6, -1))
    np.testing.assert_array_equal(x.view(4, 6).data, a.reshape(4, 6))
    np.testing.assert_array_equal(x.flatten().data, a.ravel())
    np.testing.assert_array_equal(x.flatten(1).data, a.reshape(2, 12))
    assert x.unsqueeze(1).shape == (2, 1, 3, 4) and x.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert Tensor(np.zeros((1, 3, 1))).squeeze().shape == (3,)
    assert Tensor(np.zeros((1, 3, 1))).squeeze(0).shape == (3, 1)
    assert Tensor(np.zeros((2, 1))).expand(3, 2, -1).shape == (3, 2, 1)
    assert Tensor(np.zeros((2, 1))).broadcast_to((2, 5)).shape == (2, 5)


def test_split_and_chunk():
    x = Tensor(np.arange(10.0), requires_grad=True)
    parts = x.split(4)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    parts = x.split([2, 8])
    assert [p.shape for p in parts] == [(2,), (8,)]
    chunks = x.chunk(3)
    assert [c.shape for c in chunks] == [(4,), (4,), (2,)]
    (chunks[0].sum() * 1 + chunks[2].sum() * 3).backward()
    assert x.grad.tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 3, 3]
    with pytest.raises(tg.ShapeError, match="do not add up"):
        x.split([3, 3])


def test_getitem_repeated_indices_accumulate():
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    x[[0, 0, 2]].sum().backward()
    assert x.grad.tolist() == [2.0, 0.0, 1.0]
    x.grad = None
    x[Tensor([1, 1, 1])].sum().backward()
    assert x.grad.tolist() == [0.0, 3.0, 0.0]


@pytest.mark.parametrize("rows", [[3, -1, 0, 3, 3, 1], [[2, 2], [0, -4]], [], [[]]])
def test_row_lookup_gradient_is_np_add_at(rows):
    """x[rows] (an embedding lookup) scatter-adds by sorting the rows: the
    same gradient as np.add.at, for negative, repeated, 2-D and empty rows."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((4, 3, 2)), requires_grad=True)
    rows = np.array(rows, dtype=np.int64)
    grad = rng.standard_normal(rows.shape + (3, 2))
    x[rows].backward(grad)
    expected = np.zeros((4, 3, 2))
    np.add.at(expected, rows, grad)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-15, atol=1e-15)


def test_cat_stack_where_free_functions():
    a, b = Tensor([[1.0, 2.0]]), Tensor([[3.0, 4.0]])
    assert tg.cat([a, b]).tolist() == [[1, 2], [3, 4]]
    assert tg.cat([a, b], dim=1).tolist() == [[1, 2, 3, 4]]
    assert tg.stack([a, b], dim=1).shape == (1, 2, 2)
    assert tg.where(a > 1, a, 0.0).tolist() == [[0, 2]]
    assert a.masked_fill(a > 1, -1).tolist() == [[1, -1]]


def test_float_casts_carry_gradient():
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x.double()
    assert y.dtype == np.float64
    (y * y).sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.tolist() == [2.0, 4.0]
    assert Tensor([1.7]).long().tolist() == [1]


# ---------------------------------------------------------------- bad input

def test_binary_shape_mismatch_names_op_and_shapes():
    with pytest.raises(tg.ShapeError, match=r"add: shapes \(2, 3\) and \(4,\)"):
        Tensor(np.zeros((2, 3))) + Tensor(np.zeros(4))
    with pytest.raises(tg.ShapeError, match=r"mul: shapes \(2,\) and \(3,\)"):
        Tensor(np.zeros(2)) * Tensor(np.zeros(3))


def test_matmul_shape_mismatch_names_both_shapes():
    with pytest.raises(tg.ShapeError, match=r"matmul: cannot multiply shapes \(2, 3\) and \(4, 5\)"):
        Tensor(np.zeros((2, 3))) @ Tensor(np.zeros((4, 5)))
    with pytest.raises(tg.ShapeError, match="batch"):
        Tensor(np.zeros((2, 2, 3))) @ Tensor(np.zeros((3, 3, 4)))
    with pytest.raises(tg.ShapeError, match="at least one dimension"):
        Tensor(1.0) @ Tensor(np.zeros(3))


def test_reshape_and_cat_errors_name_shapes():
    with pytest.raises(tg.ShapeError, match=r"reshape: .*shape \(2, 3\).*\(4,\)"):
        Tensor(np.zeros((2, 3))).reshape(4)
    with pytest.raises(tg.ShapeError, match=r"cat: shapes \(2, 3\) and \(2, 4\)"):
        tg.cat([Tensor(np.zeros((2, 3))), Tensor(np.zeros((2, 4)))], dim=0)
    with pytest.raises(tg.ShapeError, match="stack"):
        tg.stack([Tensor(np.zeros(2)), Tensor(np.zeros(3))])
    with pytest.raises(tg.ShapeError, match="expand"):
        Tensor(np.zeros((2, 3))).expand(4, 3)


@pytest.mark.parametrize("call", [
    lambda x: x.sum(axis=2), lambda x: x.mean(axis=-3), lambda x: x.max(axis=5),
    lambda x: x.softmax(dim=2), lambda x: x.unsqueeze(4), lambda x: x.swapaxes(0, 2),
    lambda x: tg.cat([x, x], dim=2), lambda x: tg.stack([x, x], dim=-4),
])
def test_out_of_range_axes_name_axis_and_ndim(call):
    with pytest.raises(IndexError, match=r"axis -?\d+ is out of range for a tensor with ndim 2"):
        call(Tensor(np.zeros((2, 3))))


def test_index_out_of_range_names_shape():
    with pytest.raises(IndexError, match=r"getitem: .*shape \(3,\)"):
        Tensor(np.zeros(3))[5]


def test_where_needs_boolean_condition():
    with pytest.raises(TypeError, match="where"):
        tg.where(Tensor([1.0]), Tensor([1.0]), Tensor([2.0]))
    with pytest.raises(TypeError, match="masked_fill"):
        Tensor([1.0]).masked_fill(Tensor([1.0]), 0.0)
    with pytest.raises(ValueError, match="masked_fill"):
        Tensor([1.0]).masked_fill(Tensor(np.ones((2, 2), dtype=bool)), 0.0)


# ------------- Boolean indices, integers meeting floats, integers beyond int64


@pytest.mark.parametrize("index", [
    np.array([True, False]),
    [True, False, True],
    (slice(None), np.array([True, False])),
    (Ellipsis, np.array([True, True, False, False])),
    np.ones((4, 2), bool),
])
def test_boolean_index_of_the_wrong_shape_raises_like_numpy(index):
    x = tg.randn(4, 3)
    with pytest.raises(IndexError):
        x.data[tuple(index) if isinstance(index, tuple) else np.asarray(index)]  # numpy agrees
    with pytest.raises(IndexError, match=r"getitem: a boolean index of shape .* does not match .* "
                                         r"tensor of shape \(4, 3\)"):
        x[index]


def test_boolean_indices_of_the_right_shape_still_work():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 3))
    rows, cols = np.array([True, False, True, True]), np.array([False, True, True])
    for index in [rows, (slice(None), cols), (Ellipsis, cols), (None, rows), (1, cols), a > 0, (rows, 0)]:
        x = tg.tensor(a, requires_grad=True)
        y = x[index]
        np.testing.assert_array_equal(y.data, a[index])
        y.sum().backward()
        expected = np.zeros_like(a)
        np.add.at(expected, index, 1)
        np.testing.assert_array_equal(x.grad.data, expected)


def test_integer_at_float_promotes_to_the_float_dtype_not_float64():
    ints = tg.tensor([[1, 2]])
    for w_dtype in (np.float32, np.float64):
        w = tg.randn(2, 2, dtype=w_dtype, requires_grad=True)
        for y in (ints @ w, tg.matmul(ints, w), np.array([[1, 2]]) @ w, w @ tg.tensor([[1], [2]]),
                  tg.tensor(np.ones((3, 2, 2), np.int64)) @ w):
            assert y.dtype == w_dtype
        y = ints @ w
        y.sum().backward()
        np.testing.assert_allclose(y.data, np.array([[1, 2]], w_dtype) @ w.data)
        assert w.grad.dtype == w_dtype
    assert (ints @ tg.tensor([[3], [4]])).dtype == np.int64  # integers with integers stay integers


@pytest.mark.parametrize("data", [np.array([2 ** 63], np.uint64), np.array([1, 2 ** 64 - 1], np.uint64),
                                  2 ** 63, [2 ** 63, 1], [1, 2 ** 70], -2 ** 63 - 1])
def test_integers_beyond_int64_raise_instead_of_wrapping(data):
    with pytest.raises(OverflowError, match=r"does not fit in int64.*\[-2\*\*63, 2\*\*63 - 1\]"):
        tg.tensor(data)


def test_integers_within_int64_still_convert():
    assert tg.tensor(np.array([2 ** 63 - 1], np.uint64)).tolist() == [2 ** 63 - 1]
    assert tg.tensor(2 ** 63 - 1).item() == 2 ** 63 - 1
    assert tg.tensor([-2 ** 63]).item() == -2 ** 63
    assert tg.tensor([1e19, 1.0]).dtype == np.float32  # large floats are floats
    assert tg.tensor(np.array([2 ** 63], np.uint64), dtype="float64").item() == 2.0 ** 63
    assert tg.tensor([2 ** 63, 1], dtype="float64").tolist() == [2.0 ** 63, 1.0]  # asked for as floats
    assert tg.tensor(2 ** 70, dtype="float32").item() == np.float32(2.0 ** 70)


# ----------------- Edge cases that work as in PyTorch: 0-d tensors, empty axes


@pytest.mark.parametrize("method", ["sum", "mean", "amax", "amin", "logsumexp", "argmax", "argmin"])
@pytest.mark.parametrize("dim", [0, -1, (0,)])
def test_dim_0_and_minus_1_on_a_0d_tensor(method, dim):
    torch = pytest.importorskip("torch")
    if method.startswith("arg") and isinstance(dim, tuple):
        dim = dim[0]  # torch's argmax takes one dim
    x = tg.tensor(3.0, requires_grad=not method.startswith("arg"))
    y = getattr(x, method)(dim=dim)
    expected = getattr(torch.tensor(3.0), method)(dim=dim)
    assert y.shape == () and y.item() == expected.item()
    assert getattr(x, method)(dim=dim, keepdim=True).shape == ()
    if x.requires_grad:
        y.backward()
        assert x.grad.item() == 1.0
    with pytest.raises(IndexError, match=f"{method}: axis 1 is out of range for a tensor with ndim 0"):
        getattr(x, method)(dim=1)


def test_var_std_softmax_of_a_0d_tensor_as_torch():
    x = tg.tensor(3.0)
    assert np.isnan(x.var(dim=0).item()) and x.var(dim=0, correction=0).item() == 0.0
    assert np.isnan(x.std(dim=-1).item())
    assert F.softmax(x, dim=0).item() == 1.0 and F.log_softmax(x, dim=-1).item() == 0.0


def test_max_and_min_of_an_empty_tensor_over_a_non_empty_axis():
    x = tg.zeros(0, 3, requires_grad=True)
    y = x.max(axis=1)
    assert y.shape == (0,) and x.min(axis=-1, keepdims=True).shape == (0, 1)
    y.sum().backward()
    assert x.grad.shape == (0, 3)
    for axis in (0, None):
        with pytest.raises(ValueError, match=r"max: cannot reduce over axis 0 of size 0 \(tensor of shape"):
            x.max(axis=axis)


def test_chunk_and_split_of_a_zero_length_axis_as_torch():
    torch = pytest.importorskip("torch")
    x, tx = tg.zeros(0, 3), torch.zeros(0, 3)
    for mine, theirs in [(x.chunk(2), tx.chunk(2)), (x.split(2), tx.split(2)), (x.split(0), tx.split(0)),
                         (x.chunk(3, dim=0), tx.chunk(3, dim=0)), (x.split([0, 0]), tx.split([0, 0]))]:
        assert [p.shape for p in mine] == [tuple(p.shape) for p in theirs]
    t = tg.zeros(6)
    assert [p.shape for p in t.chunk(4)] == [tuple(p.shape) for p in torch.zeros(6).chunk(4)]


# ------------------ Bad arguments of the creation functions and Tensor methods

@pytest.mark.parametrize("call,error,message", [
    (lambda: tg.zeros(-1), ValueError, r"zeros: size must not be negative, got \(-1,\)"),
    (lambda: tg.ones(2, 2.5), TypeError, r"ones: size must be an int or a tuple of ints, got \(2, 2.5\)"),
    (lambda: tg.randn((3, -2)), ValueError, r"randn: size must not be negative"),
    (lambda: tg.rand(-1), ValueError, r"rand: size must not be negative"),
    (lambda: tg.full((2, -1), 1.0), ValueError, r"full: size must not be negative"),
    (lambda: tg.arange(0, 10, 0), ValueError, r"arange: step must be nonzero"),
    (lambda: tg.arange("a"), TypeError, r"arange: end must be a number, got 'a'"),
    (lambda: tg.randn(4).chunk(0), ValueError, r"chunk: chunks must be a positive integer, got 0"),
    (lambda: tg.randn(4).split(0), ValueError, r"split: split_size must be positive"),
    (lambda: tg.randn(4).split([5, -1]), ValueError, r"split: sizes must be non-negative integers"),
    (lambda: tg.full((2,), "a"), TypeError, r"full: fill_value must be a number, got 'a'"),
    (lambda: tg.randint(5, 2, (3,)), ValueError, r"randint: low must be less than high, got low=5, high=2"),
    (lambda: tg.randint(0, 2.5, (3,)), TypeError, r"randint: low and high must be integers"),
    (lambda: tg.randint(0, 5, (-3,)), ValueError, r"randint: size must not be negative"),
    (lambda: tg.randn(5).reshape(2.5, 2), TypeError, r"reshape: the shape must be integers, got \(2.5, 2\)"),
    (lambda: tg.randn(5).expand(2.5, 5), TypeError, r"expand: the shape must be integers"),
    (lambda: tg.randn(2, 3).sum(axis=1.0), TypeError, r"sum: axis must be an int, got 1.0"),
    (lambda: tg.randn(2, 3).mean(dim=(0, 1.5)), TypeError, r"mean: axis must be an int, got 1.5"),
])
def test_bad_arguments_get_a_message_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
