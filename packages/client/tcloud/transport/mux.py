"""Connection sharing, the client's side (like OpenSSH's ControlMaster/ControlPersist).

One master process per connection (login host, port, user, key, ProxyJump, known_hosts
file, agent command; tcloud.transport.mux_master) holds a verified SSH connection and listens on
a Unix socket in a private directory. A command asks it for an agent session: the
master hands over a `tacc-agent session` it has already started (its hello read), sends
that hello line, then relays bytes both ways until either side closes. Each command
gets its own agent process; all of them share the master's SSH transport. A command
that streams (`shell`, `exec`, `logs`) asks it for an exec channel too
(tcloud.transport.mux_channel): no SSH handshake of its own either.

Who may use a socket: only its user. The directory is created 0700 and checked on every
use (owned by this uid, mode 0700, not a symlink), as is the socket (owned by this uid);
the master checks each caller's uid and the caller the master's (SO_PEERCRED, on
Linux). Anything else is a clear error, never a silent use. Only a socket nobody listens
on is replaced; a master that answers an error, or not in time, is left alone.

The master is started (detached, its own session, in /, `python -P`, its settings on a
stdin pipe, stdout /dev/null) by the first command that finds none, under a lock next
to the socket, so that 40 commands at once start one. It is only started for a host
whose key is already known: it never prompts; the first command ever connects directly,
at its terminal. It exits after `multiplex_idle` seconds (default 300) with no command
attached; `tcloud disconnect` stops it. TCLOUD_MULTIPLEX=0 (or `multiplex: false` in
the cluster's config) turns sharing off: every command connects directly, as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from tacc_contract import protocol, verbs
from tcloud import timing
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transport import ssh_files
from tcloud.transport.mux_channel import MuxChannel

try:
    import fcntl
except ImportError:  # Windows: no connection sharing, every command connects directly
    fcntl = None

DEFAULT_IDLE = 300
ENV_SWITCH = "TCLOUD_MULTIPLEX"
# How long a starting command waits for the master's socket (its connect has 20 s).
START_WAIT = 30.0
REQUEST_TIMEOUT = 30.0
OK = b'{"ok": true}'


class InsecureDirectory(TcloudError):
    """The socket's directory (or the socket) could be someone else's: refused."""


class MasterUnusable(Exception):
    """A master listens but gave no session (an error line, no answer in time, hung up):
    this command connects directly and leaves the master and its socket alone."""


def supported() -> bool:
    """Unix sockets, file locks and uids: POSIX systems (not Windows)."""
    return fcntl is not None and hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def enabled(settings: Cluster) -> bool:
    """Sharing is on unless TCLOUD_MULTIPLEX=0 or the cluster's `multiplex: false`
    (and where it is supported)."""
    if not supported():
        return False
    switch = os.environ.get(ENV_SWITCH, "").strip().lower()
    if switch in ("0", "false", "no", "off"):
        return False
    return settings.multiplex is not False


def idle_seconds(settings: Cluster) -> int:
    return DEFAULT_IDLE if settings.multiplex_idle is None else settings.multiplex_idle


def base_directory() -> Path:
    """$XDG_RUNTIME_DIR/tcloud when the runtime directory is ours, else
    ~/.cache/tcloud/m: short, so the socket's path stays under sun_path's ~104 bytes.
    POSIX-only (uids), as is everything below that touches the socket."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        with contextlib.suppress(OSError):
            info = os.stat(runtime)
            if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0:
                return Path(runtime) / "tcloud"
    return Path.home() / ".cache" / "tcloud" / "m"


def check_private(path: Path) -> Path:
    """`path` is a directory of this user's, 0700, not a symlink; InsecureDirectory if not.
    POSIX-only (uids)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise InsecureDirectory(f"{path}: cannot check: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise InsecureDirectory(
            f"{path}: not a directory (a symlink?): refusing to share connections "
            f"through it; remove it or set {ENV_SWITCH}=0"
        )
    if info.st_uid != os.getuid():
        raise InsecureDirectory(
            f"{path}: owned by uid {info.st_uid}, not you (uid {os.getuid()}): refusing "
            "to share connections through it"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise InsecureDirectory(
            f"{path}: mode {stat.S_IMODE(info.st_mode):04o}, not 0700: refusing to share "
            f"connections through it (chmod 700 {path}, or set {ENV_SWITCH}=0)"
        )
    return path


def private_directory() -> Path:
    """The socket directory, made 0700 if new, checked on every use."""
    path = base_directory()
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    return check_private(path)


def contents_digest(path: Path) -> str:
    """sha256 of a file's contents; "" when it cannot be read (absent)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def connection_key(settings: Cluster) -> str:
    """16 hex digits naming one connection: what makes two connections different. Also
    what they are resolved with (~/.ssh/config, both known_hosts files: their paths and
    contents) and the protocol: an edit there, or a new tcloud, means a new master for the
    next command (tcloud.transport.ssh reads the same files; no import of it here,
    paramiko waits)."""
    ssh_dir = ssh_files.user_ssh_dir()
    user_known_hosts = ssh_files.user_known_hosts()
    known_hosts = ssh_files.known_hosts_path(settings)
    what = {
        "host": settings.host,
        "port": settings.port,
        "user": settings.user,
        "key": settings.key,
        "proxy_jump": settings.proxy_jump,
        "known_hosts": settings.known_hosts,
        "fallback_hosts": list(settings.fallback_hosts),
        "agent": protocol.command(verbs.SESSION.request()),
        "protocol": protocol.PROTOCOL_VERSION,
        "ssh_config": contents_digest(ssh_dir / "config"),
        "known_hosts_files": {
            str(path): contents_digest(path) for path in (user_known_hosts, known_hosts)
        },
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def sun_path_room() -> int:
    """The most bytes a Unix socket's path may have (sun_path less its NUL): 103 on
    macOS and the BSDs, 107 on Linux."""
    return 107 if sys.platform.startswith("linux") else 103


def temporary_name(path: Path, pid: int) -> Path:
    """Where the master binds before it renames the socket into place
    (tcloud.transport.mux_master)."""
    return path.with_name(f"{path.stem}.{pid}.tmp")


class SocketPathTooLong(OSError):
    """The socket's path does not fit sun_path: no sharing, this command connects directly."""


def socket_path(settings: Cluster) -> Path:
    """This connection's socket; SocketPathTooLong when it (or the master's temporary
    name, the longer) would not fit sun_path (a deep home and no XDG_RUNTIME_DIR)."""
    path = private_directory() / f"{connection_key(settings)}.sock"
    longest = temporary_name(path, 2**31 - 1)
    if len(os.fsencode(longest)) > sun_path_room():
        raise SocketPathTooLong(
            errno.ENAMETOOLONG, f"{longest}: too long for a Unix socket: no connection sharing"
        )
    return path


class SocketPipe:
    """An agent session relayed by the master: the AgentSession's pipe (tcloud.transport.agent)."""

    def __init__(self, sock: socket.socket, first: bytes) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.first: bytes | None = first

    def readline(self) -> bytes:
        if self.first is not None:
            line, self.first = self.first, None
            return line
        return self.reader.readline()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.reader.close()
            self.sock.close()

    def no_hello(self, first: bytes) -> TcloudError:
        self.close()
        return TcloudError(f"the connection master answered {first[:200]!r}, not a hello")

    def exit_detail(self) -> str:
        return " (through the connection master)"


def connect_socket(path: Path) -> socket.socket | None:
    """A connection to the master at `path` (which must be this user's), or None when no
    master listens there (no socket, or connecting is refused: only then may the socket
    be removed and a master started); MasterUnusable for any other failure.
    POSIX-only (uids)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
        raise InsecureDirectory(f"{path}: not a socket of yours: refusing to use it")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REQUEST_TIMEOUT)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise MasterUnusable(f"cannot reach the connection master: {exc}") from None
    uid = peer_uid(sock)
    if uid is not None and uid != os.getuid():  # the path was swapped after the lstat
        sock.close()
        raise InsecureDirectory(
            f"{path}: answered by a process of uid {uid}, not yours: refusing to use it"
        )
    return sock


def peer_uid(conn: socket.socket) -> int | None:
    """The uid of the process at the other end (Linux SO_PEERCRED); None where it cannot
    be told (macOS: there the private directory's checks stand alone)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return struct.unpack("3i", raw)[1]


def read_line(recv: Callable[[int], bytes], limit: int = 1 << 16) -> bytes:
    """One line, byte by byte (what follows it stays unread for the relay), up to `limit`
    bytes; shorter, without its newline, at EOF."""
    line = b""
    while not line.endswith(b"\n") and len(line) < limit:
        chunk = recv(1)
        if not chunk:
            break
        line += chunk
    return line


def ask(path: Path, request: dict) -> tuple[socket.socket, bytes] | None:
    """Send one request line; the socket and the master's first answer line. None: no
    master listens; MasterUnusable: one listens but hung up or did not answer in time."""
    sock = connect_socket(path)
    if sock is None:
        return None
    return sock, first_answer(sock, request)


def first_answer(sock: socket.socket, request: dict) -> bytes:
    """Send one request line on a connected socket; the master's first answer line.
    MasterUnusable (the socket closed) when it hung up or did not answer in time."""
    try:
        sock.sendall(json.dumps(request, ensure_ascii=False).encode() + b"\n")
        first = read_line(sock.recv)
    except OSError as exc:
        sock.close()
        raise MasterUnusable(f"the connection master did not answer: {exc}") from None
    if not first:
        sock.close()
        raise MasterUnusable("the connection master hung up before it answered")
    sock.settimeout(None)
    return first


def is_hello(line: bytes) -> bool:
    try:
        protocol.Hello.parse(json.loads(line))
    except (ValueError, protocol.ProtocolError):
        return False
    return True


def session_pipe(path: Path) -> SocketPipe | None:
    """An agent session from the master at `path`; None when no master listens there;
    MasterUnusable when it has no session to give (the caller connects directly)."""
    answer = ask(path, {"op": "session"})
    if answer is None:
        return None
    sock, first = answer
    if not is_hello(first):
        sock.close()
        raise MasterUnusable(f"the connection master answered {first[:200]!r}")
    return SocketPipe(sock, first)


def remove_stale(path: Path) -> None:
    """A socket nobody listens on (its master died): removed, so a new one can bind."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def master_command() -> list[str]:
    """`python -P -m tcloud.transport.mux_master`: -P keeps the starting command's directory off
    sys.path (a json.py there is never imported by the master). Its settings come on
    stdin, never in argv (which `ps` shows every local user)."""
    return [sys.executable, "-P", "-m", "tcloud.transport.mux_master"]


def master_environment() -> dict[str, str]:
    """The master's environment: this command's, less what belongs to this command only
    (TCLOUD_TIMING: the master's later steps are no part of this command's timing)."""
    return {name: value for name, value in os.environ.items() if name != timing.ENVIRONMENT}


def start_master(settings: Cluster, path: Path) -> None:
    """Start the master for `settings`, detached; return once its socket answers, or
    once it gave up (its log, next to the socket, says why)."""
    spec = {"settings": asdict(settings), "socket": str(path), "idle": idle_seconds(settings)}
    log = path.with_suffix(".log")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        process = subprocess.Popen(
            master_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
            cwd="/",
            env=master_environment(),
        )
    finally:
        os.close(fd)
    with contextlib.suppress(BrokenPipeError), process.stdin:  # died at once: see its log
        process.stdin.write(json.dumps(spec).encode() + b"\n")
    deadline = time.monotonic() + START_WAIT
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(path):
            return
        time.sleep(0.01)


def open_session(settings: Cluster, may_start: Callable[[], bool]) -> SocketPipe | None:
    """An agent session through this connection's master, starting the master when none
    runs and may_start() (the host's key is known); None: connect directly (also when
    this machine cannot hold a master: a read-only home, no room for a process). A
    socket or directory that is not safely this user's is an error (InsecureDirectory).
    Only a socket nobody listens on is removed: a master that answered an error, or not
    in time, keeps its socket and the sessions it carries."""
    try:
        path = socket_path(settings)
        pipe = session_pipe(path)
        if pipe is not None or not may_start():
            return pipe
        with open(path.with_suffix(".lock"), "a") as lock:
            os.fchmod(lock.fileno(), 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
            pipe = session_pipe(path)  # another command started it while this one waited
            if pipe is None:
                remove_stale(path)
                start_master(settings, path)
                pipe = session_pipe(path)
    except (OSError, MasterUnusable):
        return None
    return pipe


def open_channel(
    settings: Cluster, command: str, terminal: tuple[str, int, int] | None = None
) -> MuxChannel | None:
    """An exec channel running `command` (on a PTY: (term, columns, rows)) on the
    connection of this connection's master, which must run already (an agent session
    started it). None: no master, or it said it opened none (`mux_error`): connect
    directly. Once asked, a master that does not answer is an error, not a direct try:
    it may have run the command (it never does after mux_master.EXEC_DEADLINE)."""
    try:
        sock = connect_socket(socket_path(settings))
    except (OSError, MasterUnusable):
        return None
    if sock is None:
        return None
    request = {"op": "exec", "command": command, "pty": list(terminal) if terminal else None}
    try:
        first = first_answer(sock, request)
    except MasterUnusable as exc:
        raise TcloudError(str(exc)) from None
    if first.strip() == OK:
        return MuxChannel(sock)
    sock.close()
    return None  # its mux_error: nothing was run


def stop(settings: Cluster) -> bool:
    """Stop this connection's master (`tcloud disconnect`); False when none ran."""
    if not supported():
        return False
    try:
        path = socket_path(settings)
        answer = ask(path, {"op": "exit"})
    except (OSError, MasterUnusable):
        return False
    if answer is None:
        remove_stale(path)
        return False
    answer[0].close()
    return True
