"""`job connect` on the login node (one `tcloud forward` connection): the agent's
checks (the job is the caller's and running: attach.running_job), then an srun step on
the rank's node running `tacc-agent relay` (tasks.relay), and the bytes between this
process's stdin/stdout (the SSH channel) and that relay.

They go over a connection the relay makes back to this process (tasks.backchannel),
not through srun's stdio (1 KiB messages, about 15 MiB/s); when the relay cannot
connect back it says FALLBACK and they go through srun's stdio. `--check` (is the
target there, is it exposed) needs no bytes: srun replaces this process.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected
from tacc_agent.node_verbs import RELAY
from tacc_agent.tasks.interactive import attach, backchannel, pumps
from tacc_agent.tasks.interactive.pumps import End
from tacc_contract.wire import BadArgument

SRUN_MISSING = "srun not found: is this a Slurm login node?"


@dataclass(frozen=True)
class RelayTarget:
    """What `job connect` reaches on the node: a loopback port or a Unix socket."""

    port: int | None
    socket_path: str | None
    check: bool = False

    def words(self, back: bool = False) -> list[str]:
        """`tacc-agent relay`'s words (exactly one of port and socket_path)."""
        if (self.port is None) == (self.socket_path is None):
            raise Rejected("job connect: expected --port PORT or --socket PATH (one of them)")
        try:
            return RELAY.request(
                port=self.port, socket=self.socket_path, check=self.check, back=back
            )
        except BadArgument as exc:
            raise Rejected(f"job connect: {exc}") from None


def channel_gone(fd: int) -> bool:
    """The SSH channel's stdout pipe has no reader any more (sshd closed the channel),
    as against a caller that only ended its sending side."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def exit_status(code: int) -> int:
    """srun's status as a shell gives it: 128+N for a signal N."""
    return 128 - code if code < 0 else code


def across(caller: End, back: socket.socket) -> None:
    """The caller's bytes and the relay's, over its connection back. The program's end
    (the relay's) ends the connection; the caller's end is passed on, unless the channel
    is gone with it (or broke): then a reset ends the relay's side at once."""

    def caller_done(ended: bool) -> None:
        if not ended or channel_gone(caller.write):
            pumps.reset(back)

    pumps.start(caller, End.of_socket(back), then=caller_done)
    if pumps.one_way(End.of_socket(back), caller):
        pumps.shut(back)  # the program's end: the relay's side ends too
    else:
        pumps.reset(back)  # the channel is gone


def carry(
    step: subprocess.Popen,
    listener: socket.socket,
    step_in: int,
    step_out: int,
    caller: End | None = None,
) -> int:
    """The offer to the relay (on step_in, the step's stdin), then the bytes between
    the caller (stdin and stdout: the SSH channel) and the relay: over its connection
    back, or (FALLBACK on step_out) over the step's stdio; srun's exit status."""
    caller = caller or End.of_pipes(0, 1)
    offer = backchannel.Offer.fresh(listener.getsockname()[1])
    os.write(step_in, offer.line())
    back = backchannel.Gate(listener, offer, step_out).wait()
    if back is not None:
        os.close(step_in)  # the relay reads nothing more there
        across(caller, back)
        return exit_status(step.wait())
    said = pumps.read_exactly(lambda size: os.read(step_out, size), len(backchannel.FALLBACK))
    if said != backchannel.FALLBACK:  # the relay refused (its line is on stderr) or broke
        pumps.copy_all(said, caller)
        os.close(step_in)
        return exit_status(step.wait())
    pumps.start(caller, End.of_pipes(step_out, step_in))
    pumps.one_way(End.of_pipes(step_out, step_in), caller)
    return exit_status(step.wait())


def connect(
    user_dir: Path, job_id: str, config: AgentConfig, rank: int, target: RelayTarget
) -> int:
    """The verb. stdout is the program's bytes only, so a refusal is one line on
    stderr here (the relay's, on the node, come the same way: srun's stderr is ours)."""
    try:
        job = attach.running_job(user_dir, job_id, config)
        argv = attach.step_argv(
            job, rank, target.words(back=not target.check), pty=False, agent_only=True
        )
    except AgentError as exc:
        print(f"tacc-agent: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    sys.stderr.flush()
    try:
        if target.check:
            os.execvp(argv[0], argv)  # noqa: S606 - srun replaces the agent (argv words)
            return 0  # only when exec is replaced (tests)
        listener = backchannel.listen()
        step_in_read, step_in = os.pipe()
        step_out, step_out_write = os.pipe()
        with listener:
            step = subprocess.Popen(argv, stdin=step_in_read, stdout=step_out_write)
            os.close(step_in_read)
            os.close(step_out_write)
            return carry(step, listener, step_in, step_out)
    except FileNotFoundError:
        print(f"tacc-agent: {SRUN_MISSING}", file=sys.stderr, flush=True)
        return AGENT_CLUSTER
    except OSError as exc:  # no port, no process (a login node's limits): stdout stays clean
        print(f"tacc-agent: job connect: {exc}", file=sys.stderr, flush=True)
        return AGENT_CLUSTER
