"""Issue [14] on the slurm lab: into a running job (docs/interactive.md).

The real CLI, as a researcher runs it: `tcloud shell` through a pseudo-terminal (pexpect),
`exec --all`, `forward` fetching a page the job serves, `top`, an interactive session
(`tcloud dev`) that stops itself when idle, and bob refused at every door of alice's job.

Collected as part of test_slurm_cluster.py (which imports these tests), so they run on
its lab and its researchers alice and bob. One two-node job serves i1-i4.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pexpect
import pytest

from tacc_contract.slurm_time import time_seconds
from tacc_lab.demo import researcher_env
from tests.conftest import BIN
from tests.integration.lab_helpers import node_sh, submit, wait_state
from tests.integration.labs import SLURM_LAB

JOB_PORT = 8765
SESSION_PORT = 8766
PAGE = "hello from the job\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serving_task(root: Path, name: str, port: int, **extra) -> Path:
    """A task whose every node serves its code/ directory over HTTP until cancelled."""
    root.mkdir()
    (root / "index.html").write_text(PAGE)
    task = {
        "name": name,
        "resources": {"nodes": 2, "mem": "100M", "time": "10"},
        "environment": {"env": {"MARKER": "from-the-task"}},
        "run": [f"exec python3 -m http.server {port} --bind 0.0.0.0"],
        **extra,
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def tcloud_pty(user: str, *argv: str, timeout: int = 60) -> pexpect.spawn:
    """The real tcloud on a pseudo-terminal, as the researcher types it."""
    env = researcher_env(SLURM_LAB, user)
    return pexpect.spawn(
        str(BIN / "tcloud"),
        list(argv),
        env=env,
        encoding="utf-8",
        timeout=timeout,
        dimensions=(24, 100),
    )


def alice_logins() -> int:
    """The SSH logins of alice's the login node's sshd has accepted so far."""
    script = "journalctl -u ssh --no-pager | grep -c 'Accepted publickey for alice ' || true"
    return int(node_sh(SLURM_LAB, "login1", script).stdout.strip())


class TestIntoARunningJob:
    """i1-i5 share one running two-node job of alice's, cancelled after i5 (class scope),
    so the nodes are free for the cases after them."""

    @pytest.fixture(scope="class")
    @classmethod
    def served_job(cls, alice, tmp_path_factory):
        """alice's running two-node job (n2 = rank 0, n3 = rank 1), cancelled at the end."""
        project = serving_task(tmp_path_factory.mktemp("served") / "p", "served", JOB_PORT)
        job = submit(alice, project)
        wait_state(alice, job, ("RUNNING",))
        yield job
        alice("cancel", job)

    def test_i1_a_shell_on_the_second_node_runs_hostname_in_the_jobs_environment(
        self, alice, served_job
    ):
        shell = tcloud_pty("alice", "shell", served_job, "--node", "1")
        # A""B prints AB: what the terminal echoes of a typed line never matches its output.
        shell.sendline('echo "A""T=$(hostname) M""K=$MARKER J""B=$SLURM_JOB_ID D""R=$(pwd)"')
        shell.expect(r"AT=(\S+) MK=(\S*) JB=(\S*) DR=(\S+)\r\n")
        host, marker, job, cwd = shell.match.groups()
        assert (host, marker, job) == ("n3", "from-the-task", served_job), shell.before
        assert cwd.endswith("/code"), cwd
        shell.setwinsize(40, 132)  # the window's new size reaches the remote terminal
        shell.sendline("stty size")
        shell.expect(r"40 132\r\n")
        shell.sendline('sleep 60; echo "not""-interrupted"')
        time.sleep(1)
        shell.sendcontrol("c")  # Ctrl-C stops the remote program, not tcloud
        shell.sendline('echo "still""-here"')
        shell.expect("still-here\r\n")
        assert "not-interrupted" not in shell.before
        shell.sendline("exit 7")
        shell.expect(pexpect.EOF)
        shell.close()
        assert shell.exitstatus == 7

    def test_i2_exec_all_answers_from_both_nodes_with_exit_codes_per_node(self, alice, served_job):
        proc = alice("exec", served_job, "--all", "--", "hostname")
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["[n2:0] n2", "[n3:1] n3"]
        script = 'echo "r$TACC_NODE_RANK"; exit "$TACC_NODE_RANK"'
        proc = alice("exec", served_job, "--all", "--", "sh", "-c", script)
        assert proc.returncode == 1, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["[n2:0] r0", "[n3:1] r1"]
        assert "[n3:1] exited 1" in proc.stderr

    def test_i2_exec_shell_and_logs_ride_the_connection_master_with_no_login_of_their_own(
        self, alice, served_job
    ):
        """Issue [23]: their exec channels open on the master's connection, so they cost
        no SSH handshake (the login node's sshd counts no new login of alice's)."""
        assert alice("status", served_job).returncode == 0  # the master runs
        before = alice_logins()
        proc = alice("exec", served_job, "--all", "--", "sh", "-c", "echo out; echo err >&2")
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["[n2:0] out", "[n3:1] out"]
        assert sorted(proc.stderr.splitlines()) == ["[n2:0] err", "[n3:1] err"]
        shell = alice("shell", served_job, "--node", "1", stdin="hostname; exit 3\n")
        assert (shell.returncode, shell.stdout) == (3, "n3\n"), shell.stderr
        assert alice("logs", served_job).returncode == 0
        assert alice_logins() == before

    def test_i2_exec_runs_the_nodes_step_itself_with_no_agent_on_the_login_node(
        self, alice, served_job
    ):
        """Issue [23]: `job target` answers each node's step and tcloud runs it, so the
        login node runs alice's srun and no `tacc-agent job attach` in front of it."""
        env = researcher_env(SLURM_LAB, "alice")
        command = ["sh", "-c", "umask; sleep 4"]
        argv = [str(BIN / "tcloud"), "exec", served_job, "--all", "--", *command]
        running = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        seen = ""
        try:
            for _ in range(40):
                seen = node_sh(SLURM_LAB, "login1", "ps -u alice -o args= || true").stdout
                if "--nodelist=n2" in seen and "--nodelist=n3" in seen:
                    break
                time.sleep(0.1)
        finally:
            out, err = running.communicate(timeout=60)
        assert running.returncode == 0, err
        # srun hands the login shell's umask (0002) on; the job's is the agent's private one
        assert sorted(out.splitlines()) == ["[n2:0] 0077", "[n3:1] 0077"], out + err
        steps = [line.split() for line in seen.splitlines() if line.startswith("srun ")]
        nodes = {word for words in steps for word in words if word.startswith("--nodelist=")}
        assert nodes == {"--nodelist=n2", "--nodelist=n3"}, seen  # srun shows as 2 processes
        assert all("enter" in words for words in steps), seen
        assert "job attach" not in seen, seen

    def test_i3_a_forwarded_port_fetches_a_page_served_by_the_job(self, alice, served_job):
        local = free_port()
        env = researcher_env(SLURM_LAB, "alice")
        forward = subprocess.Popen(
            [str(BIN / "tcloud"), "forward", served_job, f"{JOB_PORT}:{local}", "--node", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert forward.stdout is not None
            first = forward.stdout.readline()
            assert f"127.0.0.1:{local}" in first and "n3" in first, first + forward.stderr.read()
            for _ in range(3):  # several connections through one forward
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{local}/index.html", timeout=20
                ) as page:
                    assert page.read().decode() == PAGE
            # issue [23]: the bytes went through an OpenSSH master of the forward's
            masters = [argv for argv in children_argv(forward.pid) if "-M" in argv]
            assert len(masters) == 1 and Path(masters[0][0]).name == "ssh", masters
        finally:
            forward.send_signal(signal.SIGINT)
            assert forward.wait(timeout=20) == 0, forward.stderr.read() if forward.stderr else ""
        err = forward.stderr.read() if forward.stderr else ""
        assert "relaying through srun" not in err, err  # and the node's relay connected back

    def test_i4_top_shows_each_nodes_usage_of_the_job(self, alice, served_job):
        proc = alice("top", served_job, "--once", "--json")
        assert proc.returncode == 0, proc.stderr
        frame = json.loads(proc.stdout.splitlines()[-1])
        nodes = {node["host"]: node for node in frame["nodes"]}
        assert sorted(nodes) == ["n2", "n3"], frame
        for node in nodes.values():
            assert "error" not in node or node["error"] is None, node
            assert node["memory_bytes"] > 1 << 20, node  # at least the Python HTTP server
            assert node["cpu_seconds"] >= 0, node
        text = alice("top", served_job, "--once")
        assert text.returncode == 0 and "n3:1" in text.stdout, text.stdout + text.stderr

    @pytest.mark.security
    def test_i5_bob_can_neither_shell_exec_forward_nor_top_into_alices_job(self, bob, served_job):
        for argv in (
            ("shell", served_job),
            ("exec", served_job, "--all", "--", "id"),
            ("forward", served_job, f"{JOB_PORT}:{free_port()}"),
            ("top", served_job, "--once"),
        ):
            proc = bob(*argv)
            assert proc.returncode == 4, (argv, proc.stdout, proc.stderr)
            assert served_job in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
            assert proc.stdout == "", proc.stdout
        # Slurm is the second wall: bob's own srun into alice's job is refused by Slurm.
        script = f"su - bob -c 'srun --jobid={served_job} --overlap -N1 -n1 id' 2>&1; echo rc=$?"
        out = node_sh(SLURM_LAB, "login1", script).stdout
        assert "rc=0" not in out and "uid=" not in out, out


def children_argv(pid: int) -> list[list[str]]:
    """The argv of each process of this machine whose parent is pid."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            parent = int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
            if parent == pid:
                cmdline = (stat_file.parent / "cmdline").read_bytes()
                found.append([word.decode() for word in cmdline.split(b"\0") if word])
    return found


def job_processes(job: str) -> str:
    """A node script printing every process of Slurm job `job` (its environment says so)."""
    return (
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null"
        f" | grep -qx SLURM_JOB_ID={job} && cat $p/cmdline | tr '\\0' ' ' && echo; done; true"
    )


def session_state(tcloud, job: str, seconds: int) -> dict:
    return wait_state(tcloud, job, ("COMPLETED", "FAILED", "CANCELLED"), seconds=seconds)


def test_i6_an_idle_session_stops_itself_and_leaves_no_process_or_allocation(alice, tmp_path):
    session = {"ports": [SESSION_PORT], "idle_timeout": "0:20"}
    project = serving_task(tmp_path / "dev", "idle-dev", SESSION_PORT, session=session)
    # Timed from before the submit: the watch starts with the job, so the cancel comes
    # 20 s or more after this whatever the submit and ps below take on a loaded host.
    submitted = time.monotonic()
    proc = alice("dev", "--detach", str(project), cwd=project)
    assert proc.returncode == 0, proc.stderr
    job = next(w for w in proc.stdout.split() if w.isdigit())
    assert f"tcloud shell {job}" in proc.stdout, proc.stdout
    rows = json.loads(alice("ps", "--json").stdout)
    row = next(r for r in rows if r["job"] == job)
    assert row["kind"] == "session", row
    info = session_state(alice, job, seconds=150)
    assert info["state"] == "CANCELLED" and "idle" in (info.get("reason") or ""), info
    assert time.monotonic() - submitted >= 20
    idle_for = re.search(r"session idle for (\d+(?::\d\d)+)", info["reason"])
    assert idle_for and (time_seconds(idle_for[1]) or 0) >= 20, info
    for node in ("n2", "n3"):  # scancel's processes end within Slurm's kill wait
        deadline = time.monotonic() + 60
        while (left := node_sh(SLURM_LAB, node, job_processes(job)).stdout.strip()) and (
            time.monotonic() < deadline
        ):
            time.sleep(1)
        assert left == "", f"{node}: {left}"
    # Its allocation is released once slurmctld hears the nodes are done (it shows as
    # CG, completing, for a moment on a loaded host).
    deadline = time.monotonic() + 60
    query = f"squeue -h -j {job} 2>/dev/null || true"
    while (queue := node_sh(SLURM_LAB, "n1", query).stdout.strip()) and time.monotonic() < deadline:
        time.sleep(1)
    assert queue == "", queue


@pytest.mark.fault
def test_i7_a_session_asked_to_stop_on_disconnect_ends_when_the_client_dies(alice, tmp_path):
    project = serving_task(
        tmp_path / "dev2",
        "tethered",
        SESSION_PORT + 1,
        session={"ports": [SESSION_PORT + 1], "idle_timeout": "0"},
    )
    local = free_port()
    env = researcher_env(SLURM_LAB, "alice")
    client = subprocess.Popen(
        [
            str(BIN / "tcloud"),
            "dev",
            str(project),
            "--stop-on-disconnect",
            "--port",
            f"{SESSION_PORT + 1}:{local}",
        ],
        env=env,
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    job = ""
    try:
        assert client.stdout is not None
        deadline = time.monotonic() + 120
        for line in client.stdout:
            job = job or next((w for w in line.split() if w.isdigit() and len(w) < 9), "")
            if line.startswith(f"forwarding 127.0.0.1:{local}") or time.monotonic() > deadline:
                break
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.html", timeout=20) as page:
            assert page.read().decode() == PAGE
    finally:
        os.killpg(client.pid, signal.SIGKILL)  # the laptop dies: no goodbye
        client.wait(timeout=20)
    assert job, "no job id printed"
    info = session_state(alice, job, seconds=90)
    assert info["state"] == "CANCELLED", info
