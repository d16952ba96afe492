"""The Debian releases a lab's nodes run, and the apt sources a node of each gets.

A node's sources are the host's, with the host's release words (`bookworm`,
`bookworm-updates`, `bookworm-security`, ...) put in the node's: a Debian 12 host boots
Debian 13 nodes from the same mirrors, and the other way round. This module needs only
the standard library (make demo runs the image build with the system Python)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tacc_lab.apt_sources import source_files
from tacc_lab.errors import LabError

OS_ENV = "TACC_LAB_OS"
OS_RELEASE = Path("/etc/os-release")


@dataclass(frozen=True)
class Release:
    codename: str  # the suite: mmdebstrap's and apt's name for it
    version: str  # Debian's number
    slurm: str  # the Slurm its archive carries
    python: tuple[int, int]  # its python3: which wheels its nodes can install
    glibc: tuple[int, int]


BOOKWORM = Release("bookworm", "12", "22.05", python=(3, 11), glibc=(2, 36))
TRIXIE = Release("trixie", "13", "24.11", python=(3, 13), glibc=(2, 41))
RELEASES = {release.codename: release for release in (TRIXIE, BOOKWORM)}
DEFAULT = TRIXIE  # the primary release (issue [20]); bookworm stays supported


def release_named(name: str) -> Release:
    """The release `name` stands for; a LabError naming the ones there are."""
    try:
        return RELEASES[name]
    except KeyError:
        raise LabError(f"unknown node OS {name!r}: expected one of {', '.join(RELEASES)}") from None


def requested_release(environ: dict[str, str] | None = None) -> Release | None:
    """The release TACC_LAB_OS names; None when unset."""
    value = (os.environ if environ is None else environ).get(OS_ENV)
    if not value:
        return None
    try:
        return release_named(value)
    except LabError as exc:
        raise LabError(f"{OS_ENV}: {exc}") from None


def host_codename(os_release: Path = OS_RELEASE) -> str:
    """This machine's Debian release word (VERSION_CODENAME in /etc/os-release)."""
    try:
        text = os_release.read_text()
    except OSError as exc:
        raise LabError(f"{os_release}: unreadable ({exc}); the lab needs a Debian host") from exc
    found = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?$", text, re.MULTILINE)
    if not found:
        raise LabError(f"{os_release}: no VERSION_CODENAME; the lab needs a Debian host")
    return found.group(1)


def retarget(text: str, host: str, node: str) -> str:
    """A sources file's text with `host`'s suites (`host`, `host-updates`, ...) named for
    `node`'s release; every other word as it was."""
    if host == node:
        return text
    return re.sub(rf"(?<![\w.-]){re.escape(host)}(?=-[a-z]+\b|(?![\w.-]))", node, text)


def node_sources(release: Release, host: str | None = None) -> list[tuple[str, str]]:
    """(file name, text) of each active host sources file, for a node of `release`."""
    host = host or host_codename()
    return [
        (file.name, retarget(file.read_text("utf-8"), host, release.codename))
        for file in source_files()
    ]


def write_node_sources(release: Release, directory: Path) -> list[Path]:
    """node_sources written under `directory` (replaced): mmdebstrap's mirror arguments."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    written = []
    for name, text in node_sources(release):
        (directory / name).write_text(text)
        written.append(directory / name)
    return written
