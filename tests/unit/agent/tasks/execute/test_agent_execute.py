"""Layer 4 on one node, without Slurm: the wrapper's variables, logs, exit status and
signal handling, the environment cache and the log streamer."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tacc_agent.tasks.jobs import logs, records
from tests.unit.agent_jobs import agent, agent_env, make_job


def rank_log(job_dir: Path) -> list[str]:
    return next((job_dir / "logs").glob("rank-0-*.log")).read_text().splitlines()


def test_wrapper_sets_the_variables_and_records_the_exit(tmp_path):
    line = (
        "echo $TACC_NODE_RANK/$TACC_NUM_NODES $RANK/$WORLD_SIZE $LOCAL_RANK $MASTER_ADDR "
        "$TACC_TRANSPORT $NCCL_IB_DISABLE $GREETING $PYTHONUNBUFFERED; pwd"
    )
    task = {"name": "t", "run": [line], "environment": {"env": {"GREETING": "hi there"}}}
    _, job_dir = make_job(tmp_path, task)
    env = agent_env(tmp_path) | {"SSH_CLIENT": "10.0.0.1 50000 22"}  # as if over ssh
    proc = agent("exec", str(job_dir), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rank_log(job_dir) == [
        "tacc: transport tcp: no active RDMA port on "
        + os.uname().nodename
        + " (fail-safe switching, NCCL_IB_DISABLE=1)",
        # MASTER_ADDR: the node's own address (127.0.1.1 where Debian's installer wrote
        # the host name into /etc/hosts, 127.0.0.1 on other machines).
        f"0/1 0/1 0 {socket.gethostbyname(os.uname().nodename)} tcp 1 hi there 1",
        f"{job_dir}/code",
    ]
    rank = records.ranks(job_dir)[0]
    assert (
        rank["state"] == "EXITED" and rank["exit_code"] == 0 and rank["rdma"]["active_ports"] == 0
    )


def test_a_failing_line_stops_the_rank_with_its_exit_code(tmp_path):
    _, job_dir = make_job(tmp_path, {"name": "t", "run": ["echo one; exit 7", "echo never"]})
    proc = agent("exec", str(job_dir), env=agent_env(tmp_path))
    assert proc.returncode == 7
    assert rank_log(job_dir)[-2:] == ["one", "tacc: exited 7"]
    assert records.ranks(job_dir)[0]["exit_code"] == 7


def test_rdma_is_chosen_when_the_node_has_an_active_port(tmp_path):
    port = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    _, job_dir = make_job(tmp_path, {"name": "t", "run": ["echo $NCCL_IB_DISABLE"]})
    env = agent_env(tmp_path, rdma_sysfs_root=str(tmp_path / "sys"))
    assert agent("exec", str(job_dir), env=env).returncode == 0
    first, second = rank_log(job_dir)
    assert first.startswith("tacc: transport rdma: active RDMA ports on every node")
    assert second == "0"


def wait_for(predicate, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sigterm_kills_the_whole_program_and_usr1_reaches_it(tmp_path):
    marker = tmp_path / "got-usr1"
    # A grandchild that ignores USR1 (so it outlives the checkpoint signal) must still go.
    line = (
        f"trap 'touch {marker}' USR1; (trap '' USR1; exec sleep 861) & "
        "while true; do sleep 0.1 || true; done"
    )
    _, job_dir = make_job(tmp_path, {"name": "t", "run": [line]})
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "tacc_agent", "exec", str(job_dir)], env=agent_env(tmp_path)
    )
    wait_for(lambda: records.ranks(job_dir) and records.ranks(job_dir)[0]["state"] == "RUNNING")
    time.sleep(0.3)
    wrapper.send_signal(signal.SIGUSR1)
    wait_for(marker.exists)
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(20) != 0
    leftovers = subprocess.run(["pgrep", "-f", "sleep 861"], capture_output=True, text=True)
    assert leftovers.stdout == ""
    rank = records.ranks(job_dir)[0]
    assert rank.get("terminated") and rank["signal"] == "SIGTERM", rank
    assert "tacc: checkpoint signal (SIGUSR1) passed to the program" in rank_log(job_dir)


def test_log_stream_prefixes_each_rank_and_follows_until_the_end(tmp_path):
    job_dir = tmp_path / "job"
    (job_dir / "logs").mkdir(parents=True)
    (job_dir / "logs/job.log").write_text("tacc: provisioning\n")
    (job_dir / "logs/rank-0-n2.log").write_text("a\nb\n")
    (job_dir / "logs/rank-1-n3.log").write_text("c\npartial")
    out: list[str] = []
    logs.stream(job_dir, False, None, None, lambda: True, out.append)
    assert out == [
        "[job] tacc: provisioning\n",
        "[n2:0] a\n",
        "[n2:0] b\n",
        "[n3:1] c\n",
        "[n3:1] partial\n",
    ]
    out.clear()
    logs.stream(job_dir, False, 1, 0, lambda: True, out.append)
    assert out == ["[n2:0] b\n"]
    calls = iter([False, False, True])
    out.clear()

    def ended() -> bool:
        with (job_dir / "logs/rank-0-n2.log").open("a") as handle:
            handle.write("more\n")
        return next(calls)

    logs.stream(job_dir, True, 0, 0, ended, out.append)
    assert out == ["[n2:0] more\n"] * 2  # the first ended() ran before the file was opened


def test_job_check_and_errors_are_json_without_traceback(tmp_path):
    env = agent_env(tmp_path)
    proc = agent("job", "check", env=env, input="{not json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not valid JSON" in json.loads(proc.stdout)["error"]
    (tmp_path / "workspace").mkdir()
    proc = agent("job", "status", "123", env=env)
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"] == (
        "no job 123 of yours on this cluster"
    )


def test_a_background_process_does_not_hold_the_line_open(tmp_path):
    line = "(trap '' TERM; exec sleep 863) & echo started"
    _, job_dir = make_job(tmp_path, {"name": "t", "run": [line, "echo second"]})
    proc = agent("exec", str(job_dir), env=agent_env(tmp_path))
    assert proc.returncode == 0
    assert rank_log(job_dir)[-2:] == ["started", "second"]
    leftovers = subprocess.run(["pgrep", "-f", "sleep 863"], capture_output=True, text=True)
    assert leftovers.stdout == ""  # TERM ignored: KILL


@pytest.mark.fault
def test_an_orphan_that_left_its_session_is_stopped_when_its_line_ends(tmp_path):
    # A launcher killed before its workers (torchrun by a signal) orphans them in
    # sessions of their own, with no pipe held open: the wrapper, a child subreaper,
    # adopts and stops them. On the old code this sleep outlived the job.
    line = "setsid sh -c 'sleep 871 </dev/null >/dev/null 2>&1 &' ; echo started"
    _, job_dir = make_job(tmp_path, {"name": "t", "run": [line]})
    proc = agent("exec", str(job_dir), env=agent_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rank_log(job_dir)[-1] == "started"
    leftovers = subprocess.run(["pgrep", "-f", "sleep 871"], capture_output=True, text=True)
    assert leftovers.stdout == ""


def test_bad_store_requests_get_a_json_error_and_leave_nothing(tmp_path):
    env = agent_env(tmp_path)
    (tmp_path / "workspace").mkdir()
    for request in (
        {"op": "commit", "manifest": ["a"]},
        {"op": "missing", "blobs": 5},
        {"op": "commit", "blobs": [], "manifest": {"../../x": "0" * 64 + "-644"}},
        {
            "op": "commit",
            "blobs": [],
            "manifest": {},
            "digest": "0" * 64,
            "files": {"instruction.json": "not json"},
        },
        {"op": "explode"},
    ):
        proc = agent("store", env=env, input=json.dumps(request))
        assert proc.returncode in (2, 3), (request, proc)
        assert "error" in json.loads(proc.stdout) and "Traceback" not in proc.stderr
    user = os.environ.get("USER") or "root"
    jobs = tmp_path / "workspace" / user / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []
