"""A verified SSH connection (paramiko): a command's own, or the connection master's
(tcloud.transport.mux_master), which commands share.

Honours ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump) and ssh-agent.
Host keys are checked against ~/.ssh/known_hosts (and the cluster's own known_hosts
file when configured), read as ssh(1) reads them (tcloud.transport.known_hosts): a changed or
`@revoked` key is refused; an unknown one is refused unless the user, at a terminal,
accepts the fingerprint shown, which is then remembered as one line appended to the file.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import paramiko

from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.timing import step
from tcloud.transport import known_hosts as known_hosts_file
from tcloud.transport import ssh_files, wire

USER_KNOWN_HOSTS = ssh_files.user_known_hosts()
# paramiko logs a failed handshake with its traceback from its own thread; with no
# handler that lands on stderr. tcloud reports the failure itself (`connect`), once.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class Unreachable(TcloudError):
    """The host did not answer (down, no route, refused): another login host may."""


@dataclass(frozen=True)
class Endpoint:
    hostname: str
    port: int
    user: str
    keys: list[str]
    proxy_jump: str | None


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def resolve(
    host: str,
    user: str | None = None,
    port: int | None = None,
    key: str | None = None,
    proxy_jump: str | None = None,
) -> Endpoint:
    """Fill what is not given from ~/.ssh/config, as ssh(1) would."""
    found: dict = {}
    path = ssh_files.user_ssh_dir() / "config"
    if path.is_file():
        found = paramiko.SSHConfig.from_path(str(path)).lookup(host)
    keys = [key] if key else list(found.get("identityfile", []))
    return Endpoint(
        hostname=found.get("hostname", host),
        port=int(port or found.get("port", 22)),
        user=user or found.get("user") or os.environ.get("USER", "root"),
        keys=[os.path.expanduser(k) for k in keys if os.path.exists(os.path.expanduser(k))],
        proxy_jump=proxy_jump or found.get("proxyjump"),
    )


class AskOrRefuse(paramiko.MissingHostKeyPolicy):
    """Unknown host: show the fingerprint; accept only on an explicit "yes" at a terminal.
    A revoked key is refused without asking (it is never among the known keys)."""

    def __init__(
        self, known_hosts: Path, known: known_hosts_file.KnownHosts, *, may_ask: bool = True
    ) -> None:
        self.known_hosts = known_hosts
        self.known = known
        self.may_ask = may_ask

    def missing_host_key(self, client, hostname, key) -> None:
        shown = f"{hostname} offers a {key.get_name()} host key {fingerprint(key)}"
        if self.known.is_revoked(key):
            raise TcloudError(f"REVOKED HOST KEY: {shown}, marked @revoked in known_hosts")
        if not self.may_ask:
            # A fallback host is tried when `host` does not answer, which someone on the
            # network can arrange: its key must be known beforehand, never asked for then.
            raise TcloudError(
                f"unknown fallback host: {shown}. A fallback host's key must already be in "
                f"{self.known_hosts} (verify it and add it, or connect to it once as --host)"
            )
        if not sys.stdin.isatty():
            raise TcloudError(
                f"unknown host: {shown}. Verify it, then add it to {self.known_hosts} "
                "(or run this command at a terminal to accept it)"
            )
        answer = input(f"{shown}\nIs this the cluster's key? Type yes to trust it: ")
        if answer.strip().lower() != "yes":
            raise TcloudError(f"host key for {hostname} not accepted")
        client.get_host_keys().add(hostname, key.get_name(), key)
        known_hosts_file.append(self.known_hosts, hostname, key)


def verifying_client(known_hosts: Path, *, may_ask: bool = True) -> paramiko.SSHClient:
    """A client that knows the keys of ~/.ssh/known_hosts and `known_hosts`; an unknown
    key is asked about at a terminal only when `may_ask`."""
    client = paramiko.SSHClient()
    paths = dict.fromkeys([USER_KNOWN_HOSTS, known_hosts])  # once, when they are the same
    known = known_hosts_file.load(paths, client.get_host_keys())
    client.set_missing_host_key_policy(AskOrRefuse(known_hosts, known, may_ask=may_ask))
    return client


def connect(
    endpoint: Endpoint, known_hosts: Path, sock=None, *, may_ask: bool = True
) -> paramiko.SSHClient:
    client = verifying_client(known_hosts, may_ask=may_ask)
    try:
        client.connect(
            endpoint.hostname,
            port=endpoint.port,
            username=endpoint.user,
            key_filename=endpoint.keys or None,
            sock=sock,
            transport_factory=wire.transport,  # AEAD ciphers first (tcloud.transport.wire)
            timeout=20,
            banner_timeout=20,
            auth_timeout=20,
        )
    except paramiko.BadHostKeyException as exc:
        raise TcloudError(
            f"HOST KEY MISMATCH for {endpoint.hostname}: it offered {fingerprint(exc.key)}, "
            f"known_hosts has {fingerprint(exc.expected_key)}. Refusing to connect: the host "
            "was reinstalled or someone is intercepting the connection."
        ) from None
    except paramiko.AuthenticationException as exc:
        who = f"{endpoint.user}@{endpoint.hostname}"
        raise TcloudError(f"{who}: authentication failed: {exc}") from None
    except OSError as exc:  # no route, refused, timed out: another login host may answer
        raise Unreachable(f"cannot connect to {endpoint.hostname}:{endpoint.port}: {exc}") from None
    except paramiko.SSHException as exc:  # it answered, but not as an SSH server should
        raise TcloudError(f"cannot connect to {endpoint.hostname}:{endpoint.port}: {exc}") from None
    return client


def known_hosts_path(cluster: Cluster) -> Path:
    return ssh_files.known_hosts_path(cluster, USER_KNOWN_HOSTS)


def jump_endpoint(proxy_jump: str) -> Endpoint:
    jump_user, _, jump_host = proxy_jump.rpartition("@")
    jump_host, _, jump_port = jump_host.partition(":")
    return resolve(jump_host, jump_user or None, int(jump_port) if jump_port else None)


def host_keys_known(cluster: Cluster) -> bool:
    """Whether known_hosts already holds a key for the login node (and its jump host):
    a connection made without a terminal (tcloud.transport.mux_master) would have no one to ask."""
    known_hosts = known_hosts_path(cluster)
    paths = dict.fromkeys([USER_KNOWN_HOSTS, known_hosts])
    keys = known_hosts_file.load(paths).keys
    target = resolve(cluster.host, cluster.user, cluster.port, cluster.key, cluster.proxy_jump)
    endpoints = [target] + ([jump_endpoint(target.proxy_jump)] if target.proxy_jump else [])
    for endpoint in endpoints:
        name = endpoint.hostname
        if endpoint.port != 22:
            name = f"[{name}]:{endpoint.port}"
        if keys.lookup(name) is None:
            return False
    return True


def open_login(
    cluster: Cluster, host: str, opened: list[paramiko.SSHClient], *, fallback: bool = False
) -> None:
    """Connect to one login host (via its ProxyJump); what was opened goes into `opened`.
    A `fallback` host's key must be known already (AskOrRefuse)."""
    known_hosts = known_hosts_path(cluster)
    target = resolve(host, cluster.user, cluster.port, cluster.key, cluster.proxy_jump)
    sock = None
    if target.proxy_jump:
        jump = jump_endpoint(target.proxy_jump)
        opened.append(connect(jump, known_hosts))
        try:
            sock = (
                opened[-1]
                .get_transport()
                .open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0))
            )
        except (paramiko.SSHException, OSError) as exc:
            where = f"{target.hostname}:{target.port} through {target.proxy_jump}"
            raise Unreachable(f"cannot connect to {where}: {exc}") from None
    opened.append(connect(target, known_hosts, sock=sock, may_ask=not fallback))


@contextmanager
def session(cluster: Cluster) -> Iterator[paramiko.SSHClient]:
    """A connected, verified client for the cluster's login node (via its ProxyJump): its
    `host`, else the first of its `fallback_hosts` that answers. Only a host that does not
    answer is passed over: a wrong host key or a refused login stops here."""
    opened: list[paramiko.SSHClient] = []
    hosts = [cluster.host, *cluster.fallback_hosts]
    try:
        with step("connect"):
            failures: list[str] = []
            for index, host in enumerate(hosts):
                try:
                    open_login(cluster, host, opened, fallback=index > 0)
                    break
                except Unreachable as exc:
                    failures.append(str(exc))
                    for client in reversed(opened):
                        client.close()
                    opened.clear()
            else:
                raise Unreachable("; ".join(failures))
        yield opened[-1]
    finally:
        for client in reversed(opened):
            client.close()


def run(client: paramiko.SSHClient, argv: list[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """Run argv on the cluster; every word is shell-quoted, nothing is concatenated raw."""
    chan_in, chan_out, chan_err = client.exec_command(shlex.join(argv))
    if stdin:
        chan_in.write(stdin)
    chan_in.channel.shutdown_write()
    out = chan_out.read().decode(errors="replace")
    err = chan_err.read().decode(errors="replace")
    return chan_out.channel.recv_exit_status(), out, err
