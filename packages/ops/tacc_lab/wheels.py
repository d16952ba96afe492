"""Wheels of this machine's pip find-links directories that lab nodes can install.

The lab uploads them into the cluster package cache (`package_cache_wheels`), so a
wheel the host keeps locally (a CPU-only torch, say) is what the nodes' environment
builds get, fetched from the host once per lab instead of from the internet. An uploaded
project is served only from its uploaded files (devpi shadows the mirror's releases).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tacc_lab.releases import DEFAULT, Release
from tacc_lab.runner import run

# Lab nodes of the default release on this machine's CPU architecture; a lab of another
# release passes its own (releases.Release.python, .glibc).
NODE_PYTHON = DEFAULT.python
NODE_GLIBC = DEFAULT.glibc
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(.+)$")


def _python_ok(tag: str, abi: str, python: tuple[int, int]) -> bool:
    major, minor = python
    cp = f"cp{major}{minor}"
    if abi == "none":
        return tag == cp or tag in {f"py{major}"} | {f"py{major}{m}" for m in range(minor + 1)}
    if abi == "abi3":
        return tag in {f"cp{major}{m}" for m in range(2, minor + 1)}
    return abi == cp and tag == cp


def _platform_ok(tag: str, machine: str, glibc: tuple[int, int]) -> bool:
    if tag == "any" or tag == f"linux_{machine}":
        return True
    if match := _MANYLINUX.match(tag):
        wanted = (int(match.group(1)), int(match.group(2)))
        return match.group(3) == machine and wanted <= glibc
    legacy, _, arch = tag.partition("_")
    return arch == machine and legacy in _LEGACY_MANYLINUX and _LEGACY_MANYLINUX[legacy] <= glibc


def node_compatible(
    filename: str,
    *,
    python: tuple[int, int] = NODE_PYTHON,
    machine: str | None = None,
    glibc: tuple[int, int] = NODE_GLIBC,
) -> bool:
    """Whether a wheel file name has a tag a lab node's pip accepts (PEP 425: each of
    the python, abi and platform fields may be a '.'-separated set)."""
    machine = machine or platform.machine()
    if not filename.endswith(".whl"):
        return False
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return False
    pythons, abis, platforms = parts[-3:]
    return any(
        _python_ok(tag, abi, python) for tag in pythons.split(".") for abi in abis.split(".")
    ) and any(_platform_ok(tag, machine, glibc) for tag in platforms.split("."))


def find_links_dirs(pip_config_list: str, environ: dict[str, str]) -> list[Path]:
    """Local directories named by pip's find-links settings (`pip config list` lines such
    as `global.find-links='/opt/wheels'`) and $PIP_FIND_LINKS, in order, once each;
    URLs other than file:// are left out."""
    values = []
    for line in pip_config_list.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            values.append(value.strip().strip("'\""))
    values.append(environ.get("PIP_FIND_LINKS", ""))
    found: list[Path] = []
    for item in " ".join(values).split():
        parts = urlsplit(item)
        if parts.scheme == "file":
            path = Path(unquote(parts.path))
        elif parts.scheme == "" and item.startswith("/"):
            path = Path(item)
        else:
            continue
        if path not in found:
            found.append(path)
    return found


def node_wheels(dirs: list[Path], **tags) -> list[str]:
    """Sorted paths of the node-compatible wheels directly in `dirs`."""
    wheels = {
        str(entry)
        for directory in dirs
        if directory.is_dir()
        for entry in directory.iterdir()
        if entry.is_file() and node_compatible(entry.name, **tags)
    }
    return sorted(wheels)


def host_find_links_wheels(release: Release = DEFAULT, python: str = sys.executable) -> list[str]:
    """The wheels in this machine's pip find-links directories that nodes of `release`
    can install (a Debian 12 host's CPU torch for Python 3.11 fits no Debian 13 node)."""
    config = run([python, "-m", "pip", "config", "list"], check=False)
    dirs = find_links_dirs(config, dict(os.environ))
    return node_wheels(dirs, python=release.python, glibc=release.glibc)


def host_has_torch_for(release: Release) -> bool:
    """Whether this machine's find-links hold a torch wheel nodes of `release` install
    (a CPU build, `+cpu`: the lab's PyTorch example and tests need one; PyPI has only
    the CUDA build)."""
    return any(
        Path(wheel).name.startswith("torch-") and "+cpu-" in Path(wheel).name
        for wheel in host_find_links_wheels(release)
    )
