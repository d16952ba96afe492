"""Who may read the per-job series of /metrics (labels `job` and `user`: every job on the
node and whose it is, which Slurm's PrivateData hides from other users): the scrapers the
tacc_agent role allows (the monitoring hosts, config metrics_job_scrapers) and root on
this node. Every other client gets the node's own figures only; metrics_jobs_public
serves the per-job series to everyone (unsafe on a shared cluster).

Root on the node is told by the client's end of the connection: a local client's socket
is in this node's /proc/net/tcp (or tcp6, IPv4 addresses there mapped), keyed by its
address and port and the agent's end, with the uid that owns it (what `ss -tpe` shows).
A remote client's socket is not there. A socket no process holds any more (inode 0: an
orphan or TIME_WAIT, which the kernel lists as uid 0) is nobody's.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Endpoint = tuple[IpAddress, int]
SOCKET_TABLES = ("net/tcp", "net/tcp6")
# /proc/net/tcp columns (split on whitespace): local address, remote address, uid, inode.
LOCAL, REMOTE, UID, INODE = 1, 2, 7, 9


def plain_address(text: str) -> IpAddress | None:
    """An address, an IPv4-mapped IPv6 one as IPv4 (a dual-stack socket's view); None
    for what is no address."""
    try:
        found = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    mapped = getattr(found, "ipv4_mapped", None)
    return mapped or found


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


def table_address(text: str) -> Endpoint | None:
    """One /proc/net/tcp{,6} address: hex of the address's 32-bit words in host byte
    order, a colon, the port in hex ("0100007F:03D1" is 127.0.0.1:977)."""
    hex_address, _, hex_port = text.partition(":")
    try:
        raw = bytes.fromhex(hex_address)
        port = int(hex_port, 16)
    except ValueError:
        return None
    if len(raw) not in (4, 16):
        return None
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    found = ipaddress.ip_address(raw)
    mapped = getattr(found, "ipv4_mapped", None)
    return (mapped or found, port)


def socket_owners(proc_root: str) -> Iterator[tuple[Endpoint, Endpoint, int]]:
    """(local end, remote end, owner uid) of each TCP socket a process holds on this node."""
    for table in SOCKET_TABLES:
        try:
            with open(Path(proc_root) / table, encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) <= INODE or fields[INODE] == "0":
                        continue  # no process holds it (orphan, TIME_WAIT)
                    local, remote = table_address(fields[LOCAL]), table_address(fields[REMOTE])
                    if local and remote and fields[UID].isdigit():
                        yield local, remote, int(fields[UID])
        except OSError:  # no such table here (no IPv6), or no /proc
            continue


def client_uid(proc_root: str, agent_end: Endpoint, client_end: Endpoint) -> int | None:
    """The uid owning the client's end of a connection, when the client is on this node."""
    for local, remote, uid in socket_owners(proc_root):
        if local == client_end and remote == agent_end:
            return uid
    return None


def endpoint(address: tuple) -> Endpoint | None:
    """A socket module address ((host, port) or (host, port, flow, scope)) as an Endpoint."""
    found = plain_address(str(address[0]))
    return (found, int(address[1])) if found is not None else None


@dataclass(frozen=True)
class JobSeriesAccess:
    """Whether a connection's client may read the per-job series."""

    scrapers: tuple[IpNetwork, ...] = ()
    public: bool = False
    proc_root: str = "/proc"

    def allows(self, agent_address: tuple, client_address: tuple) -> bool:
        if self.public:
            return True
        agent_end, client_end = endpoint(agent_address), endpoint(client_address)
        if agent_end is None or client_end is None:
            return False
        client = client_end[0]
        if any(client.version == net.version and client in net for net in self.scrapers):
            return True
        return client_uid(self.proc_root, agent_end, client_end) == 0
