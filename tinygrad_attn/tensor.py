"""`Tensor`: a numpy array plus what autograd needs.

The class is thin on purpose: every method that computes something calls an
op in `tinygrad_attn/ops/`, where forward and backward live side by side.
"""
import numpy as np

from . import autograd
from .autograd import run_backward, _root_grad
from .ops import elementwise as E
from .ops import movement as M
from .ops import reduce as R
from .ops.matmul import MatMul
from .ops.softmax import LogSoftmax, Softmax
from .shapes import ShapeError, normalize_axes, normalize_axis, normalize_new_axis

float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
int64 = np.dtype(np.int64)
bool_ = np.dtype(np.bool_)

_DTYPE_NAMES = {"float32": float32, "float": float32, "float64": float64, "double": float64,
                "int64": int64, "long": int64, "int": int64, "bool": bool_}


def _canonical_dtype(dtype):
    """Map a user's dtype (np.float32, "float64", ...) to one we support."""
    if isinstance(dtype, str) and dtype in _DTYPE_NAMES:
        return _DTYPE_NAMES[dtype]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"Tensor: unsupported dtype {dtype!r}") from None
    if dt in (float32, float64, int64, bool_):
        return dt
    if dt.kind in "iu":
        return int64
    if dt == np.float16:
        return float32
    raise TypeError(f"Tensor: unsupported dtype {dt} (use float32, float64, int64 or bool)")


def _to_array(data, dtype):
    """Convert user data to an array of a supported dtype.

    numpy arrays keep their dtype (float64 stays float64, as in PyTorch);
    Python floats and lists of floats become float32, Python ints int64.
    """
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        dtype = _canonical_dtype(dtype)
    if isinstance(data, np.ndarray):
        arr = data
    else:
        if isinstance(data, (str, bytes)):
            raise TypeError(f"Tensor: cannot make a tensor from a {type(data).__name__}")
        try:
            arr = np.asarray(data)
        except ValueError as e:
            raise ValueError(f"Tensor: cannot make a tensor from this data: {e}") from None
        # numpy holds Python ints beyond int64 as objects, uint64 or (mixed with others) floats
        if dtype is not None and dtype.kind == "f":
            if arr.dtype.kind == "O":
                arr = _as_float64(data, arr)
        elif arr.dtype.kind in "Ou" or (arr.dtype.kind == "f" and (np.abs(arr) >= 2.0 ** 63).any()):
            _check_python_ints(data)
        if arr.dtype == float64 and not isinstance(data, np.generic) and dtype is None:
            dtype = float32  # Python floats default to float32
    if arr.dtype.kind not in "fiub":
        raise TypeError(f"Tensor: unsupported data of dtype {arr.dtype} "
                        "(tensors hold floats, integers or booleans)")
    target = dtype if dtype is not None else _canonical_dtype(arr.dtype)
    if target == int64 and arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:
        raise OverflowError(f"Tensor: uint64 value {arr.max()} does not fit in int64, the integer "
                            f"dtype of tensors (range [-2**63, 2**63 - 1])")
    return arr if arr.dtype == target else arr.astype(target)


_INT64_MAX = np.iinfo(np.int64).max


def _as_float64(data, arr):
    """Huge Python ints asked for as floats: convert them (anything else stays an object array)."""
    try:
        return np.asarray(data, dtype=float64)
    except (TypeError, ValueError):
        return arr


def _check_python_ints(data):
    """Raise OverflowError for a Python int outside int64 in `data` (rare:
    only called when numpy found values that large)."""
    for v in np.asarray(data, dtype=object).flat:
        if isinstance(v, int) and not isinstance(v, bool) and not -_INT64_MAX - 1 <= v <= _INT64_MAX:
            raise OverflowError(f"Tensor: integer {v} does not fit in int64, the integer dtype of "
                                "tensors (range [-2**63, 2**63 - 1])")


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


def _reduce_args(axis, keepdims, torch_names, op):
    """Accept PyTorch's `dim=` / `keepdim=` spellings as well as numpy's."""
    dim = torch_names.pop("dim", None)
    keepdim = torch_names.pop("keepdim", None)
    if torch_names:
        raise TypeError(f"{op}: unexpected keyword arguments {sorted(torch_names)}")
    if dim is not None:
        axis = dim
    if keepdim is not None:
        keepdims = keepdim
    return axis, bool(keepdims)


class Tensor:
    """An n-dimensional array that records the ops applied to it.

    `Tensor(data, dtype=None, requires_grad=False)` accepts numpy arrays,
    nested lists and Python scalars. When `requires_grad` is set, ops on it
    build a graph that `backward()` walks to fill in `.grad`.
    `.data` is the underlying numpy array.
    """

    __slots__ = ("data", "grad", "_requires_grad", "_ctx", "_retains_grad", "_hooks", "name",
                 "__weakref__")
    __array_ufunc__ = None  # numpy defers to our reflected operators: array + tensor -> Tensor

    def __init__(self, data, dtype=None, requires_grad=False):
        self.data = _to_array(data, dtype)
        self.grad = None
        self._ctx = None
        self._retains_grad = False
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
        t._retains_grad = False
        t._hooks = None
        t.name = None
        return t

    # ------------------------------------------------------------ properties
    @property
    def requires_grad(self):
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
        return self.data.shape

    @property
    def ndim(self):
        return self.data.ndim

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def size(self):
        return self.data.size

    @property
    def is_leaf(self):
        return self._ctx is None

    @property
    def grad_fn(self):
        """Name of the op that made this tensor (None for leaves)."""
        return None if self._ctx is None else self._ctx.fn.__name__

    @property
    def T(self):
        return self.permute(tuple(reversed(range(self.ndim))))

    def numpy(self):
        """The underlying array (shared, not copied)."""
        return self.data

    def __array__(self, dtype=None, copy=None):
        return self.data if dtype is None else self.data.astype(dtype)

    def item(self):
        if self.size != 1:
            raise ValueError(f"item: only a tensor with one element can be converted to a "
                             f"Python scalar, got shape {self.shape}")
        return self.data.item()

    def tolist(self):
        return self.data.tolist()

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self):
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor with {self.size} elements is ambiguous")
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
    def backward(self, gradient=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) into the `.grad` of every leaf that requires grad.

        A tensor with one element needs no `gradient`; any other tensor needs
        one of its shape (the vector in the vector-Jacobian product).
        """
        run_backward([self], [_root_grad(self, gradient, "backward")], retain_graph)

    def detach(self):
        """The same data, cut from the graph."""
        return Tensor._make(self.data, False, None)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    def retain_grad(self):
        """Keep `.grad` on this non-leaf tensor after backward."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad: this tensor does not require grad")
        self._retains_grad = True

    def register_hook(self, hook):
        """Call `hook(grad)` when this tensor's gradient is computed; a
        returned tensor replaces the gradient. Returns a handle with `.remove()`."""
        if not self.requires_grad:
            raise RuntimeError("register_hook: cannot register a hook on a tensor that does not require grad")
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        hooks = self._hooks

        class _Handle:
            @staticmethod
            def remove():
                if hook in hooks:
                    hooks.remove(hook)
        return _Handle()

    # ------------------------------------------------------------ conversion
    def to(self, dtype):
        """A copy of dtype `dtype` (gradients flow back through float casts)."""
        dtype = _canonical_dtype(dtype)
        if dtype == self.dtype:
            return self
        if dtype.kind == "f" and self.dtype.kind == "f":
            return E.Cast.apply(self, dtype=dtype)
        return Tensor._make(self.data.astype(dtype), False, None)

    astype = to

    def float(self):
        return self.to(float32)

    def double(self):
        return self.to(float64)

    def long(self):
        return self.to(int64)

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

    add, sub, mul, div, pow, matmul, neg = __add__, __sub__, __mul__, __truediv__, __pow__, __matmul__, __neg__

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
        return E.Exp.apply(self)

    def log(self):
        return E.Log.apply(self)

    def sqrt(self):
        return E.Sqrt.apply(self)

    def tanh(self):
        return E.Tanh.apply(self)

    def sigmoid(self):
        return E.Sigmoid.apply(self)

    def relu(self):
        return E.Relu.apply(self)

    def gelu(self, approximate="none"):
        return E.Gelu.apply(self, approximate=approximate)

    def abs(self):
        return E.Abs.apply(self)

    def clip(self, min=None, max=None):
        return E.Clip.apply(self, min=min, max=max)

    clamp = clip

    def maximum(self, other):
        return E.Maximum.apply(*_promote(self, other))

    def minimum(self, other):
        return E.Minimum.apply(*_promote(self, other))

    def masked_fill(self, mask, value):
        """Replace the elements where `mask` is True by `value`."""
        return E.MaskedFill.apply(self, mask, value=value)

    def softmax(self, dim=-1):
        return Softmax.apply(self, axis=dim)

    def log_softmax(self, dim=-1):
        return LogSoftmax.apply(self, axis=dim)

    # ------------------------------------------------------------ reductions
    def sum(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "sum")
        return R.Sum.apply(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "mean")
        return R.Mean.apply(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "max")
        return R.Max.apply(self, axis=axis, keepdims=keepdims)

    def min(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "min")
        return R.Min.apply(self, axis=axis, keepdims=keepdims)

    def var(self, axis=None, keepdims=False, correction=1, **torch_names):
        """Variance; correction=1 (default, as PyTorch) divides by N - 1, correction=0 by N."""
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "var")
        return R.Var.apply(self, axis=axis, keepdims=keepdims, correction=correction)

    def std(self, axis=None, keepdims=False, correction=1, **torch_names):
        """Standard deviation, sqrt(var) (its gradient is 0 where the input is constant, as PyTorch)."""
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "std")
        return R.Std.apply(self, axis=axis, keepdims=keepdims, correction=correction)

    def logsumexp(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "logsumexp")
        return R.LogSumExp.apply(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "argmax")
        if axis is not None:
            axis = normalize_axis(axis, self.ndim, "argmax")
            axis = axis if self.ndim else None  # 0-d: dim 0 is allowed, numpy needs None
        return Tensor(np.argmax(self.data, axis=axis, keepdims=keepdims))

    def argmin(self, axis=None, keepdims=False, **torch_names):
        axis, keepdims = _reduce_args(axis, keepdims, torch_names, "argmin")
        if axis is not None:
            axis = normalize_axis(axis, self.ndim, "argmin")
            axis = axis if self.ndim else None  # 0-d: dim 0 is allowed, numpy needs None
        return Tensor(np.argmin(self.data, axis=axis, keepdims=keepdims))

    # -------------------------------------------------------------- movement
    def reshape(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if shape == self.shape:
            return self
        return M.Reshape.apply(self, shape=shape)

    view = reshape

    def permute(self, *axes):
        axes = tuple(axes[0]) if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        if len(axes) != self.ndim:
            raise ShapeError(f"permute: got {len(axes)} axes for a tensor of shape {self.shape}")
        return M.Permute.apply(self, axes=axes)

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
        a = normalize_axis(axis0, self.ndim, "swapaxes")
        b = normalize_axis(axis1, self.ndim, "swapaxes")
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return M.Permute.apply(self, axes=tuple(order))

    def expand(self, *shape):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return M.Expand.apply(self, shape=shape)

    def broadcast_to(self, shape):
        return M.Expand.apply(self, shape=tuple(shape))

    def squeeze(self, axis=None, **torch_names):
        axis, _ = _reduce_args(axis, False, torch_names, "squeeze")
        if axis is None:
            axes = tuple(i for i, s in enumerate(self.shape) if s == 1)
        else:
            axes = normalize_axes(axis, self.ndim, "squeeze")
            axes = tuple(a for a in axes if self.shape[a] == 1)  # like PyTorch: others stay
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    def unsqueeze(self, axis=None, **torch_names):
        axis, _ = _reduce_args(axis, False, torch_names, "unsqueeze")
        axis = normalize_new_axis(axis, self.ndim, "unsqueeze")
        return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

    def flatten(self, start_dim=0, end_dim=-1):
        if self.ndim == 0:
            return self.reshape(1)
        start = normalize_axis(start_dim, self.ndim, "flatten")
        end = normalize_axis(end_dim, self.ndim, "flatten")
        if start > end:
            raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        merged = int(np.prod(self.shape[start:end + 1]))
        return self.reshape(self.shape[:start] + (merged,) + self.shape[end + 1:])

    def split(self, split_size_or_sections, dim=0):
        """Split along `dim` into pieces of `split_size` (the last may be
        smaller) or into the given list of sizes, as torch.split does."""
        axis = normalize_axis(dim, self.ndim, "split")
        n = self.shape[axis]
        if isinstance(split_size_or_sections, (int, np.integer)):
            size = int(split_size_or_sections)
            if size < 0 or (size == 0 and n):
                raise ValueError(f"split: split_size must be positive (0 only for an axis of size 0), "
                                 f"got {size} for axis {axis} of shape {self.shape}")
            # an axis of size 0 gives one empty piece, as in PyTorch
            sizes = [min(size, n - i) for i in range(0, n, size)] if n else [0]
        else:
            sizes = list(split_size_or_sections)
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

def tensor(data, dtype=None, requires_grad=False):
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def cat(tensors, dim=0):
    """Join tensors along an existing axis."""
    return M.Cat.apply(*tensors, axis=dim)


concatenate = cat


def stack(tensors, dim=0):
    """Join tensors of the same shape along a new axis."""
    return M.Stack.apply(*tensors, axis=dim)


def where(condition, x, y):
    """Elementwise `x if condition else y` (condition: a boolean tensor)."""
    x, y = _promote(x, y)
    ref = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    return E.Where.apply(condition, as_tensor_like(x, ref), as_tensor_like(y, ref))


def maximum(x, y):
    return E.Maximum.apply(*_promote(x, y))


def minimum(x, y):
    return E.Minimum.apply(*_promote(x, y))


def matmul(a, b):
    return MatMul.apply(*_promote(a, b))


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_size(size, op, name="size"):
    """A tensor size (an int or a sequence of ints) as a tuple, or an error
    naming the op and the argument."""
    dims = (size,) if _is_int(size) else size
    if not isinstance(dims, (tuple, list)) or not all(_is_int(d) for d in dims):
        raise TypeError(f"{op}: {name} must be an int or a tuple of ints, got {size!r}")
    if any(d < 0 for d in dims):
        raise ValueError(f"{op}: {name} must not be negative, got {tuple(dims)}")
    return tuple(int(d) for d in dims)


def _shape_args(shape, op):
    """`f(2, 3)` or `f((2, 3))`, checked."""
    return _check_size(tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape,
                       op)


def zeros(*shape, dtype=float32, requires_grad=False):
    return Tensor(np.zeros(_shape_args(shape, "zeros"), dtype=_canonical_dtype(dtype)),
                  requires_grad=requires_grad)


def ones(*shape, dtype=float32, requires_grad=False):
    return Tensor(np.ones(_shape_args(shape, "ones"), dtype=_canonical_dtype(dtype)),
                  requires_grad=requires_grad)


def full(shape, fill_value, dtype=float32, requires_grad=False):
    if not isinstance(fill_value, (int, float, bool, np.number, np.bool_)):
        raise TypeError(f"full: fill_value must be a number, got {fill_value!r}")
    return Tensor(np.full(_check_size(shape, "full"), fill_value, dtype=_canonical_dtype(dtype)),
                  requires_grad=requires_grad)


def zeros_like(t, dtype=None, requires_grad=False):
    return zeros(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def ones_like(t, dtype=None, requires_grad=False):
    return ones(t.shape, dtype=dtype or t.dtype, requires_grad=requires_grad)


def arange(start, stop=None, step=1, dtype=None):
    """[start, stop) by step: int64 for integer arguments, float32 if any is a float."""
    if stop is None:
        start, stop = 0, start
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if not isinstance(value, (int, float, np.number)) or isinstance(value, (bool, np.bool_)):
            raise TypeError(f"arange: {name} must be a number, got {value!r}")
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    data = np.arange(start, stop, step)
    return Tensor(data, dtype=dtype if dtype is not None or data.dtype.kind != "f" else float32)


def randn(*shape, dtype=float32, requires_grad=False):
    """Standard normal samples from the generator seeded by `manual_seed`."""
    from .random import get_generator
    data = get_generator().standard_normal(_shape_args(shape, "randn")).astype(_canonical_dtype(dtype))
    return Tensor(data, requires_grad=requires_grad)


def rand(*shape, dtype=float32, requires_grad=False):
    """Uniform samples in [0, 1) from the generator seeded by `manual_seed`."""
    from .random import get_generator
    data = get_generator().random(_shape_args(shape, "rand")).astype(_canonical_dtype(dtype))
    return Tensor(data, requires_grad=requires_grad)


def randint(low, high, size, dtype=int64):
    """Integers drawn uniformly from [low, high), of shape `size`."""
    from .random import get_generator
    if not _is_int(low) or not _is_int(high):
        raise TypeError(f"randint: low and high must be integers, got low={low!r}, high={high!r}")
    if low >= high:
        raise ValueError(f"randint: low must be less than high, got low={low}, high={high}")
    return Tensor(get_generator().integers(low, high, size=_check_size(size, "randint")), dtype=dtype)


autograd.register_tensor_type(Tensor, Tensor._make, as_tensor_like)  # the engine's graph nodes are Tensors
