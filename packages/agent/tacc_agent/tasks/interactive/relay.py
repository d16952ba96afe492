"""`tacc-agent relay`, on a job's node inside its allocation (srun runs it for `job
connect`, the step of one `tcloud forward` connection): one connection to the job's
program, made here by the caller's own process, to 127.0.0.1:PORT ([::1]:PORT when
nothing listens on IPv4) or to a Unix socket, and bytes relayed between it and
stdin/stdout (as `ssh -W` does), each side's end passed on.

The program therefore need not listen on any address other nodes reach: loopback (which
users with a job on the same node still reach: a listener there that is not the caller's
is refused, never relayed to), or a socket in a private (0700) directory (no one else).
When its port does listen on every address (0.0.0.0, ::), one line on stderr says so,
before any byte is relayed (tcloud prints it once); stdout carries nothing but the program's bytes.
An error (nothing listens, no socket there) is one line on stderr, the agent's rejected
status (tcloud exits 4).
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

from tacc_agent.errors import AGENT_CLUSTER, AGENT_REJECTED, Rejected
from tacc_agent.procfs import PROC
from tacc_agent.procfs.sockets import LISTEN, endpoint, tcp_sockets
from tacc_agent.tasks.interactive import backchannel, pumps
from tacc_agent.tasks.interactive.pumps import End

LOOPBACKS = (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6))


def listening_everywhere(port: int, proc_root: str = PROC) -> str | None:
    """ "0.0.0.0" or "::" when a socket listens on `port` on every address of this node;
    None otherwise."""
    for found in tcp_sockets(proc_root):
        if found.state == LISTEN and found.local[1] == port and found.local[0].is_unspecified:
            return str(found.local[0])
    return None


def peer_owner(sock: socket.socket, proc_root: str = PROC) -> int | None:
    """The uid owning the other end of a connection made here: the listener's owner
    (the kernel gives an accepted socket its listener's uid, accepted yet or not)."""
    mine, theirs = endpoint(sock.getsockname()), endpoint(sock.getpeername())
    for found in tcp_sockets(proc_root):
        if found.local == theirs and found.remote == mine:
            return found.uid
    return None


def exposure_warning(port: int, host: str, proc_root: str = PROC) -> str | None:
    """The one line said when the job's port listens on every address of the node."""
    anywhere = listening_everywhere(port, proc_root)
    if anywhere is None:
        return None
    return (
        f"warning: port {port} listens on every address of {host} ({anywhere}): other users "
        f"on the cluster can connect to it; have the program listen on 127.0.0.1 (jupyter "
        f"lab --ip=127.0.0.1) or on a Unix socket in a private directory (jupyter lab "
        f"--sock PATH, then tcloud forward JOB PATH)"
    )


def checked_socket_path(text: str) -> Path:
    """An absolute path to a Unix socket here, or Rejected naming it."""
    path = Path(text)
    if not path.is_absolute():
        raise Rejected(f"socket {text!r}: expected an absolute path on the node")
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        where = f"{text} on {socket.gethostname()}"
        raise Rejected(f"no Unix socket at {where}: {exc.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise Rejected(f"{text} on {socket.gethostname()} is not a Unix socket")
    return path


def open_port(port: int, proc_root: str = PROC) -> socket.socket:
    """A connection to 127.0.0.1:port, else [::1]:port, to a program of the caller's own;
    Rejected when neither answers, or when the one that answers is another user's (any
    user on a node can listen on a loopback port: the first one that answers decides,
    there is no trying the other)."""
    for address, family in LOOPBACKS:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect((address, port))
        except OSError:
            sock.close()
            continue
        owner = peer_owner(sock, proc_root)
        if owner != os.getuid():
            sock.close()
            whose = f"uid {owner}'s" if owner is not None else "a program whose owner is unknown"
            raise Rejected(
                f"{address} port {port} on {socket.gethostname()} is {whose}, not yours: "
                "nothing relayed (another user listens there first); have your program "
                "listen on a Unix socket in a private directory and forward that"
            )
        return sock
    raise Rejected(
        f"nothing listens on 127.0.0.1:{port} or [::1]:{port} on {socket.gethostname()} "
        "(the program has not started yet, or listens on another address)"
    )


def open_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError as exc:
        sock.close()
        where = f"{path} on {socket.gethostname()}"
        raise Rejected(f"cannot connect to {where}: {exc.strerror}") from None
    return sock


def pipe(sock: socket.socket, stdin_fd: int = 0, stdout_fd: int = 1) -> None:
    """Bytes both ways over srun's stdio; the caller's end (stdin's) passed on to the
    program, and the program's end ends the relay: srun passes no end of a task's stdout
    on until the task exits, so waiting for stdin too would leave the forwarded
    connection open for ever (a program that half-closes and still reads gets no more
    input: a known limit of this path, not of the connection back)."""
    program, caller = End.of_socket(sock), End.of_pipes(stdin_fd, stdout_fd)
    pumps.start(caller, program)
    pumps.one_way(program, caller)
    sock.close()


def across(sock: socket.socket, back: socket.socket) -> None:
    """Bytes both ways between the program and the connection back. The program's end
    is passed on, and `job connect` then closes the connection (sshd passes the end of
    the channel's stdout on only when its stderr, srun's, closes too: when the step
    ends), which ends the caller's direction here. `job connect` gone (it resets the
    connection) ends both: the program's side is shut too, even while it is silent."""
    program, caller = End.of_socket(sock), End.of_socket(back)

    def caller_done(ended: bool) -> None:
        if not ended:
            pumps.shut(sock)  # a reset, not an end: nothing more either way

    upstream = pumps.start(caller, program, then=caller_done)
    if not pumps.one_way(program, caller):
        pumps.shut(back)  # `job connect` is gone: nothing more to carry either way
    upstream.join()
    back.close()
    sock.close()


def fall_back(sock: socket.socket, why: str) -> None:
    """No connection back: one line on stderr, FALLBACK on stdout, srun's stdio."""
    print(
        f"tacc-agent: {why}: relaying through srun's stdio, about 15 MiB/s",
        file=sys.stderr,
        flush=True,
    )
    os.write(1, backchannel.FALLBACK)
    pipe(sock)


def relay_back(sock: socket.socket, offer: backchannel.Offer) -> int:
    """Over the connection back to `job connect`. Only when none can be made (no IP
    address for srun's host, the connection refused or timed out) over srun's stdio
    (fall_back); an end that takes the connection and fails its proof is an error, not
    a fallback (`job connect` may have answered meanwhile, and only one way is read)."""
    host = os.environ.get(backchannel.SRUN_HOST, "")
    try:
        address = backchannel.address_of(host)
        back = backchannel.connection_to(address, offer.port)
    except (backchannel.Unreachable, OSError) as exc:
        fall_back(
            sock, f"no connection back to {host or 'the login node'} port {offer.port} ({exc})"
        )
        return 0
    try:
        backchannel.prove(back, offer)
    except OSError as exc:
        back.close()
        sock.close()
        print(
            f"tacc-agent: the connection back to {address} port {offer.port} failed: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return AGENT_CLUSTER
    across(sock, back)
    return 0


def relay(port: int | None, socket_path: str | None, check: bool, back: bool = False) -> int:
    """The verb: the warning (a port), then the connection relayed (with back: over a
    connection back to `job connect`, its offer read from stdin first); with check only
    the warning (a port) or the socket's presence. Errors: one line on stderr, rejected
    (stdout is the program's bytes only)."""
    try:
        offer = backchannel.read_offer() if back and not check else None
        if port is not None:
            warning = exposure_warning(port, socket.gethostname())
            if warning:
                print(warning, file=sys.stderr, flush=True)
            sock = None if check else open_port(port)
        else:
            path = checked_socket_path(socket_path or "")
            sock = None if check else open_socket(path)
    except (Rejected, backchannel.OfferError) as exc:
        print(f"tacc-agent: {exc}", file=sys.stderr, flush=True)
        return AGENT_REJECTED
    if sock is not None and offer is not None:
        return relay_back(sock, offer)
    elif sock is not None:
        pipe(sock)
    return 0
