"""docs/day-one.md read as steps: its `sh` blocks (where each runs, the test that runs it
or why it is done by hand) and the `text` block after one (what it must print).
test_day_one.py runs the blocks that name no test; tests/unit/repo/test_day_one_doc.py
checks that every block is claimed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tests.conftest import ROOT

DOC = ROOT / "docs/day-one.md"
ANYTHING = "..."
# The example inventory's hosts and the hw lab's nodes that stand for them (the doc says
# so at its top); `admin` (this checkout) and `laptop` (a researcher's tcloud) are here.
LAB_NAMES = {"ctl1": "n1", "login1": "n1", "gpu01": "n2", "gpu02": "n3"}
PLACES = {"admin", "laptop", *LAB_NAMES}


@dataclass(frozen=True)
class Block:
    step: str  # the heading it is under, e.g. "7. The controller"
    line: int  # of its opening fence in the doc
    on: str  # where it runs: admin, laptop, or a host of the example inventory
    run_by: tuple[str, ...]  # "path::function" of the tests that run it instead
    by_hand: str  # why no test runs it (the machines themselves)
    script: str  # its lines but the markers
    expect: tuple[str, ...]  # the lines of the text block after it

    @property
    def runs_here(self) -> bool:
        """test_day_one.py runs it (no other test does, and it is not by hand)."""
        return not self.run_by and not self.by_hand


def read_blocks(text: str | None = None) -> list[Block]:
    """Every `sh` block of the doc, in order, with the `text` block after it."""
    lines = (DOC.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    step, index = "", 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("## "):
            step = line[3:].strip()
        if line.strip() != "```sh":
            index += 1
            continue
        start = index + 1
        body, index = fenced(lines, index)
        after = index
        while after < len(lines) and not lines[after].strip():
            after += 1
        expect: list[str] = []
        if after < len(lines) and lines[after].strip() == "```text":
            expect, index = fenced(lines, after)
        blocks.append(block(step, start, body, expect))
    return blocks


def fenced(lines: list[str], opening: int) -> tuple[list[str], int]:
    """The lines inside the fence opened at `opening`, and the index after its close."""
    end = opening + 1
    while end < len(lines) and lines[end].strip() != "```":
        end += 1
    if end == len(lines):
        raise ValueError(f"{DOC.name}:{opening + 1}: a fence that is never closed")
    return lines[opening + 1 : end], end + 1


def block(step: str, line: int, body: list[str], expect: list[str]) -> Block:
    markers: dict[str, str] = {}
    script: list[str] = []
    for text in body:
        found = re.fullmatch(r"# (on|run by|by hand): (.+)", text.strip())
        if found and not script:
            markers[found.group(1)] = found.group(2).strip()
        else:
            script.append(text)
    run_by = tuple(t.strip() for t in markers.get("run by", "").split(",") if t.strip())
    return Block(
        step=step,
        line=line,
        on=markers.get("on", ""),
        run_by=run_by,
        by_hand=markers.get("by hand", ""),
        script="\n".join(script).strip() + "\n",
        expect=tuple(t for t in expect if t.strip()),
    )


def missing_lines(expect: tuple[str, ...], output: str) -> list[str]:
    """The expected lines that `output` lacks, in order: each must match a later output
    line than the one before it; `...` in one stands for anything."""
    lines = output.splitlines()
    at, missing = 0, []
    for want in expect:
        pattern = re.compile(".*".join(re.escape(part) for part in want.split(ANYTHING)))
        found = next((i for i in range(at, len(lines)) if pattern.fullmatch(lines[i])), None)
        if found is None:
            missing.append(want)
        else:
            at = found + 1
    return missing
