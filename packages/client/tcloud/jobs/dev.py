"""`tcloud dev`: an interactive session from the command line (docs/interactive.md).
Submitted (Cluster.dev), waited for until it runs (each state change said), then how
to reach it is printed; with stop_on_disconnect a held exec channel runs `tacc-agent job
stop-on-disconnect` (the cluster cancels the session when that channel closes: Ctrl-C,
a closed laptop, a dropped connection); then its ports are forwarded until Ctrl-C, or
without ports a shell opens. Ctrl-C while it is still queued cancels it (never used)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from tacc_contract import protocol, verbs
from tacc_contract.jobs import FINAL_STATES
from tcloud.errors import TcloudError
from tcloud.jobs.portforward import PortPair
from tcloud.transport import agent

POLL_SECONDS = 2.0
# The held channel's heartbeat: a newline written this often while it is open. The agent
# cancels the session after 30 s without a byte (a dropped connection that TCP has not
# noticed yet), so the heartbeat keeps a live one from looking dead.
HEARTBEAT_SECONDS = 10.0
RUNNING = "RUNNING"

Say = Callable[[str], None]


def wait_running(job, say: Say, poll: float = POLL_SECONDS) -> dict:
    """The session's status once RUNNING, each state change said; TcloudError if it
    ended first. Ctrl-C while it waits cancels it (it never ran) and goes on."""
    last = None
    try:
        while True:
            info = job.status()
            if info["state"] != last:
                last = info["state"]
                reason = f" ({info['reason']})" if info.get("reason") else ""
                say(f"session {job.id}: {last}{reason}")
            if last == RUNNING:
                return info
            if last in FINAL_STATES:
                raise TcloudError(
                    f"session {job.id} ended before it ran ({last}); `tcloud status {job.id}`"
                )
            time.sleep(poll)
    except KeyboardInterrupt:
        with contextlib.suppress(TcloudError):
            job.cancel()
        say(f"session {job.id}: cancelled (it never ran)")
        raise


def connect_text(job_id: str, pairs: Sequence[PortPair], idle_timeout: str | None) -> list[str]:
    """How to reach a running session."""
    lines = [f"session {job_id} is running"]
    for pair in pairs:
        if pair.local:
            lines.append(f"  port {pair.remote}: http://127.0.0.1:{pair.local}/")
        else:  # any free local port: known once forwarded
            lines.append(f"  port {pair.remote}: a free local port, once forwarded")
    lines.append(f"  a shell:      tcloud shell {job_id}")
    if pairs:
        forwards = " ".join(
            str(p.remote) if p.remote == p.local else f"{p.remote}:{p.local}" for p in pairs
        )
        lines.append(f"  forward:      tcloud forward {job_id} {forwards}")
    if idle_timeout is not None:
        idle = "never" if idle_timeout.strip() == "0" else idle_timeout
        lines.append(f"  idle timeout: {idle} (cancelled once nothing has used it that long)")
    lines.append(f"  stop it:      tcloud cancel {job_id}")
    return lines


def session_pairs(submitted_ports: Sequence[int], asked: Sequence[PortPair]) -> list[PortPair]:
    """The session's ports with the local ports asked for (default: the same number)."""
    local = {pair.remote: pair.local for pair in asked}
    return [PortPair(port, local.get(port, port)) for port in submitted_ports]


def heartbeat(channel, stop: threading.Event, every: float) -> None:
    """A newline to the channel every `every` s until `stop` is set or it cannot be sent."""
    while not stop.wait(every):
        try:
            channel.sendall(b"\n")
        except Exception:  # the channel closed or the connection dropped: nothing to keep
            return


@contextlib.contextmanager
def stop_on_disconnect(
    client, userdir: str | None, job_id: str, every: float = HEARTBEAT_SECONDS
) -> Iterator[dict]:
    """The held channel: while it is open the cluster watches it (a heartbeat newline
    every `every` s says it is alive); closing it (here, or the connection dropping)
    cancels the session. Yields the agent's first line."""
    # The direct connection: its closing (this process ending) is what stops the session,
    # whatever a connection master does (`tcloud disconnect` ends what it carries).
    channel = agent.open_exec(
        client, verbs.JOB_STOP_ON_DISCONNECT, userdir, shared=False, job=job_id
    )
    try:
        first = b""
        while not first.endswith(b"\n"):
            data = channel.recv(4096)
            if not data:
                break
            first += data
        try:
            said = json.loads(first)
        except ValueError:
            said = None
        if not isinstance(said, dict) or protocol.error_message(said) is not None:
            rc = channel.recv_exit_status()
            raise agent.stream_failure(channel, first, rc or 4)
        stop = threading.Event()
        beats = threading.Thread(target=heartbeat, args=(channel, stop, every), daemon=True)
        beats.start()
        try:
            yield said
        finally:
            stop.set()
            beats.join()
    finally:
        channel.close()
