"""known_hosts files read as OpenSSH reads them, for paramiko.

paramiko's own reader stops at the first line it cannot parse (a `@cert-authority` or
`@revoked` line, a damaged key), and its writer rewrites the whole file. Here:

- a line that cannot be read (an unknown key type, a damaged key, a marker other than
  the two below) is skipped, as ssh(1) skips it;
- `@revoked` keys are refused for every host, even where another line lists them;
- `@cert-authority` lines are skipped: paramiko cannot check a host certificate's
  signature, principals or validity, so certificates vouch for nothing here (the host's
  plain key must be in known_hosts, or accepted at the prompt);
- accepting a new host key appends one line, as ssh(1) does; every other byte of the
  file stays as it was.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"


@dataclass(frozen=True)
class Line:
    """One usable known_hosts line: its marker ("" for a plain key), host patterns, key."""

    marker: str
    hostnames: list[str]
    key: paramiko.PKey


@dataclass
class KnownHosts:
    keys: paramiko.HostKeys = field(default_factory=paramiko.HostKeys)
    revoked: set[bytes] = field(default_factory=set)  # key blobs

    def is_revoked(self, key: paramiko.PKey) -> bool:
        return key.asbytes() in self.revoked


def parse_line(text: str) -> Line | None:
    """A known_hosts line, or None for a comment, a blank line or one that cannot be read."""
    words = text.split()
    if not words or words[0].startswith("#"):
        return None
    marker = words.pop(0) if words[0].startswith("@") else ""
    if marker not in ("", REVOKED, CERT_AUTHORITY) or len(words) < 3:
        return None
    hostnames, key_type, data = words[:3]
    try:
        blob = base64.b64decode(data, validate=True)
        key = paramiko.PKey.from_type_string(key_type, blob)
    except Exception:  # paramiko raises many kinds for a damaged or unknown key: skip it
        return None
    return Line(marker, hostnames.split(","), key)


def read_lines(path: Path) -> list[Line]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for raw in text.splitlines() if (line := parse_line(raw)) is not None]


def load(paths: Iterable[Path], keys: paramiko.HostKeys | None = None) -> KnownHosts:
    """The keys of every file (that exists) in `paths`, less the revoked ones, added to
    `keys` (a client's host keys) when given."""
    lines = [line for path in paths for line in read_lines(path)]
    revoked = {line.key.asbytes() for line in lines if line.marker == REVOKED}
    known = KnownHosts(paramiko.HostKeys() if keys is None else keys, revoked)
    seen: set[tuple[str, str]] = set()
    for line in lines:
        if line.marker or known.is_revoked(line.key):
            continue
        for hostname in line.hostnames:
            # The first line of a host and key type wins, as paramiko's own reader has it
            # (HostKeys.add would let a later line replace it).
            if (hostname, line.key.get_name()) not in seen:
                seen.add((hostname, line.key.get_name()))
                known.keys.add(hostname, line.key.get_name(), line.key)
    return known


def entry(hostname: str, key: paramiko.PKey) -> str:
    return f"{hostname} {key.get_name()} {key.get_base64()}\n"


def append(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Add one line for `hostname` at the end of `path` (made 0600 if new)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "ab") as handle:
        # A last line without its newline keeps its bytes and gets the newline ssh adds.
        ends_in_newline = os.fstat(fd).st_size == 0 or last_byte(path) == b"\n"
        handle.write((b"" if ends_in_newline else b"\n") + entry(hostname, key).encode())


def last_byte(path: Path) -> bytes:
    with path.open("rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)
