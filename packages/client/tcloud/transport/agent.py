"""tcloud's one way into the cluster side: `tacc-agent` on the login node, run over the
verified SSH connection (every word quoted), JSON in and JSON out. The verbs and the
shapes of their answers are the contract's (tacc_contract.protocol).

Each SSH connection runs one `tacc-agent session` (opened on its first call): its first
line is the agent's hello, checked against this tcloud's protocol (`handshake`), then
every verb is one request line and one answer line on that same process, so a command
costs one agent start however many verbs it asks. `job logs` streams text and keeps its
own exec (`lines`)."""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable
from weakref import WeakKeyDictionary

from tacc_contract import protocol, verbs
from tacc_contract.errors import AGENT_REJECTED, ERROR_KEY, kind_of
from tacc_contract.protocol import AGENT, PROTOCOL_VERSION, Hello, ProtocolError
from tacc_contract.verbs import Verb
from tcloud import timing
from tcloud.errors import EXIT_CLUSTER, TcloudError, agent_failure
from tcloud.transport.transport_errors import transport_errors

if TYPE_CHECKING:
    import paramiko

NOT_FOUND = 127
# How the agent's one error line starts (tacc_contract.errors.error_line).
ERROR_LINE = f'{{"{ERROR_KEY}": '.encode()
UPGRADE_ROLE = "re-run the tacc_agent role"


T = TypeVar("T")


class SessionLost(TcloudError):
    """The agent's session process or the SSH connection went away mid-call (exit 4)."""

    exit_code = EXIT_CLUSTER


class AgentMismatch(TcloudError):
    """The cluster's agent speaks another protocol than this tcloud (exit 4)."""

    exit_code = EXIT_CLUSTER


def argv_for(words: list[str], userdir: str | None) -> list[str]:
    return protocol.command(words, userdir)


def not_installed() -> TcloudError:
    return TcloudError(
        f"{AGENT} is not installed on the login node (the tacc_agent role installs it)"
    )


def older_agent(detail: str) -> AgentMismatch:
    return AgentMismatch(
        f"the cluster's {AGENT} is older than this tcloud (protocol {PROTOCOL_VERSION}): "
        f"upgrade the agent ({UPGRADE_ROLE}); {detail}"
    )


def newer_agent(hello: Hello) -> AgentMismatch:
    return AgentMismatch(
        f"the cluster's {AGENT} {hello.agent_version} speaks protocol {hello.protocol}, newer "
        f"than this tcloud's (protocol {PROTOCOL_VERSION}): upgrade tcloud "
        "(pip install --upgrade ./packages/contract ./packages/plugins ./packages/client "
        "from a checkout of the cluster's release)"
    )


def session_answered(out: str, rc: int, err: str) -> TcloudError:
    """Why a `tacc-agent session` ended before saying hello: an agent older than the
    verb (argparse refuses it), one that failed, or one that answered no hello."""
    if rc == NOT_FOUND:
        return not_installed()
    if rc == AGENT_REJECTED and "invalid choice" in err:
        return older_agent(f"it does not know the verb `{verbs.SESSION.name}`")
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    message = protocol.error_message(answer)
    if rc != 0 and message is not None:  # an agent that knows `session` but failed
        return agent_failure(message, kind_of(rc, answer))
    said = (out.strip() or err.strip())[:200]
    return older_agent(f"its `session` answered {said!r} (exit {rc})")


def check_hello(hello: Hello) -> Hello:
    if hello.protocol < PROTOCOL_VERSION:
        raise older_agent(f"it is {hello.agent_version}, speaking protocol {hello.protocol}")
    if hello.protocol > PROTOCOL_VERSION:
        raise newer_agent(hello)
    return hello


def as_bytes(data: bytes | str) -> bytes:
    """paramiko's stdout file reads lines as text, a fake's as bytes: the same here."""
    return data.encode() if isinstance(data, str) else data


def first_hello(line: bytes) -> Hello | None:
    try:
        return Hello.parse(json.loads(line))
    except (ValueError, ProtocolError):
        return None


class StreamRefused(Exception):
    """The agent stopped reading a stream (it refused it): its answer line says why."""


class ChannelPipe:
    """`tacc-agent session` on its own exec channel of a paramiko connection: the byte
    stream an AgentSession talks over (tcloud.transport.mux.SocketPipe is the other kind)."""

    def __init__(self, client: paramiko.SSHClient) -> None:
        try:
            argv = protocol.command(verbs.SESSION.request())
            self.stdin, self.stdout, self.stderr = client.exec_command(shlex.join(argv))
        except transport_errors() as exc:
            raise TcloudError(f"cannot start {AGENT} on the login node: {exc}") from None

    def readline(self) -> bytes:
        try:
            return as_bytes(self.stdout.readline())
        except transport_errors()[2:] as exc:
            raise OSError(str(exc)) from None

    def send(self, data: bytes) -> None:
        try:
            self.stdin.channel.sendall(data)
        except transport_errors()[2:] as exc:
            raise OSError(str(exc)) from None

    def close(self) -> None:
        with contextlib.suppress(*transport_errors()):
            self.stdin.channel.close()

    def no_hello(self, first: bytes) -> TcloudError:
        """Why the process said something else than hello, once it has ended."""
        self.stdin.channel.shutdown_write()  # a session that is one ends at EOF
        out = first + as_bytes(self.stdout.read())
        rc = self.stdout.channel.recv_exit_status()
        err = as_bytes(self.stderr.read()).decode(errors="replace")
        return session_answered(out.decode(errors="replace"), rc, err)

    def exit_detail(self) -> str:
        """Its exit status and the end of its stderr, when it has exited."""
        with contextlib.suppress(*transport_errors()):
            if self.stderr.channel.exit_status_ready():
                rc = self.stderr.channel.recv_exit_status()
                said = as_bytes(self.stderr.read()).decode(errors="replace").strip()
                return f"; it exited {rc}" + (f": {said[-400:]}" if said else "")
        return ""


class Pipe(Protocol):
    """A byte stream to one `tacc-agent session` process."""

    def readline(self) -> bytes: ...
    def send(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def no_hello(self, first: bytes) -> TcloudError: ...
    def exit_detail(self) -> str: ...


class AgentSession:
    """One `tacc-agent session` process, over a pipe (its own exec channel, or a socket
    to the connection master, tcloud.transport.mux): a request line out, an answer line back, one
    request at a time (a lock: SDK users may share a Cluster between threads). Dead once
    its pipe fails; the next call opens another."""

    def __init__(self, pipe: Pipe) -> None:
        self.lock = threading.Lock()
        self.dead = False
        self.pipe = pipe
        with timing.step("session"):
            try:
                first = pipe.readline()
            except (OSError, EOFError) as exc:
                raise TcloudError(f"cannot start {AGENT} on the login node: {exc}") from None
            hello = first_hello(first)
            if hello is None:
                raise pipe.no_hello(first)
            try:
                self.hello = check_hello(hello)
            except AgentMismatch:
                self.close()
                raise

    @property
    def stdout(self):
        """The exec channel's stdout file (a ChannelPipe's), as tests reach it."""
        return self.pipe.stdout

    def close(self) -> None:
        self.dead = True
        self.pipe.close()

    def ended(self, detail: str) -> SessionLost:
        """The session's process or connection is gone: say what is known of why."""
        self.close()
        detail += self.pipe.exit_detail()
        return SessionLost(f"the connection to the cluster's {AGENT} session was lost ({detail})")

    def send(self, data: bytes) -> None:
        self.pipe.send(data)

    def request(
        self,
        verb: list[str],
        userdir: str | None,
        stdin: bytes = b"",
        produce: Callable[[Callable[[bytes], None]], None] | None = None,
    ) -> tuple[int, object]:
        """(rc, answer) of one verb; with produce, the verb's stream is written between
        the request line and the answer (`store receive`)."""
        line = json.dumps(protocol.session_request(verb, userdir, stdin)).encode() + b"\n"
        with self.lock:
            if self.dead:
                raise TcloudError(f"the cluster's {AGENT} session has ended")
            try:
                self.send(line)
            except transport_errors() as exc:
                raise self.ended(f"sending the request: {exc}") from None
            if produce is not None:
                self.produce(produce)  # its own failure ends the session and goes on
            try:
                reply = self.pipe.readline()
            except transport_errors() as exc:
                raise self.ended(f"reading the answer: {exc}") from None
            except BaseException:
                # Ctrl-C or any error once the request is out: its answer would be read
                # as the next request's, so this session is out of step and ends.
                self.close()
                raise
            if not reply:
                raise self.ended(f"no answer to `{' '.join(verb)}`")
        try:
            checked = protocol.SESSION_ANSWER.check(json.loads(reply))
        except ValueError:
            self.close()
            raise TcloudError(
                f"{AGENT} session answered `{' '.join(verb)}` with no JSON: "
                f"{reply[:200].decode(errors='replace')!r}"
            ) from None
        return checked["rc"], checked["answer"]

    def produce(self, produce: Callable[[Callable[[bytes], None]], None]) -> None:
        """The caller writes its stream; when the agent stopped reading it (it refused
        the stream), its answer, read next, says why. Any other failure leaves half a
        stream on the channel: the session is closed and the error goes on."""

        def send(data: bytes) -> None:
            try:
                self.send(data)
            except transport_errors():
                raise StreamRefused from None  # the agent stopped reading

        try:
            produce(send)
        except StreamRefused:
            pass  # the answer line, or its absence, tells
        except BaseException:  # a local read error, Ctrl-C: half a stream is out
            self.close()
            raise


_sessions: WeakKeyDictionary[paramiko.SSHClient, AgentSession] = WeakKeyDictionary()
_opening: WeakKeyDictionary[paramiko.SSHClient, threading.Lock] = WeakKeyDictionary()
_sessions_lock = threading.Lock()


@runtime_checkable
class SessionSource(Protocol):
    """What hands out agent sessions itself (tcloud.transport.link.Link: through the connection
    master when it can); a plain paramiko client gets one exec channel per session."""

    def agent_session(self) -> AgentSession: ...


@runtime_checkable
class ChannelSource(Protocol):
    """What may carry an exec channel on a shared connection (tcloud.transport.link.Link:
    the connection master's); None from it means: open one on the direct connection."""

    def shared_channel(self, command: str, terminal: tuple[str, int, int] | None): ...


def session(client: paramiko.SSHClient | SessionSource) -> AgentSession:
    """This connection's agent session, opened on first use (or again after it ended);
    AgentMismatch (exit 4) when the agent speaks another protocol (asked again on the
    next call then)."""
    if isinstance(client, SessionSource):
        return client.agent_session()
    with _sessions_lock:
        known = _sessions.get(client)
        if known is not None and not known.dead:
            return known
        opening = _opening.setdefault(client, threading.Lock())
    with opening:  # one opening per connection; other connections do not wait
        with _sessions_lock:
            known = _sessions.get(client)
        if known is not None and not known.dead:
            return known
        opened = AgentSession(ChannelPipe(client))
        with _sessions_lock:
            _sessions[client] = opened
        return opened


def handshake(client: paramiko.SSHClient) -> Hello:
    """The agent's hello on this connection (its session's first line), checked against
    this tcloud's protocol: AgentMismatch, exit 4, when they differ."""
    return session(client).hello


def answered(verb: Verb[T], rc: int, answer: object) -> T:
    """A verb's answer checked against its type; its error as a TcloudError whose exit
    code is its kind's (tcloud.errors.EXIT_OF_KIND)."""
    if rc == 0:
        return verb.check_answer(answer)
    message = protocol.error_message(answer)
    if message is None:
        message = "unknown error" if isinstance(answer, dict) else json.dumps(answer)
    raise agent_failure(message, kind_of(rc, answer), verb.task)


def call(
    client: paramiko.SSHClient,
    verb: Verb[T],
    userdir: str | None = None,
    stdin: bytes = b"",
    **fields: object,
) -> T:
    """The agent's JSON answer to the verb asked with these fields, checked against the
    verb's answer type (ProtocolError when it does not fit); its error message as a
    TcloudError when it says no. BadArgument (exit 2) for a field that cannot go."""
    words = verb.request(**fields)
    agent = session(client)
    with timing.step(" ".join(words)):
        rc, answer = agent.request(words, userdir, stdin)
    return answered(verb, rc, answer)


def call_streaming(
    client: paramiko.SSHClient,
    verb: Verb[T],
    userdir: str | None,
    produce: Callable[[Callable[[bytes], None]], None],
) -> T:
    """A verb that reads a binary stream after its request (`store receive`): produce
    is called with a write function and writes the whole stream through it; then the
    agent's answer. When the agent refuses, its session ends (the rest of the stream
    could not be told from a request): the next call opens another."""
    words = verb.request()
    agent = session(client)
    with timing.step(" ".join(words)):
        rc, answer = agent.request(words, userdir, produce=produce)
    if rc != 0:
        agent.close()
    return answered(verb, rc, answer)


def exec_command(
    client: paramiko.SSHClient, verb: Verb, userdir: str | None, **fields: object
) -> str:
    """The command line that runs a streaming verb, every word quoted, once the agent's
    protocol is checked (handshake): what an exec channel, tcloud's or OpenSSH's, runs."""
    words = verb.request(**fields)
    handshake(client)
    return shlex.join(argv_for(words, userdir))


def open_exec(
    client: paramiko.SSHClient,
    verb: Verb,
    userdir: str | None,
    open_session: Callable[[], paramiko.Channel] | None = None,
    terminal: tuple[str, int, int] | None = None,
    shared: bool = True,
    **fields: object,
) -> paramiko.Channel:
    """A streaming verb on its own exec channel (`job logs`, `attach`, `connect`,
    `stop-on-disconnect`): the agent's protocol checked first (handshake), the channel
    opened (on the connection master's connection when the client has one and `shared`,
    else open_session: the caller's way, e.g. through its gate), a PTY asked for
    (terminal: (term, columns, rows)), every word quoted. The channel is closed on
    failure."""
    command = exec_command(client, verb, userdir, **fields)
    return open_command(client, command, open_session, terminal, shared)


def open_command(
    client: paramiko.SSHClient,
    command: str,
    open_session: Callable[[], paramiko.Channel] | None = None,
    terminal: tuple[str, int, int] | None = None,
    shared: bool = True,
) -> paramiko.Channel:
    """One exec channel running `command` (a line whose every word the caller quoted),
    opened as open_exec opens a verb's."""
    if shared and isinstance(client, ChannelSource):
        carried = client.shared_channel(command, terminal)
        if carried is not None:
            return carried
    channel = open_session() if open_session else client.get_transport().open_session()
    try:
        if terminal is not None:
            term, columns, rows = terminal
            channel.get_pty(term=term, width=columns, height=rows)
        channel.exec_command(command)
    except BaseException:
        channel.close()
        raise
    return channel


def lines(
    client: paramiko.SSHClient, verb: Verb, userdir: str | None, **fields: object
) -> Iterator[str]:
    """A text verb's lines as they arrive (`tacc-agent job logs`); its error as a
    TcloudError once it ends. Leaving the loop early closes the channel."""
    channel = open_exec(client, verb, userdir, **fields)
    try:
        pending = b""
        for chunk in iter(lambda: channel.recv(65536), b""):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for index, line in enumerate(complete):
                if line.startswith(ERROR_LINE):  # the agent's one error line: kept
                    pending = b"\n".join([*complete[index:], pending])
                    break
                yield line.decode(errors="replace")
        rc = channel.recv_exit_status()
        if rc != 0:
            raise stream_failure(channel, pending, rc)
        if pending:
            yield pending.decode(errors="replace")
    finally:
        channel.close()


def stream_failure(channel: paramiko.Channel, pending: bytes, rc: int) -> TcloudError:
    raw = pending.decode(errors="replace").strip()
    try:
        message = protocol.error_message(json.loads(raw.splitlines()[0]))
    except (ValueError, IndexError):
        message = None
    if message is None:
        message = channel.recv_stderr(65536).decode(errors="replace").strip() or raw
    error = agent_failure(message, kind_of(rc))
    error.exit_code = EXIT_CLUSTER
    return error


def stream(
    client: paramiko.SSHClient, verb: Verb, userdir: str | None, write: Callable, **fields: object
) -> int:
    """Run a verb whose output is text (logs): pass each line on as it arrives."""
    for line in lines(client, verb, userdir, **fields):
        write(line)
    return 0
