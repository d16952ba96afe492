"""`tacc-agent enter` (on the node, in the step `tcloud shell`/`exec` start) the quick
way: for a job without an image, the job's variables come from its instruction and its
environment record (both JSON) and job_vars, and the command is exec'd, with nothing
else imported: about 20 ms of Python where the full agent takes over 100 ms (issue [23];
bench/agent_startup.py). `python -m tacc_agent` tries this first (tacc_agent/__main__.py).

Anything it is not sure of goes the full way (tasks/interactive/attach.py's enter, which
says why it refuses): words other than the ones ENTER.request writes, a job directory
that is not the caller's, an instruction that is not JSON or not as expected, a job with
an image or a build. What both ways run last (the command's checks, the shell, the
working directory, the exec) is defined here once."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from tacc_agent.tasks.execute import job_vars

EXIT_NOT_FOUND = 127  # as a shell: the command is not there
EXIT_NOT_EXECUTABLE = 126  # as a shell: it is there, it cannot be run


def command_status(
    word: str,
    search_path: str,
    root: Path | None = None,
    binds: Sequence[tuple[str, str]] = (),
) -> int:
    """0 when `word` can be run (on the host, or in the image at root, where a place
    under one of the container's `binds` (source, target) is looked up in its source:
    a venv on top of the image, in the user's directory); else what a shell would exit
    with: 127 (not found), 126 (found, not executable). In an image only presence is
    checked (its links may point at paths only it has)."""
    if root is not None:
        if "/" in word and not word.startswith("/"):
            return 0  # relative to the working directory: the runtime says
        places = [word] if "/" in word else [f"{d}/{word}" for d in search_path.split(":") if d]
        found = any(os.path.lexists(in_image(root, binds, place)) for place in places)
        return 0 if found else EXIT_NOT_FOUND
    path = word if "/" in word else shutil.which(word, path=search_path)
    if path is None or not os.path.exists(path):
        return EXIT_NOT_FOUND
    runnable = os.access(path, os.X_OK) and not os.path.isdir(path)
    return 0 if runnable else EXIT_NOT_EXECUTABLE


def in_image(root: Path, binds: Sequence[tuple[str, str]], place: str) -> Path:
    """Where the container's path `place` is on the host: under the last bind whose
    target holds it (ch-run mounts them in order), else in the image's root. (The rule
    of containers.under, said again: the quick way imports nothing of the full agent.)"""
    for source, target in reversed(binds):
        if place == target or place.startswith(target.rstrip("/") + "/"):
            return Path(source) / os.path.relpath(place, target)
    return root / place.lstrip("/")


def shell_argv(search_path: str, root: Path | None = None, interactive: bool = True) -> list[str]:
    """The user's shell: bash, or sh where there is no bash (root: an image's); `-i` on a
    terminal. Without one (no PTY: commands piped in), a plain shell reads stdin as ssh's
    does, with no prompts and no job-control warnings on stderr."""
    shell = "bash" if command_status("bash", search_path, root) == 0 else "sh"
    return [shell, "-i"] if interactive else [shell]


def on_terminal() -> bool:
    """stdin is a terminal (srun --pty): the shell is interactive."""
    return os.isatty(0)


def run(argv: list[str], code: int, command: Sequence[str], env: dict, job_dir: Path) -> int:
    """The last part of `enter`, both ways: code (command_status of what runs) non-zero
    is said as a shell says it and returned; else, in the job's code/ (else its
    directory), argv replaces this process with env."""
    if code:
        what = "command not found" if code == EXIT_NOT_FOUND else "permission denied"
        word = command[0] if command else argv[0]
        print(f"tacc: {word}: {what}", file=sys.stderr, flush=True)
        return code
    workdir = job_dir / "code"
    os.chdir(workdir if workdir.is_dir() else job_dir)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - the command replaces the agent
    except OSError as exc:
        print(f"tacc: {argv[0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
    return 0  # only when exec is replaced (tests)


def parsed(words: Sequence[str]) -> tuple[Path, int, list[str]] | None:
    """(job dir, rank, command) of exactly what ENTER.request writes after `enter`
    (JOBDIR --rank N [-- WORD...]); None for anything else."""
    if len(words) < 3 or words[1] != "--rank" or words[0].startswith("-"):
        return None
    if not words[2].isdigit() or not words[2].isascii():
        return None
    rest = list(words[3:])
    if rest and (rest[0] != "--" or len(rest) == 1):
        return None
    return Path(words[0]), int(words[2]), rest[1:]


def read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def job_env(job_dir: Path, rank: int) -> dict[str, str] | None:
    """What the job's program sees (as attach.job_env), from the JSON files alone; None
    when the job is one for the full way (an image, a build, anything unexpected)."""
    document = read_json(job_dir / job_vars.INSTRUCTION)
    task = document.get("task") if isinstance(document, dict) else None
    if not isinstance(task, dict) or task.get("image") or task.get("image_build"):
        return None
    environment, runtime = task.get("environment", {}), task.get("runtime", {})
    if not isinstance(environment, dict) or not isinstance(runtime, dict):
        return None
    task_env = environment.get("env", {})
    if not isinstance(task_env, dict) or not all(
        isinstance(word, str) for word in [*task_env.keys(), *task_env.values()]
    ):
        return None
    record = read_json(job_dir / "status" / job_vars.ENVIRONMENT_RECORD)
    venv = record.get("path") if isinstance(record, dict) else None
    legacy = job_vars.legacy_workdir(runtime)
    return job_vars.entered_env(
        job_dir, legacy, task_env, rank, venv if isinstance(venv, str) else None
    )


def enter_quickly(argv: Sequence[str]) -> bool:
    """`enter` for a job without an image: exits with the command's refusal, or execs the
    command (no return); False when the full way must decide (then nothing was done)."""
    if argv[:1] != ["enter"] or (words := parsed(argv[1:])) is None:
        return False
    # As cli.main does for every verb: srun hands its caller's umask (a login shell's
    # 0002) on to the step, and what a shell or command writes must stay the user's.
    os.umask(0o077)
    job_dir, rank, command = words
    try:
        resolved = job_dir.resolve()
        mine = resolved.stat().st_uid == os.getuid()
    except OSError:
        return False
    if not mine or (env := job_env(resolved, rank)) is None:
        return False
    host_path = env.get("PATH", os.defpath)
    program = command or shell_argv(host_path, interactive=on_terminal())
    sys.exit(run(program, command_status(program[0], host_path), command, env, resolved))
