"""tcloud forward (tcloud.jobs.portforward): PORT[:LOCAL] or /SOCKET[:LOCAL] read and checked
before connecting; a listener on 127.0.0.1 only; each target checked on the node first
(`job connect --check`: its warning said once, a missing socket refused); each accepted
connection one `job connect` exec channel relayed both ways, each side's EOF passed on;
a local port in use named (exit 4) with nothing left listening; the job's end ends it
(exit 0); another user's job refused before anything listens."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import threading
import time

import pytest

from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE, TcloudError, UsageError
from tcloud.jobs import portforward
from tests.unit.interactive_fakes import NOT_YOURS, FakeCluster, argv_verb, cli_run, status


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def upper_echo(sock: socket.socket, _dest) -> None:
    """The service on the node: answers what it read, upper-cased, then closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.sendall(data.upper())
    sock.close()


def exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := conn.recv(65536):
            got += chunk
    return got


class ConnectChannel:
    """A `job connect` exec channel: with --check, the node's stderr lines and status
    (`node`); else one end of a socketpair whose other end the service holds."""

    def __init__(self, fake: FakeCluster, window_size=None) -> None:
        self.fake, self.window = fake, window_size
        self.sock: socket.socket | None = None
        self.err: list[bytes] = []
        self.status = 0
        self.closed = False

    def exec_command(self, command: str) -> None:
        verb = argv_verb(shlex.split(command))
        self.fake.connects.append(verb)
        if "--check" in verb:
            self.err, self.status = list(self.fake.node_check), self.fake.node_status
            return
        ours, theirs = socket.socketpair()
        self.sock = ours
        threading.Thread(target=upper_echo, args=(theirs, verb), daemon=True).start()

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size) if self.sock else b""

    def recv_stderr(self, _size: int) -> bytes:
        return self.err.pop(0) if self.err else b""

    def recv_exit_status(self) -> int:
        return self.status

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        if self.sock:
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        if self.sock:
            self.sock.close()


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    cluster = FakeCluster(tmp_path, monkeypatch)
    cluster.connects, cluster.node_check, cluster.node_status = [], [], 0
    cluster.transport.open_session = lambda window_size=None: ConnectChannel(cluster, window_size)
    return cluster


def test_pairs_default_the_local_port_to_the_remote_one():
    assert portforward.parse_pair("8888") == portforward.PortPair(8888, 8888)
    assert portforward.parse_pair("6006:16006") == portforward.PortPair(6006, 16006)
    assert portforward.pairs_of({8888: 9999}) == [portforward.PortPair(8888, 9999)]
    assert portforward.pairs_of(8888) == [portforward.PortPair(8888, 8888)]


@pytest.mark.bad_input
@pytest.mark.parametrize("spec", ["abc", "0", "70000", "80:", ":80", "80:90:100", "-1", "8 0"])
def test_a_bad_port_spec_is_one_usage_line(spec):
    with pytest.raises(UsageError, match="expected PORT or PORT:LOCAL"):
        portforward.parse_pair(spec)


@pytest.mark.bad_input
def test_a_bad_port_on_the_command_line_is_refused_before_connecting(fake):
    code, _, err = cli_run("forward", "42", "8888", "99999")
    assert code == EXIT_USAGE and err.count("\n") == 1 and "'99999'" in err
    assert fake.session.verbs == []


@pytest.mark.bad_input
def test_the_same_local_port_twice_is_refused(fake):
    code, _, err = cli_run("forward", "42", "8888:9000", "6006:9000")
    assert code == EXIT_USAGE and "named twice" in err


def test_a_connection_is_relayed_through_a_job_connect_channel_to_the_nodes_loopback(fake):
    with fake.cluster() as cluster, cluster.job(42).forward(["8888:0"], rank=1) as mapping:
        local = mapping[8888]
        payload = bytes(range(256)) * 4096  # 1 MiB, both ways
        assert exchange(local, payload) == payload.upper()
        assert exchange(local, b"again") == b"AGAIN"  # each connection its own channel
    check, *connections = fake.connects
    assert check == ["job", "connect", "42", "--rank", "1", "--port", "8888", "--check"]
    assert connections == [["job", "connect", "42", "--rank", "1", "--port", "8888"]] * 2
    with pytest.raises(OSError):  # closed when the block ends
        socket.create_connection(("127.0.0.1", local), timeout=1)


def test_a_unix_socket_on_the_node_is_forwarded_to_a_free_local_port(fake):
    path = "/home/alice/.tacc/run/jupyter.sock"
    with fake.cluster() as cluster, cluster.job(42).forward([path]) as mapping:
        assert exchange(mapping[path], b"notebook") == b"NOTEBOOK"
    assert fake.connects[-1] == ["job", "connect", "42", "--rank", "0", "--socket", path]
    assert portforward.parse_pair(f"{path}:9000") == portforward.PortPair(path, 9000)


@pytest.mark.bad_input
@pytest.mark.parametrize("spec", ["jupyter.sock", "run/jupyter.sock", "./j.sock:9000"])
def test_a_relative_socket_path_is_refused_before_connecting(fake, spec):
    code, _, err = cli_run("forward", "42", spec)
    assert code == EXIT_USAGE and "expected the socket's absolute path" in err
    assert err.count("\n") == 1 and fake.connects == []


@pytest.mark.bad_input
def test_a_socket_that_is_not_on_the_node_is_one_error_before_listening(fake):
    path = "/home/alice/nothing.sock"
    fake.node_check = [f"tacc-agent: no Unix socket at {path} on n2: No such file\n".encode()]
    fake.node_status = 4
    code, out, err = cli_run("forward", "42", f"{path}:{free_port()}")
    assert (code, out) == (EXIT_CLUSTER, "")
    assert err == f"tcloud: error: no Unix socket at {path} on n2: No such file\n"


EXPOSED = (
    "warning: port 8888 listens on every address of n2 (0.0.0.0): other users on the "
    "cluster can connect to it; have the program listen on 127.0.0.1"
)


@pytest.mark.security
def test_forward_warns_once_when_the_port_listens_on_every_address(fake, monkeypatch):
    """The node says its port is open to the cluster (tacc-agent relay --check): one
    line on stderr before forwarding, once however often the node says it."""
    fake.node_check = [f"{EXPOSED}\n".encode()]
    monkeypatch.setattr(portforward, "hold", lambda _running, stop=None: None)
    code, out, err = cli_run("forward", "42", f"8888:{free_port()}")
    assert code == 0 and "forwarding 127.0.0.1:" in out
    assert [line for line in err.splitlines() if "listens on every address" in line] == [
        f"tcloud: {EXPOSED}"
    ]


def test_it_listens_on_localhost_only(fake):
    with portforward.Forwarder([portforward.PortPair(1, 0)], lambda *a: None, print) as fw:
        assert fw.listeners[0].getsockname()[0] == "127.0.0.1"


def test_a_local_port_in_use_is_named_and_nothing_stays_listening(fake):
    first, busy = free_port(), socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    taken = busy.getsockname()[1]
    try:
        with pytest.raises(TcloudError) as caught:
            portforward.listen([portforward.PortPair(1, first), portforward.PortPair(2, taken)])
        assert f"local port {taken}" in str(caught.value) and "in use" in str(caught.value)
        assert caught.value.exit_code == EXIT_CLUSTER
        with socket.socket() as again:  # the first listener was closed
            again.bind(("127.0.0.1", first))
        code, _, err = cli_run("forward", "42", f"8888:{taken}")
        assert code == EXIT_CLUSTER and f"local port {taken}" in err
        assert fake.connects[1:] == []  # checked, never connected
    finally:
        busy.close()


def quick_hold(real_hold):
    """portforward.hold asking every 0.01 s."""
    return lambda running, stop=None: real_hold(running, poll=0.01, stop=stop)


def test_forward_prints_one_line_per_port_and_ends_with_the_job(fake, monkeypatch):
    states = iter(["RUNNING", "COMPLETED"])
    fake.session.answers[("job", "status")] = lambda: (0, status(next(states)))
    monkeypatch.setattr(portforward, "hold", quick_hold(portforward.hold))
    local = free_port()
    code, out, _ = cli_run("forward", "42", f"8888:{local}", "--node", "1")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"forwarding 127.0.0.1:{local} -> n3:8888 (job 42); Ctrl-C stops"
    assert lines[-1] == "job 42 is no longer running: forwarding stopped"


def test_ctrl_c_before_the_forward_is_up_stops_it_with_exit_0(fake, monkeypatch):
    def interrupted(_running, stop=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(portforward, "hold", interrupted)
    code, _, err = cli_run("forward", "42", f"8888:{free_port()}")
    assert code == 0 and "forwarding stopped" in err


@pytest.mark.fault
def test_ctrl_c_while_the_jobs_status_is_asked_lets_the_answer_come_then_stops(fake, monkeypatch):
    """SIGINT in the middle of the status call (paramiko's read, in the lab) used to raise
    KeyboardInterrupt there, and the forward sometimes hung on its way out; now it only
    sets the stop event: the call ends normally, then the forward stops, exit 0."""
    asked, answered = [], []

    def status_then_interrupted():
        asked.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of the call
        time.sleep(0.05)
        answered.append(True)  # not cut short by a KeyboardInterrupt
        return 0, status("RUNNING")

    fake.session.answers[("job", "status")] = status_then_interrupted
    monkeypatch.setattr(portforward, "hold", quick_hold(portforward.hold))
    before = signal.getsignal(signal.SIGINT)
    code, out, err = cli_run("forward", "42", f"8888:{free_port()}")
    assert code == 0 and "forwarding stopped" in err and len(asked) == len(answered) == 1
    assert "no longer running" not in out
    assert signal.getsignal(signal.SIGINT) is before  # the handler is given back


def test_a_refused_connection_on_the_node_is_said_and_the_forward_goes_on(fake):
    warnings: list[str] = []

    def refusing(pair, peer):
        raise OSError("Connect failed (connection refused)")

    pair = portforward.PortPair(8888, 0)
    with portforward.Forwarder([pair], refusing, warnings.append) as forwarder:
        port = forwarder.mapping[8888]
        for payload in (b"x", b"y"):
            # reset or closed before our byte was read: also a refusal
            with contextlib.suppress(OSError):
                assert exchange(port, payload) == b""
    assert warnings[0].startswith("port 8888: cannot connect on the node")


@pytest.mark.security
def test_forward_into_another_users_job_is_refused_before_listening(fake):
    fake.answer(("job", "target"), 4, NOT_YOURS)
    local = free_port()
    code, out, err = cli_run("forward", "42", f"8888:{local}")
    assert (code, out) == (EXIT_CLUSTER, "")
    assert err.strip() == "tcloud: error: job 42 is not yours"
    with socket.socket() as again:
        again.bind(("127.0.0.1", local))  # nothing listens
    assert fake.connects == []


def test_hold_returns_when_the_job_stops_running():
    calls = []
    stop = threading.Event()
    portforward.hold(lambda: calls.append(1) or len(calls) < 3, poll=0.001, stop=stop)
    assert len(calls) == 3
