"""Into a running job (docs/interactive.md): where it runs (`job target`), a command or
a shell on one of its nodes inside its allocation (`job attach`, which execs srun on the
login node; `enter`, which srun runs on the node), the step that reaches its program
there for `job connect` (tasks.connect, tasks.relay), and `job stop-on-disconnect`.

Two walls keep users apart: the agent's own checks (the job is in the caller's
workspace and Slurm's record of its id is this job of the caller's: jobs.checked_info),
and Slurm itself, which refuses a step in another user's allocation ("Unable to confirm
allocation for job N: Access/permission denied").

The step (verified on Slurm 22.05.8, CR_Core_Memory, proctrack/linuxproc): `--overlap`
lets it start at once in an allocation whose CPUs and memory other steps hold (without
it srun waits for them to end); it needs no --mem (with --overlap it shares the job's
memory too) and no --gres (a step gets the GRES the job asked for by default, and
--overlap shares them). srun's exit status is the command's (128+N for a signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected
from tacc_agent.node_verbs import ENTER
from tacc_agent.tasks.execute import containers, envcache, job_vars
from tacc_agent.tasks.execute import launch as execute
from tacc_agent.tasks.interactive import quick_enter
from tacc_agent.tasks.interactive.quick_enter import command_status, on_terminal, shell_argv
from tacc_agent.tasks.jobs import records, sweeps
from tacc_agent.tasks.jobs import verbs as jobs
from tacc_agent.tasks.schedule.instruction import load
from tacc_contract.instruction import FILE

POLL_SECONDS = 3.0  # stop-on-disconnect: how often it asks whether the job ended alone
# The client writes a byte on stdin every 10 s; this long without one is a disconnect.
HEARTBEAT_TIMEOUT_SECONDS = 30.0
# The disconnect's cancel, again after each of these while Slurm does not answer (~3 min).
CANCEL_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 64.0)
DISCONNECT_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE)
STATE_HINTS = {
    "QUEUED": "it runs on no node yet (tcloud status {job})",
    "PROVISIONING": "its nodes are being prepared; try again in a moment (tcloud status {job})",
    "HALTED": "it runs on no node while halted (tcloud resume {job})",
}
ENDED_HINT = "it runs on no node any more (tcloud logs {job})"
STEP_OPTIONS = ("--overlap", "--quiet")
# The steps that run only the agent's own code (relay for `tcloud forward`, node-usage
# for `tcloud top`) are no MPI job: no PMIx server for them (MpiDefault=pmix sets one
# up per step: 61 ms of each `srun true` on the bench lab, 36 ms with this). Not `enter`:
# what runs there is the user's, and Debian 12's Open MPI 4.1 aborts in MPI_Init in a
# step without PMI (docs/provisioning.md), where with pmix it runs as one rank.
AGENT_CODE_ONLY = ("--mpi=none",)


@dataclass(frozen=True)
class RunningJob:
    """A running job of the caller's: its directory and Slurm's facts about it."""

    job_id: str
    job_dir: Path
    slurm_job_id: str
    hosts: list[str]  # Slurm's order: rank 0 first, where the batch step runs
    session: dict | None

    def host(self, rank: int) -> str:
        if not 0 <= rank < len(self.hosts):
            count = len(self.hosts)
            nodes = f"{count} node{'s' if count != 1 else ''}"
            raise Rejected(
                f"job {self.job_id} runs on {nodes}: --rank is 0 to {count - 1}, got {rank}"
            )
        return self.hosts[rank]


def not_a_whole_sweep(job_dir: Path, job_id: str) -> None:
    if sweeps.is_whole_sweep(job_id, job_dir):
        raise Rejected(f"job {job_id} is a sweep: name one of its trials, e.g. {job_id}_0")


def owned_job(user_dir: Path, job_id: str, config: AgentConfig) -> tuple[Path, dict | None, str]:
    """(job dir, Slurm's record, state) of a job of the caller's: in their workspace
    (find_job: "no job 42 of yours"), and Slurm's id still names this job of theirs
    (checked_info refuses an id that names another user's job)."""
    job_dir = jobs.find_job(user_dir, job_id, config)
    not_a_whole_sweep(job_dir, job_id)
    info = jobs.checked_info(job_id, job_dir, config)
    state, _ = jobs.reconcile(job_dir, info, config.slurm_timeout_seconds)
    return job_dir, info, state


def running_job(user_dir: Path, job_id: str, config: AgentConfig) -> RunningJob:
    """The caller's job, refused (Rejected) unless it is theirs and RUNNING."""
    job_dir, info, state = owned_job(user_dir, job_id, config)
    if state != "RUNNING" or info is None:
        hint = STATE_HINTS.get(state, ENDED_HINT).format(job=job_id)
        raise Rejected(f"job {job_id} is {state}: {hint}")
    nodelist = info.get("NodeList", "")
    hosts = (
        []
        if nodelist in ("", "(null)")
        else execute.step_hostnames(nodelist, config.slurm_timeout_seconds)
    )
    if not hosts:
        raise AgentError(
            f"job {job_id}: Slurm names no nodes for it (NodeList={nodelist})", AGENT_CLUSTER
        )
    session = getattr(load(job_dir), "session", None)
    return RunningJob(job_id, job_dir, info.get("JobId") or job_id, hosts, session)


def address_of(host: str) -> str:
    """The IP the login node resolves for a node (where a tunnel goes)."""
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        message = f"cannot resolve node {host}'s address here: {exc}"
        raise AgentError(message, AGENT_CLUSTER) from None


def target(user_dir: Path, job_id: str, config: AgentConfig, rank: int | None = None) -> dict:
    """JOB_TARGET: the caller's running job's nodes by rank (host, rank, address)."""
    job = running_job(user_dir, job_id, config)
    ranks = range(len(job.hosts)) if rank is None else [rank]
    nodes = [
        {
            "host": job.host(r),
            "rank": r,
            "address": address_of(job.host(r)),
            "step": srun_argv(job, r, (), pty=False),
        }
        for r in ranks
    ]
    answer = {
        "job_id": job_id,
        "slurm_job_id": job.slurm_job_id,
        "state": "RUNNING",
        "nodes": nodes,
    }
    if job.session is not None:
        answer["session"] = job.session
    return answer


def step_argv(
    job: RunningJob, rank: int, agent_words: Sequence[str], pty: bool, agent_only: bool = False
) -> list[str]:
    """A step of one task on the rank's node, beside the job's own steps (--overlap),
    that runs `tacc-agent AGENT_WORDS` there (agent_only: and nothing of the user's, so
    no MPI set-up); every word an argv word, never a shell line."""
    return [
        "srun",
        *(["--pty"] if pty else []),  # right after "srun", where tcloud puts it (target)
        f"--jobid={job.slurm_job_id}",
        *STEP_OPTIONS,
        *(AGENT_CODE_ONLY if agent_only else ()),
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={job.host(rank)}",
        f"--chdir={job.job_dir}",
        *execute.AGENT,
        *agent_words,
    ]


def srun_argv(job: RunningJob, rank: int, command: Sequence[str], pty: bool) -> list[str]:
    """The step that runs `tacc-agent enter` (the command in the job's environment)."""
    enter_words = ENTER.request(jobdir=str(job.job_dir), rank=rank, command=list(command))
    return step_argv(job, rank, enter_words, pty)


def attach(
    user_dir: Path, job_id: str, config: AgentConfig, rank: int, command: list[str], pty: bool
) -> int:
    """Checks, then execs `srun --jobid --overlap ... tacc-agent enter JOBDIR` (no return:
    stdin, stdout, stderr, signals and the exit status are srun's, the command's)."""
    job = running_job(user_dir, job_id, config)
    argv = srun_argv(job, rank, command, pty)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)  # noqa: S606 - srun replaces the agent (argv words)
    except FileNotFoundError:
        raise AgentError("srun not found: is this a Slurm login node?", AGENT_CLUSTER) from None
    return 0  # only when exec is replaced (tests)


# ---------------------------------------------------------------- on the node
def caller_job_dir(job_dir: Path) -> Path:
    """job_dir resolved, when it is a job directory (its instruction) of the caller's."""
    resolved = job_dir.resolve()
    try:
        owner = resolved.stat().st_uid
    except OSError:
        raise Rejected(f"not a job directory: {job_dir} (it does not exist here)") from None
    if owner != os.getuid():
        raise Rejected(f"{job_dir} is not a job directory of yours")
    if not (resolved / FILE).is_file():
        raise Rejected(f"not a job directory: {job_dir} (it has no {FILE})")
    return resolved


def job_env(job_dir: Path, task, rank: int) -> dict[str, str]:
    """What the job's program sees: the agent's job variables, the task's own, the
    node's rank and the job's venv (the one its batch step recorded)."""
    environment = envcache.job_environment(job_dir) or {}
    legacy = job_vars.legacy_workdir(task.runtime)
    return job_vars.entered_env(
        job_dir, legacy, task.environment["env"], rank, environment.get("path")
    )


def enter_argv(
    task, job_dir: Path, env: dict[str, str], command: Sequence[str], config: AgentConfig
) -> tuple[list[str], int]:
    """(the argv to exec: the command, or a shell, inside the job's container if it has
    one; 0, or the shell's status when the command cannot be run there)."""
    container: containers.Container | None = execute.job_container(task, job_dir, config)
    host_path = env.get("PATH", os.defpath)
    if container is None:
        argv = list(command) or shell_argv(host_path, interactive=on_terminal())
        return argv, command_status(argv[0], host_path)
    execute.runtime_user(env)
    image_path = container.env.get("PATH", os.defpath)
    inner = list(command) or shell_argv(image_path, container.rootfs, on_terminal())
    argv = container.wrap(inner)
    if command_status(argv[0], host_path):
        raise AgentError(
            f"the container runtime {argv[0]} is not on this node's PATH", AGENT_CLUSTER
        )
    binds = [(bind.source, bind.target) for bind in container.binds]
    return argv, command_status(inner[0], image_path, container.rootfs, binds)


def enter(job_dir: Path, rank: int, command: list[str], config: AgentConfig) -> int:
    """On the node, inside the step: exec the command in the job's environment."""
    job_dir = caller_job_dir(job_dir)
    task = load(job_dir)
    env = job_env(job_dir, task, rank)
    argv, code = enter_argv(task, job_dir, env, command, config)
    return quick_enter.run(argv, code, command, env, job_dir)


# ---------------------------------------------------------------- stop on disconnect
def print_line(data: dict) -> None:
    """One JSON line; the client may be gone already (a closed pipe is no error here)."""
    with contextlib.suppress(OSError, ValueError):
        print(json.dumps(data, sort_keys=True), flush=True)


class Heartbeat:
    """When the client last wrote to stdin (any bytes: it sends one every 10 s), and
    whether stdin ended. sshd here does not probe clients (ClientAliveInterval 0), so a
    vanished laptop shows only as silence: HEARTBEAT_TIMEOUT_SECONDS without a byte is a
    disconnect, as the end of stdin is."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last = clock()
        self.ended = threading.Event()

    def beat(self) -> None:
        self.last = self.clock()

    def silent_for(self) -> float:
        return self.clock() - self.last


def watch_stdin(stdin: BinaryIO, heartbeat: Heartbeat) -> None:
    """Each chunk read is a heartbeat; the end of stdin (or a break) ends the watch."""
    read = stdin.read1 if hasattr(stdin, "read1") else stdin.read
    with contextlib.suppress(OSError, ValueError):
        while read(65536):
            heartbeat.beat()
    heartbeat.ended.set()


def slurm_still_has(job_id: str, job_dir: Path, config: AgentConfig) -> bool:
    """Slurm still runs or queues this job of the caller's (own_info: None when it forgot
    it or the id names another job)."""
    info = jobs.own_info(job_id, job_dir, config)
    return info is not None and info.get("JobState", "") not in (
        "CANCELLED",
        "COMPLETED",
        *jobs.SLURM_FAILED,
    )


def cancel_once(user_dir: Path, job_id: str, job_dir: Path, config: AgentConfig) -> list[dict]:
    """One try: `tcloud cancel`'s path (records CANCELLED, then scancel). When an
    earlier try recorded the cancel but its scancel failed, the record says the job
    ended: scancel it directly while Slurm still has it (this job of the caller's)."""
    if records.last_state(job_dir) not in records.TERMINAL:
        return jobs.cancel(user_dir, [job_id], config)
    state = records.last_state(job_dir)
    if state == "CANCELLED" and slurm_still_has(job_id, job_dir, config):
        slurm.run.output(["scancel", job_id], config.slurm_timeout_seconds)
        return [{"job_id": job_id, "state": "CANCELLED", "cancelled": True}]
    return [{"job_id": job_id, "state": state, "cancelled": False}]


def cancel_with_retries(
    user_dir: Path,
    job_id: str,
    job_dir: Path,
    config: AgentConfig,
    delays: Sequence[float] = CANCEL_RETRY_DELAYS,
) -> list[dict]:
    """The disconnect's cancel, tried again after each of `delays` (1, 2, 4 .. s: about
    3 minutes in all) while Slurm or the record cannot be reached; the last failure is
    raised (the agent's error line, its exit status)."""
    for delay in (*delays, None):
        try:
            return cancel_once(user_dir, job_id, job_dir, config)
        except AgentError as exc:
            if delay is None:
                raise
            print(
                f"tacc-agent: cancel of job {job_id} failed ({exc}); again in {delay:g} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(delay)
    return []  # not reached: the last try returns or raises


def stop_on_disconnect(
    user_dir: Path,
    job_id: str,
    config: AgentConfig,
    stdin: BinaryIO | None = None,
    poll_seconds: float = POLL_SECONDS,
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT_SECONDS,
    retry_delays: Sequence[float] = CANCEL_RETRY_DELAYS,
) -> int:
    """Cancel the caller's job when the client goes away (stdin ends, no byte on it for
    heartbeat_timeout, or SIGHUP, SIGTERM, SIGPIPE), unless it ends by itself first; one
    JSON line each: watching, then the cancel's answer or the job's final state."""
    job_dir, _, state = owned_job(user_dir, job_id, config)
    if state in records.TERMINAL:
        raise Rejected(f"job {job_id} is {state}: {ENDED_HINT.format(job=job_id)}")
    heartbeat = Heartbeat()
    gone = heartbeat.ended
    for number in DISCONNECT_SIGNALS:
        signal.signal(number, lambda _n, _f: gone.set())
    reader = threading.Thread(
        target=watch_stdin, args=(stdin or sys.stdin.buffer, heartbeat), daemon=True
    )
    reader.start()
    print_line({"job_id": job_id, "state": "WATCHING"})
    while not gone.wait(min(poll_seconds, heartbeat_timeout)):
        if heartbeat.silent_for() >= heartbeat_timeout:
            break  # the connection dropped: no heartbeat, no end of stdin
        try:
            info = jobs.own_info(job_id, job_dir, config)
            state, _ = jobs.reconcile(job_dir, info, config.slurm_timeout_seconds)
        except AgentError:  # Slurm slow or restarting: keep watching, ask again later
            continue
        if state in records.TERMINAL:
            print_line({"job_id": job_id, "state": state})
            return 0
    for answer in cancel_with_retries(user_dir, job_id, job_dir, config, retry_delays):
        print_line(answer)
    return 0
