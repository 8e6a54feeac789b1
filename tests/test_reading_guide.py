"""The reading guide of docs/backprop_through_attention.md stays true: every
file and name it lists exists, each stated line count is within 5% of the
file's, the parts of the package it sizes are that size, the total adds
up, it fits in an afternoon, and the README states the same total."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "backprop_through_attention.md").read_text()
GUIDE = DOC.split("## Reading the code: a guide for an afternoon")[1].split("\n## ")[0]
ROWS = re.findall(r"^\| (\d+) \| `([\w/.]+)` \| (\d+) \| (.*) \| (\d+) \|$", GUIDE, re.M)


def test_every_file_and_name_of_the_guide_exists_and_its_size_is_roughly_the_stated_one():
    assert len(ROWS) >= 8
    for _, path, stated, what, _ in ROWS:
        source = (ROOT / path).read_text()
        lines = len(source.splitlines())
        assert abs(lines - int(stated)) <= int(stated) / 20, f"{path}: {lines} lines, the guide says {stated}"
        for name in re.findall(r"`(\w+(?:\.\w+)?)`", what):
            for part in name.split("."):
                assert re.search(rf"^\s*(class|def) {part}\b", source, re.M), f"{path}: no {part}"


def test_the_total_adds_up_fits_an_afternoon_and_is_what_the_readme_says():
    total = re.search(r"^\| \| total \| (\d+) \| \| (\d+) \|$", GUIDE, re.M)
    assert int(total.group(1)) == sum(int(r[2]) for r in ROWS)
    assert int(total.group(2)) == sum(int(r[4]) for r in ROWS) <= 240        # an afternoon: four hours
    hundreds = round(int(total.group(1)), -2)
    readme = (ROOT / "README.md").read_text()
    assert f"about {hundreds:,} lines" in readme and f"about {hundreds:,} lines" in GUIDE
    assert "small enough to read in an afternoon" not in readme             # the whole package is not
    package = sum(len(p.read_text().splitlines()) for p in (ROOT / "tinygrad_attn").rglob("*.py"))
    stated = int(re.search(r"The framework is about ([\d,]+) lines", GUIDE).group(1).replace(",", ""))
    assert abs(package - stated) <= stated / 5


def test_the_parts_the_guide_sizes_are_that_size():
    """"about 2,000 in `kernels/`", "about 2,200 in `train/` and `cli.py`": each within a tenth."""
    package = ROOT / "tinygrad_attn"
    lines = lambda paths: sum(len(p.read_text().splitlines()) for p in paths)
    kernels = int(re.search(r"about ([\d,]+) in `kernels/`", GUIDE).group(1).replace(",", ""))
    training = int(re.search(r"about ([\d,]+) in `train/` and `cli.py`", GUIDE).group(1).replace(",", ""))
    assert abs(lines((package / "kernels").rglob("*.py")) - kernels) <= kernels / 10
    assert abs(lines([*(package / "train").rglob("*.py"), package / "cli.py"]) - training) <= training / 10
