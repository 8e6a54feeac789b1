"""Every public piece of the API explains itself: help(Tensor.sum),
help(nn.MultiheadAttention.forward), help(F.cross_entropy) show a docstring.

The walk covers the top-level package, Tensor (methods and properties),
`functional`, `nn` (each class, its forward and its other public methods),
`nn.init` and `optim` (classes, their public methods, functions). A forward
counts only with its own docstring (Module.forward's does not describe a
layer's); another override may rely on the documented method it overrides
(extra_repr, an LR schedule's lr_at).
"""
import inspect

import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn, optim

# Methods whose meaning is fixed by Python or by the container protocol.
PROTOCOL = {"keys", "values", "items"}


def _own_members(cls):
    """(name, member) for the public methods and properties `cls` defines itself."""
    for name, value in vars(cls).items():
        if name.startswith("_") or name in PROTOCOL:
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            yield name, value


def _classes_and_functions(namespace, names, own_only):
    """Classes and functions of `namespace`: those it exports (a package's
    __all__), or with own_only those its module defines (not imports)."""
    for name in names:
        value = getattr(namespace, name)
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if value.__module__.startswith("tinygrad_attn") and (not own_only or value.__module__ == namespace.__name__):
            yield f"{namespace.__name__}.{name}", value


def _documented(cls, name, member):
    """The docstring that help() shows for cls.name."""
    if isinstance(member, property) or name == "forward":
        return member.__doc__
    return inspect.getdoc(getattr(cls, name))


def public_api():
    """(qualified name, object) for every documented-by-contract piece."""
    found = {}
    spaces = [(tg, tg.__all__, False), (nn, nn.__all__, False), (optim, optim.__all__, False),
              (F, dir(F), True), (nn.init, dir(nn.init), True)]
    for namespace, names, own_only in spaces:
        public = [n for n in names if not n.startswith("_")]
        for qualname, value in _classes_and_functions(namespace, public, own_only):
            found[qualname] = value.__doc__
            if inspect.isclass(value):
                for m, member in _own_members(value):
                    found[f"{qualname}.{m}"] = _documented(value, m, member)
    return sorted(found.items())


API = public_api()


def test_the_walk_reaches_the_api():
    names = {name for name, _ in API}
    for expected in ("tinygrad_attn.Tensor.sum", "tinygrad_attn.Tensor.size", "tinygrad_attn.Tensor.shape",
                     "tinygrad_attn.nn.MultiheadAttention.forward", "tinygrad_attn.nn.Linear.forward",
                     "tinygrad_attn.nn.Module.state_dict", "tinygrad_attn.functional.cross_entropy",
                     "tinygrad_attn.optim.AdamW", "tinygrad_attn.nn.init.xavier_uniform_",
                     "tinygrad_attn.nn.TransformerEncoder.forward"):
        assert expected in names, expected
    assert len(API) > 250


@pytest.mark.parametrize("name, doc", API, ids=[name for name, _ in API])
def test_public_api_has_a_docstring(name, doc):
    assert doc and doc.strip(), f"{name} has no docstring: help({name.split('.')[-1]}) shows nothing useful"
