"""What a job's program sees: the agent's job variables (TACC_*), the task's own, and
the job's venv. One definition for the batch step, each rank's wrapper and `enter`;
it imports nothing heavy, because `enter`'s quick way (tasks/interactive/quick_enter.py)
starts with it alone."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

INSTRUCTION = "instruction.json"  # tacc_contract.instruction.FILE (a test keeps them equal)
ENVIRONMENT_RECORD = "environment.json"  # in the job's status/: the venv its batch step used


def user_dir_of(job_dir: Path) -> Path:
    return job_dir.parent.parent  # <userdir>/jobs/<dir>


def legacy_workdir(runtime: Mapping[str, object]) -> bool:
    """Whether the task asks for TACC_WORKDIR's legacy meaning, its code/ (`runtime`)."""
    return runtime.get("workdir") == "code"


def base_env(job_dir: Path, legacy_workdir: bool = False) -> dict[str, str]:
    """The agent's own environment (srun, the wrapper): the task's variables are only
    for the program, so they cannot break srun or the agent. TACC_WORKDIR is the job's
    directory, or its code/ for tasks that ask for the legacy meaning (tuxiv.conf)."""
    # Not the SSH session tcloud submitted from: with SSH_CLIENT set, Debian's bash
    # sources bashrc files even when non-interactive (and trips on `set -u`).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSH_")}
    env.update(
        TACC_WORKDIR=str(job_dir / "code" if legacy_workdir else job_dir),
        TACC_JOB_DIR=str(job_dir),
        TACC_USERDIR=str(user_dir_of(job_dir)),
        TACC_DATASETS=str(job_dir / "datasets"),
        PYTHONUNBUFFERED="1",
    )
    return env


def program_env(task_env: Mapping[str, str], env: dict[str, str]) -> dict[str, str]:
    """env with the task's own variables (`environment.env`) over it."""
    return {**env, **task_env}


def activate(env_dir: Path, env: dict[str, str]) -> None:
    """The venv at env_dir, first on PATH."""
    env["VIRTUAL_ENV"] = str(env_dir)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"


def entered_env(
    job_dir: Path, legacy: bool, task_env: Mapping[str, str], rank: int, venv: str | None
) -> dict[str, str]:
    """What a command `enter` runs sees (both ways, tasks/interactive): the job's
    variables, the task's own, the node's rank and the venv its batch step recorded."""
    env = program_env(task_env, base_env(job_dir, legacy))
    env["TACC_NODE_RANK"] = str(rank)
    if venv:
        activate(Path(venv), env)
    return env
