"""tcloud's side of `tacc-agent session` (tcloud.transport.agent): one agent process per SSH
client whatever the verbs, shared safely between threads, `call_streaming` for a verb
that reads a stream, a lost session as a clear error (and a new one on the next call),
and the TCLOUD_TIMING step lines. The SSH client is a harness that runs the real
`tacc-agent` here behind paramiko's channel-file interface (no sshd)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import paramiko
import pytest

from tacc_contract import protocol, verbs
from tcloud import timing
from tcloud.config import Cluster
from tcloud.errors import EXIT_CLUSTER, EXIT_INVALID_TASK, AgentFailure, TcloudError
from tcloud.jobs import verbs as jobs
from tcloud.transport import agent, ssh
from tests.unit.agent_jobs import agent_env


class LocalChannel:
    """paramiko's channel and its three files, over a local process's pipes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        self.channel = self

    def sendall(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def shutdown_write(self) -> None:
        self.process.stdin.close()

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError):  # paramiko's close does not raise
            self.process.stdin.close()

    def readline(self) -> bytes:
        return self.process.stdout.readline()

    def read(self) -> bytes:
        return self.process.stdout.read()

    def recv_exit_status(self) -> int:
        return self.process.wait(timeout=60)

    def exit_status_ready(self) -> bool:
        return self.process.poll() is not None

    def end(self) -> None:
        self.close()
        self.process.wait(timeout=60)
        self.process.stdout.close()
        self.process.stderr.close()


class Stderr:
    def __init__(self, channel: LocalChannel) -> None:
        self.channel = channel

    def read(self) -> bytes:
        return self.channel.process.stderr.read()


class LocalClient:
    """An SSH client whose commands run here: `tacc-agent` is the real agent."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.channels: list[LocalChannel] = []

    def exec_command(self, line: str):
        argv = shlex.split(line)
        assert argv[0] == "tacc-agent", argv
        self.channels.append(
            LocalChannel([sys.executable, "-m", "tacc_agent", *argv[1:]], self.env)
        )
        return self.channels[-1], self.channels[-1], Stderr(self.channels[-1])

    def close(self) -> None:
        for channel in self.channels:
            channel.end()


@pytest.fixture
def workspace(tmp_path) -> Path:
    (tmp_path / "workspace").mkdir()
    return tmp_path / "workspace"


@pytest.fixture
def client(tmp_path, workspace):
    local = LocalClient(agent_env(tmp_path))
    yield local
    local.close()


def test_every_verb_of_a_client_goes_through_one_agent_process(client, workspace):
    assert jobs.whoami(client, None)["userdir"].startswith(str(workspace))
    assert jobs.whoami(client, str(workspace / "own"))["userdir"] == str(workspace / "own")
    assert jobs.environments(client, str(workspace / "own")) == []
    with pytest.raises(TcloudError, match="no job 99 of yours") as caught:
        jobs.status(client, None, "99")
    assert caught.value.exit_code == EXIT_CLUSTER
    assert agent.call(client, verbs.STORE, None, b'{"op": "missing", "blobs": []}')
    assert agent.handshake(client).protocol == protocol.PROTOCOL_VERSION
    assert len(client.channels) == 1  # one `tacc-agent session`, started once


def test_a_refused_request_keeps_its_exit_code(client):
    with pytest.raises(AgentFailure, match="expected one JSON object") as caught:
        agent.call(client, verbs.STORE, None, b"[]")
    assert caught.value.exit_code == EXIT_INVALID_TASK
    assert jobs.whoami(client, None)  # the session goes on
    assert len(client.channels) == 1


def test_threads_sharing_a_client_each_get_their_own_answer(client, workspace):
    answers: dict[int, str] = {}

    def ask(n: int) -> None:
        for _ in range(5):
            answers[n] = jobs.whoami(client, str(workspace / f"u{n}"))["userdir"]

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {n: str(workspace / f"u{n}") for n in range(8)}
    assert len(client.channels) == 1


@pytest.mark.fault
def test_a_lost_session_is_a_clear_error_and_the_next_call_opens_another(client):
    jobs.whoami(client, None)
    client.channels[0].process.kill()
    client.channels[0].process.wait(timeout=60)
    with pytest.raises(
        TcloudError, match="connection to the cluster's tacc-agent session was lost"
    ):
        jobs.whoami(client, None)
    assert jobs.whoami(client, None)["user"]
    assert len(client.channels) == 2


@pytest.mark.fault
def test_a_connection_that_cannot_start_the_agent_is_a_clear_error():
    class Dropped:
        def exec_command(self, line: str):
            raise paramiko.SSHException("SSH session not active")

    with pytest.raises(
        TcloudError, match=r"^cannot start tacc-agent on the login node: SSH session"
    ):
        jobs.whoami(Dropped(), None)


# --- call_streaming: `store receive` -----------------------------------------------------


def blob(data: bytes) -> str:
    return protocol.blob_name(hashlib.sha256(data).hexdigest(), 0o644)


def stream_of(name: str, upload: str, data: bytes):
    def produce(write) -> None:
        write(json.dumps({"blob": name, "upload": upload, "offset": 0, "size": len(data)}).encode())
        write(b"\n")
        for start in range(0, len(data), 1000):  # written in pieces, as a real stream is
            write(data[start : start + 1000])
        write(b'{"end": true}\n')

    return produce


def test_call_streaming_sends_the_stream_between_request_and_answer(client, workspace):
    data = b"streamed bytes\n" * 500
    name = blob(data)
    missing = agent.call(
        client, verbs.STORE, None, json.dumps(protocol.missing_request([name])).encode()
    )
    produce = stream_of(name, missing["uploads"][name], data)
    answer = agent.call_streaming(client, verbs.STORE_RECEIVE, None, produce)
    assert isinstance(answer, dict)
    user_dir = Path(missing["userdir"])
    assert (user_dir / "store" / name).read_bytes() == data
    after = agent.call(
        client, verbs.STORE, None, json.dumps(protocol.missing_request([name])).encode()
    )
    assert after["missing"] == []
    assert len(client.channels) == 1


@pytest.mark.bad_input
def test_a_refused_stream_is_the_agents_error_then_a_new_session(client):
    def produce(write) -> None:
        write(b"not a header\n" + b"x" * 100_000)

    with pytest.raises(AgentFailure, match="upload stream") as caught:
        agent.call_streaming(client, verbs.STORE_RECEIVE, None, produce)
    assert caught.value.exit_code == EXIT_INVALID_TASK
    assert jobs.whoami(client, None)["user"]
    assert len(client.channels) == 2  # the refused stream's rest could not be read as requests


@pytest.mark.fault
def test_a_stream_that_fails_here_closes_the_session_and_its_error_goes_on(client):
    def produce(write) -> None:
        write(b'{"blob": ')
        raise ValueError("the local file changed")

    with pytest.raises(ValueError, match="the local file changed"):
        agent.call_streaming(client, verbs.STORE_RECEIVE, None, produce)
    assert jobs.whoami(client, None)["user"]
    assert len(client.channels) == 2


# --- TCLOUD_TIMING -----------------------------------------------------------------------


def steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_timing_lines_name_the_session_and_each_verb(client, tmp_path, monkeypatch):
    log = tmp_path / "timing.jsonl"
    monkeypatch.setenv(timing.ENVIRONMENT, str(log))
    jobs.whoami(client, None)
    jobs.environments(client, None)
    recorded = steps(log)
    assert [s["step"] for s in recorded] == ["session", "whoami", "env"]
    assert all(s["start"] <= s["end"] for s in recorded)
    assert recorded[0]["end"] <= recorded[1]["start"]


def test_no_timing_file_without_the_variable(client, tmp_path, monkeypatch):
    monkeypatch.delenv(timing.ENVIRONMENT, raising=False)
    monkeypatch.chdir(tmp_path)
    jobs.whoami(client, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.yaml", "workspace"]


def test_the_ssh_connect_is_a_timed_step(tmp_path, monkeypatch):
    log = tmp_path / "timing.jsonl"
    monkeypatch.setenv(timing.ENVIRONMENT, str(log))
    monkeypatch.setenv("HOME", str(tmp_path))

    class Closed:
        def close(self) -> None:
            pass

    monkeypatch.setattr(ssh, "connect", lambda *args, **kwargs: Closed())
    with ssh.session(Cluster(name="lab", host="login.example")):
        pass
    assert [s["step"] for s in steps(log)] == ["connect"]


def test_a_failed_step_is_recorded_too(tmp_path, monkeypatch):
    log = tmp_path / "timing.jsonl"
    monkeypatch.setenv(timing.ENVIRONMENT, str(log))
    with pytest.raises(RuntimeError), timing.step("failing"):
        raise RuntimeError("boom")
    assert [s["step"] for s in steps(log)] == ["failing"]


@pytest.mark.fault
def test_an_interrupted_call_ends_its_session_so_no_answer_goes_to_the_next_call(
    client, workspace, monkeypatch
):
    """Ctrl-C after the request is out: its answer is never read as the next call's."""
    jobs.whoami(client, str(workspace / "first"))
    session = agent.session(client)
    real_readline = session.stdout.readline
    calls = {"n": 0}

    def interrupted_once():
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return real_readline()

    monkeypatch.setattr(session.stdout, "readline", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        jobs.whoami(client, str(workspace / "interrupted"))
    assert jobs.whoami(client, str(workspace / "next"))["userdir"] == str(workspace / "next")
    assert len(client.channels) == 2


@pytest.mark.fault
def test_a_local_read_error_mid_stream_is_an_error_not_a_hang(client):
    def produce(write) -> None:
        write(b'{"blob": "' + b"a" * 64 + b'-644", "upload": "x", "offset": 0, "size": 10}\n')
        write(b"12345")
        raise OSError(5, "Input/output error")

    with pytest.raises(OSError, match="Input/output error"):
        agent.call_streaming(client, verbs.STORE_RECEIVE, None, produce)
    assert jobs.whoami(client, None)["user"]
    assert len(client.channels) == 2


def test_a_timing_file_that_cannot_be_written_costs_the_command_nothing(
    client, tmp_path, monkeypatch
):
    monkeypatch.setenv(timing.ENVIRONMENT, str(tmp_path / "no" / "such" / "dir" / "t.jsonl"))
    assert jobs.whoami(client, None)["user"]
