"""Every commit subject is at most 72 characters (CONTRIBUTING.md, "Commits"),
read from the repository's own history when the tests run in a git checkout
(CI runs on a clone with its history).

The rule is checked from SINCE on, the last merge landed before this test
was: the commits before it are landed, and landed commits are not
rewritten. Merges count. Outside a checkout holding SINCE (an unpacked
sdist, a shallow clone cut above it, no git installed) the test skips,
saying why; tests/conftest.py's TINYGRAD_ATTN_NO_SKIPS=1 turns only skips
for a missing Python package into failures, so CI keeps this skip a skip.
"""
import shutil
import subprocess
from pathlib import Path

import pytest

from . import conftest

ROOT = Path(__file__).resolve().parent.parent
SINCE = "7a5cc64d23445de4786f35bf0bfaccde66296a36"  # Merge branch 'kernels' (the subject itself is 74)
LIMIT = 72
WHY_NOT = {  # why the history cannot be read: the skip's reason
    "no git": "git is not installed, so the commit history cannot be read",
    "no checkout": f"{ROOT} is not the top of a git checkout, so it has no history to read",
    "no SINCE": f"the history does not hold commit {SINCE[:7]} (a shallow clone?), where the rule starts",
    "not after SINCE": f"HEAD does not descend from {SINCE[:7]}, where the rule starts",
}


def _git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _history_or_skip_reason():
    """[(hash, subject)] of the commits after SINCE up to HEAD, or a str: why they cannot be read."""
    if shutil.which("git") is None:
        return WHY_NOT["no git"]
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
        return WHY_NOT["no checkout"]
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        return WHY_NOT["no SINCE"]
    if _git("merge-base", "--is-ancestor", SINCE, "HEAD").returncode != 0:
        return WHY_NOT["not after SINCE"]
    log = _git("log", "--format=%H%x00%s", f"{SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    return [tuple(line.split("\0", 1)) for line in log.stdout.splitlines()]


def too_long(commits):
    """The commits whose subject is longer than LIMIT, as 'hash (length): subject'."""
    return [f"{sha[:7]} ({len(subject)}): {subject}" for sha, subject in commits if len(subject) > LIMIT]


def test_every_commit_subject_since_the_rule_is_at_most_72_characters():
    commits = _history_or_skip_reason()
    if isinstance(commits, str):
        pytest.skip(commits)
    assert too_long(commits) == [], "shorten these subjects (what changed; why and figures go in the body)"


def test_the_check_sees_a_long_subject_and_counts_characters_not_bytes():
    """Negative control, and a subject of 72 non-ASCII characters passes."""
    assert too_long([("a" * 40, "x" * 73), ("b" * 40, "é" * 72)]) == [f"aaaaaaa (73): {'x' * 73}"]


class _SkipReport:
    skipped = True

    def __init__(self, reason):
        self.longrepr = ("tests/test_commit_subjects.py", 1, f"Skipped: {reason}")


@pytest.mark.parametrize("reason", WHY_NOT.values())
def test_a_skip_for_missing_history_stays_a_skip_under_no_skips(reason):
    """conftest fails a skip only for a missing declared package: not these."""
    assert conftest._missing_declared_package(_SkipReport(reason)) is None
