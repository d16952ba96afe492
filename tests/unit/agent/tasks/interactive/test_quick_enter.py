"""`enter`'s quick way (tasks/interactive/quick_enter.py): for a job without an image it
execs exactly what the full way (attach.enter) execs, with the same variables, in the same
directory; anything it is not sure of goes the full way, having done nothing; and
`python -m tacc_agent enter` takes it without importing the full agent. Jobs are compiled
by the real compiler (tests/unit/agent_jobs.py); exec is caught."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.tasks.execute import envcache, job_vars
from tacc_agent.tasks.interactive import attach, quick_enter
from tacc_contract.instruction import FILE
from tests.unit.agent_jobs import make_job

TASK = {"name": "t", "run": ["python3 train.py"], "environment": {"env": {"LR": "0.1"}}}


class Caught:
    """os.execvpe, caught: (argv, env, cwd) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], dict[str, str], str]] = []
        self.umasks: list[int] = []

    def __call__(self, file: str, argv: list[str], env: dict[str, str]) -> None:
        self.calls.append((argv, env, os.getcwd()))
        umask = os.umask(0o077)
        os.umask(umask)
        self.umasks.append(umask)


@pytest.fixture
def caught(monkeypatch) -> Caught:
    calls = Caught()
    monkeypatch.setattr(os, "execvpe", calls)
    monkeypatch.chdir(os.getcwd())  # both ways change directory: put it back after
    umask = os.umask(0o077)
    yield calls
    os.umask(umask)


def a_job(tmp_path: Path, task: dict = TASK, venv: bool = True) -> Path:
    _, job_dir = make_job(tmp_path, task, {"train.py": "print('hi')\n"})
    if venv:
        env_dir = tmp_path / "envs" / "abc"
        (env_dir / "bin").mkdir(parents=True)
        envcache.record_for_job(job_dir, {"path": str(env_dir), "digest": "abc"})
    return job_dir


def quickly(job_dir: Path, rank: int, command: list[str]) -> int | None:
    """enter_quickly's exit status (it execs, then exits), or None: the full way."""
    words = ["enter", str(job_dir), "--rank", str(rank), *(["--", *command] if command else [])]
    try:
        taken = quick_enter.enter_quickly(words)
    except SystemExit as exc:
        return int(exc.code or 0)
    assert taken is False
    return None


@pytest.mark.parametrize(
    ("task", "command", "terminal"),
    [
        (TASK, ["python3", "-c", "x = 'a b'"], False),
        (TASK, [], True),  # the user's shell, interactive on a PTY
        (TASK, [], False),  # commands piped in
        ({**TASK, "runtime": {"workdir": "code"}}, ["env"], False),  # legacy TACC_WORKDIR
    ],
)
def test_the_quick_way_execs_what_the_full_way_execs(
    tmp_path, caught, monkeypatch, task, command, terminal
):
    job_dir = a_job(tmp_path, task)
    monkeypatch.setattr(quick_enter, "on_terminal", lambda: terminal)
    monkeypatch.setattr(attach, "on_terminal", lambda: terminal)
    assert attach.enter(job_dir, 1, command, AgentConfig()) == 0
    assert quickly(job_dir, 1, command) == 0
    (full_argv, full_env, full_cwd), (argv, env, cwd) = caught.calls
    assert (argv, cwd) == (full_argv, full_cwd) and env == full_env
    assert env["TACC_NODE_RANK"] == "1" and env["LR"] == "0.1"
    assert env["VIRTUAL_ENV"] == str(tmp_path / "envs" / "abc")
    assert cwd == str(job_dir / "code")


@pytest.mark.bad_input
def test_a_command_not_found_is_said_as_the_full_way_says_it(tmp_path, caught, capsys):
    job_dir = a_job(tmp_path)
    assert attach.enter(job_dir, 0, ["no-such-command-anywhere"], AgentConfig()) == 127
    full = capsys.readouterr().err
    assert quickly(job_dir, 0, ["no-such-command-anywhere"]) == 127
    assert capsys.readouterr().err == full == "tacc: no-such-command-anywhere: command not found\n"
    assert caught.calls == []


def rewrite_task(job_dir: Path, **fields: object) -> None:
    document = json.loads((job_dir / FILE).read_text())
    document["task"].update(fields)
    (job_dir / FILE).write_text(json.dumps(document))


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "words",
    [
        ["exec", "{job}"],
        ["enter", "{job}"],
        ["enter", "{job}", "--rank"],
        ["enter", "{job}", "--rank", "x"],
        ["enter", "{job}", "--rank", "\u0661"],  # a digit, not an ASCII one
        ["enter", "--rank", "1", "{job}"],
        ["enter", "{job}", "--rank", "1", "--"],
        ["enter", "{job}", "--rank", "1", "ls"],
        ["enter", "{job}", "--rank", "1", "--userdir", "/x"],
    ],
)
def test_words_other_than_enters_own_go_the_full_way(tmp_path, caught, words):
    job_dir = a_job(tmp_path)
    argv = [word.replace("{job}", str(job_dir)) for word in words]
    assert quick_enter.enter_quickly(argv) is False
    assert caught.calls == []


@pytest.mark.parametrize(
    "change",
    [
        {"image": "registry.example/pytorch@sha256:" + "a" * 64},
        {"image_build": {"file": "Dockerfile"}},
        {"environment": {"env": {"N": 1}}},
        {"environment": ["not", "a", "mapping"]},
        {"runtime": "not a mapping"},
    ],
)
def test_a_job_with_an_image_or_an_unexpected_instruction_goes_the_full_way(
    tmp_path, caught, change
):
    job_dir = a_job(tmp_path)
    rewrite_task(job_dir, **change)
    assert quickly(job_dir, 0, ["true"]) is None
    assert caught.calls == []


def test_an_instruction_that_is_not_json_or_not_there_goes_the_full_way(tmp_path, caught):
    job_dir = a_job(tmp_path)
    (job_dir / FILE).write_text("task: {name: t}\n")  # YAML: only the full way reads it
    assert quickly(job_dir, 0, ["true"]) is None
    (job_dir / FILE).unlink()
    assert quickly(job_dir, 0, ["true"]) is None
    assert quickly(tmp_path / "no-such-job", 0, ["true"]) is None
    assert caught.calls == []


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a directory away")
def test_another_users_job_directory_is_left_to_the_full_way_which_refuses_it(tmp_path, caught):
    job_dir = a_job(tmp_path)
    os.chown(job_dir, 54321, 54321)
    assert quickly(job_dir, 0, ["true"]) is None
    with pytest.raises(Rejected, match="not a job directory of yours"):
        attach.enter(job_dir, 0, ["true"], AgentConfig())
    assert caught.calls == []


def test_the_names_it_reads_are_the_contracts_and_the_stores():
    assert job_vars.INSTRUCTION == FILE
    assert job_vars.ENVIRONMENT_RECORD == envcache.JOB_RECORD


PROBE = """
import sys
import tacc_agent.tasks.interactive.quick_enter
print(sorted(m for m in sys.modules if m.startswith(("yaml", "tacc_contract", "tacc_agent.cli",
      "tacc_agent.config", "tacc_agent.tasks.execute.launch", "argparse"))))
"""


def test_the_quick_way_imports_nothing_of_the_full_agent():
    out = subprocess.run(
        [sys.executable, "-I", "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out


def test_python_m_tacc_agent_enter_takes_the_quick_way(tmp_path):
    """The real entry point: the command runs with the job's variables, and the full
    agent (tacc_agent.cli) is never imported (-X importtime lists every import)."""
    job_dir = a_job(tmp_path, venv=False)
    command = ["sh", "-c", 'echo "$TACC_NODE_RANK $LR $(pwd)"']
    entry = [sys.executable, "-X", "importtime", "-m", "tacc_agent"]
    proc = subprocess.run(
        [*entry, "enter", str(job_dir), "--rank", "3", "--", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == f"3 0.1 {job_dir / 'code'}\n"
    assert "tacc_agent.cli" not in proc.stderr


@pytest.mark.security
def test_the_command_runs_with_the_agents_private_umask_whatever_srun_handed_on(tmp_path, caught):
    """srun gives the step its caller's umask: a login shell's 0002 since tcloud runs the
    step itself. What alice's shell or command writes on the node (/tmp, scratch) must
    not be readable by bob: 0077, as in her job's own run lines."""
    job_dir = a_job(tmp_path)
    os.umask(0o002)
    assert quickly(job_dir, 0, ["touch", "x"]) == 0
    assert caught.umasks == [0o077]


def test_a_command_of_a_venv_on_top_of_an_image_is_found_through_its_bind(tmp_path):
    # Issue [24]: the venv is in the user's directory, bound into the container; in the
    # image's root that path is only an empty mount point.
    rootfs, user_dir = tmp_path / "rootfs", tmp_path / "shared" / "alice"
    (rootfs / "usr/bin").mkdir(parents=True)
    (rootfs / "usr/bin/python3").touch()
    venv_bin = user_dir / "envs" / "abc" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "jupyter").touch()
    (rootfs / str(venv_bin).lstrip("/")).mkdir(parents=True)  # the mount point alone
    search = f"{venv_bin}:/usr/bin"
    binds = [(str(user_dir), str(user_dir))]
    assert quick_enter.command_status("jupyter", search, rootfs, binds) == 0
    assert quick_enter.command_status("jupyter", search, rootfs) == quick_enter.EXIT_NOT_FOUND
    assert quick_enter.command_status("python3", search, rootfs, binds) == 0
    assert quick_enter.command_status("nope", search, rootfs, binds) == 127
