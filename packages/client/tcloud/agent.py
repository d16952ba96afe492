"""tcloud's one way into the cluster side: `tacc-agent <verb>` on the login node, run
over the verified SSH connection (every word quoted), JSON in and JSON out."""

from __future__ import annotations

import json
import shlex

import paramiko

from tcloud.errors import EXIT_CLUSTER, EXIT_INVALID_TASK, TcloudError
from tcloud.ssh import run

AGENT = "tacc-agent"
AGENT_REJECTED = 2  # tacc_agent.errors.EXIT_REJECTED
NOT_FOUND = 127
ERROR_LINE = b'{"error": '  # how the agent reports a failure (one line)


class Rejected(TcloudError):
    """The cluster refused a task it can never run (the reason names the field)."""

    exit_code = EXIT_INVALID_TASK


def argv_for(verb: list[str], userdir: str | None) -> list[str]:
    return [AGENT, *(["--userdir", userdir] if userdir else []), *verb]


def call(
    client: paramiko.SSHClient,
    verb: list[str],
    userdir: str | None = None,
    stdin: bytes = b"",
    rejected: type[TcloudError] = TcloudError,
):
    """The agent's JSON answer; its error message as a TcloudError when it says no."""
    rc, out, err = run(client, argv_for(verb, userdir), stdin)
    if rc == NOT_FOUND:
        raise TcloudError(
            f"{AGENT} is not installed on the login node (the tacc_agent role installs it)"
        )
    try:
        answer = json.loads(out)
    except ValueError:
        detail = (err.strip() or out.strip())[-800:]
        raise TcloudError(f"{AGENT} {' '.join(verb)} failed (exit {rc}): {detail}") from None
    if rc != 0:
        message = answer.get("error", "unknown error") if isinstance(answer, dict) else out
        error = rejected(message) if rc == AGENT_REJECTED else TcloudError(message)
        error.exit_code = rejected.exit_code if rc == AGENT_REJECTED else EXIT_CLUSTER
        raise error
    return answer


def stream(client: paramiko.SSHClient, verb: list[str], userdir: str | None, write) -> int:
    """Run a verb whose output is text (logs): pass it on as it arrives."""
    channel = client.get_transport().open_session()
    channel.exec_command(shlex.join(argv_for(verb, userdir)))
    pending = b""
    for chunk in iter(lambda: channel.recv(65536), b""):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.startswith(ERROR_LINE):
                pending = line + b"\n" + pending
                break
            write(line.decode(errors="replace"))
    rc = channel.recv_exit_status()
    if rc != 0:
        raw = pending.decode(errors="replace").strip()
        try:
            message = json.loads(raw.splitlines()[0])["error"]
        except (ValueError, KeyError, IndexError):
            message = channel.recv_stderr(65536).decode(errors="replace").strip() or raw
        error = Rejected(message) if rc == AGENT_REJECTED else TcloudError(message)
        error.exit_code = EXIT_CLUSTER
        raise error
    if pending:
        write(pending.decode(errors="replace"))
    return rc
