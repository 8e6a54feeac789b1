"""The autograd engine: `Function`, its `Context`, grad mode, reference mode, and backward.

Every op in tinygrad_attn is a `Function` subclass. Calling `MyOp.apply(x, y,
alpha=2.0)` runs `MyOp.forward(ctx, x.data, y.data, alpha=2.0)` on numpy
arrays and, when any input requires grad, records `ctx` on the output tensor.
`Tensor.backward()` then walks the recorded graph in reverse topological
order, calling each op's `backward(ctx, grad_output)`.

The engine, not the op, takes care of three chores so op authors never have
to: summing gradients of broadcast inputs back to the input's shape
(`shapes.unbroadcast`), accumulating the gradient of a tensor used several
times, and freeing saved arrays once a backward pass is done.

Reference mode (`reference_ops()`) is the engine's too: a fused op's
`apply` then runs the op's composite twin, registered with `composite_of`,
so a whole model runs, and backpropagates, through primitive ops.
"""
import contextlib
import contextvars
import functools
import threading
import weakref

import numpy as np

from .shapes import unbroadcast

# ---------------------------------------------------------------- grad mode

_grad_enabled = True
_anomaly_enabled = False


def is_grad_enabled():
    """Whether ops are recorded for backward now (False inside no_grad())."""
    return _grad_enabled


class set_grad_enabled:
    """Turn graph recording on or off: a context manager and a decorator."""

    def __init__(self, mode=True):
        self.mode = bool(mode)
        self.prev = []

    def __enter__(self):
        global _grad_enabled
        self.prev.append(_grad_enabled)
        _grad_enabled = self.mode
        return self

    def __exit__(self, *exc):
        global _grad_enabled
        _grad_enabled = self.prev.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(self.mode):  # a fresh one per call: safe to nest and recurse
                return fn(*args, **kwargs)
        return wrapper


class no_grad(set_grad_enabled):
    """Record no graph inside (`with no_grad():` or `@no_grad()`)."""

    def __init__(self):
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """Record the graph again inside a `no_grad` region."""

    def __init__(self):
        super().__init__(True)


# ----------------------------------------------------- reference ops mode

# Per thread (a contextvars.ContextVar): a thread that enters reference_ops()
# changes nothing for the others, and a new thread starts in a fresh
# context, with the fused ops (unless the interpreter makes threads inherit
# the context, as Python 3.14's free-threaded build does). Grad mode, by
# contrast, is one process-wide flag.
_reference_ops = contextvars.ContextVar("tinygrad_attn.reference_ops", default=False)


def is_reference_ops_enabled():
    """Whether the fused ops run their composite twins now (in this thread)."""
    return _reference_ops.get()


def set_reference_ops(enabled):
    """True: every fused op (one with a composite twin, `composite_of`) runs
    its twin instead, every primitive step in the graph; False: the fused ops
    (the default). For this thread; returns the previous setting."""
    previous = _reference_ops.get()
    _reference_ops.set(bool(enabled))
    return previous


class reference_ops(contextlib.ContextDecorator):
    """Run the composite twins of the fused ops inside: `with reference_ops():`,
    or as a decorator, `@reference_ops()`. `reference_ops(False)` runs the
    fused ops inside a reference region. Nests, and restores the previous
    setting on exit, also when an exception leaves the block. Per thread;
    one instance may be entered in several threads at once, and again inside
    itself (a decorated function that recurses)."""

    def __init__(self, enabled=True):
        self.enabled = bool(enabled)
        self._local = threading.local()  # each thread's stack of the settings to restore

    def _tokens(self):
        return self._local.__dict__.setdefault("tokens", [])

    def __enter__(self):
        self._tokens().append(_reference_ops.set(self.enabled))
        return self

    def __exit__(self, *exc):
        _reference_ops.reset(self._tokens().pop())
        return False


def composite_of(op):
    """Register the decorated function as `op`'s composite twin: the same
    computation from primitive ops, called with what `op.apply` is called
    with (tensors, then the op's keyword parameters). Inside
    `reference_ops()`, `op.apply` runs it instead of the op's kernel
    (tinygrad_attn/reference/composites.py holds them all)."""
    def register(fn):
        op.composite = staticmethod(fn)
        return fn
    return register


class AnomalyError(FloatingPointError):
    """A NaN or Inf appeared in an op's forward output or backward gradient."""


@contextlib.contextmanager
def detect_anomaly():
    """Check every op's output and gradients for NaN/Inf while inside.

    Raises `AnomalyError` naming the first op that produced a non-finite
    value, in forward or in backward. Slow: for debugging only.
    """
    global _anomaly_enabled
    prev, _anomaly_enabled = _anomaly_enabled, True
    try:
        yield
    finally:
        _anomaly_enabled = prev


def _check_finite(array, what):
    if array is not None and array.dtype.kind == "f" and not np.isfinite(array).all():
        kind = "NaN" if np.isnan(array).any() else "Inf"
        raise AnomalyError(f"{what} produced {kind} (shape {array.shape})")


# ------------------------------------------------------- the tensor type

# The engine builds graph nodes of one tensor type, which registers itself
# (tensor.py, at import): the class, a fast constructor make(data,
# requires_grad, ctx), and constant(x, like), which wraps a Python number or
# array met among an op's inputs. Registering keeps the engine below Tensor:
# it never imports tensor.py. Nodes have .data, .requires_grad, .grad,
# ._ctx, ._hooks and ._retains_grad.
_tensor_type = None
_make_tensor = None
_constant = None


def register_tensor_type(tensor_type, make, constant):
    """Tell the engine which class its nodes are and how to make them."""
    global _tensor_type, _make_tensor, _constant
    _tensor_type, _make_tensor, _constant = tensor_type, make, constant


# ------------------------------------------------------- Function and Context

class Context:
    """What an op remembers between its forward and its backward, and the
    graph node of the tensor it made.

    `save_for_backward(*arrays)` keeps arrays for backward; any other
    attribute (`ctx.axis = 1`) can be set too. `needs_input_grad[i]` tells
    backward whether input i wants a gradient, so it can skip work.

    The graph links nodes, not tensors: `parents` holds, for each input,
    the input's own Context if an op made it, else the input tensor (a
    leaf or a constant). So the graph keeps what backward needs (the saved
    arrays, and the output's shape and dtype) and no op output's data: an
    intermediate tensor nobody holds any more is freed at once, as in
    PyTorch, and a Linear layer's output that only a ReLU read costs no
    memory until backward. A node knows its tensor through a weak reference
    (`output()`); the hooks and retain_grad() of that tensor live here, so
    they work after the tensor itself is gone. A node answers the questions
    the backward walk asks a leaf tensor: requires_grad, _ctx, _hooks, and
    (as out_shape, out_dtype: ops use ctx.shape for their own) its shape.
    """

    __slots__ = ("fn", "parents", "needs_input_grad", "_saved", "_freed", "out_shape", "out_dtype", "_hooks",
                 "_retains_grad", "_output", "_kept", "__dict__")

    requires_grad = True  # only an output that requires grad gets a Context
    _ctx = property(lambda self: self)  # a node is its own op

    def __init__(self, fn, parents):
        self.fn = fn
        self.needs_input_grad = tuple(p.requires_grad for p in parents)
        self.parents = tuple(node_of(p) for p in parents)
        self._saved = ()
        self._freed = False
        self._hooks = None
        self._retains_grad = False
        self._output = self._kept = None

    def _record_output(self, tensor):
        self.out_shape, self.out_dtype = tensor.data.shape, tensor.data.dtype
        self._output = weakref.ref(tensor)
        if _keep_tensors:  # viz.keep_tensors(): the graph holds its tensors, values and all
            self._kept = tensor

    def output(self):
        """The tensor this op made, or None once nothing else holds it."""
        return None if self._output is None else self._output()

    def save_for_backward(self, *arrays):
        self._saved = arrays

    def check_not_freed(self):
        """Raise a clear error if backward already ran through this op and freed it."""
        if self._freed:
            raise RuntimeError(
                f"{self.fn.__name__}: trying to backward through the graph a second time; its saved "
                "arrays were freed after the first backward. Pass retain_graph=True to the first "
                "backward() if you need to call it twice.")

    @property
    def saved_tensors(self):
        self.check_not_freed()
        return self._saved

    def release(self):
        """Free what the graph holds after backward: saved arrays, other
        attributes, and the links to the inputs."""
        self._saved = ()
        self.__dict__.clear()
        self.parents = ()
        self._kept = None
        self._freed = True


def node_of(tensor):
    """The graph node of a tensor: its op's Context, or the tensor itself for a leaf."""
    return tensor if tensor._ctx is None else tensor._ctx


def node_shape_dtype(node):
    """(shape, dtype) of a node's tensor: a leaf's own, an op's output's."""
    return (node.shape, node.dtype) if node._ctx is None else (node.out_shape, node.out_dtype)


_keep_tensors = False


@contextlib.contextmanager
def keep_tensors():
    """Inside, every op's output stays alive as long as its graph does (for
    drawing every intermediate's values: viz.keep_tensors). Costs the memory
    of every op's output until backward frees the graph."""
    global _keep_tensors
    prev, _keep_tensors = _keep_tensors, True
    try:
        yield
    finally:
        _keep_tensors = prev


class Function:
    """Base class of every differentiable op.

    Subclasses define two static methods, working on numpy arrays:

    - `forward(ctx, *inputs, **params)` returns the output array;
    - `backward(ctx, grad_output)` returns one gradient per input (a tuple,
      or a single array for one input), `None` where no gradient is needed.

    Rules: backward must not modify `grad_output` in place, and may return a
    gradient of the broadcast shape (the engine sums it back to the input's
    shape). Call the op with `MyOp.apply(*tensors, **params)`.

    Public subclasses defined inside `tinygrad_attn.ops` are recorded in
    `Function.registry`; the test suite checks each has a gradient check.

    An op that runs a kernel also defines `example(dtype, size)`, a static
    method returning a call of the op on made-up inputs: (arrays, params),
    the arrays holding about `size` elements (a boolean array is an input
    that takes no gradient). Nothing lists the kernels a step needs: the
    warm-up (warmup.py) runs every op's example to learn which kernels to
    compile with which argument types, and the tests run the examples to
    check every kernel (bit-identical whatever the number of threads,
    float32 kept float32).

    A fused op (one kernel doing what several primitive ops could) has a
    composite twin, registered with `@composite_of(Op)`: inside
    `reference_ops()` its `apply` runs the twin, the one place where the
    fused or the readable path is chosen.
    """

    registry = {}
    example = None  # ops with a kernel: staticmethod example(dtype, size) -> (arrays, params)
    composite = None  # fused ops: their composite twin, registered by @composite_of

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("tinygrad_attn.ops") and not cls.__name__.startswith("_"):
            Function.registry[cls.__name__] = cls

    @staticmethod
    def forward(ctx, *inputs, **params):
        """The op on numpy arrays: return the output array; keep what backward
        needs with ctx.save_for_backward(...) or as attributes of ctx."""
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_output):
        """dL/d(each input) from dL/d(output): one array (or None) per input."""
        raise NotImplementedError

    @classmethod
    def apply(cls, *inputs, **params):
        """Run the op on Tensors (Python scalars and arrays become constants)."""
        return cls.apply_with_ctx(*inputs, **params)[0]

    @classmethod
    def apply_with_ctx(cls, *inputs, **params):
        """Like `apply`, but also return the `Context` (ops that expose extra
        results, such as attention weights, keep them on it). Inside
        `reference_ops()` a fused op runs its composite twin, which records
        its primitive ops and no Context of this op: (result, None)."""
        if cls.composite is not None and _reference_ops.get():
            return cls.composite(*inputs, **params), None
        ref = next((x for x in inputs if isinstance(x, _tensor_type)), None)
        parents = tuple(x if isinstance(x, _tensor_type) else _constant(x, ref) for x in inputs)
        ctx = Context(cls, parents)
        data = cls.forward(ctx, *[p.data for p in parents], **params)
        if _anomaly_enabled:
            _check_finite(data, f"{cls.__name__} (forward)")
        requires_grad = _grad_enabled and any(ctx.needs_input_grad)
        out = _make_tensor(data, requires_grad, ctx if requires_grad else None)
        if requires_grad:
            ctx._record_output(out)
        return out, ctx


# ------------------------------------------------------------------ backward

def _topological_order(roots):
    """Nodes (an op's Context, or a leaf tensor: see Context) reachable from
    the nodes `roots` that require grad, inputs before outputs.

    An explicit stack instead of recursion: a chain of 100k ops is fine.
    """
    order, visited = [], set()
    stack = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        if node._ctx is not None:
            for parent in node._ctx.parents:
                if parent.requires_grad and id(parent) not in visited:
                    stack.append((parent, False))
    return order


def _accumulate(grads, key, g):
    prev = grads.get(key)
    # Never add in place: `g` may be an array another op also holds.
    grads[key] = g if prev is None else prev + g


def _owned_copy(g, dtype, shared):
    """`g` itself if nothing else can hold it (a fresh, writeable array that
    owns its memory), else a copy; either way the result is recorded as shared.
    `.grad` arrays are updated in place (accumulation, clipping), so two
    tensors must never share one."""
    if g.base is None and g.flags.writeable and g.dtype == dtype and id(g) not in shared:
        shared.add(id(g))
        return g
    return np.array(g, dtype=dtype, copy=True)


def _hook_gradient(hook, grad, new):
    """A hook's result replaces the gradient, so, as in PyTorch, it must keep
    the gradient's shape (the tensor's): anything else would be stored as a
    wrong-shaped .grad or fail later inside some op's backward."""
    if new.shape != grad.shape:
        name = getattr(hook, "__qualname__", None) or repr(hook)
        raise RuntimeError(f"hook {name!r} has changed the size of the gradient: it returned shape "
                           f"{new.shape} for a tensor of shape {grad.shape}")
    return new


def _apply_hooks(node, g, shared):
    """The gradient of `node` after its hooks (each may return a replacement)."""
    for hook in node._hooks or ():
        new = hook(_make_tensor(g, False, None))
        if new is not None:
            new = new.data if isinstance(new, _tensor_type) else np.asarray(new, dtype=g.dtype)
            g = _hook_gradient(hook, g, new)
            shared.add(id(g))
    return g


def _input_gradients(ctx, g):
    """Run the op's backward on g; yield (input, its gradient) for the inputs
    that need one, each summed back to the input's shape and cast to its dtype."""
    in_grads = ctx.fn.backward(ctx, g)
    if not isinstance(in_grads, tuple):
        in_grads = (in_grads,)
    if len(in_grads) != len(ctx.parents):
        raise RuntimeError(f"{ctx.fn.__name__}.backward returned {len(in_grads)} gradients "
                           f"for {len(ctx.parents)} inputs")
    for parent, needs, pg in zip(ctx.parents, ctx.needs_input_grad, in_grads):
        if not needs or pg is None:
            continue
        shape, dtype = node_shape_dtype(parent)
        pg = np.asarray(pg)
        if pg.shape != shape:
            pg = unbroadcast(pg, shape)
        if pg.dtype != dtype:
            pg = pg.astype(dtype)
        if _anomaly_enabled:
            _check_finite(pg, f"{ctx.fn.__name__} (backward)")
        yield parent, pg


def _walk(roots, root_grads, retain_graph, shared):
    """The backward walk: yield (node, dL/dnode) from the roots back to the
    leaves, each node (a leaf tensor or an op's Context) once, with its
    gradient complete and its hooks applied. After the consumer has seen a
    node, its op's backward runs and adds to its inputs' gradients; unless
    retain_graph, the op is then freed."""
    grads = {}
    roots = [node_of(r) for r in roots]
    for r, g in zip(roots, root_grads):
        _accumulate(grads, id(r), g)
    for node in reversed(_topological_order(roots)):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        g = _apply_hooks(node, g, shared)
        yield node, g
        ctx = node._ctx
        if ctx is None:
            continue
        ctx.check_not_freed()
        for parent, pg in _input_gradients(ctx, g):
            _accumulate(grads, id(parent), pg)
        if not retain_graph:
            ctx.release()


def run_backward(roots, root_grads, retain_graph=False):
    """Backpropagate `root_grads` from `roots` (Tensor.backward): gradients
    accumulate into the `.grad` of leaves and of tensors that called
    `retain_grad()`."""
    # Arrays that something else may hold: the caller's starting gradients,
    # hook results, and arrays already stored as some tensor's .grad. A
    # gradient can become a .grad without a copy only if it is none of these.
    shared = {id(g) for g in root_grads}
    for node, g in _walk(roots, root_grads, retain_graph, shared):
        # a leaf, or an intermediate that called retain_grad() and is still held
        tensor = node if node._ctx is None else node.output() if node._retains_grad else None
        if tensor is None:
            continue
        if tensor.grad is None:
            tensor.grad = _make_tensor(_owned_copy(g, tensor.dtype, shared), False, None)
        else:
            tensor.grad.data += g


def _gradients_of(inputs, roots, root_grads, retain_graph):
    """The gradients of `inputs` (None where no gradient reaches one); no `.grad` is touched."""
    found = {id(node_of(t)): None for t in inputs}
    for node, g in _walk(roots, root_grads, retain_graph, set()):
        if id(node) in found:
            found[id(node)] = g
    return [found[id(node_of(t))] for t in inputs]


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """Gradients of `outputs` with respect to `inputs`, as a tuple of Tensors.

    Like `torch.autograd.grad`: nothing is accumulated into `.grad`. Inputs
    that the outputs do not depend on give `None` when `allow_unused=True`
    (zeros with materialize_grads=True) and an error otherwise. Not
    implemented: create_graph=True (gradients are first order only) and
    is_grads_batched=True (NotImplementedError); only_inputs is ignored, as
    in PyTorch.
    """
    for arg, value in (("create_graph", create_graph), ("is_grads_batched", is_grads_batched)):
        if value:
            raise NotImplementedError(f"grad: {arg}=True is not implemented (gradients are first "
                                      "order only, one backward per call)")
    allow_unused = bool(allow_unused) or materialize_grads
    outputs = [outputs] if isinstance(outputs, _tensor_type) else list(outputs)
    inputs = [inputs] if isinstance(inputs, _tensor_type) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, _tensor_type):
        grad_outputs = [grad_outputs]
    root_grads = [_root_grad(o, g, "grad") for o, g in zip(outputs, grad_outputs)]
    found = _gradients_of(inputs, outputs, root_grads, bool(retain_graph))
    result = []
    for t, g in zip(inputs, found):
        if g is None and not allow_unused:
            raise RuntimeError("grad: one of the inputs was not used to compute the outputs "
                               "(pass allow_unused=True to get None for it)")
        if g is None and materialize_grads:
            g = np.zeros(t.shape, dtype=t.dtype)
        result.append(None if g is None else _make_tensor(np.array(g, dtype=t.dtype), False, None))
    return tuple(result)


def _root_grad(tensor, gradient, op):
    """The starting gradient for a backward pass from `tensor`."""
    if not tensor.requires_grad:
        raise RuntimeError(f"{op}: the tensor does not require grad and has no graph "
                           "(was it computed under no_grad(), or from inputs without requires_grad?)")
    if gradient is None:
        if tensor.data.size != 1:
            raise RuntimeError(f"{op}: backward() without a gradient needs a tensor with one element, "
                               f"got shape {tensor.shape}; pass gradient= of that shape")
        return np.ones(tensor.shape, dtype=tensor.dtype)
    g = gradient.data if isinstance(gradient, _tensor_type) else np.asarray(gradient)
    if g.shape != tensor.shape:
        raise RuntimeError(f"{op}: gradient has shape {g.shape} but the tensor has shape {tensor.shape}")
    return g.astype(tensor.dtype, copy=False)
