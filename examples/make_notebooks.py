"""Write the notebooks of examples/ from their `# %%` scripts.

    python examples/make_notebooks.py            # rewrite every notebook from its script
    python examples/make_notebooks.py --check    # exit 1 if a notebook differs from its script

The scripts are the source: attention_walkthrough.py and
backprop_ninja_attention.py, in the "percent" format that VS Code, PyCharm,
Spyder and jupytext read as cells (`# %%` starts a code cell, `# %% [markdown]`
a markdown cell whose lines are comments; text after `# %%` is the cell's
title, kept as its first comment line). Each becomes the .ipynb beside it,
without outputs, which Jupyter opens with nothing but tinygrad_attn
installed. Edit the script, then run this; tests/test_notebooks.py fails
when a notebook and its script drift apart, and runs each notebook in a
Jupyter kernel. Only the standard library: the notebook is plain JSON
(nbformat 4).
"""
import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ("attention_walkthrough.py", "backprop_ninja_attention.py")
MARKER = re.compile(r"^# %%(.*)$")


def cells(source):
    """[(kind, text)] of a percent-format script: "code" or "markdown", in order."""
    found, kind, lines = [], None, []

    def close():
        text = "\n".join(lines).strip("\n")
        if kind is not None and text:
            found.append((kind, text))

    for line in source.splitlines():
        match = MARKER.match(line)
        if match:
            close()
            rest = match.group(1).strip()
            kind = "markdown" if rest.startswith("[markdown]") else "code"
            lines = [] if kind == "markdown" or not rest else [f"# {rest}"]
        elif kind == "markdown":
            lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
        elif kind is not None:
            lines.append(line)
    close()
    return found


def notebook(source):
    """The nbformat-4 notebook (a dict) of a percent-format script."""
    def cell(index, kind, text):
        body = {"cell_type": kind, "id": f"cell-{index}", "metadata": {}, "source": text.splitlines(keepends=True)}
        return body if kind == "markdown" else {**body, "execution_count": None, "outputs": []}

    return {"cells": [cell(i, kind, text) for i, (kind, text) in enumerate(cells(source))],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def text(source):
    """The notebook as the file holds it: JSON with one-space indents, a final newline."""
    return json.dumps(notebook(source), indent=1, ensure_ascii=False) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write examples/*.ipynb from their # %% scripts.")
    parser.add_argument("--check", action="store_true", help="only check that every notebook is up to date")
    check = parser.parse_args(argv).check
    stale = []
    for script in NOTEBOOKS:
        path = HERE / script
        target = path.with_suffix(".ipynb")
        wanted = text(path.read_text(encoding="utf-8"))
        if target.exists() and target.read_text(encoding="utf-8") == wanted:
            continue
        stale.append(target.name)
        if not check:
            target.write_text(wanted, encoding="utf-8")
    if check and stale:
        print(f"out of date: {', '.join(stale)} (run python examples/make_notebooks.py)")
        return 1
    print(("up to date" if check else "wrote " + (", ".join(stale) or "nothing (all up to date)")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
