"""Researchers' Python environments, built once per cluster and reused: a venv keyed by
the digest of the requirement lines, in the user's directory on shared storage, built
under a POSIX lock (fcntl, which NFS forwards) so concurrent jobs wait instead of
building twice. A build that fails leaves nothing a later job would mistake for ready.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tacc_agent import records
from tacc_agent.errors import EXIT_FAILED, AgentError

MARKER = "tacc-env.json"


def env_digest(requirements: list[str]) -> str:
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    message = f"{path}: still locked after {timeout:g} s"
                    raise AgentError(message, EXIT_FAILED) from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)


def ready(env_dir: Path) -> dict | None:
    return records.read_json(env_dir / MARKER)


def build(env_dir: Path, requirements: list[str], python: str, log: Callable[[str], None]) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)
    requirements_file = env_dir.with_suffix(".requirements.txt")
    requirements_file.write_text("".join(f"{line}\n" for line in requirements))
    steps = [
        [python, "-m", "venv", "--system-site-packages", str(env_dir)],
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
         "--no-input", "--progress-bar", "off", "-r", str(requirements_file)],
    ]  # fmt: skip
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        for line in (proc.stdout + proc.stderr).splitlines():
            log(f"  {line}")
        if proc.returncode != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise AgentError(
                f"building the environment failed: `{' '.join(argv[:4])} ...` exited "
                f"{proc.returncode}",
                EXIT_FAILED,
            )


def ensure(
    user_dir: Path,
    requirements: list[str],
    python: str,
    job_id: str,
    log: Callable[[str], None],
    lock_timeout: float,
) -> Path:
    """The ready venv for these requirements, building it if no job has yet."""
    digest = env_digest(requirements)
    envs = user_dir / "envs"
    envs.mkdir(mode=0o700, exist_ok=True)
    env_dir = envs / digest
    with locked(envs / f"{digest}.lock", lock_timeout):
        marker = ready(env_dir)
        if marker:
            log(f"environment {digest}: reused (built by job {marker['built_by_job']})")
            return env_dir
        log(f"environment {digest}: building ({len(requirements)} requirement(s)) ...")
        start = time.monotonic()
        build(env_dir, requirements, python, log)
        seconds = round(time.monotonic() - start, 2)
        records.write_json(
            env_dir / MARKER,
            {
                "digest": digest,
                "requirements": requirements,
                "built_by_job": job_id,
                "built_on": socket.gethostname(),
                "seconds": seconds,
                "time": time.time(),
            },
        )
        log(f"environment {digest}: built in {seconds} s")
    return env_dir


def listing(user_dir: Path) -> list[dict]:
    envs = user_dir / "envs"
    found = [ready(p) for p in sorted(envs.iterdir())] if envs.is_dir() else []
    return [{**m, "path": str(envs / m["digest"])} for m in found if m]


def activate(env_dir: Path, env: dict[str, str]) -> None:
    env["VIRTUAL_ENV"] = str(env_dir)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}"
