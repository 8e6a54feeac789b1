"""`Module`, the base class of every layer, `Parameter`, and the containers.

A Module finds its parts by looking at its own attributes: an attribute
holding a `Parameter` is a trainable weight, one holding a `Module` is a
child layer, and `register_buffer` names the non-trainable tensors that
belong to it. Names are dotted paths through those attributes, exactly as in
PyTorch ("encoder.layers.0.self_attn.in_proj_weight"), so a state dict moves
between the two frameworks unchanged.

Order matters and follows PyTorch: a module lists its own parameters (in the
order they were assigned), then its buffers, then its children, depth first.
"""
from collections import OrderedDict, namedtuple
from itertools import chain

import numpy as np

from ..dtypes import to_args
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor that is a trainable weight: it requires grad, and a Module
    that holds it as an attribute lists it in `parameters()`.

    `Parameter(data)` shares `data` when it is a numpy array or a Tensor
    (float64 stays float64), as torch.nn.Parameter shares its tensor.
    """

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data, requires_grad=requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


class StateDictError(RuntimeError):
    """`load_state_dict` found missing or unexpected keys or mismatched shapes.

    Nothing was loaded. The lists are kept as attributes for programs; the
    message names every offending key.
    """

    def __init__(self, module_name, missing, unexpected, mismatched):
        self.missing_keys, self.unexpected_keys, self.mismatched = missing, unexpected, mismatched
        lines = [f"Error(s) in loading state_dict for {module_name} (nothing was loaded):"]
        if missing:
            lines.append("  missing keys: " + ", ".join(repr(k) for k in missing))
        if unexpected:
            lines.append("  unexpected keys: " + ", ".join(repr(k) for k in unexpected))
        lines.extend("  " + m for m in mismatched)
        super().__init__("\n".join(lines))


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


def _as_array(value):
    """The numpy array behind a Tensor, a numpy array, or anything with
    `__array__`: a torch tensor, detached first (a torch Parameter refuses
    numpy conversion while it requires grad)."""
    if isinstance(value, Tensor):
        return value.data
    if hasattr(value, "detach"):
        value = value.detach()
    return np.asarray(value)


class Module:
    """Base class of layers. Subclasses call `super().__init__()`, assign
    their parameters and sub-layers as attributes, and define `forward`.

        class TwoLayer(nn.Module):
            def __init__(self):
                super().__init__()
                self.hidden = nn.Linear(4, 8)
                self.out = nn.Linear(8, 1)

            def forward(self, x):
                return self.out(self.hidden(x).relu())

    `TwoLayer()(x)` calls forward; `named_parameters()` yields
    "hidden.weight", "hidden.bias", "out.weight", "out.bias".
    """

    def __init__(self):
        self.training = True
        self._buffer_names = {}  # name -> persistent (saved in state_dict)

    def __getattr__(self, name):
        # Only reached when normal lookup fails: explain the usual cause.
        if name in ("training", "_buffer_names"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}: did its "
                                 "__init__ forget to call super().__init__()?")
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def forward(self, *args, **kwargs):
        """The computation of this layer; subclasses define it. Call the
        module itself, `layer(x)`, rather than `layer.forward(x)`."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------- structure
    def register_buffer(self, name, tensor, persistent=True):
        """Attach a non-trainable tensor (a constant table, running
        statistics) as attribute `name`. `.to(dtype)` converts it with the
        parameters; a persistent buffer is also saved in `state_dict()`."""
        if tensor is not None and not isinstance(tensor, Tensor):
            tensor = Tensor(tensor)
        self._buffer_names[name] = persistent
        setattr(self, name, tensor)

    def _own_parameters(self):
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield name, value

    def _own_buffers(self, persistent_only=False):
        for name, persistent in self._buffer_names.items():
            value = getattr(self, name, None)
            if value is not None and (persistent or not persistent_only):
                yield name, value

    def named_children(self):
        """(attribute name, module) for each direct sub-module."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def children(self):
        """Each direct sub-module."""
        return (module for _, module in self.named_children())

    def _walk(self, prefix=""):
        """(dotted name, module) for this module and all below it, depth first;
        a module reachable by two paths is visited under both."""
        yield prefix, self
        for name, child in self.named_children():
            yield from child._walk(_join(prefix, name))

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) for this module ("") and every sub-module,
        each once (under every path with remove_duplicate=False). `memo`, as
        PyTorch's, is a set of modules to leave out (it is filled in)."""
        seen = set() if memo is None else memo
        for name, module in self._walk(prefix):
            if module not in seen or not remove_duplicate:
                if remove_duplicate:
                    seen.add(module)
                yield name, module

    def modules(self, remove_duplicate=True):
        """Every module, this one first, each once (see named_modules)."""
        return (module for _, module in self.named_modules(remove_duplicate=remove_duplicate))

    def get_submodule(self, target):
        """The sub-module at dotted path `target` ("" is this module)."""
        module = self
        for part in target.split(".") if target else ():
            children = dict(module.named_children())
            if part not in children:
                raise AttributeError(f"{type(module).__name__} has no sub-module {part!r} "
                                     f"(looking up {target!r})")
            module = children[part]
        return module

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Parameter) for every parameter; a parameter shared
        by two layers (tied weights) is listed once, under its first name
        (under each name with remove_duplicate=False)."""
        seen = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse
                   else [(prefix, self)])
        for module_name, module in modules:
            for name, p in module._own_parameters():
                if id(p) not in seen or not remove_duplicate:
                    seen.add(id(p))
                    yield _join(module_name, name), p

    def parameters(self, recurse=True):
        """Every Parameter, each once (see named_parameters)."""
        return (p for _, p in self.named_parameters(recurse=recurse))

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, Tensor) for every buffer (see register_buffer)."""
        seen = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse
                   else [(prefix, self)])
        for module_name, module in modules:
            for name, b in module._own_buffers():
                if id(b) not in seen or not remove_duplicate:
                    seen.add(id(b))
                    yield _join(module_name, name), b

    def buffers(self, recurse=True):
        """Every buffer, each once."""
        return (b for _, b in self.named_buffers(recurse=recurse))

    def num_parameters(self, trainable_only=False):
        """Number of scalars in the parameters (shared ones counted once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def apply(self, fn):
        """Call `fn(module)` on every sub-module, then on this one (custom init)."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # ------------------------------------------------------------ mode, grads
    def train(self, mode=True):
        """Set training mode (dropout active) on this module and all below it."""
        for module in self.modules():
            module.training = bool(mode)
        return self

    def eval(self):
        """Evaluation mode: dropout becomes the identity."""
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        """Set requires_grad on every parameter (False freezes the module); returns self."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    def zero_grad(self, set_to_none=True):
        """Forget the gradients of every parameter (or fill them with zeros)."""
        for p in self.parameters():
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.data[...] = 0

    def to(self, *args, **kwargs):
        """Convert every floating parameter and buffer (and gradient) to a
        floating dtype, in place, keeping the same Parameter objects; returns
        self. As torch's: to(dtype), to("cpu") (nothing to do: the CPU is the
        only device), to("cpu", dtype), to(tensor) (its dtype), dtype=/device=."""
        dtype, _ = to_args(args, dict(kwargs), f"{type(self).__name__}.to")
        if dtype is None:
            return self
        if dtype.kind != "f":
            raise TypeError(f"{type(self).__name__}.to: modules hold floating point weights, "
                            f"cannot convert to {dtype}")
        for module in self.modules():
            for _, t in chain(module._own_parameters(), module._own_buffers()):
                if t.dtype.kind == "f" and t.dtype != dtype:
                    t.data = t.data.astype(dtype)
                    if t.grad is not None:
                        t.grad = Tensor(t.grad.data.astype(dtype))
        return self

    def cpu(self):
        """self: the CPU is the only device (PyTorch's model.cpu())."""
        return self

    def double(self):
        """to(float64)."""
        return self.to(np.float64)

    def float(self):
        """to(float32)."""
        return self.to(np.float32)

    # ------------------------------------------------------------ state dict
    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """An ordered dict from dotted name to Tensor: every parameter and
        persistent buffer, with PyTorch's names. The tensors are detached but
        share memory with the module (copy them to keep a snapshot);
        `keep_vars=True` returns the Parameters themselves; `destination`,
        a dict to fill, is returned instead of a new one."""
        state = OrderedDict() if destination is None else destination
        for module_name, module in self._walk(prefix):
            for name, t in chain(module._own_parameters(), module._own_buffers(persistent_only=True)):
                state[_join(module_name, name)] = t if keep_vars else t.detach()
        return state

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy values from `state_dict` (name -> Tensor, numpy array or torch
        tensor) into the parameters and persistent buffers, in place.

        Everything is checked before anything is copied: a shape mismatch, an
        impossible cast (float into int) and, with `strict=True`, a missing or
        unexpected key raise `StateDictError` naming every problem, and the
        module is left untouched. Values are cast to each parameter's dtype.
        Returns (missing_keys, unexpected_keys). assign=True (PyTorch's: take
        the given tensors as the parameters) is not implemented.
        """
        if assign:
            raise NotImplementedError("load_state_dict: assign=True is not implemented (values "
                                      "are copied into the existing parameters)")
        targets = self.state_dict(keep_vars=True)
        missing = [k for k in targets if k not in state_dict]
        unexpected = [k for k in state_dict if k not in targets]
        mismatched, sources = [], {}
        for key, target in targets.items():
            if key not in state_dict:
                continue
            value = _as_array(state_dict[key])
            if value.shape != target.shape:
                mismatched.append(f"shape mismatch for {key!r}: the state dict has {value.shape}, "
                                  f"the model {target.shape}")
            elif not np.can_cast(value.dtype, target.dtype, "same_kind"):
                mismatched.append(f"dtype mismatch for {key!r}: cannot load {value.dtype} into "
                                  f"{target.dtype}")
            else:
                sources[key] = value
        if mismatched or (strict and (missing or unexpected)):
            raise StateDictError(type(self).__name__, missing if strict else [],
                                 unexpected if strict else [], mismatched)
        for key, value in sources.items():
            np.copyto(targets[key].data, value, casting="same_kind")
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------------ repr
    def extra_repr(self):
        """The settings shown between the parentheses of this module's repr."""
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        children = [f"({name}): " + repr(child).replace("\n", "\n  ")
                    for name, child in self.named_children()]
        if not children:
            return f"{type(self).__name__}({extra})"
        lines = ([extra] if extra else []) + children
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"

    def summary(self):
        """A table of every parameter (name, shape, count) and the total."""
        rows = [(name, str(p.shape), p.numel()) for name, p in self.named_parameters()]
        width = max([len(r[0]) for r in rows] + [9])
        lines = [f"{name:<{width}}  {shape:<14} {count:>10,}" for name, shape, count in rows]
        lines.append(f"{'total':<{width}}  {'':<14} {self.num_parameters():>10,}")
        return "\n".join(lines)


def _check_module(container, value):
    if not isinstance(value, Module):
        raise TypeError(f"{container} holds Modules, got {type(value).__name__}")
    return value


class ModuleList(Module):
    """A list of modules whose parameters are named "0.weight", "1.weight", ...

    It has no forward: the owner decides how to call its items.
    """

    def __init__(self, modules=None):
        super().__init__()
        self._items = [_check_module("ModuleList", m) for m in (modules or ())]

    def named_children(self):
        yield from ((str(i), m) for i, m in enumerate(self._items))
        yield from super().named_children()

    def append(self, module):
        """Add `module` at the end; returns self."""
        self._items.append(_check_module("ModuleList", module))
        return self

    def extend(self, modules):
        """Append each of `modules`; returns self."""
        for m in modules:
            self.append(m)
        return self

    def insert(self, index, module):
        """Insert `module` before position `index`."""
        self._items.insert(index, _check_module("ModuleList", module))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ModuleList(self._items[index])
        return self._items[index]

    def __setitem__(self, index, module):
        self._items[index] = _check_module("ModuleList", module)

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


class ModuleDict(Module):
    """A dict of modules; parameter names start with the key ("enc.weight")."""

    def __init__(self, modules=None):
        super().__init__()
        self._items = OrderedDict()
        if modules is not None:
            self.update(modules)

    def named_children(self):
        yield from self._items.items()
        yield from super().named_children()

    def update(self, modules):
        """Add or replace modules from a dict or from (key, module) pairs."""
        items = modules.items() if hasattr(modules, "items") else modules
        for key, module in items:
            self[key] = module

    def __getitem__(self, key):
        return self._items[key]

    def __setitem__(self, key, module):
        if not isinstance(key, str) or not key or "." in key:
            raise KeyError(f"ModuleDict keys must be non-empty strings without '.', got {key!r}")
        self._items[key] = _check_module("ModuleDict", module)

    def __delitem__(self, key):
        del self._items[key]

    def __contains__(self, key):
        return key in self._items

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def keys(self):
        """The keys, in insertion order."""
        return self._items.keys()

    def values(self):
        """The modules, in insertion order."""
        return self._items.values()

    def items(self):
        """(key, module) pairs, in insertion order."""
        return self._items.items()


class Sequential(Module):
    """Modules called one after the other: Sequential(a, b, c)(x) = c(b(a(x))).

    Children are named "0", "1", ... as in PyTorch, or by the keys of an
    OrderedDict given as the only argument.
    """

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            items = args[0].items()
        else:
            items = ((str(i), m) for i, m in enumerate(args))
        self._items = OrderedDict((name, _check_module("Sequential", m)) for name, m in items)

    def named_children(self):
        yield from self._items.items()
        yield from super().named_children()

    def append(self, module):
        """Add `module` at the end (named by its position); returns self."""
        self._items[str(len(self._items))] = _check_module("Sequential", module)
        return self

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._items.items())[index]))
        return list(self._items.values())[index]

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items.values())

    def forward(self, input):
        """Each module applied in turn to the previous one's output."""
        for module in self._items.values():
            input = module(input)
        return input
