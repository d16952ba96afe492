"""The one runner of Slurm's commands (squeue, scontrol, sacct, srun, ...): argv only (no
shell), each bounded by a timeout, its failures mapped to the agent's AgentError
(AGENT_CLUSTER). Everything in this package that asks Slurm asks through here, so a test
fakes Slurm in one place (tests/unit/fake_slurm.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import NamedTuple

from tacc_agent.errors import AGENT_CLUSTER, AgentError

TIMEOUT = 15
# Times as epoch seconds (glibc's strftime %s), whatever SLURM_TIME_FORMAT or TZ the
# caller's environment has: no local time to misread across a DST change.
EPOCH_TIMES = {"SLURM_TIME_FORMAT": "%s"}
SLURM_NODE = "is this a Slurm node?"  # said of a command not found, unless told otherwise


class NotFound(AgentError):
    """The command is not installed here."""


class NoAnswer(AgentError):
    """The command did not end within its timeout (it was killed)."""


class Finished(NamedTuple):
    """A command that ended: its exit status and what it printed."""

    code: int
    stdout: str
    stderr: str


def command(
    argv: list[str],
    timeout: float = TIMEOUT,
    env: Mapping[str, str] | None = None,
    *,
    environment: Mapping[str, str] | None = None,
    cwd: str | None = None,
    hint: str = "",
) -> Finished:
    """Run argv to its end, whatever its exit status. `env` is added to this process's
    environment; `environment` replaces it whole (nothing inherited). NotFound or
    NoAnswer (both AgentError, AGENT_CLUSTER) when it is missing or hangs; `hint` says
    what the command is needed for (default: SLURM_NODE)."""
    if environment is not None:
        child_env: dict[str, str] | None = dict(environment)
    else:
        child_env = {**os.environ, **env} if env else None
    try:
        # Free text users write (job names, comments) may hold any byte: never a crash.
        proc = subprocess.run(
            argv,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            check=False,
            env=child_env,
            cwd=cwd,
        )
    except FileNotFoundError:
        raise NotFound(f"{argv[0]} not found: {hint or SLURM_NODE}", AGENT_CLUSTER) from None
    except subprocess.TimeoutExpired:
        raise NoAnswer(f"{argv[0]} did not answer within {timeout:g} s", AGENT_CLUSTER) from None
    return Finished(proc.returncode, proc.stdout, proc.stderr)


def failure(argv: list[str], done: Finished, hint: str = "") -> AgentError:
    """The AgentError of a command that exited non-zero: its own words (stderr, else
    stdout, else its exit status), then `hint` in parentheses when given."""
    message = (done.stderr or done.stdout).strip() or f"exit status {done.code}"
    return AgentError(
        f"{argv[0]} failed: {message}" + (f" ({hint})" if hint else ""), AGENT_CLUSTER
    )


def output(
    argv: list[str],
    timeout: float = TIMEOUT,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    hint: str = "",
) -> str:
    """stdout of a Slurm command (with `env` added to the environment); AgentError when
    it is missing, hangs, or (with `check`) exits non-zero."""
    done = command(argv, timeout, env, hint=hint)
    if check and done.code != 0:
        raise failure(argv, done, hint)
    return done.stdout
