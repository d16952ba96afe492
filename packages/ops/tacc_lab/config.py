"""Where a lab keeps its state, and the names derived from the lab's name."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tacc_lab.errors import LabError

DEFAULT_NAME = "lab"
DEFAULT_SUBNET = "10.77.0.0/24"
PROXY_PORT = 3128
STATE_ROOT = Path(os.environ.get("TACC_LAB_STATE_ROOT", "/var/lib/tacc-lab"))
# The node image is cached outside the repository and shared by every lab on the machine.
IMAGE_CACHE = Path(os.environ.get("TACC_LAB_IMAGE_CACHE", "/var/cache/tacc-lab/images"))
# The lab's container base image (an OCI archive, `tacc-lab up --container-image`), cached
# beside the node images and shared by every lab on the machine (tacc_lab/oci_image.py).
OCI_CACHE = Path(os.environ.get("TACC_LAB_OCI_CACHE", "/var/cache/tacc-lab/oci"))
# The package cache's data (devpi-server's directory, roles/package_cache), per lab name and
# kept across labs, outside the repository: the multi-GB downloads (torch) happen once
# per machine, not once per lab. Per name because two labs run at once (pytest-xdist)
# and two devpi-server processes must never share one server directory.
PACKAGE_CACHE = Path(os.environ.get("TACC_LAB_PACKAGE_CACHE", "/var/cache/tacc-lab/package-cache"))
# Where the head node sees it: the role's package_cache_dir.
NODE_PACKAGE_CACHE = "/var/lib/tacc-package-cache"

_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")


@dataclass(frozen=True)
class LabConfig:
    """Everything about one lab that follows from its name and subnet."""

    name: str
    subnet: ipaddress.IPv4Network
    state_root: Path = STATE_ROOT
    image_cache: Path = IMAGE_CACHE
    package_cache_root: Path = PACKAGE_CACHE

    @classmethod
    def create(cls, name: str, subnet: str, **paths: Path) -> LabConfig:
        if not _NAME_RE.match(name):
            raise LabError(
                f"lab name {name!r} is invalid: expected 1-8 lowercase letters or digits, "
                "starting with a letter (it becomes part of interface names)"
            )
        return cls(name=name, subnet=parse_subnet(subnet), **paths)

    @property
    def state_dir(self) -> Path:
        return self.state_root / self.name

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def nodes_dir(self) -> Path:
        return self.state_dir / "nodes"

    @property
    def shared_dir(self) -> Path:
        """Host directory bind-mounted at /shared in every node."""
        return self.state_dir / "shared"

    @property
    def package_cache_dir(self) -> Path:
        """Host directory bind-mounted at NODE_PACKAGE_CACHE in the head node; `down`
        leaves it (it is not under the state directory)."""
        return self.package_cache_root / self.name

    @property
    def container_image_file(self) -> Path:
        """Which container image the lab seeds (`up --container-image`), kept so a later
        `up` without the option keeps it; absent: the lab runs no containers."""
        return self.state_dir / "container-image.json"

    @property
    def ssh_dir(self) -> Path:
        return self.state_dir / "ssh"

    @property
    def ssh_key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def users_dir(self) -> Path:
        """Per-researcher keys and tcloud config (`tacc-lab user NAME`)."""
        return self.state_dir / "users"

    def researcher_key(self, name: str) -> Path:
        """A lab researcher's SSH private key; the public key is next to it (.pub)."""
        return self.users_dir / name / "id_ed25519"

    @property
    def proxy_dir(self) -> Path:
        return self.state_dir / "proxy"

    @property
    def bridge(self) -> str:
        # Linux interface names are at most 15 bytes; the name regex keeps this at 13.
        return f"tacc-{self.name}"

    def machine_name(self, node: str) -> str:
        """nspawn machine name; unique per lab so veth names (vb-<machine>) never collide."""
        return f"{self.name}-{node}"


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as exc:
        raise LabError(
            f"--subnet {text!r} is not an IPv4 network like 10.77.0.0/24: {exc}"
        ) from exc
    if not net.is_private:
        raise LabError(
            f"--subnet {net} is not a private range; the lab only uses private addresses"
        )
    if net.prefixlen > 28:
        raise LabError(f"--subnet {net} is too small: use a /28 or larger (e.g. a /24)")
    return net
