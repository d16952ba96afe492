"""tcloud shell and exec (tcloud.jobs.interactive) over fake channels: the job is checked with
`job target` before any channel opens (another user's job or one not running: one line,
exit 4, nothing opened); each node's command is one exec channel running `tacc-agent
job attach` with every word quoted; exec's lines are prefixed `[host:rank] ` and never
cut, stdout to stdout and stderr to stderr; the exit-code rules; the shell's PTY and the
local terminal's raw mode restored on every way out."""

from __future__ import annotations

import os
import select
import shlex
import signal
import termios
import threading
import time
from collections.abc import Callable

import pytest

from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE
from tcloud.jobs import interactive
from tests.unit.interactive_fakes import (
    NOT_YOURS,
    TARGET,
    FakeChannel,
    FakeCluster,
    argv_verb,
    cli_run,
    rank_of,
)


def per_rank(outputs: dict[int, FakeChannel]):
    return lambda argv: outputs[rank_of(argv)]


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    channels = {
        0: FakeChannel([b"hel", b"lo\nwor", b"ld\npartial"], [b"warn", b"ing\n"], 0),
        1: FakeChannel([b"from n3\n"], [b"srun: error: n3: task 0: Exited with exit code 3\n"], 3),
    }
    return FakeCluster(tmp_path, monkeypatch, per_rank(channels))


# --- exec ----------------------------------------------------------------------------


def test_exec_on_one_node_prefixes_whole_lines_and_exits_with_its_status(fake):
    code, out, err = cli_run("exec", "42", "--", "python", "-c", "print('a b')")
    assert code == 0
    assert out == "[n2:0] hello\n[n2:0] world\n[n2:0] partial\n"
    assert err == "[n2:0] warning\n"
    (channel,) = fake.transport.channels
    argv = shlex.split(channel.command)
    assert argv_verb(argv) == [
        "job",
        "attach",
        "42",
        "--rank",
        "0",
        "--",
        "python",
        "-c",
        "print('a b')",
    ]
    assert channel.pty is None and channel.write_shut and channel.closed
    assert fake.session.verbs[0][:3] == ["job", "target", "42"]


def test_exec_node_picks_the_rank_and_its_status_is_the_exit_code(fake):
    code, out, err = cli_run("exec", "42", "--node", "1", "--", "hostname")
    assert (code, out) == (3, "[n3:1] from n3\n")
    assert "srun: error" not in err  # srun's report of the failed step: the status says it


def test_exec_all_runs_every_node_and_names_each_failing_one(fake):
    code, out, err = cli_run("exec", "42", "--all", "--", "true")
    assert code == 3
    assert "[n3:1] from n3\n" in out and "[n2:0] hello\n" in out
    assert err.splitlines()[-1] == "[n3:1] exited 3"
    assert sorted(rank_of(shlex.split(c.command)) for c in fake.transport.channels) == [0, 1]


def test_exec_all_is_zero_when_every_node_is_zero():
    results = [interactive.NodeResult("n2", 0, 0), interactive.NodeResult("n3", 1, 0)]
    assert interactive.exit_code(results, every=True) == (0, [])
    results[0].exit_code = 7
    results[1].exit_code = 2
    assert interactive.exit_code(results, every=True)[0] == 7


def test_the_words_after_dash_dash_are_the_commands_even_when_they_look_like_options(fake):
    code, _, _ = cli_run("exec", "42", "--", "--all", "--node", "1", ";", "rm", "-rf", "/")
    assert code == 0
    words = argv_verb(shlex.split(fake.transport.channels[0].command))
    assert words[words.index("--") + 1 :] == ["--all", "--node", "1", ";", "rm", "-rf", "/"]


def test_sdk_exec_captures_each_nodes_output(fake):
    with fake.cluster() as cluster:
        results = cluster.job(42).exec(["hostname"], ranks="all")
    assert results == [
        {
            "host": "n2",
            "rank": 0,
            "exit_code": 0,
            "stdout": "hello\nworld\npartial\n",
            "stderr": "warning\n",
        },
        {"host": "n3", "rank": 1, "exit_code": 3, "stdout": "from n3\n", "stderr": ""},
    ]


def test_a_channel_without_an_exit_status_reads_255(tmp_path, monkeypatch):
    FakeCluster(tmp_path, monkeypatch, lambda argv: FakeChannel([], [], -1))
    assert cli_run("exec", "42", "--", "true")[0] == 255


@pytest.mark.bad_input
def test_exec_without_a_command_is_a_usage_error_before_connecting(fake):
    for argv in (["exec", "42"], ["exec", "42", "--"]):
        code, _, err = cli_run(*argv)
        assert code == EXIT_USAGE and "expected a command after `--`" in err
    assert fake.session.verbs == [] and fake.transport.channels == []


@pytest.mark.bad_input
def test_exec_node_out_of_range_names_the_ranks(fake):
    code, _, err = cli_run("exec", "42", "--node", "5", "--", "true")
    assert code == EXIT_USAGE
    assert err.strip() == "tcloud: error: --node 5: job 42 has ranks 0 to 1"
    assert fake.transport.channels == []


@pytest.mark.bad_input
def test_exec_bad_job_id_is_refused_before_connecting(fake):
    code, _, err = cli_run("exec", "42;ls", "--", "true")
    assert code == EXIT_USAGE and "\n" not in err.strip()
    assert fake.session.verbs == []


@pytest.mark.security
def test_exec_into_another_users_job_is_refused_and_opens_no_channel(fake):
    fake.answer(("job", "target"), 4, NOT_YOURS)
    code, out, err = cli_run("exec", "42", "--all", "--", "id")
    assert (code, out) == (EXIT_CLUSTER, "")
    assert err.strip() == "tcloud: error: job 42 is not yours"
    assert fake.transport.channels == []


@pytest.mark.security
def test_shell_into_another_users_job_is_refused_and_opens_no_channel(fake):
    fake.answer(("job", "target"), 4, NOT_YOURS)
    code, _, err = cli_run("shell", "42")
    assert code == EXIT_CLUSTER and err.strip() == "tcloud: error: job 42 is not yours"
    assert fake.transport.channels == []


def test_a_job_that_is_not_running_is_one_line_exit_4(fake):
    fake.answer(("job", "target"), 4, {"error": "job 42 is PENDING, not running"})
    code, _, err = cli_run("exec", "42", "--", "true")
    assert code == EXIT_CLUSTER and err.count("\n") == 1


# --- shell ---------------------------------------------------------------------------


def test_shell_without_a_terminal_relays_plainly_with_no_pty(fake, monkeypatch):
    stdin_r, stdin_w = os.pipe()
    os.write(stdin_w, b"echo hi\n")
    os.close(stdin_w)
    monkeypatch.setattr("sys.stdin", os.fdopen(stdin_r, "r"))
    code, out, _ = cli_run("shell", "42", "--node", "1")
    assert (code, out) == (3, "from n3\n")
    (channel,) = fake.transport.channels
    deadline = time.monotonic() + 5  # stdin is fed on a thread of its own
    while not channel.write_shut and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channel.pty is None and bytes(channel.sent) == b"echo hi\n" and channel.write_shut
    assert argv_verb(shlex.split(channel.command)) == ["job", "attach", "42", "--rank", "1"]


def test_shell_on_a_terminal_asks_a_pty_of_the_terminals_size_and_term(fake, monkeypatch):
    controller, terminal = os.openpty()
    os.write(controller, b"exit\n")
    monkeypatch.setenv("TERM", "screen")
    monkeypatch.setattr(interactive, "terminal_size", lambda fd: (120, 40))
    seen = []

    def relay(channel, stdin_fd, stdout_fd):
        seen.append(termios.tcgetattr(stdin_fd))
        return 5

    monkeypatch.setattr(interactive, "relay_pty", relay)
    before = termios.tcgetattr(terminal)
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr("sys.stdin", tty_in)
        code, _, err = cli_run("shell", "42")
        assert termios.tcgetattr(terminal) == before  # restored
    assert err == ""
    os.close(controller)
    assert code == 5
    assert seen[0] != before  # raw while it ran
    (channel,) = fake.transport.channels
    assert channel.pty == ("screen", 120, 40)
    assert argv_verb(shlex.split(channel.command)) == [
        "job",
        "attach",
        "42",
        "--rank",
        "0",
        "--pty",
    ]
    assert channel.closed


def test_raw_mode_is_restored_when_the_relay_fails(fake, monkeypatch):
    controller, terminal = os.openpty()

    def broken(channel, stdin_fd, stdout_fd):
        raise OSError("connection reset")

    monkeypatch.setattr(interactive, "relay_pty", broken)
    before = termios.tcgetattr(terminal)
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr("sys.stdin", tty_in)
        code, _, err = cli_run("shell", "42")
        assert termios.tcgetattr(terminal) == before
    os.close(controller)
    assert code != 0 and "connection reset" in err
    assert fake.transport.channels[0].closed


@pytest.mark.fault
def test_raw_mode_is_restored_on_sigterm(fake, monkeypatch):
    controller, terminal = os.openpty()

    def killed(channel, stdin_fd, stdout_fd):
        assert termios.tcgetattr(terminal) != before  # raw now
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the signal's handler runs before this ends
        return 0

    monkeypatch.setattr(interactive, "relay_pty", killed)
    before = termios.tcgetattr(terminal)
    default = signal.getsignal(signal.SIGTERM)
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr("sys.stdin", tty_in)
        with pytest.raises(SystemExit) as exited:
            cli_run("shell", "42")
        assert termios.tcgetattr(terminal) == before
    os.close(controller)
    assert exited.value.code == 128 + signal.SIGTERM
    assert fake.transport.channels[0].closed
    assert signal.getsignal(signal.SIGTERM) == default  # put back


def test_raw_mode_is_restored_on_ctrl_c():
    controller, terminal = os.openpty()
    before = termios.tcgetattr(terminal)
    with pytest.raises(KeyboardInterrupt), interactive.raw_mode(terminal):
        assert termios.tcgetattr(terminal) != before
        raise KeyboardInterrupt
    assert termios.tcgetattr(terminal) == before
    os.close(controller)
    os.close(terminal)


def test_a_line_typed_before_raw_mode_is_kept_to_be_sent():
    """Typed while tcloud was still connecting: the line waits in the terminal's buffer
    and must reach the remote shell (the lab's pexpect test types ahead of the prompt)."""
    controller, terminal = os.openpty()
    os.write(controller, b"echo typed-ahead\n")
    time.sleep(0.1)
    with interactive.raw_mode(terminal):
        ready, _, _ = select.select([terminal], [], [], 2)
        assert ready and os.read(terminal, 100) == b"echo typed-ahead\n"
    os.close(controller)
    os.close(terminal)


def test_the_pty_relay_passes_keystrokes_and_output_until_the_channel_closes():
    """relay_pty over a socketpair standing in for the channel (select needs a fileno)."""
    import socket

    ours, theirs = socket.socketpair()
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()

    class Channel:
        def fileno(self):
            return ours.fileno()

        def recv(self, n):
            return ours.recv(n)

        def sendall(self, data):
            ours.sendall(data)

        def shutdown_write(self):
            ours.shutdown(socket.SHUT_WR)

        def recv_exit_status(self):
            return 9

    os.write(stdin_w, b"ls\r")
    theirs.sendall(b"file\r\n")
    got = []

    def remote():
        got.append(theirs.recv(100))
        theirs.close()

    import threading

    thread = threading.Thread(target=remote)
    thread.start()
    assert interactive.relay_pty(Channel(), stdin_r, out_w) == 9
    thread.join()
    assert got == [b"ls\r"]
    assert os.read(out_r, 100) == b"file\r\n"
    for fd in (stdin_r, stdin_w, out_r, out_w):
        os.close(fd)
    ours.close()


def test_exec_waits_for_a_channel_to_close_when_sshd_refuses_more_sessions(tmp_path, monkeypatch):
    """sshd's MaxSessions (here 1): the second node's open is refused until the first
    node's channel closes; both run."""
    import paramiko

    fake = FakeCluster(
        tmp_path,
        monkeypatch,
        per_rank({0: FakeChannel([b"a\n"], [], 0), 1: FakeChannel([b"b\n"], [], 0)}),
    )
    transport = fake.transport
    opened = transport.open_session
    refused = []

    def limited():
        if any(not c.closed for c in transport.channels):
            refused.append(1)
            raise paramiko.ChannelException(1, "Administratively prohibited")
        return opened()

    transport.open_session = limited
    code, out, _ = cli_run("exec", "42", "--all", "--", "true")
    assert code == 0 and sorted(out.splitlines()) == ["[n2:0] a", "[n3:1] b"]


def test_a_refusal_with_none_of_ours_open_is_the_answer():
    import paramiko

    def refusing():
        raise paramiko.ChannelException(1, "Administratively prohibited")

    gate = interactive.ChannelGate()
    monkey_wait = gate.changed.wait
    gate.changed.wait = lambda timeout=None: monkey_wait(0.001)
    with pytest.raises(paramiko.ChannelException):
        gate.open(refusing)


class BlockingChannel(FakeChannel):
    """A remote command that runs on: recv blocks until the channel is closed. Its end
    comes only from a close (`outwaited` says if a read gave up after 5 s instead: the
    client waited for a command that never ends on its own)."""

    def __init__(self, opened: list) -> None:
        super().__init__()
        self.woken = threading.Event()
        self.opened = opened
        self.outwaited = False

    def exec_command(self, command: str) -> None:
        self.command = command
        self.thread = threading.get_ident()  # the pool thread that opened it (and reads it)
        self.opened.append(self)

    def wait_for_close(self) -> None:
        if not self.woken.wait(5):  # a guard against a hang, not a timing
            self.outwaited = True

    def recv(self, _size: int) -> bytes:
        self.wait_for_close()
        return b""

    recv_stderr = recv

    def recv_exit_status(self) -> int:
        self.wait_for_close()
        return -1

    def close(self) -> None:
        self.closed = True
        self.woken.set()


def exec_interrupted(tmp_path, monkeypatch, ctrl_c: Callable[[list], None]):
    """`tcloud exec --all` on 2 nodes whose command never ends; `ctrl_c(channels)` runs in
    its own thread once both channels are open (or after 3 s). (exit code, stderr, the
    channels, whether both had opened)."""
    fake = FakeCluster(tmp_path, monkeypatch)
    channels = fake.transport.channels
    fake.transport.open_session = lambda: BlockingChannel(channels)
    opened = threading.Event()

    def when_open() -> None:
        deadline = time.monotonic() + 3
        while len(channels) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        if len(channels) == 2:
            opened.set()
        ctrl_c(channels)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Thread(target=when_open, daemon=True).start()
        code, _, err = cli_run("exec", "42", "--all", "--", "sleep", "1000")
    finally:
        signal.signal(signal.SIGINT, previous)
    return code, err, channels, opened.is_set()


@pytest.mark.fault
def test_ctrl_c_in_exec_closes_every_channel_and_does_not_wait(tmp_path, monkeypatch):
    code, err, channels, opened = exec_interrupted(
        tmp_path, monkeypatch, lambda _channels: os.kill(os.getpid(), signal.SIGINT)
    )
    assert opened and code == 130 and "interrupted" in err
    assert [c.closed for c in channels] == [True, True]
    # Not waited for: every read ended because its channel was closed, none gave up.
    assert [c.outwaited for c in channels] == [False, False]


@pytest.mark.fault
def test_a_ctrl_c_that_a_reading_thread_receives_still_stops_exec(tmp_path, monkeypatch):
    """The kernel may deliver SIGINT to any thread; Python runs its handler only in the
    main thread, which must not sleep in a wait no signal of its own ends (before: it
    waited for the nodes' reads, about 2 Ctrl-Cs in 100)."""
    code, err, channels, opened = exec_interrupted(
        tmp_path,
        monkeypatch,
        lambda channels: signal.pthread_kill(channels[0].thread, signal.SIGINT),
    )
    assert opened and code == 130 and "interrupted" in err
    assert [c.closed for c in channels] == [True, True]
    assert [c.outwaited for c in channels] == [False, False]


@pytest.mark.fault
def test_a_long_line_without_a_newline_is_pumped_whole():
    """40 MiB in CHUNK pieces with no newline (a progress bar, a binary dump) come out as
    one line. Its cost (linear; once quadratic: minutes) is measured in
    bench/unit_timing.py, not here."""
    chunks = [b"x" * interactive.CHUNK] * (40 * 1024 * 1024 // interactive.CHUNK)
    chunks.append(b"x\nnext\ntail")
    emitted: list[bytes] = []
    interactive.pump(lambda _n: chunks.pop(0) if chunks else b"", emitted.extend)
    assert [len(line) for line in emitted] == [40 * 1024 * 1024 + 1, 4, 4]
    assert emitted[1:] == [b"next", b"tail"]


def test_split_lines_keeps_the_unfinished_line():
    pending = bytearray(b"he")
    assert interactive.split_lines(pending, b"llo") == [] and pending == b"hello"
    assert interactive.split_lines(pending, b"\nworld\nmo") == [b"hello", b"world"]
    assert pending == b"mo"
    assert interactive.split_lines(pending, b"re\n") == [b"more"] and pending == b""


# --- the agent's step: srun run by tcloud, no `job attach` start on the login node -----


def step_of(host: str, rank: int) -> list[str]:
    """A `job target` node's step as the agent answers it (answers.TargetNode.step)."""
    return [
        "srun",
        "--jobid=42",
        "--overlap",
        f"--nodelist={host}",
        "--chdir=/w/alice/jobs/j 42",  # a space: one word after the round trip
        "/opt/tacc-agent/venv/bin/python3",
        "-I",
        "-m",
        "tacc_agent",
        "enter",
        "/w/alice/jobs/j 42",
        "--rank",
        str(rank),
    ]


@pytest.fixture
def stepped(fake) -> FakeCluster:
    nodes = [{**node, "step": step_of(node["host"], node["rank"])} for node in TARGET["nodes"]]
    fake.answer(("job", "target"), 0, {**TARGET, "nodes": nodes})
    return fake


@pytest.mark.security
def test_with_the_agents_step_exec_runs_it_with_every_word_quoted_and_no_job_attach(stepped):
    command = ["sh", "-c", "echo $HOME; rm -rf /tmp/x", "a'b", "--rank", "9", "-- x"]
    code, out, _ = cli_run("exec", "42", "--all", "--", *command)
    assert code == 3 and "[n2:0] hello\n" in out and "[n3:1] from n3\n" in out
    commands = sorted(shlex.split(channel.command) for channel in stepped.transport.channels)
    assert commands == [
        [*step_of("n2", 0), "--", *command],
        [*step_of("n3", 1), "--", *command],
    ]
    assert all(channel.pty is None for channel in stepped.transport.channels)


def test_with_the_agents_step_a_shell_asks_srun_for_a_pty_right_after_srun(stepped, monkeypatch):
    controller, terminal = os.openpty()
    monkeypatch.setattr(interactive, "terminal_size", lambda fd: (80, 24))
    monkeypatch.setattr(interactive, "relay_pty", lambda channel, stdin_fd, stdout_fd: 0)
    with os.fdopen(terminal, "r") as tty_in:
        monkeypatch.setattr("sys.stdin", tty_in)
        code, _, _ = cli_run("shell", "42", "--node", "1")
    os.close(controller)
    assert code == 0
    (channel,) = stepped.transport.channels
    step = step_of("n3", 1)
    assert shlex.split(channel.command) == [step[0], "--pty", *step[1:]]
    assert channel.pty is not None


@pytest.mark.bad_input
@pytest.mark.parametrize("step", [[], ["sh", "-c", "true"], ["srun", 7]])
def test_a_step_that_is_not_sruns_is_refused_and_opens_no_channel(fake, step):
    nodes = [{**node, "step": step} for node in TARGET["nodes"]]
    fake.answer(("job", "target"), 0, {**TARGET, "nodes": nodes})
    code, out, err = cli_run("exec", "42", "--", "true")
    assert code != 0 and out == ""
    assert "not srun's" in err or "does not fit protocol" in err  # a word not text
    assert "Traceback" not in err
    assert fake.transport.channels == []


def test_a_node_whose_turn_comes_late_gets_job_attach_which_checks_again(stepped, monkeypatch):
    """More nodes than channels at once: a step answered long before its node's turn is not
    run blind; `job attach` checks the job again (an ended job: the agent's message)."""
    monkeypatch.setattr(interactive, "STEP_FRESH_SECONDS", -1.0)
    code, _, _ = cli_run("exec", "42", "--all", "--", "true")
    assert code == 3
    verbs = sorted(argv_verb(shlex.split(c.command))[:2] for c in stepped.transport.channels)
    assert verbs == [["job", "attach"], ["job", "attach"]]
