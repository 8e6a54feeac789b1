"""TINYGRAD_ATTN_NO_SKIPS=1 (set by .ci/run) turns a skip for a missing
declared package into a failure, and leaves other skips alone."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PYPROJECT = """
[project]
name = "demo"
dependencies = ["numpy>=1.24", "not-installed-pkg-xyz>=1"]

[project.optional-dependencies]
test = ["pytest>=7", "another-absent-pkg==2.0"]
"""

TESTS = '''
import pytest


def test_needs_a_declared_package():
    pytest.importorskip("not_installed_pkg_xyz")


def test_needs_an_undeclared_package():
    pytest.importorskip("undeclared_absent_module_xyz")


@pytest.mark.skipif(True, reason="data file not present")
def test_needs_a_data_file():
    pass


def test_needs_a_checkout_named_by_an_environment_variable():
    pytest.skip("SOME_CHECKOUT_DIR_XYZ is not set: point it at a checkout")
'''

MODULE_LEVEL = '''
import pytest

pytest.importorskip("another_absent_pkg")


def test_never_collected():
    pass
'''


def run(tmp_path, no_skips):
    env = {k: v for k, v in os.environ.items() if k != "TINYGRAD_ATTN_NO_SKIPS"}
    if no_skips:
        env["TINYGRAD_ATTN_NO_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_demo.py").write_text(TESTS)
    (tmp_path / "tests" / "test_module_level.py").write_text(MODULE_LEVEL)
    return tmp_path


def test_without_the_variable_missing_packages_skip(project):
    result = run(project, no_skips=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 skipped" in result.stdout


def test_with_it_a_missing_declared_package_fails_and_other_skips_stay(project):
    result = run(project, no_skips=True)
    out = result.stdout
    assert result.returncode != 0, out
    assert "FAILED tests/test_demo.py::test_needs_a_declared_package" in out
    assert "ERROR tests/test_module_level.py" in out  # the module-level importorskip, at collection
    assert "'not_installed_pkg_xyz' is missing, but pyproject.toml declares it" in out
    assert "3 skipped" in out  # the undeclared module, the absent data file and the unset variable
    assert re.search(r"SKIPPED \[1\] tests/test_demo\.py:\d+: SOME_CHECKOUT_DIR_XYZ is not set", out)  # with its reason
