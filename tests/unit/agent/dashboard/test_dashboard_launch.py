"""`dashboard open` and `dashboard connect` for real (tacc_agent/dashboard/launch.py): the
first of many connections at once starts one server (a real `tacc-agent dashboard serve`
process, detached), the code it answers logs in over the socket, and the server leaves
once unused, taking its socket with it."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tacc_agent.dashboard import launch, place
from tests.conftest import BIN


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("127.0.0.1", 8700, timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.path))


def request(path: Path, url: str, cookie: str = "") -> http.client.HTTPResponse:
    connection = UnixHTTPConnection(path)
    connection.request("GET", url, headers={"Host": "127.0.0.1:8700", "Cookie": cookie})
    return connection.getresponse()


@pytest.fixture
def own_tmp(monkeypatch):
    """TMPDIR (and tempfile's idea of it) in a short new directory (a Unix socket's path
    holds 107 bytes), for this process and the server."""
    tmp_path = Path(tempfile.mkdtemp(prefix="td", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    (tmp_path / "home").mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "config.yaml"
    config.write_text("dashboard_idle_seconds: 2\n")
    yield tmp_path, ["--config", str(config)]
    shutil.rmtree(tmp_path, ignore_errors=True)


def server_pids(where: Path) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"config {where}/config.yaml dashboard serve"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in found.stdout.split()]


def test_many_connections_at_once_start_one_server_and_its_code_logs_in(own_tmp):
    tmp, settings = own_tmp
    sockets: list[socket.socket] = []
    threads = [
        threading.Thread(target=lambda: sockets.append(launch.ensure_server(settings)))
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(sockets) == 6
    for sock in sockets:
        sock.close()
    assert len(server_pids(tmp)) == 1
    where = place.directory()
    assert where.parent == tmp and where.stat().st_mode & 0o777 == 0o700
    assert (where / place.SOCKET).stat().st_mode & 0o777 == 0o600

    opened = launch.open_dashboard(settings)
    login = request(where / place.SOCKET, f"/login?code={opened['code']}")
    assert login.status == 303
    cookie = login.getheader("Set-Cookie").split(";")[0]
    me = request(where / place.SOCKET, "/api/me", cookie)
    assert me.status == 200
    assert json.loads(me.read())["user"] == "root" if os.getuid() == 0 else True

    deadline = time.monotonic() + 40  # idle after 2 s, checked every 2 s
    while server_pids(tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server_pids(tmp) == []
    assert not (where / place.SOCKET).exists()


def test_dashboard_connect_relays_one_connection_as_ssh_w_does(own_tmp):
    tmp, settings = own_tmp
    opened = launch.open_dashboard(settings)
    relay = subprocess.Popen(
        [str(BIN / "tacc-agent"), *settings, "dashboard", "connect"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    relay.stdin.write(
        f"GET /login?code={opened['code']} HTTP/1.1\r\nHost: 127.0.0.1:8700\r\n\r\n".encode()
    )
    relay.stdin.flush()
    assert relay.stdout.readline().startswith(b"HTTP/1.1 303")
    relay.stdin.close()  # the browser's connection closed: the relay ends
    assert relay.wait(timeout=30) == 0
    for pid in server_pids(tmp):
        os.kill(pid, 15)


@pytest.mark.security
def test_a_name_another_user_took_first_in_tmp_stops_nobody(own_tmp):
    """/tmp is shared and sticky: mallory can make /tmp/tacc-dashboard-<alice's uid>
    first, and alice cannot remove it. Her server goes to a directory of a random name
    instead, which her home remembers; nothing of hers lands in mallory's."""
    tmp, settings = own_tmp
    if os.getuid() != 0:
        pytest.skip("needs root to make the directory another user's")
    squatted = place.directory()
    squatted.mkdir(mode=0o777)
    squatted.chmod(0o777)
    os.chown(squatted, 2001, 2001)
    env = {**os.environ, "TMPDIR": str(tmp), "HOME": str(tmp / "home")}
    opened = subprocess.run(
        [sys.executable, "-m", "tacc_agent", *settings, "dashboard", "open"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=env,
    )
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert list(squatted.iterdir()) == []
    pointer = tmp / "home" / place.POINTER.format(host=socket.gethostname())
    used = Path(pointer.read_text().strip())
    assert used.parent == tmp and used != squatted and used.name.startswith(squatted.name)
    assert used.stat().st_mode & 0o777 == 0o700 and (used / place.SOCKET).exists()
    assert place.private_directory() == used  # found again
    for pid in server_pids(tmp):
        os.kill(pid, 15)
