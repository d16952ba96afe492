"""The lab's on-disk record of its subnet, proxy and nodes (JSON, written atomically)."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tacc_lab.releases import BOOKWORM, Release, release_named


@dataclass
class NodeRecord:
    name: str
    index: int
    address: str
    pid: int | None = None
    # Set by `tacc-lab reimage`: the image this node boots and its release (None: the
    # lab's, LabState.image and .os).
    image: str | None = None
    os: str | None = None


@dataclass
class LabState:
    subnet: str
    proxy_pid: int | None = None
    image: str | None = None
    # The Debian release (releases.py) of the lab's nodes, and of the nodes `up` adds (a
    # reimaged node may run another: NodeRecord.os); None: an older lab's bookworm.
    os: str | None = None
    inventory: str | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)

    def sorted_nodes(self) -> list[NodeRecord]:
        return sorted(self.nodes.values(), key=lambda n: n.index)

    @property
    def release(self) -> Release:
        """The nodes' release: an older lab's state names none, and those ran bookworm."""
        return release_named(self.os or BOOKWORM.codename)


def load_state(path: Path) -> LabState | None:
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    nodes = {name: NodeRecord(**rec) for name, rec in raw.pop("nodes", {}).items()}
    return LabState(nodes=nodes, **raw)


def save_state(path: Path, state: LabState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, path)


@contextmanager
def locked(directory: Path, name: str = ".lock") -> Iterator[None]:
    """An exclusive flock on `directory`/`name`, waited for: lab changes (two `tacc-lab
    up` at once would race on the same nodes) and the machine's image builds (labs that
    come up side by side wait for one build) are serialized this way."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / name, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
