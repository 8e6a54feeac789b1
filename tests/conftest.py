import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Bounded examples and no deadline (the first call of a Numba kernel compiles).
# HYPOTHESIS_PROFILE=thorough explores more; CI uses the default "ci" profile.
settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# With TINYGRAD_ATTN_NO_SKIPS=1 (.ci/run sets it), a test skipped because
# `pytest.importorskip` could not import a package that pyproject.toml lists
# (a dependency or the `test` extra: torch, matplotlib, ...) fails instead:
# `pip install -e ".[test]"` is meant to run the whole suite. Other skips
# (a data file or a system program that is absent) stay skips.
NO_SKIPS = os.environ.get("TINYGRAD_ATTN_NO_SKIPS") == "1"
_IMPORTORSKIP = re.compile(r"could not import '([\w.]+)'")


def _declared_packages():
    """The distributions named in pyproject's dependencies and test extra."""
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    lists = re.findall(r"^(?:dependencies|test) = \[(.*?)\]", text, re.M | re.S)
    return {name.lower().replace("-", "_") for name in re.findall(r'"([A-Za-z0-9_.-]+?)\s*[\[<>=!~;"]',
                                                                  " ".join(lists))}


def _missing_declared_package(report):
    """The package whose absence skipped this report, if pyproject declares it."""
    if not report.skipped:
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    match = _IMPORTORSKIP.search(reason)
    if match is None:
        return None
    package = match.group(1).split(".")[0].lower()
    return package if package in _declared_packages() else None


def _fail_instead_of_skip(report):
    package = _missing_declared_package(report)
    if NO_SKIPS and package is not None:
        report.outcome = "failed"
        report.longrepr = (f"skipped because the package {package!r} is missing, but pyproject.toml "
                           f"declares it and TINYGRAD_ATTN_NO_SKIPS=1: install the test extra, "
                           f"pip install -e \".[test]\"")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_instead_of_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level importorskip skips the whole module at collection
    _fail_instead_of_skip(outcome.get_result())
