"""This process's mount table, /proc/self/mountinfo: each mount point's type, source and
options (its own and its superblock's), for the health check that wants mounts present."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tacc_agent.procfs import PROC


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    options: frozenset[str]


def unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    return text.encode().decode("unicode_escape") if "\\" in text else text


def parse_mountinfo(text: str) -> dict[str, Mount]:
    """Mount point -> its mount; of two mounts on one point the later (the one seen)."""
    mounts = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 6 or len(tail) < 3:
            continue
        options = frozenset(fields[5].split(",")) | frozenset(tail[2].split(","))
        point = unescape(fields[4])
        mounts[point] = Mount(point, tail[0], unescape(tail[1]), options)  # last one wins
    return mounts


def mount_table(proc_root: str = PROC) -> dict[str, Mount]:
    """This process's mounts; OSError when /proc/self/mountinfo cannot be read."""
    return parse_mountinfo(Path(proc_root, "self", "mountinfo").read_text())
