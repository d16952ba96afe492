"""This node's TCP sockets from /proc/net/tcp{,6} (tacc_agent/procfs/sockets.py): table
addresses in host byte order, IPv4-mapped ones as IPv4, each socket's owner and inode,
and a strict reader that will not take an unreadable table for an empty one."""

from __future__ import annotations

import ipaddress
import os
import socket

import pytest

from tacc_agent.procfs.sockets import ESTABLISHED, table_address, tcp_sockets
from tests.unit.proc_fakes import hex_endpoint, mapped_endpoint, socket_table


def address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_socket_table_addresses_are_read_in_host_byte_order():
    assert table_address(hex_endpoint("10.77.6.11", 977)) == (address("10.77.6.11"), 977)
    # ::ffff:127.0.0.1, a dual-stack socket's end: as IPv4
    assert table_address(mapped_endpoint("127.0.0.1", 80)) == (address("127.0.0.1"), 80)
    assert table_address("zz:1") is None


def test_each_socket_has_its_ends_state_owner_and_inode(tmp_path):
    session = mapped_endpoint("127.0.0.1", 8888)
    client = mapped_endpoint("127.0.0.1", 51336)
    socket_table(
        tmp_path, [(hex_endpoint("127.0.0.1", 51336), hex_endpoint("127.0.0.1", 8888), 2001, 7)]
    )
    socket_table(tmp_path, [(session, client, 2002, 0)], table="net/tcp6")
    found = list(tcp_sockets(str(tmp_path)))
    loopback = address("127.0.0.1")
    assert [(s.local, s.remote, s.state, s.uid, s.inode, s.held) for s in found] == [
        ((loopback, 51336), (loopback, 8888), ESTABLISHED, 2001, 7, True),
        ((loopback, 8888), (loopback, 51336), ESTABLISHED, 2002, 0, False),
    ]


@pytest.mark.fault
def test_a_missing_table_is_skipped_unless_the_reader_is_strict(tmp_path):
    """Without IPv6 there is no tcp6: skipped. net/tcp unreadable: none found, or, for a
    caller that must not mistake it for no socket, an OSError."""
    socket_table(tmp_path, [(hex_endpoint("127.0.0.1", 1), hex_endpoint("127.0.0.1", 2), 0, 1)])
    assert len(list(tcp_sockets(str(tmp_path), strict=True))) == 1
    assert list(tcp_sockets(str(tmp_path / "none"))) == []
    with pytest.raises(OSError):
        list(tcp_sockets(str(tmp_path / "none"), strict=True))


def test_the_real_tables_hold_this_process_connection_with_its_owner():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with client, accepted:
            ends = (client.getsockname()[1], listener.getsockname()[1])
            found = [
                s
                for s in tcp_sockets(strict=True)
                if (s.local[1], s.remote[1]) == ends and s.state == ESTABLISHED
            ]
    assert len(found) == 1 and found[0].uid == os.geteuid() and found[0].held
