"""Arrows point down: no module imports from a layer above its own, and no
two modules import each other, directly or around a circle.

The layers of docs/architecture.md, bottom first. Every import statement of
every module counts, including those inside functions (an import at call
time is still an upward dependency, and closes a circle as well). A module
may import its own layer and the layers below.
"""
import ast
import os

import pytest

import tinygrad_attn as tg

PACKAGE = os.path.dirname(os.path.abspath(tg.__file__))

LAYERS = [  # (name, paths relative to the package; a path ending in / is a folder)
    ("kernels", ["kernels/"]),
    ("shapes", ["shapes.py", "dtypes.py", "random.py"]),
    ("engine", ["autograd.py"]),
    ("ops", ["ops/"]),
    ("tensor", ["tensor.py", "creation.py", "reference/"]),  # reference: compositions of Tensor methods, numpy backwards
    ("functional", ["functional.py", "gradcheck.py"]),
    ("nn", ["nn/"]),
    ("optim", ["optim/"]),
    ("tools", [""]),  # everything else: checkpoint, viz, data, models, generation, train, cli, llama2c, warmup,
    # memory, __init__, __main__
]


def layer_of(relative_path):
    """Index in LAYERS of a module's file (the most specific path wins)."""
    best = None
    for index, (_, paths) in enumerate(LAYERS):
        for path in paths:
            matches = relative_path == path or (path.endswith("/") or path == "") and relative_path.startswith(path)
            if matches and (best is None or len(path) > best[1]):
                best = (index, len(path))
    return best[0]


def module_path(module):
    """tinygrad_attn.kernels.threads -> kernels/threads.py (or .../__init__.py)."""
    parts = module.split(".")[1:]
    base = os.path.join(PACKAGE, *parts)
    if os.path.isdir(base):
        return os.path.relpath(os.path.join(base, "__init__.py"), PACKAGE)
    return os.path.relpath(base + ".py", PACKAGE)


def package_modules():
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(root, name), PACKAGE)


def imported_modules(relative_path):
    """The tinygrad_attn modules a file imports, as (line, module name)."""
    path = os.path.join(PACKAGE, relative_path)
    tree = ast.parse(open(path).read(), path)
    package = "tinygrad_attn." + os.path.dirname(relative_path).replace(os.sep, ".") if os.path.dirname(
        relative_path) else "tinygrad_attn"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tinygrad_attn"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("tinygrad_attn"):
                continue
            for alias in node.names:  # `from . import nn` imports the module tinygrad_attn.nn
                candidate = f"{target}.{alias.name}"
                is_module = os.path.exists(os.path.join(PACKAGE, *candidate.split(".")[1:])) or \
                    os.path.exists(os.path.join(PACKAGE, *candidate.split(".")[1:]) + ".py")
                yield node.lineno, candidate if is_module else target


def upward_imports():
    found = []
    for relative in sorted(package_modules()):
        own = layer_of(relative)
        for line, module in imported_modules(relative):
            theirs = layer_of(module_path(module))
            if theirs > own:
                found.append(f"{relative}:{line} ({LAYERS[own][0]}) imports {module} ({LAYERS[theirs][0]})")
    return found


def test_no_module_imports_from_a_layer_above():
    assert upward_imports() == []


@pytest.mark.parametrize("source,expected", [
    ("from ..tensor import Tensor\n", "ops/x.py:1 (ops) imports tinygrad_attn.tensor (tensor)"),
    ("def f():\n    from .. import functional\n", "ops/x.py:2 (ops) imports tinygrad_attn.functional (functional)"),
])
def test_the_check_sees_upward_imports_even_inside_functions(tmp_path, monkeypatch, source, expected):
    """Negative control: a planted upward import (also a call-time one) is reported."""
    import shutil
    copy = tmp_path / "tinygrad_attn"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "ops" / "x.py").write_text(source)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", str(copy))
    assert expected in upward_imports()


def import_cycles():
    """Circles of imports between the package's modules (call-time imports
    included): ["a.py -> b.py -> a.py", ...], at least one through every
    group of modules that import each other around a loop (a depth-first
    walk; a finished module cannot lead back into the walk's path). A
    package's own __init__.py, which Python runs before its modules, is not
    counted as imported by them: only import statements are."""
    graph = {relative: sorted({module_path(m) for _, m in imported_modules(relative)} - {relative})
             for relative in package_modules()}
    found, done = [], set()
    for start in sorted(graph):  # depth-first from each module; a path back into the stack is a circle
        stack, on_path = [(start, iter(graph[start]))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif child in on_path:
                circle = on_path[on_path.index(child):]
                first = circle.index(min(circle))  # written from its first module by name, so found once
                circle = circle[first:] + circle[:first]
                found.append(" -> ".join(circle + circle[:1]))
            elif child not in done and child in graph:
                stack.append((child, iter(graph[child])))
                on_path.append(child)
    return sorted(set(found))


def test_no_two_modules_import_each_other():
    """Not directly, nor around a circle, nor at call time (tensor.py used to
    import reference/ inside a function, and reference/ imports tensor.py)."""
    assert import_cycles() == []


@pytest.mark.parametrize("planted,expected", [
    ({"tensor.py": "\ndef _twins():\n    from . import reference\n"},
     "reference/__init__.py -> reference/composites.py -> tensor.py -> reference/__init__.py"),
    ({"ops/x.py": "from . import y\n", "ops/y.py": "def f():\n    from . import x\n"},
     "ops/x.py -> ops/y.py -> ops/x.py"),
])
def test_the_cycle_check_sees_circles_even_through_call_time_imports(tmp_path, monkeypatch, planted, expected):
    """Negative control: a planted circle (one import inside a function) is reported."""
    import shutil
    copy = tmp_path / "tinygrad_attn"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text in planted.items():
        with open(copy / name, "a") as f:
            f.write(text)
    monkeypatch.setattr(__import__(__name__, fromlist=["PACKAGE"]), "PACKAGE", str(copy))
    assert expected in import_cycles()


def test_nothing_but_the_package_imports_the_readable_twins():
    """reference/ holds the readable twins; the code that runs does not use
    them: no module outside it imports it, but the package's __init__.py,
    which imports it so that the twins are registered on their ops."""
    found = [f"{relative}:{line} imports {module}" for relative in sorted(package_modules())
             if not relative.startswith("reference" + os.sep) and relative != "__init__.py"
             for line, module in imported_modules(relative) if module.startswith("tinygrad_attn.reference")]
    assert found == []


def applied_ops(relative_path):
    """Names of the ops a module applies: X of each `X.apply(...)` / `M.X.apply_with_ctx(...)`."""
    path = os.path.join(PACKAGE, relative_path)
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("apply", "apply_with_ctx"):
            owner = node.func.value
            if isinstance(owner, (ast.Name, ast.Attribute)):
                names.add(owner.id if isinstance(owner, ast.Name) else owner.attr)
    return names & set(tg.Function.registry)


def test_an_op_with_a_tensor_method_is_applied_there_alone():
    """One dispatch per op: an op that a Tensor method applies is not applied
    again in functional.py, whose function calls the method (F.gelu, F.silu,
    F.softmax); functional applies only the ops that Tensor has no method for."""
    in_tensor, in_functional = applied_ops("tensor.py"), applied_ops("functional.py")
    assert {"Gelu", "Softmax", "MatMul"} <= in_tensor and {"LinearOp", "LayerNormOp"} <= in_functional
    assert sorted(in_tensor & in_functional) == []


def test_the_numpy_backward_reads_alone():
    """reference/numpy_backward.py is plain numpy on arrays: it imports nothing of
    the framework (not even the kernels), so a reader needs no other file."""
    assert list(imported_modules("reference/numpy_backward.py")) == []


def test_op_classes_do_not_share_names_with_layers():
    """grad_fn=<...> and tracebacks name an op; it must not read as an nn layer."""
    from tinygrad_attn import nn
    layers = {name for name in dir(nn) if isinstance(getattr(nn, name), type)}
    assert sorted(set(tg.Function.registry) & layers) == []


def test_op_files_say_nothing_about_threads():
    """The threading policy lives in kernels/threads.py alone."""
    ops = os.path.join(PACKAGE, "ops")
    for name in os.listdir(ops):
        if name.endswith(".py"):
            text = open(os.path.join(ops, name)).read()
            for word in ("thread", "parallel_for", "_NS", "min_items"):
                assert word not in text, f"ops/{name} mentions {word!r}"
