"""This node's TCP sockets as the kernel lists them in /proc/net/tcp and tcp6 (what
`ss -tane` shows): each socket's two ends, state, owner uid and inode. The one reader of
those tables, for whoever must know whose a socket is (the metrics port's clients, a
forwarded port's listener, an interactive session's connections)."""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.procfs import PROC

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Endpoint = tuple[IpAddress, int]
IPV4_TABLE = "net/tcp"
TABLES = (IPV4_TABLE, "net/tcp6")
# Columns (split on whitespace): local address, remote address, state, uid, inode.
LOCAL, REMOTE, STATE, UID, INODE = 1, 2, 3, 7, 9
ESTABLISHED = "01"  # TCP_ESTABLISHED
LISTEN = "0A"  # TCP_LISTEN


@dataclass(frozen=True)
class TcpSocket:
    local: Endpoint
    remote: Endpoint
    state: str  # the kernel's hex code: LISTEN is "0A"
    uid: int
    inode: int  # 0: no process holds it (an orphan, TIME_WAIT)

    @property
    def held(self) -> bool:
        """A process holds it: not an orphan or TIME_WAIT."""
        return self.inode != 0


def table_address(text: str) -> Endpoint | None:
    """One table address: hex of the address's 32-bit words in host byte order, a
    colon, the port in hex ("0100007F:03D1" is 127.0.0.1:977); an IPv4-mapped IPv6
    address as IPv4 (a dual-stack socket's view)."""
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


def plain_address(text: str) -> IpAddress | None:
    """An address, an IPv4-mapped IPv6 one as IPv4 (a dual-stack socket's view); None
    for what is no address."""
    try:
        found = ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None
    mapped = getattr(found, "ipv4_mapped", None)
    return mapped or found


def endpoint(address: tuple) -> Endpoint | None:
    """A socket module address ((host, port) or (host, port, flow, scope)) as an Endpoint."""
    found = plain_address(str(address[0]))
    return (found, int(address[1])) if found is not None else None


def tcp_sockets(proc_root: str = PROC, strict: bool = False) -> Iterator[TcpSocket]:
    """Every TCP socket of this node. A table this kernel lacks (tcp6 without IPv6) is
    skipped; with `strict`, an unreadable net/tcp, which every kernel has, is an OSError,
    for a caller that must not take "no socket" for "cannot see"."""
    for table in TABLES:
        try:
            with open(Path(proc_root) / table, encoding="ascii", errors="replace") as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) <= UID or not fields[UID].isdigit():
                        continue
                    local, remote = table_address(fields[LOCAL]), table_address(fields[REMOTE])
                    if local and remote:
                        inode = fields[INODE] if len(fields) > INODE else ""
                        number = int(inode) if inode.isdigit() else 0
                        yield TcpSocket(local, remote, fields[STATE], int(fields[UID]), number)
        except OSError:
            if strict and table == IPV4_TABLE:
                raise
            continue
