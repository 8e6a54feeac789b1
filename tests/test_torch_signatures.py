"""Every callable of ours that has a PyTorch name takes PyTorch's parameters.

The callables are found, not listed: each public function of
`tinygrad_attn.functional`, `nn.init`, `optim` and the top-level package,
each class of `nn` and `optim` (its __init__ and every public method it
shares with PyTorch's class), and each public Tensor method, whenever
PyTorch has one of the same name in the same place. For each, PyTorch's
parameters (from `inspect.signature`, or the signature line of the
docstring for built-ins) must appear in ours with the same name, the same
kind (positional or keyword-only), the same position and the same default.

Differences are allowed only where listed below, each with its reason:
parameters of PyTorch's that we do not take (an unexpected keyword is a
TypeError naming it), deliberate differences, and our extensions, which must
be keyword-only and come after PyTorch's parameters. An entry that no longer
matches a difference fails too, so the lists stay true.
"""
import ast
import inspect
import re
from collections import namedtuple

import pytest

import tinygrad_attn as tg
from tinygrad_attn import functional as F
from tinygrad_attn import nn, optim

torch = pytest.importorskip("torch")

Param = namedtuple("Param", ["name", "kind", "default"])  # kind: positional, *args, keyword, **kwargs
NO_DEFAULT = "<no default>"

# PyTorch parameters no callable of ours takes: passing one is a TypeError.
NOT_TAKEN_ANYWHERE = {
    "out": "writing into a given tensor: results are always new tensors",
    "layout": "sparse layouts do not exist here",
    "memory_format": "memory formats (channels_last) do not exist here",
    "pin_memory": "pinned memory is a CUDA transfer option",
}

# label -> {parameter: reason}: a parameter of PyTorch's we do not take, or
# one that differs on purpose ("*" covers the whole callable).
DIFFERENCES = {
    "tg.save": {"*": "safetensors files of a state dict (no pickle): tg.save(state_dict, path, metadata=None)"},
    "tg.load": {"*": "reads safetensors files: tg.load(path, with_metadata=False)"},
    "Tensor.transpose": {"*": "transpose(dim0, dim1) as PyTorch, and also numpy's transpose(*axes)"},
    **{f"Tensor.{m}": {doc_name: "PyTorch's docs say so, but it takes `other=`",
                       "other": "the keyword PyTorch accepts"}
       for m, doc_name in (("matmul", "tensor2"), ("mul", "value"), ("div", "value"))},
    "Tensor.logsumexp": {"dim": "PyTorch requires dim; ours defaults to None, all axes"},
    "Tensor.unsqueeze": {"dim": "required as in PyTorch (TypeError when missing); None only so "
                                "that numpy's axis= may be given instead"},
    "Tensor.var": {"correction": "also PyTorch's older overload var(dim, unbiased, keepdim): "
                                 "unbiased and keepdim are positional; correction=None means 1",
                   "keepdim": "positional third, as in var(dim, unbiased, keepdim)",
                   "unbiased": "PyTorch's older overload var(dim, unbiased, keepdim)"},
    "Tensor.std": {"correction": "as Tensor.var", "keepdim": "as Tensor.var", "unbiased": "as Tensor.var"},
    "tg.arange": {"end": "arange(end) works too, as PyTorch's overload arange(end)"},
    "tg.randint": {"high": "randint(high, size) works too, as PyTorch's overload",
                   "size": "as high"},
    "Tensor.type": {"kwargs": "no other options"},
    "Tensor.clone": {"memory_format": NOT_TAKEN_ANYWHERE["memory_format"]},
    "Module.__init__": {"args": "PyTorch's Module ignores them; ours takes none",
                        "kwargs": "as args"},
    "Module.forward": {"*": "the base class's forward: every layer defines its own"},
    "Module.state_dict": {"args": "PyTorch's deprecated positional destination, prefix, keep_vars"},
    "Parameter.__init__": {"*": "Parameter(data, requires_grad=True), as torch.nn.Parameter's __new__"},
}

# label -> {parameter: reason}: our keyword-only extensions.
EXTENSIONS = {
    "F.scaled_dot_product_attention": {"need_weights": "also return the attention weights"},
    "MultiheadAttention.__init__": {"head_dim": "a head size apart from embed_dim // num_heads"},
    **{f"Tensor.{m}": {"axis": "numpy's name for dim", "keepdims": "numpy's name for keepdim"}
       for m in ("sum", "mean", "max", "min", "var", "std", "logsumexp", "argmax", "argmin")},
    "Tensor.squeeze": {"axis": "numpy's name for dim"},
    "Tensor.unsqueeze": {"axis": "numpy's name for dim"},
}

# Built-ins whose docstring has no signature line: PyTorch's documented signatures.
HAND_WRITTEN = {
    "Tensor.detach": "detach()",
    "Tensor.relu": "relu()",
    "Tensor.log_softmax": "log_softmax(dim, dtype=None)",
    "Tensor.softmax": "softmax(dim, dtype=None)",
    "tg.set_num_threads": "set_num_threads(n)",  # its docs: set_num_threads(int), one positional int
}


# ----------------------------------------------------------------- parsing

def _split_top_level(text):
    """Split a parameter list at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip() for p in parts + [current] if p.strip()]


def _default_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # torch.strided and such: compared as text


def parse_signature_text(text):
    """Params from a documented signature "name(a, b=1, *size, *, c=None)"."""
    inner = text[text.index("(") + 1:text.rindex(")")].replace("\\*", "*").replace("\n", " ")
    params, keyword_only = [], False
    for item in _split_top_level(inner):
        if item == "*":
            keyword_only = True
        elif item.startswith("**"):
            params.append(Param(item[2:], "**kwargs", NO_DEFAULT))
        elif item.startswith("*"):
            params.append(Param(item[1:], "*args", NO_DEFAULT))
            keyword_only = True
        else:
            name, _, default = (s.strip() for s in item.partition("="))
            params.append(Param(name, "keyword" if keyword_only else "positional",
                                _default_value(default) if default else NO_DEFAULT))
    return params


_KINDS = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
          inspect.Parameter.VAR_POSITIONAL: "*args", inspect.Parameter.KEYWORD_ONLY: "keyword",
          inspect.Parameter.VAR_KEYWORD: "**kwargs"}


def python_params(fn):
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("self", "cls"):
            continue
        default = NO_DEFAULT if p.default is inspect.Parameter.empty else p.default
        params.append(Param(p.name, _KINDS[p.kind], default))
    return params


def _documented(obj, name):
    doc = obj.__doc__ or ""
    see = re.match(r"\s*See :func:`torch\.(\w+)`", doc)
    if see:  # Tensor.split: torch.split's signature without the tensor
        return torch_params(getattr(torch, see.group(1)), see.group(1))[1:]
    line = re.match(r"\s*" + re.escape(name) + r"\((.*?)\)\s*->", doc, re.S)
    return None if line is None else parse_signature_text(f"{name}({line.group(1)})")


def _schema_args(schema):
    """[(name, keyword_only)] of an aten schema string "aten::f(Tensor self, int d, *, bool k=False)"."""
    inner = schema[schema.index("(") + 1:schema.rindex(") ->")]
    args, keyword_only = [], False
    for item in _split_top_level(inner):
        if item == "*":
            keyword_only = True
        else:
            args.append((item.split("=")[0].split()[-1], keyword_only))
    return args


def _aten_keyword_only(name):
    """Names keyword-only in every aten schema of `name` that has them (the
    out= variants aside). Docstrings of built-ins often omit the `*`
    (F.gelu's approximate, Tensor.sum's dtype, F.scaled_dot_product_attention's
    scale): the schema is what PyTorch's argument parser follows."""
    try:
        schemas = [str(s) for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}")]
    except RuntimeError:
        return set()
    seen = {}
    for schema in schemas:
        if "out)" in schema or "Tensor(a!)" in schema:
            continue
        for arg, keyword_only in _schema_args(schema):
            seen[arg] = seen.get(arg, True) and keyword_only
    return {arg for arg, keyword_only in seen.items() if keyword_only}


def torch_params(obj, name, label=None):
    if label in HAND_WRITTEN:
        return parse_signature_text(HAND_WRITTEN[label])
    try:
        return python_params(obj)
    except (ValueError, TypeError):
        params = _documented(obj, name)
    if params is None:
        raise AssertionError(f"{label or name}: no signature found for PyTorch's {name}; add it "
                             "to HAND_WRITTEN")
    keyword_only = _aten_keyword_only(name)
    return [p._replace(kind="keyword") if p.kind == "positional" and p.name in keyword_only else p
            for p in params]


# ----------------------------------------------------------------- discovery

def _public(namespace):
    """The public functions defined in module `namespace` (not those it imports)."""
    for name in dir(namespace):
        value = getattr(namespace, name)
        if not name.startswith("_") and inspect.isfunction(value) and value.__module__ == namespace.__name__:
            yield name, value


def _methods(cls, theirs):
    """Public methods our class defines itself that PyTorch's class has too
    (inherited ones are checked on the class that defines them)."""
    for name, value in vars(cls).items():
        if (not name.startswith("_") and callable(getattr(cls, name)) and not isinstance(value, property)
                and callable(getattr(theirs, name, None))):
            yield name, getattr(cls, name), getattr(theirs, name)


def pytorch_named_callables():
    """(label, ours, theirs) for every callable of ours with a PyTorch namesake."""
    found = []
    for name, fn in _public(F):
        if hasattr(torch.nn.functional, name):
            found.append((f"F.{name}", fn, getattr(torch.nn.functional, name)))
    for name, fn in _public(nn.init):
        if hasattr(torch.nn.init, name):
            found.append((f"nn.init.{name}", fn, getattr(torch.nn.init, name)))
    torch_optim = [torch.optim, torch.optim.lr_scheduler, torch.nn.utils]
    for space, theirs_spaces in ((nn, [torch.nn]), (optim, torch_optim)):
        for name in space.__all__:
            ours = getattr(space, name)
            theirs = next((getattr(t, name) for t in theirs_spaces if hasattr(t, name)), None)
            if theirs is None or not callable(ours):
                continue
            if isinstance(ours, type):
                if ours.__name__ != name:
                    continue  # an alias (nn.MultiHeadAttention): checked under the class's own name
                found.append((f"{name}.__init__", ours.__init__, theirs.__init__))
                found += [(f"{name}.{m}", a, b) for m, a, b in _methods(ours, theirs)]
            else:
                found.append((f"optim.{name}", ours, theirs))
    found += [(f"Tensor.{m}", a, b) for m, a, b in _methods(tg.Tensor, torch.Tensor)]
    for name in tg.__all__:
        ours = getattr(tg, name)
        if inspect.isfunction(ours) and callable(getattr(torch, name, None)):
            found.append((f"tg.{name}", ours, getattr(torch, name)))
    found.append(("tg.grad", tg.grad, torch.autograd.grad))
    return found


CALLABLES = pytorch_named_callables()


# ----------------------------------------------------------------- the check

def _same_default(ours, theirs):
    if callable(ours) and callable(theirs):  # activation=F.relu against torch's F.relu
        return ours.__name__ == theirs.__name__
    if isinstance(theirs, str) and not isinstance(ours, str):
        return False
    return ours == theirs and type(ours) is not bool or ours is theirs


def differences(label, ours, theirs):
    """Each way our parameters differ from PyTorch's, as (parameter, text)."""
    found = []
    by_name = {p.name: (i, p) for i, p in enumerate(ours)}
    for i, p in enumerate(theirs):
        if p.name not in by_name:
            found.append((p.name, f"missing PyTorch's parameter {p.name!r}"))
            continue
        j, q = by_name[p.name]
        if q.kind != p.kind:
            found.append((p.name, f"{p.name!r} is {q.kind}, PyTorch's is {p.kind}"))
        elif p.kind == "positional" and i != j:
            found.append((p.name, f"{p.name!r} is positional argument {j}, PyTorch's is {i}"))
        elif not _same_default(q.default, p.default):
            found.append((p.name, f"{p.name!r} defaults to {q.default!r}, PyTorch's to {p.default!r}"))
    torch_names = {p.name for p in theirs}
    last_torch = max([by_name[p.name][0] for p in theirs if p.name in by_name], default=-1)
    for j, q in enumerate(ours):
        if q.name in torch_names:
            continue
        if q.kind not in ("keyword", "**kwargs") or j < last_torch:
            found.append((q.name, f"extension {q.name!r} must be keyword-only, after PyTorch's parameters"))
        else:
            found.append((q.name, f"extension {q.name!r}"))
    return found


def test_the_callables_are_found():
    labels = {label for label, _, _ in CALLABLES}
    for expected in ("MultiheadAttention.__init__", "MultiheadAttention.forward", "Transformer.forward",
                     "TransformerEncoder.__init__", "Embedding.__init__", "LayerNorm.__init__",
                     "F.scaled_dot_product_attention", "F.cross_entropy", "F.softmax", "F.dropout",
                     "F.silu", "SiLU.__init__",
                     "SGD.__init__", "Adam.__init__", "optim.clip_grad_norm_", "Tensor.size",
                     "Tensor.sum", "Tensor.to", "Module.load_state_dict", "nn.init.xavier_uniform_",
                     "tg.tensor", "tg.arange", "F.rms_norm", "RMSNorm.__init__", "RMSNorm.forward",
                     "F.silu", "SiLU.__init__", "SiLU.forward"):
        assert expected in labels, expected
    assert len(CALLABLES) > 150


@pytest.mark.parametrize("label, ours, theirs", CALLABLES, ids=[c[0] for c in CALLABLES])
def test_pytorch_named_callable_takes_pytorchs_parameters(label, ours, theirs):
    name = label.split(".")[-1] if not label.endswith("__init__") else "__init__"
    found = differences(label, python_params(ours), torch_params(theirs, name, label))
    allowed, extensions = DIFFERENCES.get(label, {}), EXTENSIONS.get(label, {})
    if "*" in allowed:
        assert found, f"{label}: listed as different ({allowed['*']}) but takes PyTorch's parameters"
        return
    unexplained = [text for param, text in found
                   if param not in allowed and param not in NOT_TAKEN_ANYWHERE
                   and not (text.startswith("extension") and param in extensions)]
    assert not unexplained, f"{label}: " + "; ".join(unexplained)
    stale = set(allowed) | set(extensions)
    stale -= {param for param, _ in found}
    assert not stale, f"{label}: allow-list entries {sorted(stale)} match no difference: remove them"
