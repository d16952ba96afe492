"""Build real job directories for agent tests: tcloud compiles, the agent's store commits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tacc_agent.tasks.store import delta as store
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task


def make_job(tmp: Path, task: dict, files: dict[str, str] | None = None) -> tuple[Path, Path]:
    """(user_dir, job_dir) for `task` (a tcloud.yaml as a dict) and its code files."""
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (project / name).write_text(text)
    (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    user_dir = tmp / "workspace" / "user"
    user_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return user_dir, Path(store.commit_local(user_dir, instruction)["workdir"])


def agent_env(tmp: Path, **settings) -> dict[str, str]:
    config = tmp / "agent.yaml"
    base = {
        "workspace": str(tmp / "workspace"),
        "rdma_sysfs_root": str(tmp / "no-sysfs"),
        "facts_file": str(tmp / "facts.json"),
        "python": sys.executable,
    }
    config.write_text(yaml.safe_dump({**base, **settings}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "TACC_AGENT_CONFIG": str(config)}


def agent(*argv: str, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tacc_agent", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        **kwargs,
    )
