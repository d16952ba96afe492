"""Check, before touching anything, that this host can run a lab."""

from __future__ import annotations

import os
import shutil

from tacc_lab.errors import LabError

# command -> Debian package that provides it
REQUIRED_COMMANDS = {
    "systemd-nspawn": "systemd-container",
    "debootstrap": "debootstrap",
    "tinyproxy": "tinyproxy",
    "ip": "iproute2",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "mount": "mount",
}


def missing_commands(which=shutil.which) -> dict[str, str]:
    return {cmd: pkg for cmd, pkg in REQUIRED_COMMANDS.items() if which(cmd) is None}


def check_prerequisites(*, euid: int | None = None, which=shutil.which) -> None:
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        raise LabError(
            "tacc-lab must run as root (it mounts overlays, creates a bridge and boots "
            "systemd-nspawn containers); try: sudo tacc-lab ..."
        )
    missing = missing_commands(which)
    if missing:
        cmds = ", ".join(sorted(missing))
        pkgs = " ".join(sorted(set(missing.values())))
        raise LabError(f"missing commands: {cmds}; install them with: apt-get install {pkgs}")
