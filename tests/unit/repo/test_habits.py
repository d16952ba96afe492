"""Habits the repository keeps ([19]): the formatter runs on everything, and a commit
subject is one line of at most 72 characters (the story goes in the body)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import ROOT

# A `# fmt: skip` stays only where a table reads better aligned, with its reason on the
# same line before the marker: `# aligned table: <why>  # fmt: skip`.
FMT_SKIP_LIMIT = 50
FMT_SKIP_WITH_REASON = re.compile(r"#\s*aligned table: \S.*#\s*fmt: skip\s*$")
# Subjects before this commit ran long; every later one is held to the rule.
SUBJECTS_CHECKED_FROM = "35d8c57"
FMT_MARKER = re.compile(r"#\s*fmt:\s*(skip|off)\s*$")
SUBJECT_LIMIT = 72


def tracked_python() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "*.py"], capture_output=True, text=True, check=True
    )
    return listed.stdout.split()


def test_fmt_skip_is_rare_and_says_why() -> None:
    skips = []
    for name in tracked_python():
        path = ROOT / name
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FMT_MARKER.search(line):
                skips.append((f"{name}:{number}", line))
    unexplained = [where for where, line in skips if not FMT_SKIP_WITH_REASON.search(line)]
    assert not unexplained, f"a `# fmt: skip` without `# aligned table: <why>`: {unexplained}"
    assert len(skips) < FMT_SKIP_LIMIT, f"{len(skips)} `# fmt: skip` lines (limit {FMT_SKIP_LIMIT})"


def test_commit_subjects_are_one_short_line() -> None:
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{SUBJECTS_CHECKED_FROM}^{{commit}}"],
        capture_output=True,
    )
    if known.returncode != 0:
        pytest.skip(f"history before {SUBJECTS_CHECKED_FROM} is not in this clone")
    subjects = subprocess.run(
        ["git", "-C", str(ROOT), "log", "--format=%h %s", f"{SUBJECTS_CHECKED_FROM}..HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    long = [line for line in subjects if len(line.split(" ", 1)[1]) > SUBJECT_LIMIT]
    assert not long, f"commit subjects over {SUBJECT_LIMIT} characters: {long}"
