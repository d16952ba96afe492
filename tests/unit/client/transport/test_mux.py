"""Connection sharing's client side (tcloud.transport.mux): who may use a master's socket, when
sharing is on, and the cluster settings that tune it. The master itself runs against
a real sshd in tests/integration/test_tcloud_mux.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tcloud import config
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transport import mux
from tcloud.transport.link import Link
from tests.unit.agent_jobs import agent_env

SETTINGS = Cluster(name="c", host="login.example", user="alice")
OTHER_UID = 4242


@pytest.fixture
def home(monkeypatch) -> Iterator[Path]:
    """A short HOME: the sockets bound in it stay under sun_path's 108 bytes (a pytest
    tmp_path under xdist does not)."""
    path = Path(tempfile.mkdtemp(prefix="mux", dir="/tmp"))
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv(mux.ENV_SWITCH, raising=False)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_private_directory_is_made_0700_and_the_socket_name_is_short(home):
    path = mux.socket_path(SETTINGS)
    assert path.parent == home / ".cache" / "tcloud" / "m"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert len(path.name) == len("0123456789abcdef.sock")
    assert mux.socket_path(SETTINGS) == path  # the same connection, the same socket
    other = Cluster(name="c", host="login.example", user="bob")
    assert mux.socket_path(other) != path


def test_the_runtime_directory_is_used_when_it_is_private(home, monkeypatch):
    runtime = home / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert mux.socket_path(SETTINGS).parent == runtime / "tcloud"
    runtime.chmod(0o755)  # not private: not used
    assert mux.base_directory() == home / ".cache" / "tcloud" / "m"


@pytest.mark.security
@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_directory_others_can_enter_is_refused(home, mode):
    directory = mux.socket_path(SETTINGS).parent
    directory.chmod(mode)
    with pytest.raises(mux.InsecureDirectory, match="not 0700: refusing"):
        mux.socket_path(SETTINGS)


@pytest.mark.security
def test_a_symlinked_directory_is_refused(home, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    (home / ".cache" / "tcloud").mkdir(parents=True)
    (home / ".cache" / "tcloud" / "m").symlink_to(real)
    with pytest.raises(mux.InsecureDirectory, match="symlink"):
        mux.socket_path(SETTINGS)


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_a_directory_of_another_user_is_refused(home):
    directory = mux.socket_path(SETTINGS).parent
    os.chown(directory, OTHER_UID, OTHER_UID)
    with pytest.raises(mux.InsecureDirectory, match=f"owned by uid {OTHER_UID}"):
        mux.socket_path(SETTINGS)


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
def test_a_socket_of_another_user_is_never_used(home):
    path = mux.socket_path(SETTINGS)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    os.chown(path, OTHER_UID, OTHER_UID)
    try:
        with pytest.raises(mux.InsecureDirectory, match="not a socket of yours"):
            mux.open_session(SETTINGS, lambda: False)
    finally:
        listener.close()


@pytest.mark.security
def test_a_file_in_place_of_the_socket_is_refused(home):
    path = mux.socket_path(SETTINGS)
    path.write_text("not a socket")
    with pytest.raises(mux.InsecureDirectory, match="not a socket of yours"):
        mux.open_session(SETTINGS, lambda: False)


def test_no_master_and_an_unknown_host_key_means_a_direct_connection(home):
    asked = []
    assert mux.open_session(SETTINGS, lambda: asked.append(1) or False) is None
    assert asked == [1]  # asked whether it may start one; it may not
    assert not mux.socket_path(SETTINGS).exists()


def test_a_stale_socket_is_not_a_master(home):
    path = mux.socket_path(SETTINGS)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # nobody listens: connecting is refused
    assert mux.session_pipe(path) is None
    assert mux.stop(SETTINGS) is False  # `tcloud disconnect`: nothing to stop, removed
    assert not path.exists()


def serve_once(listener: socket.socket, behaviour: str) -> list[bytes]:
    """One client of a master that answers an error, hangs up, or never answers."""
    said: list[bytes] = []

    def answer() -> None:
        conn, _ = listener.accept()
        said.append(conn.recv(100))
        if behaviour == "error":
            conn.sendall(b'{"mux_error": "cannot start the agent"}\n')
        elif behaviour == "silent":
            conn.recv(100)  # until the client gives up and closes
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    return said


@pytest.mark.fault
@pytest.mark.parametrize("behaviour", ["error", "hangs up", "silent"])
def test_a_live_master_that_gives_no_session_keeps_its_socket(home, monkeypatch, behaviour):
    path = mux.socket_path(SETTINGS)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    monkeypatch.setattr(mux, "REQUEST_TIMEOUT", 0.5)
    started = []
    monkeypatch.setattr(mux, "start_master", lambda *args: started.append(args))
    try:
        said = serve_once(listener, behaviour)
        assert mux.open_session(SETTINGS, lambda: True) is None  # connect directly
        assert said == [b'{"op": "session"}\n']
        assert path.exists()  # the master's socket, and the sessions it carries, live on
        assert started == []  # no second master
    finally:
        listener.close()


@pytest.mark.fault
def test_a_read_only_home_means_a_direct_connection(home, monkeypatch):
    def read_only() -> Path:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(mux, "private_directory", read_only)
    assert mux.open_session(SETTINGS, lambda: True) is None
    assert mux.stop(SETTINGS) is False


def test_a_master_without_a_session_to_give_means_a_direct_connection(home):
    path = mux.socket_path(SETTINGS)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    try:
        client_side = []

        def answer() -> None:
            conn, _ = listener.accept()
            client_side.append(conn.recv(100))
            conn.sendall(b'{"mux_error": "cannot start the agent"}\n')
            conn.close()

        thread = threading.Thread(target=answer)
        thread.start()
        with pytest.raises(mux.MasterUnusable, match="cannot start the agent"):
            mux.session_pipe(path)
        thread.join()
        assert client_side == [b'{"op": "session"}\n']
    finally:
        listener.close()


@pytest.mark.parametrize("value", ["0", "false", "off", "no"])
def test_tcloud_multiplex_0_turns_sharing_off(home, monkeypatch, value):
    assert mux.enabled(SETTINGS)  # on by default
    monkeypatch.setenv(mux.ENV_SWITCH, value)
    assert not mux.enabled(SETTINGS)
    link = Link(SETTINGS, lambda settings: None, multiplex=True)
    assert link.multiplex is False


def test_the_cluster_config_turns_sharing_off_and_sets_the_idle_time(home, tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("TCLOUD_CONFIG", str(path))
    entry = {"host": "h", "multiplex": False, "multiplex_idle": 60}
    path.write_text(yaml.safe_dump({"current": "c", "clusters": {"c": entry}}))
    settings = config.cluster()
    assert settings.multiplex is False and not mux.enabled(settings)
    assert mux.idle_seconds(settings) == 60
    assert mux.idle_seconds(SETTINGS) == mux.DEFAULT_IDLE


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("multiplex", "yes", "multiplex must be true or false"),
        ("multiplex_idle", -1, "multiplex_idle must be whole seconds >= 0"),
        ("multiplex_idle", "300", "multiplex_idle must be whole seconds >= 0"),
        ("multiplex_idle", True, "multiplex_idle must be whole seconds >= 0"),
    ],
)
def test_bad_multiplex_settings_are_one_clear_error(tmp_path, monkeypatch, field, value, message):
    path = tmp_path / "config.yaml"
    monkeypatch.setenv("TCLOUD_CONFIG", str(path))
    entry = {"host": "h", field: value}
    path.write_text(yaml.safe_dump({"current": "c", "clusters": {"c": entry}}))
    with pytest.raises(TcloudError, match=message):
        config.cluster()


class StandInMaster:
    """A master's socket protocol, served here: each session is a local `tacc-agent
    session` (the real agent, on this machine), its hello first, then relayed."""

    def __init__(self, path: Path, env: dict[str, str]) -> None:
        self.env = env
        self.sessions = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.session, args=(conn,), daemon=True).start()

    def session(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        assert json.loads(reader.readline()) == {"op": "session"}
        self.sessions += 1
        agent = subprocess.Popen(
            [sys.executable, "-m", "tacc_agent", "session"],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

        def upstream() -> None:
            while data := reader.read1(65536):
                agent.stdin.write(data)
                agent.stdin.flush()
            agent.stdin.close()

        threading.Thread(target=upstream, daemon=True).start()
        while data := agent.stdout.read1(65536):
            conn.sendall(data)
        agent.wait()
        conn.close()

    def close(self) -> None:
        self.listener.close()


PROBE = """
import sys
from tcloud import cli
code = cli.main(sys.argv[1:])
print("paramiko loaded:", sorted(m for m in sys.modules if m.split(".")[0] == "paramiko") != [])
sys.exit(code)
"""


def test_a_command_the_master_serves_never_loads_paramiko(home, tmp_path, monkeypatch):
    config_path = tmp_path / "config.yaml"
    entry = {"host": "cluster.invalid", "user": "alice", "userdir": str(tmp_path / "u")}
    config_path.write_text(yaml.safe_dump({"current": "c", "clusters": {"c": entry}}))
    monkeypatch.setenv("TCLOUD_CONFIG", str(config_path))
    master = StandInMaster(mux.socket_path(config.cluster()), agent_env(tmp_path))
    try:
        proc = subprocess.run(
            [sys.executable, "-c", PROBE, "env", "ls", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ},
        )
    finally:
        master.close()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout.split("paramiko loaded:")[0]) == []
    assert master.sessions == 1  # served by the master: no direct connection was tried
    assert proc.stdout.strip().endswith("paramiko loaded: False"), proc.stdout


def test_a_home_where_no_master_can_live_means_a_direct_connection(home, monkeypatch):
    def no_room(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mux, "start_master", no_room)
    assert mux.open_session(SETTINGS, lambda: True) is None


@pytest.mark.security
def test_a_json_py_where_the_command_runs_is_never_imported_by_the_master(
    home, tmp_path, monkeypatch
):
    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TCLOUD_TIMING", str(tmp_path / "timing.jsonl"))
    settings = Cluster(name="c", host="127.0.0.1", port=1, user="alice")
    mux.start_master(settings, mux.socket_path(settings))  # nothing listens on port 1
    assert not marker.exists()
    assert "TCLOUD_TIMING" not in mux.master_environment()
    assert not (tmp_path / "timing.jsonl").exists()


@pytest.mark.fault
def test_a_home_too_deep_for_a_unix_socket_means_a_direct_connection(home, monkeypatch):
    deep = home / ("d" * 80)
    deep.mkdir()
    monkeypatch.setenv("HOME", str(deep))
    started = []
    monkeypatch.setattr(mux, "start_master", lambda *args: started.append(args))
    with pytest.raises(mux.SocketPathTooLong, match="too long for a Unix socket"):
        mux.socket_path(SETTINGS)
    assert mux.open_session(SETTINGS, lambda: True) is None
    assert started == []  # no master that would log in and die


@pytest.mark.security
@pytest.mark.parametrize("edited", ["config", "known_hosts", "cluster_known_hosts"])
def test_an_edited_ssh_config_or_known_hosts_means_a_new_connection(home, edited):
    cluster_file = str(home / "cluster_known_hosts")
    settings = Cluster(name="c", host="login.example", known_hosts=cluster_file)
    (home / ".ssh").mkdir()
    before = mux.connection_key(settings)
    target = home / edited if edited == "cluster_known_hosts" else home / ".ssh" / edited
    target.write_text("@revoked * ssh-ed25519 AAAA\n")
    assert mux.connection_key(settings) != before  # a running master is not used for it


OTHER_UID_LISTENER = """
import os, socket, sys, time
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])  # as root: the socket file is root's, as the client's is
os.setuid(int(sys.argv[2]))
listener.listen(1)  # the peer credentials a client sees: this uid's
print("listening", flush=True)
time.sleep(30)
"""


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="a listener of another uid needs root")
def test_a_master_of_another_uid_is_never_used(home):
    path = mux.socket_path(SETTINGS)
    listener = subprocess.Popen(
        [sys.executable, "-c", OTHER_UID_LISTENER, str(path), str(OTHER_UID)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout.readline() == "listening\n"
        with pytest.raises(mux.InsecureDirectory, match=f"process of uid {OTHER_UID}"):
            mux.open_session(SETTINGS, lambda: False)
    finally:
        listener.kill()
        listener.wait()


@pytest.mark.security
def test_the_masters_settings_are_never_on_its_command_line(home, monkeypatch):
    seen = {}
    real_popen = subprocess.Popen

    def recording_popen(argv, **kwargs):
        seen["argv"] = argv
        return real_popen(argv, **kwargs)

    monkeypatch.setattr(mux.subprocess, "Popen", recording_popen)
    settings = Cluster(name="c", host="127.0.0.1", port=1, user="alice", key="/k/secret_id")
    path = mux.socket_path(settings)
    mux.start_master(settings, path)  # nothing listens on port 1: it logs why and exits
    assert not any("secret_id" in word or "127.0.0.1" in word for word in seen["argv"])
    assert "cannot start" in path.with_suffix(".log").read_text()  # it read its settings
