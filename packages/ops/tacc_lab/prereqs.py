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
# `tacc-lab up --container-image` builds the lab's container image on this host
# (tacc_lab/oci_image.py) with these.
CONTAINER_IMAGE_COMMANDS = {
    "mmdebstrap": "mmdebstrap",
    "mmtarfilter": "mmdebstrap",
    "umoci": "umoci",
    "skopeo": "skopeo",
}


def missing_commands(which=shutil.which, commands: dict[str, str] | None = None) -> dict[str, str]:
    wanted = REQUIRED_COMMANDS if commands is None else commands
    return {cmd: pkg for cmd, pkg in wanted.items() if which(cmd) is None}


def check_prerequisites(
    *, euid: int | None = None, which=shutil.which, container_image: bool = False
) -> None:
    uid = os.geteuid() if euid is None else euid
    if uid != 0:
        raise LabError(
            "tacc-lab must run as root (it mounts overlays, creates a bridge and boots "
            "systemd-nspawn containers); try: sudo tacc-lab ..."
        )
    wanted = REQUIRED_COMMANDS | (CONTAINER_IMAGE_COMMANDS if container_image else {})
    missing = missing_commands(which, wanted)
    if missing:
        cmds = ", ".join(sorted(missing))
        pkgs = " ".join(sorted(set(missing.values())))
        raise LabError(f"missing commands: {cmds}; install them with: apt-get install {pkgs}")
