"""`tcloud forward`'s node side: `job connect` (the srun it runs on the login node,
tasks/interactive/connect.py) and `tacc-agent relay` (tasks/interactive/relay.py: the exposure
warning read from /proc/net/tcp{,6}, the connection to 127.0.0.1:PORT or a Unix socket,
bytes relayed between it and stdin/stdout, errors on stderr only); the protocol's builder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_REJECTED, Rejected
from tacc_agent.tasks.interactive import connect, relay
from tacc_contract.protocol import BadArgument
from tacc_contract.verbs import JOB_CONNECT
from tests.unit.agent.tasks.interactive.test_attach import a_job
from tests.unit.fake_slurm import FakeSlurm

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def proc_net(tmp_path: Path, tcp: str = "", tcp6: str = "") -> str:
    """A /proc whose net/tcp and net/tcp6 hold these lines."""
    (tmp_path / "net").mkdir(exist_ok=True)
    (tmp_path / "net" / "tcp").write_text(HEADER + tcp)
    (tmp_path / "net" / "tcp6").write_text(HEADER + tcp6)
    return str(tmp_path)


def listener(address: str, port: int, state: str = "0A") -> str:
    return f"   0: {address}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:0 0 1000\n"


ANY6 = "0" * 32
LOOP6 = "0" * 24 + "01000000"


# ---------------------------------------------------------------- the exposure warning
@pytest.mark.security
def test_a_port_listening_on_every_address_is_said_in_one_line(tmp_path):
    """jupyter --ip=0.0.0.0 on the node: `relay --check` says other users can reach it."""
    net = proc_net(tmp_path, tcp=listener("00000000", 8888))
    warning = relay.exposure_warning(8888, "n2", net)
    assert warning is not None and "\n" not in warning
    assert "port 8888 listens on every address of n2 (0.0.0.0)" in warning
    assert "other users on the cluster can connect" in warning and "127.0.0.1" in warning


@pytest.mark.parametrize(
    ("tcp", "tcp6", "said"),
    [
        (listener("00000000", 8888), "", "0.0.0.0"),  # noqa: S104 - the name said
        ("", listener(ANY6, 8888), "::"),
        (listener("0100007F", 8888), listener(LOOP6, 8888), None),  # loopback only
        (listener("00000000", 8889), "", None),  # another port
        (listener("00000000", 8888, state="01"), "", None),  # a connection, not a listener
    ],
)
def test_only_a_listener_on_the_any_address_is_exposed(tmp_path, tcp, tcp6, said):
    assert relay.listening_everywhere(8888, proc_net(tmp_path, tcp, tcp6)) == said


def test_a_real_listener_is_read_from_this_hosts_proc(tmp_path):
    every = "0.0.0.0"  # noqa: S104 - bound on purpose: the exposed case
    for address, exposed in ((every, True), ("127.0.0.1", False)):
        with socket.socket() as sock:
            sock.bind((address, 0))
            sock.listen(1)
            port = sock.getsockname()[1]
            assert (relay.listening_everywhere(port) is not None) is exposed


# ---------------------------------------------------------------- connecting, relaying
def relayed(sock: socket.socket, payload: bytes) -> bytes:
    """`pipe` between sock and a pair of OS pipes as its stdin and stdout."""
    stdin_read, stdin_write = os.pipe()
    stdout_read, stdout_write = os.pipe()
    worker = threading.Thread(target=relay.pipe, args=(sock, stdin_read, stdout_write))
    worker.start()
    os.write(stdin_write, payload)
    os.close(stdin_write)
    got = b""
    while chunk := os.read(stdout_read, 65536):
        got += chunk
    worker.join(timeout=5)
    os.close(stdin_read)
    os.close(stdout_read)
    return got


def upper_server(server: socket.socket) -> None:
    conn, _ = server.accept()
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.sendall(data.upper())
    conn.close()


def test_a_loopback_port_is_relayed_both_ways_with_each_end(tmp_path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        threading.Thread(target=upper_server, args=(server,), daemon=True).start()
        sock = relay.open_port(server.getsockname()[1])
        assert relayed(sock, b"notebook" * 10000) == b"NOTEBOOK" * 10000


@pytest.mark.fault
def test_the_program_closing_its_connection_ends_the_relay_while_the_caller_still_sends():
    """An HTTP/1.0 server, a stream that ends: srun ends the forwarded connection only
    when this step exits, so the relay must not wait for the caller's end too."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def say_and_close() -> None:
            conn, _ = server.accept()
            conn.sendall(b"whole answer")
            conn.close()

        threading.Thread(target=say_and_close, daemon=True).start()
        sock = relay.open_port(server.getsockname()[1])
        stdin_read, stdin_write = os.pipe()  # the caller: open, says nothing
        stdout_read, stdout_write = os.pipe()
        args = (sock, stdin_read, stdout_write)
        worker = threading.Thread(target=relay.pipe, args=args, daemon=True)
        worker.start()
        got = b""
        while chunk := os.read(stdout_read, 65536):
            got += chunk
        worker.join(timeout=5)
        assert got == b"whole answer" and not worker.is_alive()
        for fd in (stdin_read, stdin_write, stdout_read):
            os.close(fd)


def test_a_unix_socket_is_relayed(tmp_path):
    path = tmp_path / "private" / "jupyter.sock"
    path.parent.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(1)
        threading.Thread(target=upper_server, args=(server,), daemon=True).start()
        sock = relay.open_socket(relay.checked_socket_path(str(path)))
        assert relayed(sock, b"kernel") == b"KERNEL"


@pytest.mark.bad_input
def test_a_bad_socket_path_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    cases = [
        ("run/jupyter.sock", "expected an absolute path"),
        (str(tmp_path / "none.sock"), "no Unix socket at"),
        (str(tmp_path / "file"), "is not a Unix socket"),
    ]
    for text, why in cases:
        with pytest.raises(Rejected, match=why):
            relay.checked_socket_path(text)


OTHER_UID = 65534
SQUATTER = """
import os, socket, sys, time
os.setuid(int(sys.argv[1]))
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # this uid's, as all it accepts
listener.bind(("127.0.0.1", 0))
listener.listen(1)
print(listener.getsockname()[1], flush=True)
time.sleep(30)
"""


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="a listener of another uid needs root")
def test_a_loopback_port_another_user_listens_on_is_never_relayed(capfd):
    """alice listens on 127.0.0.1:PORT on the node before bob's notebook does (or while it
    listens on ::1 only): bob's relay refuses her listener, tries no other address, and
    relays nothing of his browser's traffic to her."""
    squatter = subprocess.Popen(
        [sys.executable, "-c", SQUATTER, str(OTHER_UID)], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(squatter.stdout.readline())
        with pytest.raises(Rejected, match=f"port {port} on .* is uid {OTHER_UID}'s, not yours"):
            relay.open_port(port)
        assert relay.relay(port, None, check=False) == AGENT_REJECTED
        out, err = capfd.readouterr()
        assert out == "" and err.count("\n") == 1 and "not yours" in err
    finally:
        squatter.kill()
        squatter.wait()


@pytest.mark.bad_input
@pytest.mark.parametrize("port", ["0", "70000", "-1", "http"])
def test_a_port_outside_1_to_65535_is_a_usage_error_not_a_traceback(port):
    argv = [sys.executable, "-m", "tacc_agent", "relay", "--port", port]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "a TCP port 1..65535" in proc.stderr


@pytest.mark.bad_input
def test_nothing_listening_is_one_line_on_stderr_and_nothing_on_stdout(capfd):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        assert relay.relay(port, None, check=False) == AGENT_REJECTED
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1 and f"nothing listens on 127.0.0.1:{port}" in err


# ---------------------------------------------------------------- job connect, protocol
@pytest.fixture
def slurm_fake(monkeypatch) -> FakeSlurm:
    return FakeSlurm().install(monkeypatch)


@pytest.fixture
def agent_config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(workspace=str(tmp_path / "workspace"), slurm_timeout_seconds=5)


def test_job_connect_runs_srun_with_relay_on_the_ranks_node(
    tmp_path, slurm_fake, agent_config, monkeypatch
):
    """A connection: srun runs `relay --back` (carry gives it the offer); a check: srun
    replaces the agent and runs `relay --check`."""
    user_dir, _ = a_job(tmp_path, slurm_fake)
    config = agent_config
    started, execs = [], []

    def popen(argv, **_kwargs):
        started.append(argv)
        return "the step"

    monkeypatch.setattr(connect.subprocess, "Popen", popen)
    monkeypatch.setattr(connect, "carry", lambda step, *_fds: 0 if step == "the step" else 1)
    monkeypatch.setattr(connect.os, "execvp", lambda file, argv: execs.append(argv))
    assert connect.connect(user_dir, "42", config, 1, connect.RelayTarget(8888, None)) == 0
    connect.connect(user_dir, "42", config, 0, connect.RelayTarget(None, "/s/j.sock", True))
    prefix = ["srun", "--jobid=42", "--overlap", "--quiet", "--mpi=none", "--nodes=1"]
    assert started[0][:6] == prefix and "--nodelist=n3" in started[0]
    assert started[0][-4:] == ["relay", "--port", "8888", "--back"]
    assert execs[0][-4:] == ["relay", "--socket", "/s/j.sock", "--check"]
    assert sys.executable in started[0] and "--pty" not in started[0]


def test_job_connect_into_a_job_not_yours_is_refused_on_stderr(
    tmp_path, slurm_fake, agent_config, monkeypatch, capfd
):
    user_dir, _ = a_job(tmp_path, slurm_fake)
    config = agent_config
    execs = []
    monkeypatch.setattr(connect.os, "execvp", lambda *a: execs.append(a))
    monkeypatch.setattr(connect.subprocess, "Popen", lambda *a, **_k: execs.append(a))
    target = connect.RelayTarget(8888, None)
    assert connect.connect(user_dir, "77", config, 0, target) == AGENT_REJECTED
    out, err = capfd.readouterr()
    assert out == "" and "77" in err and execs == []


def job_connect(job: str, rank: int, target: int | str, check: bool = False) -> list[str]:
    where = {"socket": target} if isinstance(target, str) else {"port": target}
    return JOB_CONNECT.request(job=job, rank=rank, check=check, **where)


def test_the_protocol_builds_job_connect_words():
    assert job_connect("42", 1, 8888) == ["job", "connect", "42", "--rank", "1", "--port", "8888"]
    assert job_connect("42", 0, "/s/j.sock", check=True)[-3:] == [
        "--socket",
        "/s/j.sock",
        "--check",
    ]
    for bad in ("j.sock", 0, 70000, True):
        with pytest.raises(BadArgument, match=r"--port|--socket"):
            job_connect("42", 0, bad)
