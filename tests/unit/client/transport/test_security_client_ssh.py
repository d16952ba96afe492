"""Security, issue [10] point 6: known_hosts as ssh(1) reads it. A real SSH handshake
against a local paramiko server: a file with `@cert-authority` and `@revoked` lines, a
comment and a garbage line still loads; a revoked key is refused; accepting a new host
appends exactly one line and keeps every other byte. Each test fails on the old code
(paramiko's reader raised InvalidHostKey on such a file; its writer rewrote it)."""

from __future__ import annotations

import builtins
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tcloud.errors import TcloudError
from tcloud.transport import ssh

pytestmark = pytest.mark.security


def ed25519_line() -> str:
    """'ssh-ed25519 AAAA...' of a fresh key (paramiko cannot generate Ed25519 keys)."""
    public = Ed25519PrivateKey.generate().public_key()
    encoding, public_format = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    return public.public_bytes(encoding, public_format).decode()


def public_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


@contextmanager
def ssh_server(host_key: paramiko.PKey) -> Iterator[int]:
    """A local SSH server offering `host_key` (and no way to log in); yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transports.append(transport)
            try:
                transport.start_server(server=paramiko.ServerInterface())
            except (paramiko.SSHException, EOFError, OSError):
                continue

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for transport in transports:
            transport.close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """No keys, no agent, ~/.ssh/known_hosts of this test only."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setattr(ssh, "USER_KNOWN_HOSTS", home / ".ssh" / "known_hosts")
    return home


def hostile_known_hosts(path: Path, port: int, known: paramiko.PKey, revoked: paramiko.PKey):
    """A known_hosts file as real ones look: every line paramiko could not read before."""
    text = (
        "# written by hand; keep this comment\n"
        f"@cert-authority *.example.org {ed25519_line()} ca@example\n"
        f"@revoked * {public_line(revoked)}\n"
        "this line is garbage !!! not base64\n"
        f"[127.0.0.1]:{port} ssh-ed25519 AAAA%%%broken\n"
        f"[127.0.0.1]:{port} {public_line(revoked)}\n"  # listed, but revoked above
        f"known.example.org {ed25519_line()}\n"
        f"[127.0.0.1]:{port + 1},other {public_line(known)}\n"
    )
    path.write_text(text)
    return text


def connect(port: int, known_hosts: Path) -> None:
    """tcloud's connection; the server lets no one in, so a host key that is accepted
    ends in "authentication failed"."""
    identity = known_hosts.parent / "id_test"
    if not identity.exists():
        identity.write_bytes(
            Ed25519PrivateKey.generate().private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption(),
            )
        )
    endpoint = ssh.Endpoint("127.0.0.1", port, "nobody", [str(identity)], None)
    ssh.connect(endpoint, known_hosts).close()


def test_p6_known_hosts_with_markers_and_garbage_loads(home):
    known_hosts = home / ".ssh" / "known_hosts"
    key = paramiko.ECDSAKey.generate()
    with ssh_server(key) as port:
        hostile_known_hosts(known_hosts, port, revoked=paramiko.ECDSAKey.generate(), known=key)
        with known_hosts.open("a") as handle:
            handle.write(f"[127.0.0.1]:{port} {public_line(key)}\n")
        # The host key is found and accepted: what fails next is the login (no keys).
        with pytest.raises(TcloudError, match=r"nobody@127\.0\.0\.1: authentication failed"):
            connect(port, known_hosts)


def test_p6_a_revoked_host_key_is_refused_even_when_listed(home, monkeypatch):
    known_hosts = home / ".ssh" / "known_hosts"
    revoked = paramiko.ECDSAKey.generate()
    with ssh_server(revoked) as port:
        before = hostile_known_hosts(known_hosts, port, paramiko.ECDSAKey.generate(), revoked)
        # Even at a terminal, with the user ready to say yes: never asked.
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        monkeypatch.setattr(builtins, "input", lambda prompt="": "yes")
        with pytest.raises(TcloudError, match=r"REVOKED HOST KEY: \[127.0.0.1\]:\d+ offers"):
            connect(port, known_hosts)
    assert known_hosts.read_text() == before


def test_p6_accepting_a_new_host_appends_one_line_and_keeps_the_rest(home, monkeypatch):
    known_hosts = home / ".ssh" / "known_hosts"
    key = paramiko.ECDSAKey.generate()
    with ssh_server(key) as port:
        before = hostile_known_hosts(
            known_hosts, port, paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
        )
        asked = []
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "yes")
        with pytest.raises(TcloudError, match="authentication failed"):
            connect(port, known_hosts)
        assert len(asked) == 1
        after = known_hosts.read_bytes()
        assert after == before.encode() + f"[127.0.0.1]:{port} {public_line(key)}\n".encode()
        # Remembered: the next connection is not asked again.
        with pytest.raises(TcloudError, match="authentication failed"):
            connect(port, known_hosts)
        assert len(asked) == 1


def test_p6_a_last_line_without_newline_keeps_its_bytes(home, monkeypatch, tmp_path):
    known_hosts = tmp_path / "cluster_known_hosts"  # the cluster's own file (tcloud config)
    known_hosts.write_bytes(b"# only a comment, no newline")
    key = paramiko.ECDSAKey.generate()
    with ssh_server(key) as port:
        monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
        monkeypatch.setattr(builtins, "input", lambda prompt="": "yes")
        with pytest.raises(TcloudError, match="authentication failed"):
            connect(port, known_hosts)
    line = f"[127.0.0.1]:{port} {public_line(key)}\n".encode()
    assert known_hosts.read_bytes() == b"# only a comment, no newline\n" + line
