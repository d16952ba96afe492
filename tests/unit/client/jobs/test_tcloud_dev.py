"""tcloud dev (tcloud.jobs.dev, Cluster.dev) over a fake cluster: the task submitted as a
session (its own `session:` block, or the defaults, with the flags laid over it), each
state change said until RUNNING, how to connect printed, then its ports forwarded (or
a shell without ports); with stop_on_disconnect a held channel runs `job
stop-on-disconnect` for as long as tcloud runs; Ctrl-C while queued cancels it;
--detach prints and exits 0 and is refused with --stop-on-disconnect."""

from __future__ import annotations

import shlex
import socket
import threading
import time
from pathlib import Path

import pytest

from tcloud import cli, core
from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE, UsageError
from tcloud.jobs import dev, interactive, portforward
from tests.unit.interactive_fakes import (
    TARGET,
    FakeChannel,
    FakeCluster,
    argv_verb,
    cli_run,
    status,
)

TASK = "name: nb\nrun: [jupyter lab --port 8888]\nsession:\n  ports: [8888]\n  idle_timeout: '60'\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def script(argv: list[str]) -> FakeChannel:
    verb = argv_verb(argv)
    if verb[:2] == ["job", "stop-on-disconnect"]:
        return FakeChannel([b'{"job_id": "42", "state": "RUNNING"}\n'], [], 0)
    return FakeChannel()


def held_channels(fake: FakeCluster) -> list:
    """The exec channels other than the forward's own (`job connect`, tcloud.jobs.portforward)."""
    return [c for c in fake.transport.channels if "connect" not in shlex.split(c.command)]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    cluster = FakeCluster(tmp_path, monkeypatch, script)
    states = iter(["PENDING", "PENDING", "RUNNING"])
    cluster.session.answers[("job", "status")] = lambda: (0, status(next(states, "RUNNING")))
    cluster.session.answers[("job", "cancel")] = (
        0,
        [{"job_id": "42", "cancelled": True, "state": "CANCELLED"}],
    )
    cluster.submitted = []

    def submit(self, task, *, base_dir=None, allow_outside=False, sweep=False):
        cluster.submitted.append((task, base_dir))
        return self.job_class(self, "42")

    monkeypatch.setattr(core.Cluster, "submit", submit)
    monkeypatch.setattr(dev.time, "sleep", lambda _s: None)
    return cluster


def project(root: Path, text: str = TASK) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tcloud.yaml").write_text(text)
    return root


def with_session(fake: FakeCluster, **session) -> None:
    fake.answer(("job", "target"), 0, {**TARGET, "session": session})


def test_cluster_dev_lays_the_flags_over_the_tasks_session_block(fake, tmp_path):
    root = project(tmp_path / "p")
    with fake.cluster() as cluster:
        cluster.dev(root, ports=[6006, 8888], idle_timeout="0", stop_on_disconnect=True)
    task, base_dir = fake.submitted[0]
    assert task["session"] == {
        "ports": [8888, 6006],
        "idle_timeout": "0",
        "stop_on_disconnect": True,
    }
    assert Path(base_dir) == root.resolve() and task["run"] == ["jupyter lab --port 8888"]


def test_a_task_without_a_session_block_gets_the_defaults(fake, tmp_path):
    root = project(tmp_path / "p", "name: plain\nrun: [sleep 1000]\n")
    with fake.cluster() as cluster:
        cluster.dev(root)
    assert fake.submitted[0][0]["session"] == {}  # present: a session; the schema fills it


def test_dev_waits_says_each_state_prints_how_to_connect_and_forwards(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")
    local = free_port()
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=False)
    held = []

    def hold(running, stop=None):
        held.append(True)
        raise KeyboardInterrupt  # Ctrl-C while forwarding

    monkeypatch.setattr(portforward, "hold", hold)
    code, out, _ = cli_run("dev", str(root), "--port", f"8888:{local}")
    assert code == 0 and held
    lines = out.splitlines()
    assert lines[:3] == ["submitted session 42", "session 42: PENDING", "session 42: RUNNING"]
    assert f"  port 8888: http://127.0.0.1:{local}/" in lines
    assert "  a shell:      tcloud shell 42" in lines
    assert f"  forward:      tcloud forward 42 8888:{local}" in lines
    assert any("idle timeout: 60" in line for line in lines)
    assert "  stop it:      tcloud cancel 42" in lines
    assert f"forwarding 127.0.0.1:{local} -> n2:8888 (job 42); Ctrl-C stops" in lines
    assert held_channels(fake) == []  # no stop-on-disconnect channel was asked


def test_stop_on_disconnect_holds_a_channel_while_it_forwards(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=True)
    seen = []

    def hold(running, stop=None):
        seen.append([c.closed for c in held_channels(fake)])
        raise KeyboardInterrupt

    monkeypatch.setattr(portforward, "hold", hold)
    code, out, _ = cli_run(
        "dev", str(root), "--port", f"8888:{free_port()}", "--stop-on-disconnect"
    )
    assert code == 0
    (channel,) = held_channels(fake)
    assert argv_verb(shlex.split(channel.command)) == ["job", "stop-on-disconnect", "42"]
    assert seen == [[False]]  # open while forwarding
    assert channel.closed  # closed when tcloud ends: the cluster cancels the session
    assert "session 42 is cancelled when this command ends" in out
    assert fake.submitted[0][0]["session"]["stop_on_disconnect"] is True


def test_without_ports_dev_opens_a_shell(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p", "name: plain\nrun: [sleep 1000]\n")
    with_session(fake, ports=[], idle_timeout="30", stop_on_disconnect=False)
    shells = []
    monkeypatch.setattr(interactive, "shell", lambda *a: shells.append(a) or 7)
    code, _, _ = cli_run("dev", str(root))
    assert code == 7 and shells[0][2:] == ("42", 0)


def test_detach_prints_and_exits_0(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=False)
    monkeypatch.setattr(portforward, "hold", lambda _r, stop=None: pytest.fail("forwarded"))
    code, out, _ = cli_run("dev", str(root), "--detach")
    assert code == 0 and "  port 8888: http://127.0.0.1:8888/" in out


@pytest.mark.bad_input
def test_detach_with_stop_on_disconnect_is_a_usage_error(fake, tmp_path):
    root = project(tmp_path / "p")
    code, _, err = cli_run("dev", str(root), "--detach", "--stop-on-disconnect")
    assert code == EXIT_USAGE and "exclude each other" in err and fake.submitted == []


@pytest.mark.bad_input
def test_a_bad_port_flag_is_refused_before_submitting(fake, tmp_path):
    root = project(tmp_path / "p")
    code, _, err = cli_run("dev", str(root), "--port", "8888:http")
    assert code == EXIT_USAGE and "'8888:http'" in err and fake.submitted == []


def test_ctrl_c_while_queued_cancels_the_session(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")

    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(dev.time, "sleep", interrupted)
    code, out, _ = cli_run("dev", str(root))
    assert code == 130
    assert ["job", "cancel", "42"] in fake.session.verbs
    assert "session 42: cancelled (it never ran)" in out


def test_a_session_that_ends_before_running_is_exit_4(fake, tmp_path):
    root = project(tmp_path / "p")
    fake.session.answers[("job", "status")] = (0, status("FAILED", reason="bad partition"))
    code, out, err = cli_run("dev", str(root))
    assert code == EXIT_CLUSTER and "session 42: FAILED (bad partition)" in out
    assert "ended before it ran" in err


def test_the_agent_refusing_stop_on_disconnect_is_one_line_exit_4(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=True)
    refusal = FakeChannel([b'{"error": "job 42 is not yours"}\n'], [], 4)
    fake.transport.script = lambda argv: refusal
    monkeypatch.setattr(portforward, "hold", lambda _r, stop=None: pytest.fail("forwarded"))
    code, _, err = cli_run("dev", str(root), "--stop-on-disconnect")
    assert code == EXIT_CLUSTER and err.strip() == "tcloud: error: job 42 is not yours"
    assert [c.closed for c in fake.transport.channels] == [True]


def test_connect_text_names_never_for_no_idle_timeout():
    lines = dev.connect_text("42", [], "0")
    assert any("idle timeout: never" in line for line in lines)
    assert not any("forward" in line for line in lines)


def test_cli_wiring_has_every_interactive_command():
    for name in ("shell", "exec", "forward", "dev", "top"):
        assert name in cli.CLUSTER_COMMANDS


def test_ps_shows_a_kind_column_when_the_agent_says_it(fake):
    rows = [
        {
            "job": "42",
            "name": "nb",
            "state": "RUNNING",
            "submitted": "t",
            "nodes": "n2",
            "kind": "session",
        },
        {"job": "41", "name": "train", "state": "COMPLETED", "submitted": "t", "nodes": "n3"},
    ]
    fake.answer(("job", "ps"), 0, rows)
    code, out, _ = cli_run("ps")
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["JOB", "KIND", "NAME", "STATE", "SUBMITTED", "NODES"]
    assert lines[1].split()[:2] == ["42", "session"] and lines[2].split()[:2] == ["41", "job"]


def test_ps_of_an_agent_without_kinds_has_no_kind_column(fake):
    rows = [{"job": "41", "name": "t", "state": "RUNNING", "submitted": "t", "nodes": "n3"}]
    fake.answer(("job", "ps"), 0, rows)
    assert "KIND" not in cli_run("ps")[1]


@pytest.mark.fault
def test_the_held_channel_beats_while_open_and_stops_when_it_closes(fake):
    """The agent cancels a session whose channel is silent 30 s (a dead connection TCP
    has not noticed): a live one writes a newline every HEARTBEAT_SECONDS."""
    link = core.Link()
    with dev.stop_on_disconnect(link, "/w/alice", "42", every=0.02) as said:
        assert said["job_id"] == "42"
        (channel,) = fake.transport.channels
        deadline = time.monotonic() + 2
        while channel.sent.count(b"\n") < 3 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert channel.sent.count(b"\n") >= 3 and set(channel.sent) == {ord("\n")}
    assert channel.closed
    beats = len(channel.sent)
    threading.Event().wait(0.1)  # (time.sleep is stubbed by the fixture)
    assert len(channel.sent) == beats  # the heartbeat stopped with the context
    assert dev.HEARTBEAT_SECONDS == 10


def test_a_local_port_0_is_printed_as_the_real_port_once_bound(fake, tmp_path, monkeypatch):
    root = project(tmp_path / "p")
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=False)

    def hold(_running, stop=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(portforward, "hold", hold)
    code, out, _ = cli_run("dev", str(root), "--port", "8888:0")
    assert code == 0
    assert ":0/" not in out and "8888:0" not in out
    (url,) = [line for line in out.splitlines() if line.startswith("  port 8888: http://")]
    local = int(url.rsplit(":", 1)[1].rstrip("/"))
    assert local > 0
    assert f"  forward:      tcloud forward 42 8888:{local}" in out.splitlines()
    assert f"forwarding 127.0.0.1:{local} -> n2:8888 (job 42); Ctrl-C stops" in out


def test_detach_with_a_local_port_0_names_no_port_0(fake, tmp_path):
    root = project(tmp_path / "p")
    with_session(fake, ports=[8888], idle_timeout="60", stop_on_disconnect=False)
    code, out, _ = cli_run("dev", str(root), "--port", "8888:0", "--detach")
    assert code == 0 and "127.0.0.1:0" not in out
    assert "  port 8888: a free local port, once forwarded" in out.splitlines()


@pytest.mark.bad_input
@pytest.mark.parametrize("idle", ["foo", "-5", "1:2:3:4", ""])
def test_a_bad_idle_is_a_usage_error_before_submitting(fake, tmp_path, idle, capsys):
    root = project(tmp_path / "p")
    with pytest.raises(SystemExit) as exited:
        cli.main(["dev", str(root), "--idle", idle])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--idle" in err and "a Slurm time" in err and "0 for never" in err
    assert fake.submitted == [] and fake.session.verbs == []


@pytest.mark.bad_input
def test_sdk_dev_refuses_a_bad_idle_timeout_before_submitting(fake, tmp_path):
    root = project(tmp_path / "p")
    with fake.cluster() as cluster, pytest.raises(UsageError, match="idle_timeout 'foo'"):
        cluster.dev(root, idle_timeout="foo")
    assert fake.submitted == []


@pytest.mark.parametrize("idle", ["0", "30", "1:00:00", "2-00:00:00"])
def test_a_good_idle_is_taken(idle):
    assert cli.idle_time(idle) == idle
