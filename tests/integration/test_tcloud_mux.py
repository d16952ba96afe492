"""Connection sharing (tcloud.transport.mux, tcloud.transport.mux_master) against a real
sshd: commands share one master and one SSH login, 40 at once start one master, a killed
master is replaced, an idle one exits, `tcloud disconnect` stops it, TCLOUD_MULTIPLEX=0
connects directly, and a socket directory others could enter is refused. On the
factory's one-node lab with the agent (tests/integration/labs.py: AGENT_NODE, shared
with test_tcloud_upload.py)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tacc_lab.lab import resolve_config
from tcloud.transport import mux_master
from tests.conftest import run_cli
from tests.integration.lab_helpers import node_sh
from tests.integration.labs import AGENT_NODE

pytestmark = pytest.mark.lab

NAME = AGENT_NODE.name
NODE = AGENT_NODE.address("n1")
USERDIR = "/root/tcloud-mux"
# One command as the CLI's agent-session path runs it: its own process, one verb.
COMMAND = """
from tcloud.jobs import verbs as jobs
from tcloud.sdk import Cluster
with Cluster() as cluster:
    print(jobs.whoami(cluster.client, cluster.userdir)["userdir"])
"""


@pytest.fixture(scope="module")
def lab(shaped_lab):
    return resolve_config(NAME, AGENT_NODE.subnet, AGENT_NODE.subnet)


class User:
    """A tcloud user of the lab: its own HOME (a short path: the socket's stays well
    under sun_path's limit) and config."""

    def __init__(self, cfg, **settings) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="mux", dir="/tmp"))
        entry = {
            "host": NODE,
            "user": "root",
            "key": str(cfg.ssh_key),
            "known_hosts": str(cfg.known_hosts),
            "userdir": USERDIR,
            **settings,
        }
        config = self.home / "config.yaml"
        config.write_text(yaml.safe_dump({"current": NAME, "clusters": {NAME: entry}}))
        self.env = {**os.environ, "HOME": str(self.home), "TCLOUD_CONFIG": str(config)}
        self.env.pop("XDG_RUNTIME_DIR", None)
        self.env.pop("TCLOUD_MULTIPLEX", None)
        self.directory = self.home / ".cache" / "tcloud" / "m"

    def start(self, **env: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", COMMAND],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def command(self, **env: str) -> subprocess.CompletedProcess:
        process = self.start(**env)
        out, err = process.communicate(timeout=120)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def sockets(self) -> list[Path]:
        return sorted(self.directory.glob("*.sock")) if self.directory.is_dir() else []

    def masters(self) -> list[int]:
        """The pids of this user's masters (tcloud.transport.mux_master with this HOME: its argv
        holds no settings, they came on its stdin)."""
        found = []
        home = f"HOME={self.home}".encode()
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                words = cmdline.read_bytes().decode(errors="replace")
                environ = (cmdline.parent / "environ").read_bytes().split(b"\0")
            except OSError:
                continue  # it ended meanwhile
            if "tcloud.transport.mux_master" in words and home in environ:
                found.append(int(cmdline.parent.name))
        return found

    def disconnect(self) -> None:
        run_cli("tcloud", "disconnect", env=self.env)


def logins() -> int:
    """sshd's accepted logins on the node so far (this count's own included)."""
    out = node_sh(NAME, "n1", "journalctl -u ssh --no-pager | grep -c Accepted").stdout
    return int(out.strip())


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == USERDIR, proc.stdout + proc.stderr


def test_two_commands_share_one_master_and_one_login(lab):
    user = User(lab)
    try:
        before = logins()
        ok(user.command())
        ok(user.command())
        assert logins() - before == 1 + 1  # the master's login, and this count's own
        assert len(user.sockets()) == 1 and len(user.masters()) == 1
        assert oct(user.directory.stat().st_mode & 0o777) == "0o700"
        assert oct(user.sockets()[0].stat().st_mode & 0o777) == "0o600"
    finally:
        user.disconnect()


def test_tcloud_multiplex_0_connects_directly(lab):
    user = User(lab)
    before = logins()
    ok(user.command(TCLOUD_MULTIPLEX="0"))
    ok(user.command(TCLOUD_MULTIPLEX="0"))
    assert logins() - before == 2 + 1
    assert user.sockets() == [] and user.masters() == []


def test_forty_commands_at_once_start_one_master(lab):
    user = User(lab)
    try:
        before = logins()
        running = [user.start() for _ in range(40)]
        seen: set[int] = set()  # every master that ran meanwhile: one, never replaced
        deadline = time.monotonic() + 300
        while any(process.poll() is None for process in running):
            assert time.monotonic() < deadline, "40 commands still running after 300 s"
            seen.update(user.masters())
            time.sleep(0.05)
        for process in running:
            out, err = process.communicate(timeout=10)
            ok(subprocess.CompletedProcess(process.args, process.returncode, out, err))
        assert user.masters() == sorted(seen) and len(seen) == 1
        # The master's connections: one, and another each PER_CONNECTION sessions open at
        # once (the 40 and its spares); and this count's own login.
        at_once = 40 + mux_master.MAX_SPARES
        assert logins() - before <= math.ceil(at_once / mux_master.PER_CONNECTION) + 1
    finally:
        user.disconnect()


@pytest.mark.fault
def test_a_killed_master_is_replaced_and_the_command_still_runs(lab):
    user = User(lab)
    try:
        ok(user.command())
        [first] = user.masters()
        os.kill(first, signal.SIGKILL)  # its socket stays behind, stale
        time.sleep(0.2)
        assert len(user.sockets()) == 1
        ok(user.command())
        assert len(user.masters()) == 1 and user.masters() != [first]
    finally:
        user.disconnect()


def test_an_idle_master_exits_and_disconnect_stops_one(lab):
    user = User(lab, multiplex_idle=2)
    ok(user.command())
    assert len(user.masters()) == 1
    deadline = time.monotonic() + 20
    while user.masters() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert user.masters() == [] and user.sockets() == []
    ok(user.command())
    stopped = run_cli("tcloud", "disconnect", env=user.env)
    assert "stopped the shared connection" in stopped.stdout, stopped.stdout + stopped.stderr
    time.sleep(0.5)
    assert user.masters() == [] and user.sockets() == []


@pytest.mark.security
def test_a_socket_directory_others_can_enter_is_refused(lab):
    user = User(lab)
    user.directory.mkdir(parents=True, mode=0o700)
    user.directory.chmod(0o755)
    refused = run_cli("tcloud", "ps", env=user.env)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert refused.stderr.startswith("tcloud: error: ") and "Traceback" not in refused.stderr
    assert "not 0700: refusing to share connections" in refused.stderr, refused.stderr
    assert user.masters() == [] and user.sockets() == []
