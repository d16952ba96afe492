"""Where a user's dashboard server lives on the login node, and the one-time codes that
log a browser in to it.

Each user's server listens on a Unix socket in a directory of their own,
`<tmp>/tacc-dashboard-<uid>`, made 0700 and checked on every use (a directory, not a
link, owned by the user, no access for anyone else): only that user (and root) can
connect, so nothing new listens where another user could reach it. The server writes a
fresh secret there when it starts; `dashboard open`, run by the same user over SSH,
signs a code with it (HMAC-SHA256 of a random nonce and an expiry), and the server
takes each code once, before its expiry. No code, password or port is kept anywhere
else."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
import time
from pathlib import Path

from tacc_agent.errors import Rejected

SOCKET = "server.sock"
SECRET = "secret"  # noqa: S105  (the file's name, not a secret)
LOG = "server.log"
START_LOCK = "start.lock"
CODE_SECONDS = 120  # a code not used by then is refused (the browser opens in seconds)
SECRET_BYTES = 32


def directory(uid: int | None = None) -> Path:
    uid = os.getuid() if uid is None else uid
    return Path(tempfile.gettempdir()) / f"tacc-dashboard-{uid}"


def private_directory(path: Path | None = None) -> Path:
    """The user's directory, made when missing; Rejected when it is anything but a
    directory of theirs that only they can enter (someone made it first, or a link)."""
    path = path or directory()
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Rejected(
            f"{path}: not a private directory of yours (expected a directory owned by you, "
            f"mode 0700, not a link); remove it, or ask an admin to"
        )
    return path


def write_secret(where: Path) -> bytes:
    """A new secret, written 0600 and moved into place whole."""
    secret = secrets.token_bytes(SECRET_BYTES)
    partial = where / f"{SECRET}.{os.getpid()}"
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secret)
    os.replace(partial, where / SECRET)
    return secret


def read_secret(where: Path) -> bytes:
    try:
        secret = (where / SECRET).read_bytes()
    except FileNotFoundError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise Rejected(f"{where / SECRET}: the dashboard server has no secret yet")
    return secret


def signature(secret: bytes, nonce: str, expires: int) -> str:
    return hmac.new(secret, f"{nonce}.{expires}".encode(), hashlib.sha256).hexdigest()


def mint(secret: bytes, now: float | None = None) -> tuple[str, int]:
    """(a one-time code, its expiry as a Unix time)."""
    expires = int((time.time() if now is None else now) + CODE_SECONDS)
    nonce = secrets.token_urlsafe(18)
    return f"{nonce}.{expires}.{signature(secret, nonce, expires)}", expires


class Codes:
    """The server's side: a code is good when signed with its secret, not expired and not
    used before (each nonce is kept until its expiry)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.used: dict[str, int] = {}

    def take(self, code: str, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        self.used = {nonce: expires for nonce, expires in self.used.items() if expires >= now}
        parts = code.split(".") if isinstance(code, str) else []
        if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit():
            return False
        nonce, expires_text, mac = parts
        expires = int(expires_text)
        expected = signature(self.secret, nonce, expires)
        if not hmac.compare_digest(expected, mac) or expires < now or nonce in self.used:
            return False
        if expires > now + CODE_SECONDS + 5:  # signed, yet longer-lived than any we mint
            return False
        self.used[nonce] = expires
        return True
