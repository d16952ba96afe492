"""OpenSSH's own connection sharing, for byte streams where it is there: an `ssh`
ControlMaster to the login node, held while a `tcloud forward` runs, and one `ssh -S`
session per forwarded connection, with the accepted socket as its stdin and stdout. The
mux client hands those to the master, so the bytes move in OpenSSH (C), not through
paramiko's Python packet loop (about 4 s of one CPU per GiB on the bench machine).

The same checks as tcloud's own connection (tcloud.transport.ssh), whatever the ssh
config says: it reads the same file ($HOME/.ssh/config, -F: no system-wide one), and
options on the command line come first, so they win. The host key must be in
~/.ssh/known_hosts or the cluster's known_hosts, as is (StrictHostKeyChecking=yes, no
global file, no KnownHostsCommand, nothing added or updated, no prompt: BatchMode); no
proxy, no agent or X11 forwarding, no forwardings, no local or remote command, no
session type, stdin or backgrounding from a config. Like paramiko's, the config may
give the host's HostName, User, Port and IdentityFile (the cluster's settings first).
The control socket sits in tcloud's private (0700) socket directory under a random
name, and OpenSSH takes only its own user's requests on it. A session whose master is
gone fails (ProxyCommand=false) rather than log in directly and outlive tcloud.

Not used (tcloud carries the bytes itself, as before): with TCLOUD_FORWARD_OPENSSH=0,
on Windows, without an `ssh` client, with the cluster's proxy_jump or a ProxyJump or
ProxyCommand for the host in the config (`ssh -G` says), when a known_hosts path has a
space or a quote in it, or when the master does not come up (an unknown key, a refused
login, an `ssh` older than 8.7).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transport import mux, ssh_files

ENV_SWITCH = "TCLOUD_FORWARD_OPENSSH"  # 0: tcloud's own connection carries the bytes
READY_SECONDS = 20.0  # the master's connection and login
SETTLE_SECONDS = 3.0  # a forward waits this long for it before it listens
POLL_SECONDS = 0.02
# sshd's MaxSessions (10 by default) counts the master's sessions, its own among them: 8
# at once, the rest wait for one to end.
SESSIONS = 8
# The master's own session: it ends when the master's stdin does, so a master whose
# tcloud was killed goes too (once its forwarded connections have ended), instead of
# holding a connection to the login node for ever.
HELD_BY_STDIN = "exec cat >/dev/null"
SSH_FAILED = 255  # ssh's own failure (no connection, no login), not the command's
# OpenSSH binds the control socket as PATH.<16 random characters> first, then renames it.
BIND_SUFFIX = 17


def known_hosts_option(paths: list[Path]) -> str | None:
    """UserKnownHostsFile's value: the paths, space-separated; None when one of them
    cannot be written so (a space or a quote in it)."""
    words = [str(path) for path in dict.fromkeys(paths)]
    if any(any(c.isspace() or c in "\"'" for c in word) for word in words):
        return None
    return " ".join(words)


def switched_off() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "false", "no", "off")


def config_file() -> str:
    """The ssh config tcloud's own connection reads ($HOME's, not the system's): the
    same for OpenSSH, whose own choice (the passwd entry's home, and /etc/ssh) may
    differ."""
    path = ssh_files.user_ssh_dir() / "config"
    return str(path) if path.is_file() else "none"


def base_argv(cluster: Cluster, control: Path) -> list[str] | None:
    """ssh's words shared by the master and its sessions (the host last); None when
    OpenSSH is not to be used for this cluster (or TCLOUD_FORWARD_OPENSSH=0)."""
    if switched_off():
        return None
    executable = shutil.which("ssh")
    files = [ssh_files.user_known_hosts(), ssh_files.known_hosts_path(cluster)]
    known = known_hosts_option(files)
    if os.name != "posix" or executable is None or cluster.proxy_jump or known is None:
        return None
    options = {
        "BatchMode": "yes",
        "StrictHostKeyChecking": "yes",
        "UserKnownHostsFile": known,
        "GlobalKnownHostsFile": "/dev/null",
        "KnownHostsCommand": "none",
        "VerifyHostKeyDNS": "no",
        "UpdateHostKeys": "no",
        "CheckHostIP": "no",
        "ProxyCommand": "none",
        "ProxyJump": "none",
        "ClearAllForwardings": "yes",
        "ForwardAgent": "no",
        "ForwardX11": "no",
        "PermitLocalCommand": "no",
        "RemoteCommand": "none",
        "RequestTTY": "no",
        "ConnectTimeout": "20",
        "ServerAliveInterval": "15",
        "ServerAliveCountMax": "4",
        "SessionType": "default",
        "StdinNull": "no",
        "ForkAfterAuthentication": "no",
        "ControlPath": str(control),
        "ControlPersist": "no",
        "LogLevel": "ERROR",
    }
    argv = [executable, "-F", config_file(), "-e", "none"]
    for name, value in options.items():
        argv += ["-o", f"{name}={value}"]
    return [*argv, *destination(cluster)]


def destination(cluster: Cluster) -> list[str]:
    """ssh's words for where it goes, the cluster's own settings (~/.ssh/config may
    add to them, as for paramiko): the host last."""
    words = []
    if cluster.key:
        words += ["-i", os.path.expanduser(cluster.key)]
    if cluster.port:
        words += ["-p", str(cluster.port)]
    if cluster.user:
        words += ["-l", cluster.user]
    return [*words, "--", cluster.host]


def proxied(probe: list[str]) -> bool:
    """Whether the user's config reaches the host through a proxy (ProxyJump,
    ProxyCommand), which the master's forced options would skip: a direct connection
    that fails only after ConnectTimeout. Asked of `ssh -G` (no connection): probe."""
    try:
        found = subprocess.run(probe, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if found.returncode != 0:
        return True
    settings = dict(line.split(" ", 1) for line in found.stdout.splitlines() if " " in line)
    return any(settings.get(name, "none") != "none" for name in ("proxyjump", "proxycommand"))


def control_path() -> Path | None:
    """A control socket of a random name (two tcloud processes never share one, even
    with the same pid in two containers); None when it would not fit sun_path or the
    socket directory is not private."""
    with contextlib.suppress(OSError, TcloudError):
        path = mux.private_directory() / f"fw{secrets.token_hex(4)}"
        if len(os.fsencode(path)) + BIND_SUFFIX <= mux.sun_path_room():
            return path
    return None


class Master:
    """The ControlMaster (its own session held by its stdin) and its sessions: at most
    SESSIONS at once (take_slot), the rest go tcloud's own way."""

    def __init__(self, base: list[str], control: Path, probe: list[str]) -> None:
        self.base, self.control, self.probe = base, control, probe
        self.process: subprocess.Popen | None = None
        self.listening = threading.Event()
        self.closed = False
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(SESSIONS)

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> Master | None:
        """A master to start (run), or None when OpenSSH is not to be used."""
        control = control_path()
        base = base_argv(cluster, control) if control is not None else None
        if base is None or control is None:
            return None
        return cls(base, control, [base[0], "-G", "-F", config_file(), *destination(cluster)])

    def run(self) -> None:
        """Start it and wait until it listens on its control socket, ends, or is closed
        (a thread's work: the connection and login take a while). Nothing is said when
        it does not come up: tcloud's own way goes on."""
        if proxied(self.probe):
            return
        argv = [*self.base[:-2], "-M", *self.base[-2:], HELD_BY_STDIN]
        with self.lock:
            if self.closed:
                return
            try:
                self.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,  # never written: it ends when this process does
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C at the terminal is tcloud's to handle
                )
            except OSError:
                return
        deadline = time.monotonic() + READY_SECONDS
        while not self.closed and time.monotonic() < deadline and self.process.poll() is None:
            if self.control.exists():
                self.listening.set()
                return
            time.sleep(POLL_SECONDS)
        self.close()

    @property
    def up(self) -> bool:
        process = self.process
        return (
            self.listening.is_set()
            and not self.closed
            and process is not None
            and process.poll() is None
        )

    def take_slot(self) -> bool:
        """One of the SESSIONS places, without waiting; session() gives it back."""
        return self.up and self.slots.acquire(blocking=False)

    def give_slot(self) -> None:
        self.slots.release()

    def session(
        self, command: str, sock: socket.socket, said: Callable[[list[bytes]], None]
    ) -> int:
        """`command` on the login node with sock as its stdin and stdout, through the
        master (the bytes never pass through this process), in a place take_slot gave;
        each stderr line given to `said` (without its newline); the command's exit
        status, SSH_FAILED when ssh could not run it. sock is closed here. If the master
        is gone by then, the session fails (ProxyCommand=false, first on its command
        line, so the first value: no direct login of its own that would outlive tcloud)."""
        argv = [
            self.base[0],
            "-o",
            "ProxyCommand=false",
            *self.base[1:-2],
            "-o",
            "ControlMaster=no",
            *self.base[-2:],
            command,
        ]
        try:
            with self.lock:
                try:
                    if self.closed:
                        return SSH_FAILED
                    process = subprocess.Popen(
                        argv,
                        stdin=sock.fileno(),
                        stdout=sock.fileno(),
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                    )
                except OSError:
                    return SSH_FAILED
                finally:
                    sock.close()
            with process.stderr:
                for line in process.stderr:
                    said([line.rstrip(b"\n")])
            return process.wait()
        finally:
            self.give_slot()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            process = self.process
        if process is not None:
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        with contextlib.suppress(OSError):
            self.control.unlink()


@contextlib.contextmanager
def master_for(cluster: Cluster) -> Iterator[Callable[..., Master | None]]:
    """A master starting on a thread of its own while the block runs: the callable
    gives it once it is up (None before, or when it is not to be had; `wait` seconds
    for it to come up first); closed after (one still starting is stopped, not waited
    for)."""
    master = Master.for_cluster(cluster)
    if master is not None:
        threading.Thread(target=master.run, daemon=True).start()

    def ready(wait: float = 0.0) -> Master | None:
        if master is None:
            return None
        if wait:
            master.listening.wait(wait)
        return master if master.up else None

    try:
        yield ready
    finally:
        if master is not None:
            master.close()


__all__ = ["Master", "base_argv", "master_for"]
