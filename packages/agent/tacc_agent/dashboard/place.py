"""Where a user's dashboard server lives on the login node, and the one-time codes that
log a browser in to it.

Each user's server listens on a Unix socket in a directory of their own, made 0700 and
checked on every use (a directory, not a link, owned by the user, no access for anyone
else): only that user (and root) can connect, so nothing new listens where another user
could reach it. Which directory:
- `$XDG_RUNTIME_DIR/tacc-dashboard` where the login has one (pam_systemd's /run/user/UID,
  made by root: nobody else can take the name);
- else `<tmp>/tacc-dashboard-<uid>`; and when someone else took that name first (/tmp is
  shared, and its sticky bit keeps the user from removing another's directory), a new
  directory of a random name there, found again through a pointer file in the user's
  own home (~/.cache/tacc-dashboard-<host>), so squatting the name stops nobody.

The server writes a fresh secret there when it starts; `dashboard open`, run by the same
user over SSH, signs a code with it (HMAC-SHA256 of a random nonce and an expiry), and
the server takes each code once, before its expiry. No code, password or port is kept
anywhere else."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
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


RUNTIME_NAME = "tacc-dashboard"
POINTER = ".cache/tacc-dashboard-{host}"  # in the user's home: their directory's path


def directory() -> Path:
    """The caller's directory by its usual name (it may not exist yet)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime.startswith("/") and owned_privately(Path(runtime)):
        return Path(runtime) / RUNTIME_NAME
    return Path(tempfile.gettempdir()) / f"tacc-dashboard-{os.getuid()}"


def owned_privately(path: Path) -> bool:
    """path is a directory (not a link) of the caller's that nobody else may enter."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def checked(path: Path) -> Path:
    """path, made when missing; Rejected when it is anything but a directory of the
    caller's that only they can enter (someone made it first, or a link)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    if not owned_privately(path):
        raise Rejected(
            f"{path}: not a private directory of yours (expected a directory owned by you, "
            f"mode 0700, not a link); remove it, or ask an admin to"
        )
    return path


def private_directory(path: Path | None = None) -> Path:
    """The caller's directory (path, when given: checked only). When its usual name in
    the shared tmp is someone else's, the one the pointer in the caller's home names, or
    a new one of a random name there."""
    if path is not None:
        return checked(path)
    usual = directory()
    try:
        return checked(usual)
    except Rejected:
        if usual.parent != Path(tempfile.gettempdir()):
            raise
        return squatted_elsewhere(usual)


def squatted_elsewhere(usual: Path) -> Path:
    pointer = Path.home() / POINTER.format(host=socket.gethostname())
    try:
        named = Path(pointer.read_text().strip())
    except OSError:
        named = None
    if named is not None and named.parent == usual.parent and owned_privately(named):
        return named
    made = Path(tempfile.mkdtemp(prefix=f"{usual.name}-", dir=usual.parent))  # 0700
    try:
        pointer.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = pointer.with_name(f"{pointer.name}.{os.getpid()}")
        partial.write_text(f"{made}\n")
        os.replace(partial, pointer)
    except OSError as exc:
        raise Rejected(
            f"{usual}: someone else's directory, and {pointer} cannot say where yours is "
            f"instead ({exc.strerror}); ask an admin to remove {usual}"
        ) from None
    return made


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
