"""The files tcloud's SSH connections are made with: ~/.ssh/config, ~/.ssh/known_hosts
and the cluster's own known_hosts file. paramiko's connection (tcloud.transport.ssh),
the master's key (tcloud.transport.mux) and OpenSSH's (tcloud.transport.openssh) all
find them here; nothing here imports paramiko."""

from __future__ import annotations

import os
from pathlib import Path

from tcloud.config import Cluster


def user_ssh_dir() -> Path:
    return Path.home() / ".ssh"


def user_known_hosts() -> Path:
    return user_ssh_dir() / "known_hosts"


def known_hosts_path(cluster: Cluster, user_file: Path | None = None) -> Path:
    """The cluster's known_hosts file: its own when configured, else the user's."""
    return Path(os.path.expanduser(cluster.known_hosts or user_file or user_known_hosts()))
