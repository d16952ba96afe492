"""Researchers' Python environments, built once per cluster and reused, and locked.

An environment is a venv in the user's directory on shared storage, keyed by the digest
of what it is built from: the requirement lines (or, for a rerun, the lock), the
interpreter's version and the platform. It is built with uv (`uv pip compile` resolves
the requirements to exact versions, the lock; `uv pip sync` installs exactly those)
from the cluster's package cache (agent setting `package_index`) under a POSIX lock
(locks.POSIX, which NFS carries), so concurrent jobs wait instead of building twice. The
lock is kept in the environment (tacc-lock.txt) and recorded in each job that uses it
(status/environment.json), so `tcloud rerun` can build the same versions again. A build
that fails leaves nothing a later job would mistake for ready.

A task with an image and requirements (issue [24]): the same venv, built in the job's
container on the image's own Python (uv bound into the container), keyed by the image's
digest or build key too, and put first on the container's PATH (launch.job_container).

A step that fails because the cache could not reach upstream (devpi then says a project
"does not exist", or answers 502) is run again after a pause, RETRY_DELAYS; one whose
project is truly missing fails at once (tasks/execute/package_index.py tells them apart). Past
the last retry the error names the cache and says to try again.

uv instead of pip: one static binary that resolves and installs in one pass, reuses a
per-user wheel cache by hard links, and writes a lock with `pip compile`; pip has no
lock of its own (bench/frameworks.py measures both side by side).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tacc_agent import locks
from tacc_agent.errors import AGENT_FAILED, AgentError
from tacc_agent.tasks.execute import job_vars, package_index
from tacc_agent.tasks.jobs import records

# A command run in the job's container (containers.Container.wrap).
Wrap = Callable[[list[str]], list[str]]
MARKER = "tacc-env.json"
LOCK_FILE = "tacc-lock.txt"
JOB_RECORD = job_vars.ENVIRONMENT_RECORD
# Seconds before each new try of a uv step that met a transient cache failure: the
# cache's upstream fetch goes on in the background, so a later try usually finds it done.
RETRY_DELAYS = (5.0, 15.0, 30.0)
INTERPRETER_PROBE = (
    "import json, platform, sys, sysconfig; print(json.dumps({"
    "'implementation': sys.implementation.name, 'version': platform.python_version(), "
    "'platform': sysconfig.get_platform()}))"
)


@dataclass(frozen=True)
class Interpreter:
    implementation: str
    version: str
    platform: str


def interpreter(
    python: str, wrap: Wrap | None = None, env: Mapping[str, str] | None = None
) -> Interpreter:
    """What the environment's interpreter is: part of the environment's key (`wrap`:
    the interpreter of the job's image, run in it with `env`)."""
    argv = [python, "-I", "-c", INTERPRETER_PROBE]
    proc = subprocess.run(
        wrap(argv) if wrap else argv,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise AgentError(
            f"cannot run the environments' interpreter {python}: {proc.stderr.strip()[-300:]}",
            AGENT_FAILED,
        )
    return Interpreter(**json.loads(proc.stdout))


def env_digest(
    requirements: list[str], lock: list[str], python: Interpreter, image: str = ""
) -> str:
    """The environment's key: what it holds, its interpreter, and the image it is built
    on (its digest or build key: the same Python version in two images is two
    interpreters, each with its own libraries)."""
    identity = {"requirements": requirements, "lock": lock, "python": asdict(python)}
    if image:
        identity["image"] = image
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def uv_binary(configured: str) -> str:
    """The uv the agent builds with: the setting, else the one installed beside the
    agent's Python (the tacc_agent role puts it there), else uv on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = configured or (str(beside) if beside.exists() else shutil.which("uv"))
    if not found:
        message = (
            "uv is not installed on this node (the tacc_agent role installs it beside "
            "the agent); cannot build the environment"
        )
        raise AgentError(message, AGENT_FAILED)
    return found


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """The lock file at path (on shared storage: a POSIX lock), waited for `timeout` at
    most; AgentError when it is still held then."""
    with locks.lock_file(path, locks.POSIX, within=timeout, mode=0o666) as taken:
        if not taken:
            raise AgentError(f"{path}: still locked after {timeout:g} s", AGENT_FAILED)
        yield


def ready(env_dir: Path) -> dict | None:
    return records.read_json(env_dir / MARKER)


@dataclass(frozen=True)
class Builder:
    """How environments are built on this cluster (from the agent's settings). uv runs
    with --no-config: no uv.toml of the user's or above the job changes where packages
    come from behind the record's back."""

    python: str
    uv: str
    index: str = ""  # the cluster's package cache; "" = uv's default (PyPI)
    cache_dir: Path | None = None  # uv's wheel cache (per user, beside the envs)
    # A task with an image: each step runs in the job's container (uv bound into it),
    # the venv on the image's Python, keyed by the image too.
    wrap: Wrap | None = None
    image: str = ""
    step_uv: str = ""  # uv as the steps name it: its path in the container, when wrapped
    extra_env: Mapping[str, str] = field(default_factory=dict)  # what the runtime needs

    def argv(self, argv: list[str]) -> list[str]:
        return self.wrap(argv) if self.wrap else argv

    def uv_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env.update(UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
        if not self.wrap:
            # The node's CA store (a site's own CA for its package cache). In an image
            # uv keeps its own roots: a minimal image has no CA store, and uv then fails
            # to start ("No CA certificates were loaded from the system").
            env["UV_NATIVE_TLS"] = "1"
        if self.cache_dir:
            env["UV_CACHE_DIR"] = str(self.cache_dir)
        return {**env, **self.extra_env}

    def index_args(self) -> list[str]:
        return ["--index-url", self.index] if self.index else []

    def steps(self, env_dir: Path, requirements_file: Path, lock: bool) -> list[list[str]]:
        """uv's commands: a venv, the lock (unless given), exactly the locked versions."""
        uv = self.step_uv or self.uv
        python = str(env_dir / "bin" / "python")
        lock_file = str(env_dir / LOCK_FILE)
        resolve = [
            uv,
            "pip",
            "compile",
            "--no-config",
            "--quiet",
            "--no-header",
            "--no-annotate",
            "--python",
            python,
            *self.index_args(),
            "-o",
            lock_file,
            str(requirements_file),
        ]
        return [
            # --seed: pip in the environment, for setup lines that install the code; from
            # the cluster's cache too (without --index-url uv fetches it from PyPI).
            # --clear: a try again after a failure starts from an empty directory.
            [
                uv,
                "venv",
                "--no-config",
                "--quiet",
                "--clear",
                "--seed",
                "--python",
                self.python,
                *self.index_args(),
                str(env_dir),
            ],
            *([] if lock else [resolve]),
            [
                uv,
                "pip",
                "sync",
                "--no-config",
                "--quiet",
                "--python",
                python,
                *self.index_args(),
                lock_file,
            ],
        ]

    def version(self) -> str:
        proc = subprocess.run(
            [self.uv, "--version"], capture_output=True, text=True, check=False, timeout=60
        )
        return proc.stdout.strip()


def lock_lines(env_dir: Path) -> list[str]:
    text = (env_dir / LOCK_FILE).read_text()
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def build(
    env_dir: Path,
    requirements: list[str],
    lock: list[str],
    builder: Builder,
    log: Callable[[str], None],
) -> None:
    shutil.rmtree(env_dir, ignore_errors=True)
    requirements_file = env_dir.with_suffix(".requirements.txt")
    requirements_file.write_text("".join(f"{line}\n" for line in requirements))
    steps = builder.steps(env_dir, requirements_file, lock=bool(lock))
    try:
        for number, argv in enumerate(steps):
            run_step(argv, builder, log)
            if number == 0 and lock:  # the venv exists: the lock goes in
                (env_dir / LOCK_FILE).write_text("".join(f"{line}\n" for line in lock))
    except AgentError:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


def run_step(argv: list[str], builder: Builder, log: Callable[[str], None]) -> None:
    """Run one uv step (each reaches the cache: the venv for its seed packages); again
    after a pause while the cache fails transiently. A missing project or a failure that
    is not the cache's ends the build at once."""
    command = f"`uv {' '.join(argv[1:3])} ...`"
    where = builder.index or package_index.PYPI
    delays = RETRY_DELAYS
    refresh: list[str] = []
    for attempt, delay in enumerate((*delays, None), 1):
        proc = subprocess.run(
            builder.argv([*argv, *refresh]),
            capture_output=True,
            text=True,
            check=False,
            env=builder.uv_env(),
        )
        for line in (proc.stdout + proc.stderr).splitlines():
            log(f"  {line}")
        if proc.returncode == 0:
            return
        failed = f"building the environment failed: {command} exited {proc.returncode}"
        found = package_index.diagnose(builder.index, proc.stdout + proc.stderr)
        if found is None:
            raise AgentError(failed, AGENT_FAILED)
        if not found.transient:
            raise AgentError(f"{failed}: the package cache {where} {found.detail}", AGENT_FAILED)
        if delay is None:
            message = (
                f"{failed}: the package cache {where} could not get what it needs from its "
                f"upstream ({found.detail}) after {attempt} tries: upstream unreachable, "
                "try again (tcloud rerun JOB, or submit again)"
            )
            raise AgentError(message, AGENT_FAILED)
        log(
            f"package cache {where}: {found.detail}; "
            f"trying again in {delay:g} s ({attempt}/{len(delays)})"
        )
        # uv asks the cache again for the projects it was told are missing.
        names = package_index.missing_projects(proc.stdout + proc.stderr)
        refresh = [f"--refresh-package={name}" for name in names]
        time.sleep(delay)


def ensure(
    user_dir: Path,
    requirements: list[str],
    builder: Builder,
    job_id: str,
    log: Callable[[str], None],
    lock_timeout: float,
    lock: list[str] | None = None,
) -> dict:
    """The ready environment's record (path, lock, ...) for these requirements, or for
    exactly the versions of `lock`, building it if no job has yet."""
    lock = list(lock or [])
    python = interpreter(builder.python, builder.wrap, builder.uv_env() if builder.wrap else None)
    digest = env_digest(requirements, lock, python, builder.image)
    envs = user_dir / "envs"
    envs.mkdir(mode=0o700, exist_ok=True)
    env_dir = envs / digest
    with locked(envs / f"{digest}.lock", lock_timeout):
        marker = ready(env_dir)
        if marker:
            log(f"environment {digest}: reused (built by job {marker['built_by_job']})")
            return {**marker, "path": str(env_dir)}
        what = f"{len(lock)} locked version(s)" if lock else f"{len(requirements)} requirement(s)"
        log(f"environment {digest}: building ({what}, python {python.version}) ...")
        start = time.monotonic()
        build(env_dir, requirements, lock, builder, log)
        seconds = round(time.monotonic() - start, 2)
        marker = {
            "digest": digest,
            "requirements": requirements,
            "lock": lock_lines(env_dir),
            "python": python.version,
            "implementation": python.implementation,
            "platform": python.platform,
            "installer": builder.version(),
            **({"image": builder.image} if builder.image else {}),
            "index": builder.index or "(uv default)",
            "built_by_job": job_id,
            "built_on": socket.gethostname(),
            "seconds": seconds,
            "time": time.time(),
        }
        records.write_json(env_dir / MARKER, marker)
        log(f"environment {digest}: built in {seconds} s ({len(marker['lock'])} locked)")
    return {**marker, "path": str(env_dir)}


def record_for_job(job_dir: Path, environment: dict) -> None:
    """What this job ran with: a rerun builds exactly these versions again."""
    records.write_json(job_dir / "status" / JOB_RECORD, environment)


def job_environment(job_dir: Path) -> dict | None:
    return records.read_json(job_dir / "status" / JOB_RECORD)


def listing(user_dir: Path) -> list[dict]:
    envs = user_dir / "envs"
    found = [ready(p) for p in sorted(envs.iterdir()) if p.is_dir()] if envs.is_dir() else []
    return [{**m, "path": str(envs / m["digest"])} for m in found if m]
