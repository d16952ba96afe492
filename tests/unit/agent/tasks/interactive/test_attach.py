"""Into a running job, the agent's side (tasks/interactive/attach.py): `job target`'s checks and
answer, the srun that `job attach` execs, what `enter` execs on the node, and
`job stop-on-disconnect`. Slurm is tests/unit/fake_slurm.py behind the agent's runner
(scontrol's records, host lists, scancel); exec is caught, nothing is started."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute import envcache
from tacc_agent.tasks.interactive import attach
from tacc_agent.tasks.jobs import records, sweeps
from tacc_agent.tasks.jobs import verbs as jobs
from tacc_agent.tasks.store import workspace
from tacc_contract.instruction import FILE
from tacc_contract.verbs import JOB_TARGET
from tests.unit.agent_jobs import make_job
from tests.unit.fake_slurm import FakeSlurm

TASK = {"name": "t", "run": ["python3 train.py"]}
TAG = "tacc:job:0123456789abcdef"
ME = f"alice({os.getuid()})"


@pytest.fixture
def fake(monkeypatch) -> FakeSlurm:
    monkeypatch.setattr(attach.socket, "gethostbyname", lambda host: f"10.0.0.{host[1:]}")
    return FakeSlurm().install(monkeypatch)


def asked(fake: FakeSlurm) -> list[list[str]]:
    """What the agent asked of Slurm beyond reading job records (scontrol show job)."""
    return [call for call in fake.calls if call[:3] != ["scontrol", "show", "job"]]


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(workspace=str(tmp_path / "workspace"), slurm_timeout_seconds=5)


def slurm_job(
    state: str = "RUNNING",
    nodes: str = "n[2-3]",
    uid: int = os.getuid(),
    user: str = "alice",
    comment: str = TAG,
    **fields: str,
) -> dict:
    """A job as the fake holds it (the caller's, tagged, by default); `fields`: more of
    scontrol's, or ones that replace the fake's (JobId=...)."""
    return {
        "uid": uid,
        "user": user,
        "state": state,
        "nodelist": nodes,
        "comment": comment,
        "reason": "None",
        "fields": fields,
    }


def a_job(
    tmp_path: Path,
    fake: FakeSlurm,
    state: str = "RUNNING",
    job_id: str = "42",
    task: dict | None = None,
    **record,
) -> tuple[Path, Path]:
    """A job of the caller's, registered as job_id, in `state` (record and Slurm)."""
    user_dir, job_dir = make_job(tmp_path, task or TASK, {"train.py": "print('hi')\n"})
    records.write_json(job_dir / "status" / "submit.json", {"tag": TAG, "name": "t"})
    workspace.register(user_dir, job_id, job_dir)
    slurm_state = {"QUEUED": "PENDING", "HALTED": "PENDING"}.get(state, "RUNNING")
    if state in records.TERMINAL:
        slurm_state = state
    if state != "QUEUED":
        records.add_event(job_dir, state if state != "HALTED" else "RUNNING")
    if state == "HALTED":
        records.add_event(job_dir, "HALTED")
    nodes = "n[2-3]" if slurm_state == "RUNNING" else "(null)"
    fake.add_job(job_id, **slurm_job(slurm_state, nodes, **record))
    return user_dir, job_dir


# --- job target -------------------------------------------------------------------------


def test_target_names_the_nodes_in_slurms_order_with_their_addresses(tmp_path, fake, config):
    user_dir, _ = a_job(tmp_path, fake)
    answer = JOB_TARGET.check_answer(attach.target(user_dir, "42", config))
    places = [(node["host"], node["rank"], node["address"]) for node in answer["nodes"]]
    assert places == [("n2", 0, "10.0.0.2"), ("n3", 1, "10.0.0.3")]
    assert {k: v for k, v in answer.items() if k != "nodes"} == {
        "job_id": "42",
        "slurm_job_id": "42",
        "state": "RUNNING",
    }
    one = attach.target(user_dir, "42", config, rank=1)
    assert [(node["host"], node["rank"]) for node in one["nodes"]] == [("n3", 1)]


def test_targets_step_is_the_srun_that_job_attach_execs_without_its_command(
    tmp_path, fake, config, monkeypatch
):
    """tcloud runs each node's step itself (no `job attach` start on the login node): it
    must be exactly attach's srun, checked the same way, the command's words to follow
    "--" and --pty to follow "srun"."""
    user_dir, job_dir = a_job(tmp_path, fake)
    execs = []
    monkeypatch.setattr(attach.os, "execvp", lambda file, argv: execs.append(argv))
    for rank, node in enumerate(attach.target(user_dir, "42", config)["nodes"]):
        attach.attach(user_dir, "42", config, rank, [], False)
        assert node["step"] == execs[-1]
        attach.attach(user_dir, "42", config, rank, ["true"], True)
        assert execs[-1] == ["srun", "--pty", *node["step"][1:], "--", "true"]
        assert f"--nodelist={node['host']}" in node["step"]
        assert node["step"][-4:] == ["enter", str(job_dir), "--rank", str(rank)]


def test_target_of_a_session_carries_its_settings(tmp_path, fake, config):
    user_dir, job_dir = a_job(tmp_path, fake)
    document = records.read_json(job_dir / FILE)
    document["task"]["session"] = {"ports": [8888]}  # what the compiler writes for one
    (job_dir / FILE).write_text(json.dumps(document))
    answer = JOB_TARGET.check_answer(attach.target(user_dir, "42", config))
    assert answer["session"]["ports"] == [8888]
    (tmp_path / "plain").mkdir()
    plain, _ = a_job(tmp_path / "plain", fake)
    assert "session" not in attach.target(plain, "42", config)


def test_target_of_a_sweep_trial_uses_the_trials_own_slurm_id(tmp_path, fake, config):
    user_dir, job_dir = a_job(tmp_path, fake)
    sweeps.make_trials(job_dir, 2)
    records.add_event(sweeps.trial_dir(job_dir, "1"), "RUNNING")
    fake.add_job("42_1", **slurm_job(nodes="n3", JobId="44", ArrayJobId="42", ArrayTaskId="1"))
    answer = JOB_TARGET.check_answer(attach.target(user_dir, "42_1", config))
    assert answer["slurm_job_id"] == "44"
    [node] = answer["nodes"]
    assert (node["host"], node["rank"], node["address"]) == ("n3", 0, "10.0.0.3")
    assert "--jobid=44" in node["step"]  # the trial's own allocation
    assert f"--chdir={sweeps.trial_dir(job_dir, '1')}" in node["step"]


@pytest.mark.bad_input
def test_a_whole_sweep_is_refused_naming_a_trial(tmp_path, fake, config):
    user_dir, job_dir = a_job(tmp_path, fake)
    sweeps.make_trials(job_dir, 2)
    with pytest.raises(Rejected, match=r"job 42 is a sweep: name one of its trials, e.g. 42_0"):
        attach.target(user_dir, "42", config)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("state", "says"),
    [
        ("QUEUED", r"job 42 is QUEUED: it runs on no node yet \(tcloud status 42\)"),
        ("PROVISIONING", r"job 42 is PROVISIONING: its nodes are being prepared"),
        ("HALTED", r"job 42 is HALTED: .*tcloud resume 42"),
        ("COMPLETED", r"job 42 is COMPLETED: it runs on no node any more"),
        ("CANCELLED", r"job 42 is CANCELLED"),
    ],
)
def test_a_job_that_does_not_run_is_refused_with_its_state(tmp_path, fake, config, state, says):
    user_dir, _ = a_job(tmp_path, fake, state=state)
    with pytest.raises(Rejected, match=says) as caught:
        attach.target(user_dir, "42", config)
    assert caught.value.exit_code == Rejected("x").exit_code


@pytest.mark.bad_input
@pytest.mark.parametrize("rank", [2, 7, -1])
def test_a_rank_out_of_range_names_the_jobs_node_count(tmp_path, fake, config, rank):
    user_dir, _ = a_job(tmp_path, fake)
    with pytest.raises(Rejected, match=rf"job 42 runs on 2 nodes: --rank is 0 to 1, got {rank}"):
        attach.target(user_dir, "42", config, rank=rank)


@pytest.mark.security
def test_a_job_id_not_in_the_callers_workspace_is_not_theirs(tmp_path, fake, config):
    user_dir, _ = a_job(tmp_path, fake)
    fake.add_job("77", **slurm_job(uid=4242, user="bob"))
    for verb in (
        lambda: attach.target(user_dir, "77", config),
        lambda: attach.attach(user_dir, "77", config, 0, [], False),
        lambda: attach.stop_on_disconnect(user_dir, "77", config),
    ):
        with pytest.raises(Rejected, match=r"no job 77 of yours"):
            verb()
    assert fake.calls == []  # nothing asked of Slurm, nothing started


@pytest.mark.security
def test_an_id_slurm_now_gives_another_users_job_is_refused(tmp_path, fake, config, monkeypatch):
    """The index says 42 is the caller's, but Slurm lost its state and gave 42 to bob."""
    user_dir, _ = a_job(tmp_path, fake)
    fake.add_job("42", **slurm_job(uid=4242, user="bob", comment="tacc:bob:1"))
    execs = []
    monkeypatch.setattr(attach.os, "execvp", lambda *a: execs.append(a))
    for verb in (
        lambda: attach.target(user_dir, "42", config),
        lambda: attach.attach(user_dir, "42", config, 0, ["id"], False),
        lambda: attach.stop_on_disconnect(user_dir, "42", config),
    ):
        with pytest.raises(Rejected, match=r"not this job of yours.*bob's"):
            verb()
    assert execs == [] and asked(fake) == []


@pytest.mark.security
def test_a_copied_tag_does_not_make_another_users_job_the_callers(tmp_path, fake, config):
    user_dir, _ = a_job(tmp_path, fake)
    fake.add_job("42", **slurm_job(uid=4242, user="bob"))  # bob wrote the same comment
    with pytest.raises(Rejected, match=r"not this job of yours"):
        attach.target(user_dir, "42", config)


# --- job attach: the srun it execs ------------------------------------------------------


def test_attach_execs_srun_into_the_jobs_allocation_on_the_ranks_node(
    tmp_path, fake, config, monkeypatch
):
    user_dir, job_dir = a_job(tmp_path, fake)
    execs = []
    monkeypatch.setattr(attach.os, "execvp", lambda file, argv: execs.append((file, argv)))
    command = ["python3", "-c", "print('a b'); import os", "$HOME; rm -rf /", "--rank", "9"]
    attach.attach(user_dir, "42", config, 1, command, False)
    assert execs == [
        (
            "srun",
            [
                "srun",
                "--jobid=42",
                "--overlap",
                "--quiet",
                "--nodes=1",
                "--ntasks=1",
                "--nodelist=n3",
                f"--chdir={job_dir}",
                sys.executable,
                "-I",
                "-m",
                "tacc_agent",
                "enter",
                str(job_dir),
                "--rank",
                "1",
                "--",
                *command,
            ],
        )
    ]


def test_attach_with_a_pty_and_no_command_asks_srun_for_one_and_a_shell(
    tmp_path, fake, config, monkeypatch
):
    user_dir, job_dir = a_job(tmp_path, fake)
    execs = []
    monkeypatch.setattr(attach.os, "execvp", lambda file, argv: execs.append(argv))
    attach.attach(user_dir, "42", config, 0, [], True)
    argv = execs[0]
    assert "--pty" in argv and argv.index("--pty") < argv.index("enter")
    assert "--nodelist=n2" in argv and "--" not in argv
    assert argv[-4:] == ["enter", str(job_dir), "--rank", "0"]


@pytest.mark.bad_input
def test_attach_to_a_rank_the_job_lacks_starts_nothing(tmp_path, fake, config, monkeypatch):
    user_dir, _ = a_job(tmp_path, fake)
    execs = []
    monkeypatch.setattr(attach.os, "execvp", lambda *a: execs.append(a))
    with pytest.raises(Rejected, match=r"runs on 2 nodes"):
        attach.attach(user_dir, "42", config, 5, [], False)
    assert execs == []


def test_attach_without_srun_is_a_clear_cluster_error(tmp_path, fake, config, monkeypatch):
    user_dir, _ = a_job(tmp_path, fake)

    def missing(*_a):
        raise FileNotFoundError("srun")

    monkeypatch.setattr(attach.os, "execvp", missing)
    with pytest.raises(AgentError, match=r"srun not found"):
        attach.attach(user_dir, "42", config, 0, [], False)


# --- enter: on the node -----------------------------------------------------------------


class Exec:
    def __init__(self) -> None:
        self.file, self.argv, self.env, self.cwd = "", [], {}, ""

    def __call__(self, file: str, argv: list[str], env: dict[str, str]) -> None:
        self.file, self.argv, self.env, self.cwd = file, argv, env, os.getcwd()


@pytest.fixture
def caught_exec(monkeypatch) -> Exec:
    caught = Exec()
    monkeypatch.setattr(attach.os, "execvpe", caught)
    monkeypatch.chdir(os.getcwd())  # enter changes directory: put it back after
    return caught


def test_enter_execs_the_command_in_the_jobs_environment_and_code_dir(
    tmp_path, fake, config, caught_exec
):
    task = {**TASK, "environment": {"env": {"LR": "0.1"}}}
    _, job_dir = a_job(tmp_path, fake, task=task)
    venv = tmp_path / "envs" / "abc"
    (venv / "bin").mkdir(parents=True)
    envcache.record_for_job(job_dir, {"path": str(venv), "digest": "abc"})
    assert attach.enter(job_dir, 1, ["python3", "-c", "x = 'a b'"], config) == 0
    assert caught_exec.argv == ["python3", "-c", "x = 'a b'"]
    assert caught_exec.cwd == str(job_dir / "code")
    env = caught_exec.env
    assert env["TACC_NODE_RANK"] == "1" and env["LR"] == "0.1"
    assert env["TACC_JOB_DIR"] == str(job_dir) and env["VIRTUAL_ENV"] == str(venv)
    assert env["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert not any(name.startswith("SSH_") for name in env)


def test_enter_without_a_command_starts_the_users_shell(
    tmp_path, fake, config, caught_exec, monkeypatch
):
    _, job_dir = a_job(tmp_path, fake)
    monkeypatch.setattr(attach, "on_terminal", lambda: True)
    attach.enter(job_dir, 0, [], config)
    assert caught_exec.argv in (["bash", "-i"], ["sh", "-i"])
    monkeypatch.setattr(attach, "on_terminal", lambda: False)  # no PTY: commands piped in
    attach.enter(job_dir, 0, [], config)
    assert caught_exec.argv in (["bash"], ["sh"])


def test_enter_falls_back_to_sh_where_there_is_no_bash(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert attach.shell_argv(str(bin_dir)) == ["sh", "-i"]
    root = tmp_path / "rootfs"
    (root / "usr" / "bin").mkdir(parents=True)
    assert attach.shell_argv("/usr/bin:/bin", root) == ["sh", "-i"]
    (root / "usr" / "bin" / "bash").symlink_to("/nonexistent/on/the/host/bash")
    assert attach.shell_argv("/usr/bin:/bin", root) == ["bash", "-i"]


@pytest.mark.bad_input
def test_enter_a_command_not_found_is_one_line_and_127(tmp_path, fake, config, caught_exec, capsys):
    _, job_dir = a_job(tmp_path, fake)
    assert attach.enter(job_dir, 0, ["no-such-command-anywhere"], config) == 127
    assert capsys.readouterr().err == "tacc: no-such-command-anywhere: command not found\n"
    assert caught_exec.argv == []
    plain = tmp_path / "not-executable"
    plain.write_text("x")
    assert attach.enter(job_dir, 0, [str(plain)], config) == 126


def test_enter_runs_the_command_inside_the_jobs_container(
    tmp_path, fake, config, caught_exec, monkeypatch
):
    _, job_dir = a_job(tmp_path, fake)
    rootfs = tmp_path / "rootfs"
    (rootfs / "usr" / "bin").mkdir(parents=True)
    (rootfs / "usr" / "bin" / "python3").touch()
    wrapped = []

    class Container:
        def __init__(self) -> None:
            self.rootfs, self.env, self.binds = rootfs, {"PATH": "/usr/bin:/bin"}, []

        def wrap(self, argv):
            wrapped.append(list(argv))
            return ["sh", "-c", 'exec "$@"', "ch-run", *argv]

    monkeypatch.setattr(attach.execute, "job_container", lambda task, d, c: Container())
    monkeypatch.setattr(attach, "on_terminal", lambda: True)
    assert attach.enter(job_dir, 0, ["python3", "train.py"], config) == 0
    assert wrapped[-1] == ["python3", "train.py"]
    assert caught_exec.argv[-2:] == ["python3", "train.py"]
    assert caught_exec.env.get("USER")  # ch-run wants $USER
    attach.enter(job_dir, 0, [], config)
    assert wrapped[-1] == ["sh", "-i"]  # the image has no bash
    assert attach.enter(job_dir, 0, ["nvcc"], config) == 127  # not in the image


@pytest.mark.security
def test_enter_refuses_a_directory_that_is_not_a_job_of_the_callers(tmp_path, config, caught_exec):
    with pytest.raises(Rejected, match=r"not a job directory"):
        attach.enter(tmp_path / "nothing-here", 0, [], config)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Rejected, match=r"not a job directory: .*instruction"):
        attach.enter(empty, 0, [], config)
    if os.getuid() != 0 and Path("/").stat().st_uid != os.getuid():
        with pytest.raises(Rejected, match=r"not a job directory of yours"):
            attach.enter(Path("/"), 0, [], config)
    assert caught_exec.argv == []


# --- job stop-on-disconnect -------------------------------------------------------------


class Stdin(io.RawIOBase):
    """A client's stdin that ends when `close_it` is set."""

    def __init__(self) -> None:
        self.close_it = threading.Event()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self.close_it.wait()
        return 0


def run_watch(user_dir, config, stdin) -> tuple[list[int], threading.Thread]:
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            attach.stop_on_disconnect(user_dir, "42", config, stdin, poll_seconds=0.05)
        )
    )
    return result, thread


def lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_stop_on_disconnect_cancels_the_job_when_stdin_ends(
    tmp_path, fake, config, capsys, monkeypatch
):
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)  # not the main thread
    user_dir, job_dir = a_job(tmp_path, fake)
    stdin = Stdin()
    result, thread = run_watch(user_dir, config, stdin)
    thread.start()
    time.sleep(0.3)
    assert asked(fake) == []  # watching, the job left alone
    stdin.close_it.set()
    thread.join(10)
    assert result == [0]
    assert ["scancel", "42"] in fake.calls
    assert records.last_state(job_dir) == "CANCELLED"
    assert lines(capsys) == [
        {"job_id": "42", "state": "WATCHING"},
        {"job_id": "42", "state": "CANCELLED", "cancelled": True},
    ]


def test_stop_on_disconnect_reports_a_job_that_ends_by_itself(
    tmp_path, fake, config, capsys, monkeypatch
):
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, job_dir = a_job(tmp_path, fake)
    stdin = Stdin()
    result, thread = run_watch(user_dir, config, stdin)
    thread.start()
    time.sleep(0.2)
    records.add_event(job_dir, "COMPLETED", exit_code=0)
    thread.join(10)
    stdin.close_it.set()
    assert result == [0]
    assert not any(call[0] == "scancel" for call in fake.calls)
    assert lines(capsys) == [
        {"job_id": "42", "state": "WATCHING"},
        {"job_id": "42", "state": "COMPLETED"},
    ]


def test_stop_on_disconnect_cancels_on_sighup(tmp_path, fake, config, capsys):
    """In the main thread, as the verb runs: the handler ends the watch."""
    user_dir, job_dir = a_job(tmp_path, fake)
    stdin = Stdin()
    before = {n: attach.signal.getsignal(n) for n in attach.DISCONNECT_SIGNALS}
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), attach.signal.SIGHUP))
    timer.start()
    try:
        assert attach.stop_on_disconnect(user_dir, "42", config, stdin, poll_seconds=0.05) == 0
    finally:
        stdin.close_it.set()
        for number, handler in before.items():
            attach.signal.signal(number, handler)
    assert records.last_state(job_dir) == "CANCELLED"
    assert lines(capsys)[-1]["state"] == "CANCELLED"


@pytest.mark.bad_input
def test_stop_on_disconnect_refuses_a_job_that_ended(tmp_path, fake, config):
    user_dir, _ = a_job(tmp_path, fake, state="COMPLETED")
    with pytest.raises(Rejected, match=r"job 42 is COMPLETED"):
        attach.stop_on_disconnect(user_dir, "42", config, io.BytesIO(b""))


def test_stop_on_disconnect_watches_a_queued_job_too(tmp_path, fake, config, capsys, monkeypatch):
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, _ = a_job(tmp_path, fake, state="QUEUED")
    assert attach.stop_on_disconnect(user_dir, "42", config, io.BytesIO(b""), 0.05) == 0
    assert lines(capsys)[-1] == {"job_id": "42", "state": "CANCELLED", "cancelled": True}


def test_the_cancel_on_disconnect_is_jobs_cancel(monkeypatch, tmp_path, fake, config):
    """The same path as `tcloud cancel` (records the owner's cancel, then scancel)."""
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, _ = a_job(tmp_path, fake)
    called = []
    real = jobs.cancel
    monkeypatch.setattr(jobs, "cancel", lambda *a: called.append(a[1]) or real(*a))
    attach.stop_on_disconnect(user_dir, "42", config, io.BytesIO(b""), 0.05)
    assert called == [["42"]]


@pytest.mark.fault
def test_stop_on_disconnect_keeps_watching_while_slurm_does_not_answer(
    tmp_path, fake, config, capsys, monkeypatch
):
    """A slow or restarting controller between polls: the watch goes on, and the
    client's disconnect still cancels the job."""
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, job_dir = a_job(tmp_path, fake)
    asked = []

    def silent(*_a, **_k):
        asked.append(1)
        raise AgentError("scontrol did not answer within 5 s")

    monkeypatch.setattr(jobs, "own_info", silent)
    stdin = Stdin()
    result, thread = run_watch(user_dir, config, stdin)
    thread.start()
    time.sleep(0.3)
    assert asked and thread.is_alive()
    stdin.close_it.set()
    thread.join(10)
    assert result == [0] and records.last_state(job_dir) == "CANCELLED"
    assert lines(capsys)[-1]["state"] == "CANCELLED"


# --- the heartbeat: a dropped connection, not only a closed stdin ----------------------


class Beating(io.RawIOBase):
    """A client's stdin that sends a byte every `every` s until `stop_beating` is set, then
    goes silent without ending (a laptop that vanished: no FIN, no EOF)."""

    def __init__(self, every: float = 0.05) -> None:
        self.every = every
        self.stop_beating = threading.Event()
        self.closed_for_good = threading.Event()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.stop_beating.wait(self.every):
            self.closed_for_good.wait()  # silent from now on
            return 0
        buffer[0:1] = b"\n"
        return 1


def watch_with_heartbeat(user_dir, config, stdin, timeout) -> tuple[list[int], threading.Thread]:
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            attach.stop_on_disconnect(
                user_dir, "42", config, stdin, poll_seconds=0.05, heartbeat_timeout=timeout
            )
        )
    )
    return result, thread


@pytest.mark.fault
def test_stop_on_disconnect_cancels_when_the_heartbeat_stops_though_stdin_never_ends(
    tmp_path, fake, config, capsys, monkeypatch
):
    """sshd does not probe clients (ClientAliveInterval 0): a vanished laptop is silence,
    not EOF. Heartbeats keep the job; heartbeat_timeout of silence cancels it."""
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, job_dir = a_job(tmp_path, fake)
    stdin = Beating()
    result, thread = watch_with_heartbeat(user_dir, config, stdin, timeout=0.5)
    thread.start()
    try:
        time.sleep(1.2)  # longer than the timeout: the heartbeats keep it watching
        assert thread.is_alive() and not any(c[0] == "scancel" for c in fake.calls)
        stdin.stop_beating.set()
        thread.join(10)
    finally:
        stdin.closed_for_good.set()
    assert result == [0] and ["scancel", "42"] in fake.calls
    assert records.last_state(job_dir) == "CANCELLED"
    assert lines(capsys)[-1] == {"job_id": "42", "state": "CANCELLED", "cancelled": True}


def test_the_heartbeat_timeout_is_30_seconds():
    assert attach.HEARTBEAT_TIMEOUT_SECONDS == 30


# --- the disconnect's cancel, tried again -----------------------------------------------


@pytest.mark.fault
def test_the_disconnect_cancel_is_tried_again_when_slurm_does_not_answer(
    tmp_path, fake, config, capsys, monkeypatch
):
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, job_dir = a_job(tmp_path, fake)
    real, tries = jobs.cancel, []

    def fails_once(*args):
        tries.append(1)
        if len(tries) == 1:
            raise AgentError("scontrol did not answer within 5 s")
        return real(*args)

    monkeypatch.setattr(jobs, "cancel", fails_once)
    assert (
        attach.stop_on_disconnect(
            user_dir, "42", config, io.BytesIO(b""), 0.05, retry_delays=(0.01, 0.02)
        )
        == 0
    )
    assert len(tries) == 2
    assert fake.calls.count(["scancel", "42"]) == 1
    assert records.last_state(job_dir) == "CANCELLED"
    assert lines(capsys)[-1] == {"job_id": "42", "state": "CANCELLED", "cancelled": True}


@pytest.mark.fault
def test_a_cancel_recorded_whose_scancel_failed_is_scancelled_on_the_next_try(
    tmp_path, fake, config, capsys, monkeypatch
):
    """jobs.cancel records CANCELLED before scancel: a failed scancel leaves the record
    ended and the job running, so the next try scancels it directly."""
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, _ = a_job(tmp_path, fake)
    real, failed = fake.command, []

    def scancel_fails_once(argv, *args, **kwargs):
        if argv[0] == "scancel" and not failed:
            failed.append(argv)
            raise AgentError("scancel: Unable to contact slurm controller")
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(slurm.run, "command", scancel_fails_once)
    assert (
        attach.stop_on_disconnect(
            user_dir, "42", config, io.BytesIO(b""), 0.05, retry_delays=(0.01, 0.02)
        )
        == 0
    )
    assert failed and fake.calls.count(["scancel", "42"]) == 1
    assert fake.jobs["42"]["state"] == "CANCELLED"
    assert lines(capsys)[-1] == {"job_id": "42", "state": "CANCELLED", "cancelled": True}


@pytest.mark.fault
def test_the_disconnect_cancel_gives_up_after_its_retries_with_the_error(
    tmp_path, fake, config, monkeypatch
):
    monkeypatch.setattr(attach.signal, "signal", lambda *_a: None)
    user_dir, _ = a_job(tmp_path, fake)

    def never(*_a):
        raise AgentError("scontrol did not answer within 5 s")

    tries = []
    monkeypatch.setattr(jobs, "cancel", lambda *_a: tries.append(1) or never())
    with pytest.raises(AgentError, match="did not answer"):
        attach.stop_on_disconnect(
            user_dir, "42", config, io.BytesIO(b""), 0.05, retry_delays=(0.01, 0.02, 0.04)
        )
    assert len(tries) == 4
    delays = attach.CANCEL_RETRY_DELAYS  # backoff, about 3 minutes in all
    assert list(delays) == sorted(delays) and 120 <= sum(delays) <= 240
