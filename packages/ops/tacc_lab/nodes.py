"""One lab node: an overlay over the cached image, booted by systemd-nspawn on the bridge."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tacc_lab import backup_controller
from tacc_lab.config import NODE_PACKAGE_CACHE, LabConfig
from tacc_lab.errors import LabError
from tacc_lab.processes import process_alive, stop_process
from tacc_lab.proxy import proxy_url
from tacc_lab.runner import run
from tacc_lab.state import NodeRecord


class NodePaths:
    def __init__(self, cfg: LabConfig, name: str) -> None:
        self.base = cfg.nodes_dir / name
        self.upper = self.base / "upper"
        self.work = self.base / "work"
        self.rootfs = self.base / "rootfs"
        self.log = self.base / "console.log"
        self.host_key = self.base / "ssh_host_ed25519_key"
        # Written after the first boot's configure_node: a node booted again after a
        # power cut keeps its disk (hosts, machine-id) like a real server does.
        self.configured = self.base / "configured"


def is_mounted(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def mount_overlay(paths: NodePaths, image: Path) -> None:
    for directory in (paths.upper, paths.work, paths.rootfs):
        directory.mkdir(parents=True, exist_ok=True)
        # The merged root takes the upper directory's mode: 0755 whatever the caller's
        # umask (under 077 the node's services, not root, could not enter `/`).
        directory.chmod(0o755)
    if not is_mounted(paths.rootfs):
        options = f"lowerdir={image},upperdir={paths.upper},workdir={paths.work}"
        run(["mount", "-t", "overlay", "overlay", "-o", options, str(paths.rootfs)])


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def configure_node(
    cfg: LabConfig, node: NodeRecord, paths: NodePaths, peers: list[NodeRecord]
) -> str:
    """Write the node's identity and network files into its overlay; return its host public key."""
    root = paths.rootfs
    prefix = cfg.subnet.prefixlen
    proxy = proxy_url(cfg)
    _write(root / "etc/hostname", f"{node.name}\n")
    # A hosts file from the first boot: without it every FQDN lookup waits 10 s for DNS.
    host_lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    host_lines += [f"{peer.address}\t{peer.name}" for peer in peers]
    _write(root / "etc/hosts", "\n".join(host_lines) + "\n")
    _write(root / "etc/machine-id", secrets.token_hex(16) + "\n", 0o444)
    # Must sort before the image's 80-container-host0.network, or host0 stays link-local.
    _write(
        root / "etc/systemd/network/10-host0.network",
        f"[Match]\nName=host0\n\n[Network]\nAddress={node.address}/{prefix}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\n",
    )
    # No default route: the proxy on the bridge is the only way out, for registries only.
    _write(
        root / "etc/apt/apt.conf.d/01tacc-lab-proxy",
        f'Acquire::http::Proxy "{proxy}";\nAcquire::https::Proxy "{proxy}";\n',
    )
    _write(root / "etc/pip.conf", f"[global]\nproxy = {proxy}\n")
    # Peers by name too: pip and uv match no_proxy against the host name they were given
    # (http://n1:3141, the package cache), and a CIDR only matches literal addresses.
    no_proxy = ",".join(["localhost", "127.0.0.1", str(cfg.subnet), *(p.name for p in peers)])
    _write(
        root / "etc/environment",
        f"http_proxy={proxy}\nhttps_proxy={proxy}\nno_proxy={no_proxy}\n",
    )
    # Under load a boot-time unit can fail to get its cgroup (status=219/CGROUP); this
    # one removes /run/nologin, and without it no researcher can log in: retry it.
    _write(
        root / "etc/systemd/system/systemd-user-sessions.service.d/10-tacc-lab-retry.conf",
        "[Service]\nRestart=on-failure\nRestartSec=1\n",
    )
    (root / "shared").mkdir(exist_ok=True)
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write(ssh_dir / "authorized_keys", cfg.ssh_key.with_suffix(".pub").read_text(), 0o600)
    if not paths.host_key.exists():
        generate_ed25519_key(paths.host_key, comment=f"root@{node.name}")
    key_dst = root / "etc/ssh/ssh_host_ed25519_key"
    _write(key_dst, paths.host_key.read_text(), 0o600)
    public = paths.host_key.with_suffix(".pub").read_text()
    _write(key_dst.with_suffix(".pub"), public)
    return public


def _marker(paths: NodePaths) -> str:
    return f"--directory={paths.rootfs}"


def node_alive(cfg: LabConfig, node: NodeRecord) -> bool:
    return process_alive(node.pid, _marker(NodePaths(cfg, node.name)))


@dataclass
class Boot:
    """One systemd-nspawn run of a node: its process and where its console output of
    this run starts (the log is appended to across power cuts, so older runs' last
    words must not be read as this one's)."""

    process: subprocess.Popen
    log: Path
    log_offset: int

    def exit_status(self) -> int | None:
        return self.process.poll()

    def said(self) -> str:
        with self.log.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace").strip()


def start_node(cfg: LabConfig, node: NodeRecord, paths: NodePaths) -> Boot:
    """Boot the node detached in its own session."""
    # The head node keeps the package cache's data in a host directory of this lab's
    # name that outlives the lab (config.PACKAGE_CACHE).
    cache = [f"--bind={cfg.package_cache_dir}:{NODE_PACKAGE_CACHE}"] if node.index == 1 else []
    # The lab's BMC (tacc_lab.bmc) runs systemd-nspawn and boots the node again when it
    # reboots itself.
    cmd = [
        sys.executable,
        "-m",
        "tacc_lab.bmc",
        "--",
        "systemd-nspawn",
        "--quiet",
        "--boot",
        f"--directory={paths.rootfs}",
        f"--machine={cfg.machine_name(node.name)}",
        f"--hostname={node.name}",
        # The host has no systemd as PID 1: no machined registration, no scope unit.
        "--register=no",
        "--keep-unit",
        f"--network-bridge={cfg.bridge}",
        # The node's /etc/resolv.conf is its own (roles/common points it at the cluster's
        # DNS); nspawn would otherwise copy the host's over it at every boot.
        "--resolv-conf=off",
        f"--bind={cfg.shared_dir}:/shared",
        *cache,
        *backup_controller.bind_argv(cfg),
        # NFS-Ganesha's VFS backend needs open_by_handle_at, which nspawn's default
        # seccomp filter denies (EPERM -> NFS3ERR_PERM); /shared is exported from n1.
        "--system-call-filter=open_by_handle_at",
        "--console=passive",
    ]
    with open(paths.log, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    return Boot(proc, paths.log, offset)


def _exit_words(status: int) -> str:
    if status < 0:
        return f"killed by signal {-status}"
    return f"exit status {status}"


def wait_for_ssh(
    cfg: LabConfig,
    boots: dict[str, Boot],
    nodes: list[NodeRecord],
    timeout: float = 90.0,
    boot_again: Callable[[NodeRecord], Boot] | None = None,
) -> None:
    """Block until every node accepts an SSH login with its verified host key.

    A node whose systemd-nspawn exits in its first moments without a word of this run
    in its console log (seen under heavy load, cause not found) is booted once more by
    `boot_again`; one that says why it failed, or fails twice, is an error that names
    nspawn's exit status and what this run printed."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    retried: set[str] = set()
    while pending and time.monotonic() < deadline:
        for node in list(pending):
            boot = boots[node.name]
            status = boot.exit_status()
            if status is not None:
                said = boot.said()
                if not said and boot_again and node.name not in retried:
                    print(
                        f"{node.name}: systemd-nspawn ended while booting "
                        f"({_exit_words(status)}) without a word; booting it again"
                    )
                    retried.add(node.name)
                    boots[node.name] = boot_again(node)
                    continue
                raise LabError(
                    f"node {node.name} exited while booting ({_exit_words(status)}): "
                    + (said[-500:] if said else "nothing in its console log")
                )
            if _port_open(node.address) and _ssh_ok(cfg, node):
                pending.remove(node)
        if pending:
            time.sleep(0.2)
    if pending:
        names = ", ".join(n.name for n in pending)
        raise LabError(f"nodes {names} did not answer SSH within {timeout:.0f} s")


def _port_open(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=0.5):
            return True
    except OSError:
        return False


def ssh_base_args(cfg: LabConfig) -> list[str]:
    return [
        "ssh",
        "-i",
        str(cfg.ssh_key),
        "-o",
        f"UserKnownHostsFile={cfg.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
    ]


def ssh_command_argv(cfg: LabConfig, address: str, words: list[str], *, tty: bool) -> list[str]:
    """`ssh` as root to `address`, running `words` as ssh does: joined with spaces into
    one command line for the node's login shell (`'echo a; echo b'` runs two commands; a
    word holding spaces must come quoted, e.g. by shlex.join). No words: a login shell."""
    argv = [*ssh_base_args(cfg), "-t" if tty else "-T", f"root@{address}"]
    if words:
        # `--`: a command that starts with `-` is the node's, not an option of ssh.
        argv += ["--", " ".join(words)]
    return argv


def _ssh_ok(cfg: LabConfig, node: NodeRecord) -> bool:
    proc = subprocess.run(
        [*ssh_base_args(cfg), f"root@{node.address}", "true"],
        capture_output=True,
        check=False,
        timeout=15,
    )
    return proc.returncode == 0


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cut_power(cfg: LabConfig, node: NodeRecord, timeout: float = 15.0) -> bool:
    """Like pulling a server's power cord: SIGKILL to the container's init, so every
    process in it dies at once and nothing shuts down cleanly. Its disk (the overlay)
    stays; `tacc-lab up` boots it again. (SIGKILL to systemd-nspawn alone would leave
    the container running, reparented.) False if the node was not running."""
    if not node_alive(cfg, node):
        return False
    # node.pid is the lab's BMC: killed first, so it does not boot the node again; then
    # the container's init (the child of its systemd-nspawn).
    nspawns = _children(node.pid or 0)
    os.kill(node.pid or 0, signal.SIGKILL)
    for nspawn in nspawns:
        for child in _children(nspawn):
            os.kill(child, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while node_alive(cfg, node):
        if time.monotonic() > deadline:
            raise LabError(f"{node.name}: still running {timeout:.0f} s after its power cut")
        time.sleep(0.1)
    return True


def stop_node(cfg: LabConfig, node: NodeRecord) -> None:
    """Power the node off (SIGTERM makes nspawn halt the container), unmount, delete."""
    paths = NodePaths(cfg, node.name)
    stop_process(node.pid, _marker(paths), timeout=15)
    if is_mounted(paths.rootfs):
        run(["umount", str(paths.rootfs)])
    if paths.base.exists():
        run(["rm", "-rf", "--one-file-system", str(paths.base)])


def generate_ed25519_key(path: Path, *, comment: str) -> None:
    """A passphrase-less ed25519 key pair at `path` and `path`.pub."""
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def ensure_ssh_key(cfg: LabConfig) -> None:
    cfg.ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not cfg.ssh_key.exists():
        generate_ed25519_key(cfg.ssh_key, comment=f"tacc-lab-{cfg.name}")


def write_known_hosts(cfg: LabConfig, entries: dict[str, tuple[str, str]]) -> None:
    """entries: node name -> (address, public key line)."""
    lines = []
    for name, (address, public) in sorted(entries.items()):
        keytype, key = public.split()[:2]
        lines.append(f"{name},{address} {keytype} {key}\n")
    _write(cfg.known_hosts, "".join(lines), 0o600)


def host_public_key(cfg: LabConfig, name: str) -> str:
    return (cfg.nodes_dir / name / "ssh_host_ed25519_key.pub").read_text()
