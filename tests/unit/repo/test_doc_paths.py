"""The README and docs/ name only repository paths that exist ([19]): every `quoted`
path whose first part is one of the repository's own top-level entries must be there.
Paths a program writes (a lab's inventory) are listed with the program that writes them."""

from __future__ import annotations

import functools
import re
import subprocess

import pytest

from tests.conftest import ROOT

# Written at run time, not kept in the repository: what writes each.
GENERATED = {
    "inventory/lab/hosts.yml": "`tacc-lab up` writes the default lab's inventory",
}
QUOTED = re.compile(r"`([^`\s]+)`")
NOT_A_PATH = set("<>*{}$[]|")


@functools.cache
def tracked_top_level() -> frozenset[str]:
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.split()
    return frozenset(name.split("/")[0] for name in listed)


def documents() -> list:
    readmes = sorted(ROOT.glob("packages/*/README.md"))
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *readmes]


def named_paths(text: str, tops: set[str] | frozenset[str]) -> list[tuple[int, str]]:
    """(line, path) of each quoted word that names a path under a top-level entry."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for word in QUOTED.findall(line):
            path = word.rstrip(".,:;)").split(":")[0].split("#")[0]
            if "/" in path and path.split("/")[0] in tops and not NOT_A_PATH & set(path):
                found.append((number, path))
    return found


def test_the_check_sees_a_missing_path():
    tops = {"roles", "docs"}
    text = "see `roles/common/tasks/main.yml` and `docs/nowhere.md:12`, not `tacc/cluster`"
    assert named_paths(text, tops) == [(1, "roles/common/tasks/main.yml"), (1, "docs/nowhere.md")]


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_document_names_only_paths_that_exist(document):
    missing = [
        f"{document.relative_to(ROOT)}:{number}: {path}"
        for number, path in named_paths(document.read_text(), tracked_top_level())
        if path not in GENERATED and not (ROOT / path).exists()
    ]
    assert not missing, "\n".join(missing)


def test_the_readmes_layout_table_names_only_what_is_there():
    """Its first column names repository paths from the root (a `templates/` that does
    not exist was listed there once)."""
    text = (ROOT / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in layout.splitlines() if line.startswith("| `")]
    named = [word for cell in rows for word in QUOTED.findall(cell)]
    assert len(named) >= 10, named
    assert [word for word in named if not (ROOT / word).exists()] == []
