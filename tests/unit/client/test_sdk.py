"""tcloud's Python SDK (tcloud.sdk, `from tcloud import Cluster`), with the cluster faked
at the SSH boundary only: `tcloud.sdk.session` yields a client whose commands run the
real `tacc-agent` here (its store, jobs and logs; Slurm is tests/unit/fake_slurm.py)
and whose SFTP is this machine's files. Everything above SSH is the SDK's own code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import paramiko
import pytest
import yaml

from tacc_agent.tasks.jobs import records
from tcloud import Cluster, Job, JobTimeout, cli, dry_run, sdk, validate
from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE, TaskFileError, TcloudError, UsageError
from tests.unit.agent_jobs import agent_env
from tests.unit.fake_slurm import FakeSlurmOnPath

TASK = {"name": "t", "resources": {"nodes": 1, "mem": "100M", "time": "5"}, "run": ["echo hi"]}


class LocalCommand:
    """One `exec_command`: run when its input is complete, as paramiko's three files."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv, self.env, self.input = argv, env, b""
        self.done: subprocess.CompletedProcess | None = None
        self.channel = self

    def write(self, data: bytes) -> None:
        self.input += data

    def shutdown_write(self) -> None:
        self.result()

    def result(self) -> subprocess.CompletedProcess:
        if self.done is None:
            self.done = subprocess.run(
                self.argv, input=self.input, capture_output=True, env=self.env, timeout=60
            )
        return self.done

    def recv_exit_status(self) -> int:
        return self.result().returncode


class Output:
    def __init__(self, command: LocalCommand, stream: str) -> None:
        self.command, self.stream, self.channel = command, stream, command

    def read(self) -> bytes:
        return getattr(self.command.result(), self.stream)


class LocalChannel:
    """A session channel (`tcloud logs`): the command's output as it comes."""

    def __init__(self, client: FakeSSH) -> None:
        self.client, self.process = client, None

    def exec_command(self, cmdline: str) -> None:
        self.process = subprocess.Popen(
            self.client.local_argv(cmdline),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.client.env,
        )

    def recv(self, size: int) -> bytes:
        return self.process.stdout.read1(size)

    def recv_exit_status(self) -> int:
        return self.process.wait(timeout=60)

    def recv_stderr(self, size: int) -> bytes:
        return self.process.stderr.read(size)

    def close(self) -> None:
        self.client.closed_channels += 1
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=60)
        self.process.stdout.close()
        self.process.stderr.close()

    def get_transport(self):  # paramiko's client.get_transport().open_session()
        return self

    def open_session(self) -> LocalChannel:
        return self


class LocalSession:
    """`tacc-agent session`: the real agent, running while the connection lasts, as
    paramiko's three channel files; each request line sent is recorded as a command."""

    def __init__(self, client: FakeSSH, argv: list[str]) -> None:
        self.client, self.channel = client, self
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=client.env,
        )
        self.stderr = Stderr(self)

    def sendall(self, data: bytes) -> None:
        with contextlib.suppress(ValueError):  # a request line, not a stream's bytes
            request = json.loads(data)
            if isinstance(request, dict) and "verb" in request:
                self.client.commands.append(["tacc-agent", *request["verb"]])
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def readline(self) -> bytes:
        return self.process.stdout.readline()

    def read(self) -> bytes:
        return self.process.stdout.read()

    def shutdown_write(self) -> None:
        self.process.stdin.close()

    def close(self) -> None:
        if not self.process.stdin.closed:
            self.process.stdin.close()  # EOF: the session ends
        self.process.wait(timeout=60)
        self.process.stdout.close()
        self.process.stderr.close()

    def recv_exit_status(self) -> int:
        return self.process.wait(timeout=60)

    def exit_status_ready(self) -> bool:
        return self.process.poll() is not None


class Stderr:
    def __init__(self, session: LocalSession) -> None:
        self.channel = session

    def read(self) -> bytes:
        return self.channel.process.stderr.read()


class LocalSFTP:
    """The SFTP calls tcloud makes, onto this machine's files."""

    class Handle(io.FileIO):
        def set_pipelined(self, _on: bool) -> None:
            pass

    def open(self, path: str, mode: str):
        return self.Handle(path, mode.replace("b", ""))

    def normalize(self, path: str) -> str:
        return os.path.abspath(path)

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        os.mkdir(path, mode)

    def put(self, source: str, target: str) -> None:
        Path(target).write_bytes(Path(source).read_bytes())

    def get(self, source: str, target: str) -> None:
        Path(target).write_bytes(Path(source).read_bytes())

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(old, new)

    rename = posix_rename

    def remove(self, path: str) -> None:
        os.remove(path)

    def listdir_attr(self, path: str) -> list[paramiko.SFTPAttributes]:
        return [
            paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(path, name)), name)
            for name in sorted(os.listdir(path))
        ]

    def close(self) -> None:
        pass


class FakeSSH:
    """What tcloud uses of a paramiko.SSHClient, run on this machine: `tacc-agent` is the
    real agent (`python -m tacc_agent`) with the test's settings and fake Slurm."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env, self.commands, self.closed_channels = env, [], 0
        self.agent_sessions: list[LocalSession] = []

    def local_argv(self, cmdline: str) -> list[str]:
        argv = shlex.split(cmdline)
        self.commands.append(argv)
        assert argv[0] == "tacc-agent", argv
        return [sys.executable, "-m", "tacc_agent", *argv[1:]]

    def exec_command(self, cmdline: str):
        argv = self.local_argv(cmdline)
        if argv[3:] == ["session"]:
            self.agent_sessions.append(LocalSession(self, argv))
            return self.agent_sessions[-1], self.agent_sessions[-1], self.agent_sessions[-1].stderr
        command = LocalCommand(argv, self.env)
        return command, Output(command, "stdout"), Output(command, "stderr")

    def close(self) -> None:
        """As paramiko's close: the channels end, and with them the agent's session."""
        for agent_session in self.agent_sessions:
            agent_session.close()

    def get_transport(self) -> LocalChannel:
        return LocalChannel(self)

    def open_sftp(self) -> LocalSFTP:
        return LocalSFTP()


class FakeCluster:
    """A configured cluster `fake` whose SSH sessions are FakeSSH clients."""

    def __init__(self, tmp: Path, monkeypatch) -> None:
        self.slurm = FakeSlurmOnPath(tmp)
        self.user_dir = tmp / "workspace" / "alice"
        self.user_dir.mkdir(parents=True, mode=0o700)
        self.env = agent_env(tmp) | self.slurm.env()
        self.sessions: list[FakeSSH] = []
        settings = {"host": "cluster.invalid", "user": "alice", "userdir": str(self.user_dir)}
        config = tmp / "tcloud-config.yaml"
        config.write_text(yaml.safe_dump({"current": "fake", "clusters": {"fake": settings}}))
        monkeypatch.setenv("TCLOUD_CONFIG", str(config))
        monkeypatch.setenv("TCLOUD_CACHE_DIR", str(tmp / "cache"))
        monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
        monkeypatch.setattr(sdk, "session", self.session)

    @contextmanager
    def session(self, settings):
        assert settings.name == "fake"
        client = FakeSSH(self.env)
        self.sessions.append(client)
        try:
            yield client
        finally:
            client.close()

    def verbs(self) -> list[list[str]]:
        """Every agent verb run, without `tacc-agent --userdir DIR`."""
        return [
            argv[3:] if "--userdir" in argv else argv[1:]
            for s in self.sessions
            for argv in s.commands
        ]

    def finish(self, job: Job, state: str = "COMPLETED", exit_code: int = 0) -> Path:
        """The job ends as its batch step would record it; its job directory."""
        workdir = Path(job.status()["workdir"])
        records.add_event(workdir, state, exit_code=exit_code)
        return workdir


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    return FakeCluster(tmp_path, monkeypatch)


def project(root: Path, task: dict | None = None, files: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tcloud.yaml").write_text(yaml.safe_dump(task or TASK))
    for name, text in (files or {"train.py": "print('hi')\n"}).items():
        (root / name).write_text(text)
    return root


# --- jobs: submit, status, ps, logs, wait, download, cancel ------------------------------


def test_submit_a_task_directory_then_status_ps_logs_wait_and_download(fake, tmp_path):
    with Cluster() as cluster:
        job = cluster.submit(project(tmp_path / "p"))
        assert job.submission.name == "t" and job.submission.blobs_sent == 2
        assert job.submission.partition == "batch" and Path(job.submission.workdir).is_dir()
        assert job.status()["state"] == "QUEUED"
        assert [row["job"] for row in cluster.jobs()] == [job.id]
        workdir = fake.finish(job)
        (workdir / "logs" / "rank-0-n1.log").write_text("hi\nbye\n")
        (workdir / "outputs" / "model.txt").write_text("weights\n")
        assert job.wait(timeout=30, poll=0.1)["state"] == "COMPLETED"
        assert list(job.logs()) == ["[n1:0] hi", "[n1:0] bye"]
        assert list(job.logs(tail=1)) == ["[n1:0] bye"]
        assert job.download(tmp_path / "got") >= 2
    assert (tmp_path / "got/outputs/model.txt").read_text() == "weights\n"
    assert (tmp_path / "got/logs/rank-0-n1.log").is_file()
    assert len(fake.sessions) == 1  # one SSH session for everything above


def test_a_dict_task_uploads_its_base_dir_and_can_be_cancelled(fake, tmp_path):
    code = project(tmp_path / "code", files={"train.py": "print(1)\n", "data.csv": "1,2\n"})
    (code / "tcloud.yaml").unlink()
    with Cluster("fake") as cluster:
        job = cluster.submit({**TASK, "run": ["python3 train.py"]}, base_dir=code)
        manifest = (Path(job.submission.workdir) / "code").iterdir()
        assert sorted(p.name for p in manifest) == ["data.csv", "train.py"]
        assert job.cancel() == {"job_id": job.id, "cancelled": True, "state": "CANCELLED"}
        assert job.wait(timeout=30, poll=0.1)["state"] == "CANCELLED"


def test_wait_times_out_on_a_job_that_does_not_end(fake, tmp_path):
    with Cluster() as cluster:
        job = cluster.submit(TASK, base_dir=project(tmp_path / "p"))
        with pytest.raises(JobTimeout, match=f"job {job.id} is still QUEUED after 0.2 s"):
            job.wait(timeout=0.2, poll=0.05)


def test_a_sweep_is_submitted_with_its_parameters_as_one_job(fake, tmp_path):
    with Cluster() as cluster:
        job = cluster.sweep(project(tmp_path / "p"), {"LR": ["0.1", "0.01"]}, parallel=1)
        assert job.submission.plugins == {"sweep": "job array 0-1%1 (2 trials)"}
    array = next(call for call in fake.slurm.calls("sbatch"))
    assert "--array=0-1%1" in array, array


def test_a_sampled_sweep_draws_its_trials_from_ranges_with_a_seed(fake, tmp_path):
    ranges = {"LR": {"loguniform": [1.0e-4, 1.0e-1]}, "OPT": ["adam", "sgd"]}
    with Cluster() as cluster:
        job = cluster.sweep(project(tmp_path / "p"), ranges, samples=4, sampler="sobol", seed=3)
        assert job.submission.plugins == {"sweep": "job array 0-3 (4 trials)"}
        trials = [t["parameters"] for t in job.status()["trials"]]
    assert len(trials) == 4 and all(1.0e-4 <= float(t["LR"]) <= 1.0e-1 for t in trials)
    array = next(call for call in fake.slurm.calls("sbatch"))
    assert "--array=0-3" in array, array


def test_a_sweep_task_needs_sweep_true_and_a_plain_task_has_none(fake, tmp_path):
    swept = {**TASK, "sweep": {"parameters": {"LR": ["0.1", "0.01"]}}}
    with Cluster() as cluster:
        with pytest.raises(TaskFileError, match="task: sweep: this task is a sweep of 2 trial"):
            cluster.submit(swept, base_dir=tmp_path)
        with pytest.raises(TaskFileError, match="--sweep given, but the task file has no sweep"):
            cluster.submit(TASK, sweep=True, base_dir=tmp_path)
    assert fake.sessions == []  # refused before connecting


def test_logs_stream_lines_as_an_iterator_and_leaving_early_closes_the_channel(fake, tmp_path):
    with Cluster() as cluster:
        job = cluster.submit(TASK, base_dir=project(tmp_path / "p"))
        workdir = fake.finish(job)
        lines = "".join(f"line {i}\n" for i in range(1000))
        (workdir / "logs" / "rank-0-n1.log").write_text(lines)
        stream = job.logs()
        assert next(stream) == "[n1:0] line 0"
        stream.close()
        assert fake.sessions[0].closed_channels == 1
        assert len(list(job.logs(node=0))) == 1000


def test_an_agent_refusal_is_an_exception_never_an_exit(fake):
    with Cluster() as cluster, pytest.raises(TcloudError, match="no job 999 of yours") as caught:
        cluster.job(999).status()
    assert caught.value.exit_code == EXIT_CLUSTER


def test_files_upload_ls_cat(fake, tmp_path):
    (tmp_path / "notes.txt").write_text("remember\n")
    with Cluster() as cluster:
        assert cluster.upload(tmp_path / "notes.txt") == 1
        assert [row["name"] for row in cluster.ls("files")] == ["notes.txt"]
        assert cluster.cat("files/notes.txt") == b"remember\n"
        assert cluster.home() == str(fake.user_dir)


# --- one SSH session, opened lazily -----------------------------------------------------


def test_the_session_is_opened_on_first_use_reused_and_reopened_after_close(fake):
    cluster = Cluster()
    job = cluster.job("7")
    assert fake.sessions == []  # a handle asks nothing
    cluster.jobs()
    cluster.jobs()
    assert len(fake.sessions) == 1
    assert fake.verbs() == [["session"], ["job", "ps"], ["job", "ps"]]  # one agent a session
    cluster.close()
    with pytest.raises(TcloudError, match="no job 7 of yours"):
        job.status()
    assert len(fake.sessions) == 2
    cluster.close()


# --- usage errors: refused before the cluster, UsageError (exit 2) -----------------------


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c, tmp: c.job("abc"), "not a job id: abc"),
        (lambda c, tmp: c.job("1;rm -rf ~"), "not a job id: 1;rm -rf ~"),
        (lambda c, tmp: c.job(None), "not a job id: None"),
        (lambda c, tmp: c.cancel("12", "$(id)"), "not a job id: $(id)"),
        (lambda c, tmp: c.job(1).download(tmp / "no" / "dir"), "no such directory"),
        (lambda c, tmp: c.job(1).download(tmp / "file"), "exists and is not a directory"),
        (lambda c, tmp: c.job(1).logs(tail=-1), "tail: expected a whole number >= 0"),
        (lambda c, tmp: c.job(1).halt(grace=86400), "grace: expected 0 to 3600 seconds"),
        (lambda c, tmp: c.job(1).halt(grace="5"), "grace: expected 0 to 3600 seconds"),
        (lambda c, tmp: c.job(1).wait(poll=0), "poll: expected seconds > 0"),
        (lambda c, tmp: c.ls("../other"), "is outside your cluster directory"),
        (lambda c, tmp: c.cat("/etc/shadow"), "is outside your cluster directory"),
        (lambda c, tmp: c.upload(tmp / "nothing"), "does not exist"),
        (lambda c, tmp: c.upload(tmp / "file", "../x"), "NAME '../x' is outside"),
        (lambda c, tmp: c.submit(tmp / "nowhere"), "no such file or directory"),
        (lambda c, tmp: c.submit(TASK, base_dir=tmp / "nowhere"), "base_dir"),
        (lambda c, tmp: c.submit(42), "a task is a task file, its directory or a dict"),
    ],
)
def test_usage_errors_are_refused_before_connecting(fake, tmp_path, call, message):
    (tmp_path / "file").write_text("x\n")
    with Cluster() as cluster, pytest.raises(UsageError, match=re.escape(message)) as caught:
        call(cluster, tmp_path)
    assert caught.value.exit_code == EXIT_USAGE
    assert fake.sessions == []


# --- no cluster needed: validate, dry_run ----------------------------------------------


def test_validate_and_dry_run_need_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLOUD_CONFIG", str(tmp_path / "no-config.yaml"))
    code = project(tmp_path / "p")
    assert validate(code).name == "t" and validate(code).source == str(code / "tcloud.yaml")
    plan = dry_run(code)
    assert plan.files == 2 and plan.instruction["task"]["run"] == ["echo hi"]
    assert "--job-name=t" in plan.sbatch
    # The same fields as a dict, with the same directory: the same instruction.
    assert dry_run(dict(TASK), base_dir=code).digest == plan.digest


def test_a_dict_task_is_checked_by_the_schema_and_its_problems_name_the_field(tmp_path):
    with pytest.raises(TaskFileError) as caught:
        validate(
            {"name": "t", "run": ["x"], "resources": {"nodes": 0, "memory": "4G"}},
            base_dir=tmp_path,
        )
    nodes, memory = str(caught.value).splitlines()
    assert nodes == "task: resources.nodes: expected a node count >= 1, or a range like 2-4, got 0"
    assert memory.startswith("task: resources.memory: unknown key (did you mean 'mem'?)")
    with pytest.raises(TaskFileError, match="task: run: missing; expected a list of shell"):
        validate({"name": "t"}, base_dir=tmp_path)
    with pytest.raises(TaskFileError) as missing:
        validate({**TASK, "datasets": [{"name": "d", "local": "./d"}]}, base_dir=tmp_path)
    assert str(missing.value) == f"{tmp_path}/d: datasets.d: local path does not exist"
    with pytest.raises(TaskFileError, match=r"resources\.sbatch\.output: expected an option"):
        dry_run({**TASK, "resources": {"sbatch": {"output": "/tmp/x"}}}, base_dir=tmp_path)


@pytest.mark.bad_input
def test_a_dict_task_without_base_dir_is_a_usage_error_not_an_upload_of_the_cwd(tmp_path):
    """Not the current directory by default: from a notebook or a project root that
    would upload everything under it."""
    with pytest.raises(UsageError, match="a dict task needs base_dir") as caught:
        dry_run(TASK)
    assert caught.value.exit_code == 2


def test_a_dict_tasks_local_paths_are_relative_to_base_dir(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("1\n")
    task = {**TASK, "datasets": [{"name": "d", "local": Path("data")}]}
    manifest = dry_run(task, base_dir=tmp_path).instruction["manifest"]
    assert "datasets/d/a.csv" in manifest


# --- the CLI is a thin layer: it prints what the SDK returns ---------------------------


def test_the_cli_prints_the_sdks_answers(fake, tmp_path):
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["submit", str(project(tmp_path / "p"))]) == 0
    first = out.getvalue().splitlines()[0]
    assert first.startswith("submitted job 100 (t) to partition batch; sent 2 file(s), ")
    with redirect_stdout(out), contextlib.suppress(SystemExit):
        assert cli.main(["cancel", "100"]) == 0
    assert out.getvalue().splitlines()[-1] == "job 100: cancelled"
