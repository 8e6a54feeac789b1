"""`Tensor`: a numpy array plus what autograd needs.

The class is thin on purpose: every method that computes something calls an
op in `tinygrad_attn/ops/`, where forward and backward live side by side.
The dtypes and the device are in dtypes.py; the functions that make new
tensors (tensor, zeros, arange, randn, ...) in creation.py.
"""
from collections import namedtuple

import numpy as np

from . import autograd
from .autograd import node_of, run_backward, _root_grad
from .dtypes import CPU, TYPE_NAMES, bool_, float32, float64, int64, to_args, to_array
from .ops import elementwise as E
from .ops import movement as M
from .ops import reduce as R
from .ops.matmul import MatMul
from .ops.softmax import LogSoftmax, Softmax
from .shapes import ShapeError, normalize_axes, normalize_axis, normalize_new_axis


def as_tensor_like(x, ref):
    """Wrap a Python scalar or array as a constant matching `ref`'s float dtype."""
    if isinstance(x, Tensor):
        return x
    if ref is not None and ref.dtype.kind == "f" and isinstance(x, (int, float, np.number)):
        return Tensor._make(np.asarray(x, dtype=ref.dtype), False, None)
    return Tensor(x)


_INTEGRAL_KINDS = frozenset("iub")  # numpy dtype kinds: signed, unsigned, bool


def _promote(x, y, divide=False):
    """PyTorch's type promotion where numpy's differs: an integer or boolean
    operand meeting a float one takes its float dtype (float32 for a Python
    float), and dividing integers gives float32. numpy would turn all of
    these into float64, silently leaving the float32 default."""
    kx = x.dtype.kind if isinstance(x, (Tensor, np.ndarray)) else None
    ky = y.dtype.kind if isinstance(y, (Tensor, np.ndarray)) else None
    if kx not in _INTEGRAL_KINDS and ky not in _INTEGRAL_KINDS:
        return x, y  # the usual case (floats, or a float with a Python number): nothing to do
    floats = [v.dtype for v, k in ((x, kx), (y, ky)) if k == "f"]
    if floats:
        target = floats[0]
    elif divide or any(isinstance(v, float) for v in (x, y)):
        target = float32
    else:
        return x, y  # integers with integers stay integers

    def cast(v):
        if isinstance(v, Tensor) and v.dtype.kind != "f":
            return v.to(target)
        if isinstance(v, np.ndarray) and v.dtype.kind != "f":
            return v.astype(target)
        return v
    return cast(x), cast(y)


def _dim_args(dim, keepdim, axis, keepdims, op):
    """PyTorch's `dim` / `keepdim`, or numpy's `axis=` / `keepdims=` (keyword-only here)."""
    if axis is not None:
        if dim is not None:
            raise TypeError(f"{op}: got both dim={dim!r} and axis={axis!r}; pass one")
        dim = axis
    if keepdims is not None:
        keepdim = keepdims
    return dim, bool(keepdim)


# What max(dim) / min(dim) return, as torch.return_types.max / min.
max_result = namedtuple("max", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])


class Tensor:
    """An n-dimensional array that records the ops applied to it.

    `Tensor(data, dtype=None, requires_grad=False)` accepts numpy arrays,
    nested lists and Python scalars. When `requires_grad` is set, ops on it
    build a graph that `backward()` walks to fill in `.grad`.
    `.data` is the underlying numpy array.

    `.name` is a label of your own (None by default, also on every op
    result): `t.name = "W_q"` makes `viz.graph` print it on the tensor's
    card. Nothing else reads it, and copies and op results do not inherit it.
    """

    __slots__ = ("data", "grad", "_requires_grad", "_ctx", "_hooks", "name", "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators: array + tensor -> Tensor

    def __init__(self, data, dtype=None, requires_grad=False):
        self.data = to_array(data.data if isinstance(data, Tensor) else data, dtype)
        self.grad = None
        self._ctx = None
        self._hooks = None
        self.name = None
        self._requires_grad = False
        self.requires_grad = requires_grad

    @classmethod
    def _make(cls, data, requires_grad, ctx):
        """Fast constructor for op outputs: `data` is already a valid array."""
        t = object.__new__(cls)
        t.data = data
        t.grad = None
        t._requires_grad = requires_grad
        t._ctx = ctx
        t._hooks = None
        t.name = None
        return t

    # ------------------------------------------------------------ properties
    @property
    def requires_grad(self):
        """Whether ops on this tensor are recorded for backward (floats only)."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        if value and self.data.dtype.kind != "f":
            raise RuntimeError(f"only floating point tensors can require gradients, got dtype {self.dtype}")
        if not value and self._ctx is not None:
            raise RuntimeError("requires_grad can only be turned off on leaf tensors; use detach()")
        self._requires_grad = bool(value)

    @property
    def shape(self):
        """The shape, a tuple of ints (PyTorch's torch.Size is a tuple too)."""
        return self.data.shape

    @property
    def ndim(self):
        """The number of axes."""
        return self.data.ndim

    @property
    def dtype(self):
        """The numpy dtype: float32, float64, int64 or bool."""
        return self.data.dtype

    @property
    def device(self):
        """Always the CPU (tensors are numpy arrays): equal to "cpu", and
        `x.device.type == "cpu"` as with a torch.device."""
        return CPU

    def size(self, dim=None):
        """The shape as a tuple, or the size of axis `dim` (an int), as
        torch's `size()`. (numpy's `.size`, the element count, is `numel()`.)"""
        if dim is None:
            return self.data.shape
        return self.data.shape[normalize_axis(dim, self.ndim, "size")]

    def dim(self):
        """The number of axes (= ndim)."""
        return self.data.ndim

    def numel(self):
        """The number of elements."""
        return self.data.size

    @property
    def is_leaf(self):
        """True for tensors made by the user (no op recorded them)."""
        return self._ctx is None

    @property
    def grad_fn(self):
        """Name of the op that made this tensor (None for leaves)."""
        return None if self._ctx is None else self._ctx.fn.__name__

    @property
    def T(self):
        """All axes reversed."""
        return self.permute(tuple(reversed(range(self.ndim))))

    def numpy(self, *, force=False):
        """The underlying array (shared, not copied; `force` changes nothing here)."""
        return self.data

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def item(self):
        """The value of a one-element tensor as a Python number."""
        if self.data.size != 1:
            raise ValueError(f"item: only a tensor with one element can be converted to a "
                             f"Python scalar, got shape {self.shape}")
        return self.data.item()

    def tolist(self):
        """The values as (nested) Python lists."""
        return self.data.tolist()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self):
        if self.data.size != 1:
            raise ValueError(f"the truth value of a tensor with {self.data.size} elements is ambiguous")
        return bool(self.data)

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __repr__(self):
        body = np.array2string(self.data, separator=", ", prefix="tensor(", precision=4)
        extras = []
        if self.dtype != float32:
            extras.append(f"dtype={self.dtype}")
        if self._ctx is not None:
            extras.append(f"grad_fn=<{self._ctx.fn.__name__}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return "tensor(" + body + "".join(", " + e for e in extras) + ")"

    __hash__ = object.__hash__

    # ------------------------------------------------------------- autograd
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) into the `.grad` of every leaf that requires grad.

        A tensor with one element needs no `gradient`; any other tensor needs
        one of its shape (the vector in the vector-Jacobian product).
        retain_graph=True keeps the graph for another backward. Not
        implemented: create_graph=True (gradients are first order only) and
        `inputs` (NotImplementedError).
        """
        if create_graph:
            raise NotImplementedError("backward: create_graph=True is not implemented (gradients "
                                      "are first order only)")
        if inputs is not None:
            raise NotImplementedError("backward: inputs= is not implemented; use "
                                      "tinygrad_attn.grad(outputs, inputs)")
        run_backward([self], [_root_grad(self, gradient, "backward")], bool(retain_graph))

    def detach(self):
        """The same data, cut from the graph."""
        return Tensor._make(self.data, False, None)

    def requires_grad_(self, requires_grad=True):
        """Set `requires_grad` in place; returns self."""
        self.requires_grad = requires_grad
        return self

    def retain_grad(self):
        """Keep `.grad` on this non-leaf tensor after backward (a leaf keeps it anyway)."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad: this tensor does not require grad")
        if self._ctx is not None:
            self._ctx._retains_grad = True  # the graph's node holds the flag (autograd.Context)

    @property
    def retains_grad(self):
        """Whether this non-leaf tensor keeps its `.grad` (retain_grad() was called)."""
        return self._ctx is not None and self._ctx._retains_grad

    def register_hook(self, hook):
        """Call `hook(grad)` when this tensor's gradient is computed; a
        returned tensor replaces the gradient. Returns a handle with `.remove()`."""
        if not self.requires_grad:
            raise RuntimeError("register_hook: cannot register a hook on a tensor that does not require grad")
        node = node_of(self)  # a non-leaf's hooks live on its graph node: they run even once it is gone
        if node._hooks is None:
            node._hooks = []
        node._hooks.append(hook)
        hooks = node._hooks

        class _Handle:
            @staticmethod
            def remove():
                if hook in hooks:
                    hooks.remove(hook)
        return _Handle()

    # ------------------------------------------------------------ conversion
    def to(self, *args, **kwargs):
        """This tensor as another dtype, as torch's `to`: to(dtype),
        to("cpu"), to("cpu", dtype), to(other_tensor) (its dtype), with
        keywords dtype=, device=, copy=. Returns self when nothing changes
        (unless copy=True); gradients flow back through float casts. The
        CPU is the only device: any other raises NotImplementedError."""
        dtype, copy = to_args(args, dict(kwargs), "to")
        if dtype is None or dtype == self.dtype:
            return self.clone() if copy else self
        if dtype.kind == "f" and self.dtype.kind == "f":
            return E.Cast.apply(self, dtype=dtype)
        return Tensor._make(self.data.astype(dtype), False, None)

    def cpu(self):
        """self: the CPU is the only device (as in x.detach().cpu().numpy())."""
        return self

    def astype(self, dtype):
        """numpy's spelling of to(dtype)."""
        return self.to(dtype)

    def type(self, dtype=None, non_blocking=False):
        """With no argument, the type name as PyTorch spells it
        ("torch.FloatTensor", ...); with a dtype (or such a name), to(dtype)."""
        if dtype is None:
            return TYPE_NAMES[self.dtype]
        names = {v: k for k, v in TYPE_NAMES.items()}
        return self.to(names.get(dtype, dtype))

    def float(self):
        """to(float32)."""
        return self.to(float32)

    def double(self):
        """to(float64)."""
        return self.to(float64)

    def long(self):
        """to(int64)."""
        return self.to(int64)

    def clone(self):
        """A copy of the data (same memory layout, as torch's); gradients
        flow back through it unchanged (dz/dx = 1)."""
        if self.dtype.kind == "f":
            return E.Cast.apply(self, dtype=self.dtype)  # astype copies, its backward passes g on
        return Tensor._make(self.data.copy(), False, None)

    def contiguous(self):
        """self if its data is C-contiguous, else a C-contiguous copy
        (gradients flow back through it)."""
        if self.data.flags.c_contiguous:
            return self
        # Flattening a strided view copies it in C order; the second reshape is a view of that copy.
        return M.Reshape.apply(M.Reshape.apply(self, shape=(-1,)), shape=self.shape)

    # ------------------------------------------------------------ arithmetic
    def __add__(self, other):
        return E.Add.apply(*_promote(self, other))

    def __radd__(self, other):
        return E.Add.apply(*_promote(other, self))

    def __sub__(self, other):
        return E.Sub.apply(*_promote(self, other))

    def __rsub__(self, other):
        a, b = _promote(other, self)
        return E.Sub.apply(as_tensor_like(a, b), b)

    def __mul__(self, other):
        return E.Mul.apply(*_promote(self, other))

    def __rmul__(self, other):
        return E.Mul.apply(*_promote(other, self))

    def __truediv__(self, other):
        return E.Div.apply(*_promote(self, other, divide=True))

    def __rtruediv__(self, other):
        a, b = _promote(other, self, divide=True)
        return E.Div.apply(as_tensor_like(a, b), b)

    def __pow__(self, other):
        return E.Pow.apply(*_promote(self, other))

    def __rpow__(self, other):
        a, b = _promote(other, self)
        return E.Pow.apply(as_tensor_like(a, b), b)

    def __matmul__(self, other):
        return MatMul.apply(*_promote(self, other))

    def __rmatmul__(self, other):
        return MatMul.apply(*_promote(other, self))

    def __neg__(self):
        return E.Neg.apply(self)

    def __getitem__(self, index):
        if isinstance(index, Tensor):  # tensors in an index are plain arrays to the op
            index = index.data
        elif isinstance(index, tuple) and any(isinstance(i, Tensor) for i in index):
            index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
        return M.GetItem.apply(self, index=index)

    def __abs__(self):
        return self.abs()

    def add(self, other, *, alpha=1):
        """self + alpha * other."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other, *, alpha=1):
        """self - alpha * other."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other):
        """self * other (broadcast)."""
        return self * other

    def div(self, other, *, rounding_mode=None):
        """self / other (true division; rounding_mode is not implemented)."""
        if rounding_mode is not None:
            raise NotImplementedError(f"div: rounding_mode={rounding_mode!r} is not implemented "
                                      "(only true division, rounding_mode=None)")
        return self / other

    def pow(self, exponent):
        """self ** exponent."""
        return self ** exponent

    def matmul(self, other):
        """self @ other (batched and broadcast like numpy's matmul)."""
        return self @ other

    def neg(self):
        """-self."""
        return -self

    # Comparisons give boolean tensors that carry no gradient.
    def _compare(self, other, fn):
        other = other.data if isinstance(other, Tensor) else other
        return Tensor._make(np.asarray(fn(self.data, other)), False, None)

    def __lt__(self, other):
        return self._compare(other, np.less)

    def __le__(self, other):
        return self._compare(other, np.less_equal)

    def __gt__(self, other):
        return self._compare(other, np.greater)

    def __ge__(self, other):
        return self._compare(other, np.greater_equal)

    def __eq__(self, other):
        return self._compare(other, np.equal)

    def __ne__(self, other):
        return self._compare(other, np.not_equal)

    def __invert__(self):
        if self.dtype != bool_:
            raise TypeError(f"~ is only defined for boolean tensors, got {self.dtype}")
        return Tensor._make(~self.data, False, None)

    def __and__(self, other):
        return self._compare(other, np.logical_and)

    def __or__(self, other):
        return self._compare(other, np.logical_or)

    # --------------------------------------------------------- unary functions
    def exp(self):
        """e ** self, elementwise."""
        return E.Exp.apply(self)

    def log(self):
        """The natural logarithm, elementwise."""
        return E.Log.apply(self)

    def sqrt(self):
        """The square root, elementwise."""
        return E.Sqrt.apply(self)

    def tanh(self):
        """tanh, elementwise."""
        return E.Tanh.apply(self)

    def erfc(self):
        """The complementary error function 1 - erf(self), elementwise."""
        return E.Erfc.apply(self)

    def sigmoid(self):
        """1 / (1 + e ** -self), elementwise."""
        return E.Sigmoid.apply(self)

    def relu(self):
        """max(self, 0), elementwise."""
        return E.Relu.apply(self)

    def gelu(self, approximate="none"):
        """self * Phi(self), Phi the standard normal CDF (approximate="tanh":
        the tanh approximation). Not a torch.Tensor method: torch has F.gelu."""
        return E.Gelu.apply(self, approximate=approximate)

    def silu(self):
        """self * sigmoid(self), elementwise (SiLU, or swish). Not a torch.Tensor
        method: torch has F.silu."""
        return E.Silu.apply(self)

    def abs(self):
        """|self|, elementwise (also the built-in abs(x))."""
        return E.Abs.apply(self)

    def clip(self, min=None, max=None):
        """Each element clamped into [min, max] (either bound may be None)."""
        return E.Clip.apply(self, min=min, max=max)

    clamp = clip

    def maximum(self, other):
        """The elementwise maximum of self and other (broadcast)."""
        return E.Maximum.apply(*_promote(self, other))

    def minimum(self, other):
        """The elementwise minimum of self and other (broadcast)."""
        return E.Minimum.apply(*_promote(self, other))

    def masked_fill(self, mask, value):
        """Replace the elements where `mask` is True by `value`."""
        return E.MaskedFill.apply(self, mask, value=value)

    def softmax(self, dim, dtype=None):
        """exp(x_i) / sum_j exp(x_j) along `dim` (F.softmax); `dtype` casts first."""
        x = self if dtype is None else self.to(dtype)
        return Softmax.apply(x, axis=dim)

    def log_softmax(self, dim, dtype=None):
        """x_i - log sum_j exp(x_j) along `dim` (F.log_softmax); `dtype` casts first."""
        x = self if dtype is None else self.to(dtype)
        return LogSoftmax.apply(x, axis=dim)

    # ------------------------------------------------------------ reductions
    # PyTorch's dim / keepdim, positional as in torch; numpy's axis= / keepdims=
    # are accepted as keywords. dim may be one axis, a tuple of axes, or None (all).
    def sum(self, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
        """The sum over `dim` (all axes if None); `dtype` casts first."""
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "sum")
        x = self if dtype is None else self.to(dtype)
        return R.Sum.apply(x, axis=dim, keepdims=keepdim)

    def mean(self, dim=None, keepdim=False, *, dtype=None, axis=None, keepdims=None):
        """The mean over `dim` (all axes if None); `dtype` casts first."""
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "mean")
        x = self if dtype is None else self.to(dtype)
        return R.Mean.apply(x, axis=dim, keepdims=keepdim)

    def _max_min(self, op, dim, keepdim, axis, keepdims):
        name = op.__name__.lower()
        if isinstance(dim, Tensor):  # torch's max(other): the elementwise maximum
            return self.maximum(dim) if name == "max" else self.minimum(dim)
        torch_style = dim is not None
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, name)
        values = op.apply(self, axis=dim, keepdims=keepdim)
        if not torch_style:
            return values
        if not isinstance(dim, (int, np.integer)):
            raise TypeError(f"{name}: dim must be one axis (an int), got {dim!r}; PyTorch's {name}(dim) "
                            f"returns (values, indices) of one axis: for several use "
                            f"a{name}(dim) or {name}(axis=...)")
        arg = np.argmax if name == "max" else np.argmin
        axis = normalize_axis(dim, self.ndim, name) if self.ndim else None  # 0-d: dim 0 or -1 allowed
        indices = arg(self.data, axis=axis, keepdims=keepdim)
        result = max_result if name == "max" else min_result
        return result(values, Tensor._make(np.asarray(indices, dtype=np.int64), False, None))

    def max(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The largest element (dim=None); as torch, max(dim) returns a
        namedtuple (values, indices) along that axis and max(other_tensor)
        the elementwise maximum. numpy's max(axis=...) (an axis or a tuple)
        returns the values only. The gradient goes to every maximal element."""
        return self._max_min(R.Max, dim, keepdim, axis, keepdims)

    def min(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The smallest element; min(dim) returns (values, indices), as max."""
        return self._max_min(R.Min, dim, keepdim, axis, keepdims)

    def amax(self, dim=None, keepdim=False):
        """The maximum over one or several axes (all for None or ()), values only."""
        axis = None if dim in (None, ()) else dim
        if axis is not None:
            normalize_axes(axis, self.ndim, "amax")  # the error names amax
        return R.Max.apply(self, axis=axis, keepdims=bool(keepdim))

    def amin(self, dim=None, keepdim=False):
        """The minimum over one or several axes (all for None or ()), values only."""
        axis = None if dim in (None, ()) else dim
        if axis is not None:
            normalize_axes(axis, self.ndim, "amin")
        return R.Min.apply(self, axis=axis, keepdims=bool(keepdim))

    def _correction(self, dim, unbiased, correction, op):
        """(dim, correction) from PyTorch's spellings: var(dim, unbiased),
        var(unbiased) with a bool, or correction= (1 by default)."""
        if isinstance(dim, bool):  # var(False): PyTorch's var(unbiased)
            dim, unbiased = None, dim
        if unbiased is not None:
            if correction is not None:
                raise TypeError(f"{op}: pass unbiased or correction, not both")
            correction = int(bool(unbiased))
        return dim, 1 if correction is None else correction

    def var(self, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,
            keepdims=None):
        """The variance over `dim`: sum((x - mean)^2) / (N - correction).

        correction=1 (the default, as PyTorch) is the unbiased estimate,
        correction=0 divides by N. PyTorch's older spellings work too:
        var(dim, unbiased, keepdim) and var(unbiased) with a bool."""
        dim, correction = self._correction(dim, unbiased, correction, "var")
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "var")
        return R.Var.apply(self, axis=dim, keepdims=keepdim, correction=correction)

    def std(self, dim=None, unbiased=None, keepdim=False, *, correction=None, axis=None,
            keepdims=None):
        """Standard deviation, sqrt(var), with the same arguments as `var`
        (its gradient is 0 where the input is constant, as PyTorch)."""
        dim, correction = self._correction(dim, unbiased, correction, "std")
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "std")
        return R.Std.apply(self, axis=dim, keepdims=keepdim, correction=correction)

    def logsumexp(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """log(sum(exp(x))) over `dim`, computed stably (all axes if None)."""
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "logsumexp")
        return R.LogSumExp.apply(self, axis=dim, keepdims=keepdim)

    def argmax(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The index of the largest element along `dim` (of the flattened
        tensor if None), as int64; no gradient."""
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "argmax")
        if dim is not None:
            dim = normalize_axis(dim, self.ndim, "argmax")
            dim = dim if self.ndim else None  # 0-d: dim 0 is allowed, numpy needs None
        return Tensor(np.argmax(self.data, axis=dim, keepdims=keepdim))

    def argmin(self, dim=None, keepdim=False, *, axis=None, keepdims=None):
        """The index of the smallest element along `dim`, as argmax."""
        dim, keepdim = _dim_args(dim, keepdim, axis, keepdims, "argmin")
        if dim is not None:
            dim = normalize_axis(dim, self.ndim, "argmin")
            dim = dim if self.ndim else None  # 0-d: dim 0 is allowed, numpy needs None
        return Tensor(np.argmin(self.data, axis=dim, keepdims=keepdim))

    # -------------------------------------------------------------- movement
    def reshape(self, *shape):
        """The same elements in shape `shape` (ints or one tuple; one may be -1)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if shape == self.shape:
            return self
        return M.Reshape.apply(self, shape=shape)

    def view(self, *shape):
        """reshape (a copy when numpy cannot make a view; tensors are not written in place)."""
        return self.reshape(*shape)

    def permute(self, *dims):
        """The axes reordered: output axis i is input axis dims[i]."""
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if len(dims) != self.ndim:
            raise ShapeError(f"permute: got {len(dims)} axes for a tensor of shape {self.shape}")
        return M.Permute.apply(self, axes=dims)

    def transpose(self, *axes):
        """Two axes swap them (PyTorch's transpose(dim0, dim1)); no axes reverse
        all of them; a full permutation applies it (numpy's transpose)."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if len(axes) == 0:
            return self.T
        if len(axes) == 2:
            return self.swapaxes(*axes)
        return self.permute(axes)

    def swapaxes(self, axis0, axis1):
        """Axes axis0 and axis1 exchanged."""
        a = normalize_axis(axis0, self.ndim, "swapaxes")
        b = normalize_axis(axis1, self.ndim, "swapaxes")
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return M.Permute.apply(self, axes=tuple(order))

    def expand(self, *size):
        """A broadcast view to `size` (ints or one tuple); the gradient is summed back."""
        size = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
        return M.Expand.apply(self, shape=size)

    def broadcast_to(self, shape):
        """expand(shape)."""
        return M.Expand.apply(self, shape=tuple(shape))

    def squeeze(self, dim=None, *, axis=None):
        """Drop the axes of size 1 (all, or those of `dim` that have size 1)."""
        axis, _ = _dim_args(dim, False, axis, None, "squeeze")
        if axis is None:
            axes = tuple(i for i, s in enumerate(self.shape) if s == 1)
        else:
            axes = normalize_axes(axis, self.ndim, "squeeze")
            axes = tuple(a for a in axes if self.shape[a] == 1)  # like PyTorch: others stay
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def unsqueeze(self, dim=None, *, axis=None):
        """A new axis of size 1 at position `dim` (required; numpy's axis= also works)."""
        axis, _ = _dim_args(dim, False, axis, None, "unsqueeze")
        if axis is None:
            raise TypeError("unsqueeze: missing the position of the new axis, dim")
        axis = normalize_new_axis(axis, self.ndim, "unsqueeze")
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def flatten(self, start_dim=0, end_dim=-1):
        """Axes start_dim..end_dim merged into one."""
        if self.ndim == 0:
            return self.reshape(1)
        start = normalize_axis(start_dim, self.ndim, "flatten")
        end = normalize_axis(end_dim, self.ndim, "flatten")
        if start > end:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        merged = int(np.prod(self.shape[start:end + 1]))
        return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    def split(self, split_size, dim=0):
        """Split along `dim` into pieces of `split_size` (the last may be
        smaller) or into the given list of sizes, as torch.split does."""
        axis = normalize_axis(dim, self.ndim, "split")
        n = self.shape[axis]
        if isinstance(split_size, (int, np.integer)):
            size = int(split_size)
            if size < 0 or (size == 0 and n):
                raise ValueError(f"split: split_size must be positive (0 only for an axis of size 0), "
                                 f"got {size} for axis {axis} of shape {self.shape}")
            # an axis of size 0 gives one empty piece, as in PyTorch
            sizes = [min(size, n - i) for i in range(0, n, size)] if n else [0]
        else:
            sizes = list(split_size)
            if any(not isinstance(s, (int, np.integer)) or s < 0 for s in sizes):
                raise ValueError(f"split: sizes must be non-negative integers, got {sizes}")
            if sum(sizes) != n:
                raise ShapeError(f"split: sizes {sizes} do not add up to {n}, the size of axis "
                                 f"{axis} of shape {self.shape}")
        pieces, start = [], 0
        lead = (slice(None),) * axis
        for s in sizes:
            pieces.append(self[lead + (slice(start, start + s),)])
            start += s
        return tuple(pieces)

    def chunk(self, chunks, dim=0):
        """Split into `chunks` pieces of equal size (the last may be smaller;
        there may be fewer pieces, as in PyTorch: 6 in 4 chunks gives 3 of 2)."""
        if not isinstance(chunks, (int, np.integer)) or isinstance(chunks, bool) or chunks <= 0:
            raise ValueError(f"chunk: chunks must be a positive integer, got {chunks!r}")
        axis = normalize_axis(dim, self.ndim, "chunk")
        n = self.shape[axis]
        if n == 0:
            return self.split([0] * int(chunks), dim=axis)  # as PyTorch: `chunks` empty pieces
        return self.split(-(-n // chunks), dim=axis)


# ------------------------------------------------------------- free functions
# torch.cat, torch.where, ...: the functions that mirror Tensor methods. The
# creation functions (tensor, zeros, randn, ...) are in creation.py.

def cat(tensors, dim=0):
    """Join tensors along an existing axis."""
    return M.Cat.apply(*tensors, axis=dim)


def concatenate(tensors, axis=0):
    """cat with numpy's argument name (as torch.concatenate)."""
    return M.Cat.apply(*tensors, axis=axis)


def stack(tensors, dim=0):
    """Join tensors of the same shape along a new axis."""
    return M.Stack.apply(*tensors, axis=dim)


def where(condition, input, other):
    """Elementwise `input if condition else other` (condition: a boolean tensor)."""
    x, y = _promote(input, other)
    ref = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    return E.Where.apply(condition, as_tensor_like(x, ref), as_tensor_like(y, ref))


def maximum(input, other):
    """The elementwise maximum (broadcast)."""
    return E.Maximum.apply(*_promote(input, other))


def minimum(input, other):
    """The elementwise minimum (broadcast)."""
    return E.Minimum.apply(*_promote(input, other))


def matmul(input, other):
    """input @ other (an integer operand takes the other's float dtype)."""
    return MatMul.apply(*_promote(input, other))




autograd.register_tensor_type(Tensor, Tensor._make, as_tensor_like)  # the engine's graph nodes are Tensors
