"""tcloud's one way into the cluster side: `tacc-agent <verb>` on the login node, run
over the verified SSH connection (every word quoted), JSON in and JSON out. The verbs
and the shapes of their answers are the contract's (tacc_contract.protocol); the first
call of each SSH session asks the agent which protocol it speaks (`handshake`)."""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable, Iterator, Sequence
from weakref import WeakKeyDictionary

import paramiko

from tacc_contract import protocol
from tacc_contract.errors import AGENT_REJECTED, ERROR_KEY
from tacc_contract.protocol import AGENT, PROTOCOL_VERSION, Hello, ProtocolError
from tcloud.errors import EXIT_CLUSTER, EXIT_INVALID_TASK, TcloudError
from tcloud.ssh import run

NOT_FOUND = 127
# How the agent's one error line starts (tacc_contract.errors.error_line).
ERROR_LINE = f'{{"{ERROR_KEY}": '.encode()
UPGRADE_ROLE = "re-run the tacc_agent role"


class Rejected(TcloudError):
    """The cluster refused a task it can never run (the reason names the field)."""

    exit_code = EXIT_INVALID_TASK


class AgentMismatch(TcloudError):
    """The cluster's agent speaks another protocol than this tcloud (exit 4)."""

    exit_code = EXIT_CLUSTER


def argv_for(verb: list[str], userdir: str | None) -> list[str]:
    return protocol.command(verb, userdir)


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


def ask_hello(client: paramiko.SSHClient) -> Hello:
    """The agent's protocol, or AgentMismatch for an agent that cannot say (older than
    `hello`: argparse refuses the verb, or answers no JSON)."""
    rc, out, err = run(client, protocol.command(protocol.hello()))
    if rc == NOT_FOUND:
        raise not_installed()
    if rc == AGENT_REJECTED and "invalid choice" in err:
        raise older_agent("it does not know the verb `hello`")
    try:
        answer = json.loads(out)
    except ValueError:
        answer = None
    message = protocol.error_message(answer)
    if rc != 0 and message is not None:  # an agent that knows `hello` but failed
        raise failure(message, rc, TcloudError)
    try:
        return Hello.parse(answer)
    except ProtocolError:
        said = (out.strip() or err.strip())[:200]
        raise older_agent(f"its `hello` answered {said!r} (exit {rc})") from None


def check_hello(hello: Hello) -> Hello:
    if hello.protocol < PROTOCOL_VERSION:
        raise older_agent(f"it is {hello.agent_version}, speaking protocol {hello.protocol}")
    if hello.protocol > PROTOCOL_VERSION:
        raise newer_agent(hello)
    return hello


_spoken: WeakKeyDictionary[paramiko.SSHClient, Hello] = WeakKeyDictionary()
_spoken_lock = threading.Lock()


def handshake(client: paramiko.SSHClient) -> Hello:
    """Once per SSH client: the agent's `hello`, checked against this tcloud's protocol
    (AgentMismatch, exit 4, when they differ; asked again on the next call then)."""
    with _spoken_lock:
        known = _spoken.get(client)
    if known is not None:
        return known
    hello = check_hello(ask_hello(client))
    with _spoken_lock:
        _spoken[client] = hello
    return hello


def failure(message: str, rc: int, rejected: type[TcloudError]) -> TcloudError:
    error = rejected(message) if rc == AGENT_REJECTED else TcloudError(message)
    error.exit_code = rejected.exit_code if rc == AGENT_REJECTED else EXIT_CLUSTER
    return error


def call(
    client: paramiko.SSHClient,
    verb: Sequence[str],
    userdir: str | None = None,
    stdin: bytes = b"",
    rejected: type[TcloudError] = TcloudError,
):
    """The agent's JSON answer, checked against the verb's shape (ProtocolError when it
    does not fit); its error message as a TcloudError when it says no."""
    verb = list(verb)
    handshake(client)
    rc, out, err = run(client, argv_for(verb, userdir), stdin)
    if rc == NOT_FOUND:
        raise not_installed()
    try:
        answer = json.loads(out)
    except ValueError:
        detail = (err.strip() or out.strip())[-800:]
        raise TcloudError(f"{AGENT} {' '.join(verb)} failed (exit {rc}): {detail}") from None
    if rc != 0:
        message = protocol.error_message(answer)
        if message is None:
            message = "unknown error" if isinstance(answer, dict) else out.strip()
        raise failure(message, rc, rejected)
    return protocol.parse_answer(verb, answer)


def lines(client: paramiko.SSHClient, verb: Sequence[str], userdir: str | None) -> Iterator[str]:
    """A text verb's lines as they arrive (`tacc-agent job logs`); its error as a
    TcloudError once it ends. Leaving the loop early closes the channel."""
    handshake(client)
    channel = client.get_transport().open_session()
    try:
        channel.exec_command(shlex.join(argv_for(list(verb), userdir)))
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
    error = failure(message, rc, Rejected)
    error.exit_code = EXIT_CLUSTER
    return error


def stream(
    client: paramiko.SSHClient, verb: Sequence[str], userdir: str | None, write: Callable
) -> int:
    """Run a verb whose output is text (logs): pass each line on as it arrives."""
    for line in lines(client, verb, userdir):
        write(line)
    return 0
