"""Who may read the per-job series of /metrics (labels `job` and `user`: every job on the
node and whose it is, which Slurm's PrivateData hides from other users): the cluster's
Prometheus, and root on this node. Every other client gets the node's own figures only;
metrics_jobs_public serves the per-job series to everyone (unsafe on a shared cluster).

Prometheus is told by two things at once: the scrapers' token (the agent's
metrics_job_token_file, sent as `Authorization: Bearer <token>`, compared in constant
time) from an allowed address (metrics_job_scrapers). The address alone is not enough: a
user logged in on the monitoring host, or any request forgery there, comes from it too.
The token alone crosses the network in clear text (plain HTTP), so one seen on the wire
is worth nothing from any other host. No token file, or a bad one: root only.

Root on the node is told by the client's end of the connection: a local client's socket
is in this node's /proc/net/tcp (or tcp6, IPv4 addresses there mapped), keyed by its
address and port and the agent's end, with the uid that owns it (what `ss -tpe` shows).
Only a client on the loopback or at the very address it connected to is looked up (a
remote one never is, so no remote client makes the agent read those tables). A socket no
process holds any more (inode 0: an orphan or TIME_WAIT, which the kernel lists as uid 0)
is nobody's.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tacc_agent.procfs import PROC
from tacc_agent.procfs.sockets import Endpoint, IpAddress, endpoint, plain_address, tcp_sockets

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# The scrapers' token: at least this many characters, each visible ASCII (an HTTP header's).
TOKEN_MIN_LENGTH = 32


Resolver = Callable[[str], Iterable[str]]


def addresses_of(name: str) -> list[str]:
    """Every address a host name resolves to; [] when it does not resolve."""
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return [str(info[4][0]) for info in found]


def scraper_networks(
    entries: Iterable[str], resolve: Resolver = addresses_of
) -> tuple[tuple[IpNetwork, ...], list[str]]:
    """The networks (a single address: a /32 or /128) of the allowed scrapers, host names
    resolved now; and the names that did not resolve."""
    networks: list[IpNetwork] = []
    unresolved: list[str] = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        found = [address for text in resolve(entry) if (address := plain_address(text))]
        networks += [ipaddress.ip_network(address) for address in found]
        if not found:
            unresolved.append(entry)
    return tuple(networks), unresolved


def client_uid(proc_root: str, agent_end: Endpoint, client_end: Endpoint) -> int | None:
    """The uid owning the client's end of a connection, when the client is on this node
    (a socket no process holds, TIME_WAIT or an orphan listed as uid 0, is nobody's)."""
    for found in tcp_sockets(proc_root):
        if found.held and found.local == client_end and found.remote == agent_end:
            return found.uid
    return None


class TokenFileError(Exception):
    """The scrapers' token file cannot be used; the message names the file and why."""


def read_token(path: str) -> bytes:
    """The scrapers' token from its file (surrounding whitespace dropped, as Prometheus
    drops it from its credentials_file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # never a link
    except OSError as exc:
        raise TokenFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        text = handle.read(4096).strip()
    if info.st_uid != 0 or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenFileError(
            f"{path}: not root's alone (owner uid {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}): chown root and chmod 0600"
        )
    if len(text) < TOKEN_MIN_LENGTH or not all(0x21 <= byte <= 0x7E for byte in text):
        raise TokenFileError(
            f"{path}: expected one token of at least {TOKEN_MIN_LENGTH} visible ASCII "
            "characters (no spaces)"
        )
    return text


def bearer_token(authorization: str) -> bytes:
    """The token of an `Authorization: Bearer <token>` header value; b"" for any other."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return b""
    try:
        return token.strip().encode("ascii")
    except UnicodeEncodeError:
        return b""


def is_local_peer(agent_end: Endpoint, client_end: Endpoint) -> bool:
    """Whether the client may be on this node: on the loopback, or at the very address it
    connected to (where the kernel puts a local client's end). Only these are looked up
    in the socket tables; root on the node uses either."""
    return client_end[0].is_loopback or client_end[0] == agent_end[0]


@dataclass(frozen=True)
class JobSeriesAccess:
    """Whether a connection's client may read the per-job series."""

    scrapers: tuple[IpNetwork, ...] = ()
    public: bool = False
    proc_root: str = PROC
    # The scrapers' token; b"": none (then only root on the node).
    token: bytes = b""

    def allows(self, agent_address: tuple, client_address: tuple, authorization: str = "") -> bool:
        if self.public:
            return True
        agent_end, client_end = endpoint(agent_address), endpoint(client_address)
        if agent_end is None or client_end is None:
            return False
        if self.is_scraper(client_end[0], authorization):
            return True
        if not is_local_peer(agent_end, client_end):
            return False
        return client_uid(self.proc_root, agent_end, client_end) == 0

    def is_scraper(self, client: IpAddress, authorization: str) -> bool:
        """The scrapers' token, from an allowed address."""
        if not self.token or not hmac.compare_digest(bearer_token(authorization), self.token):
            return False
        return any(client.version == net.version and client in net for net in self.scrapers)
