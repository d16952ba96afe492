"""`job top` (tasks/interactive/top.py on the login node, node_usage.py on the job's nodes):
one step
of the caller's job (a FAKE srun) runs `tacc-agent node-usage` on every node, which reads
that node's figures of the job whose step runs it (a fake /proc with alice's job 41 and
bob's job 42 on one node) and keeps the caller's own; a silent or refusing step is an
error per node; another user's job is refused before any step starts."""

from __future__ import annotations

import http.server
import json
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tacc_agent import node_usage, slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_REJECTED, Rejected
from tacc_agent.health import job_usage
from tacc_agent.tasks.interactive import attach, top
from tacc_contract import verbs
from tests.unit.agent.health.test_job_usage import ALICE, TICKS, add_process, fake_smi, two_gpus
from tests.unit.agent_jobs import agent, agent_env

BOB = 65533  # another account than ALICE's
STEP_PID = 150  # `tacc-agent node-usage` in alice's step 41.3 (srun --overlap)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> job_usage.Sources:
    """Node n2: alice's job 41 (a training task on GPU 1, and the step top started) and
    bob's job 42 (a task on GPU 0) side by side, read as job_usage reads a node."""
    root = tmp_path / "proc"
    add_process(root, 1, 0, 0, b"/sbin/init\0")
    add_process(root, 110, 1, 0, b"slurmstepd: [41.0]\0")
    add_process(
        root,
        111,
        110,
        ALICE,
        b"python\0train.py\0",
        ticks=(3 * TICKS, 0, 0, 0),
        pss_kb=1000,
        environ={"SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "1"},
    )
    add_process(root, 140, 1, 0, b"slurmstepd: [41.3]\0")
    add_process(root, STEP_PID, 140, ALICE, b"python\0-m\0tacc_agent\0", pss_kb=10)
    add_process(root, 210, 1, 0, b"slurmstepd: [42.0]\0")
    add_process(
        root,
        211,
        210,
        BOB,
        b"python\0secret.py\0",
        ticks=(77 * TICKS, 0, 0, 0),
        pss_kb=9999,
        environ={"SLURM_CPUS_ON_NODE": "8", "SLURM_JOB_GPUS": "0"},
    )
    # alice's own process titled like a step daemon of bob's job: not a step daemon.
    add_process(root, 300, 1, ALICE, b"slurmstepd: [42.0]\0")
    add_process(root, 301, 300, ALICE, b"sh\0", pss_kb=1)
    smi = fake_smi(
        tmp_path,
        monkeypatch,
        two_gpus(
            processes1=[{"pid": 111, "used_mib": 2048}],
            processes0=[{"pid": 211, "used_mib": 4096}],
        ),
    )
    return job_usage.Sources(
        str(root),
        str(tmp_path / "no-cgroup"),
        smi,
        nvidia_smi_seconds=60.0,  # the FAKE nvidia-smi is a Python start: never cut off
        node="n2",
        scontrol=str(tmp_path / "no-scontrol"),
    )


def running(*hosts: str) -> attach.RunningJob:
    return attach.RunningJob("41", Path("/ws/alice/jobs/41"), "41", list(hosts), None)


# --- the node side: node-usage ---------------------------------------------------------


def test_node_usage_reads_the_job_of_its_own_step_and_the_callers_figures(node):
    line = node_usage.here(node, STEP_PID, ALICE, "n2")
    assert {k: v for k, v in line.items() if k != "sampled"} == {
        "job": "41",
        "host": "n2",
        "cpu_seconds": 3.0,
        "memory_bytes": (1000 + 10) * 1024,
        "cpus": 4,
        "gpus": [
            {
                "index": 1,
                "utilization_ratio": 0.75,
                "memory_used_bytes": 2048 << 20,
                "memory_total_bytes": 81559 << 20,
            }
        ],
    }
    assert line["sampled"] > 0


@pytest.mark.security
@pytest.mark.parametrize(
    "pid", [301, 1, 999], ids=["below-a-forged-step-daemon", "no-step", "not-in-proc"]
)
def test_node_usage_outside_a_step_of_ones_own_job_says_so_and_gives_no_figures(node, pid):
    """Only a root-owned step daemon makes a job: a process of alice's below her own
    process titled `slurmstepd: [42.0]` learns nothing of bob's job 42."""
    line = node_usage.here(node, pid, ALICE, "n2")
    assert set(line) == {"host", "error"} and "step" in line["error"], line


@pytest.mark.security
def test_node_usage_keeps_only_the_callers_processes_of_the_job(node):
    """Run as bob in alice's job (which Slurm would not start): nothing of job 41."""
    line = node_usage.here(node, STEP_PID, BOB, "n2")
    assert (line["cpu_seconds"], line["memory_bytes"], line["gpus"]) == (None, None, [])


# --- the login side: one step on every node --------------------------------------------


def fake_srun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, code: int = 0, sleep: float = 0.0
) -> Path:
    """A FAKE srun on PATH printing `out`, exiting `code`; it writes its argv to a file."""
    (tmp_path / "srun.out").write_text(out)
    argv_file = tmp_path / "srun.argv"
    tool = tmp_path / "bin" / "srun"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(
        f"#!{sys.executable}\nimport json, sys, time\n"
        f"open({str(argv_file)!r}, 'w').write(json.dumps(sys.argv[1:]))\ntime.sleep({sleep})\n"
        f"sys.stdout.write(open({str(tmp_path / 'srun.out')!r}).read())\n"
        f"sys.stderr.write('srun: error: refused (fake)\\n' if {code} else '')\nsys.exit({code})\n"
    )
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    return argv_file


def line(host: str, job: str = "41", cpu: float = 1.5) -> str:
    return json.dumps(
        {
            "job": job,
            "host": host,
            "cpu_seconds": cpu,
            "memory_bytes": 1024,
            "cpus": 2,
            "gpus": [],
            "sampled": 1.0,
        }
    )


def test_one_step_on_every_node_and_each_nodes_line_by_host(tmp_path, monkeypatch):
    out = (
        "\n".join(
            [
                "srun: a word of its own",
                line("n3", cpu=2.5),
                line("n9"),
                line("n2", job="42", cpu=9),
                line("n2"),
                line("n3", cpu=7.0),
                "{not json",
            ]
        )
        + "\n"
    )
    argv_file = fake_srun(tmp_path, monkeypatch, out)
    before = time.time()
    answer = verbs.JOB_TOP.answer.check(top.usage(running("n2", "n3", "n4")))
    argv = json.loads(argv_file.read_text())
    assert argv[:10] == [
        "--jobid=41",
        "--overlap",
        "--quiet",
        "--mpi=none",
        "--nodes=3",
        "--ntasks=3",
        "--ntasks-per-node=1",
        "--nodelist=n2,n3,n4",
        "--chdir=/ws/alice/jobs/41",
        sys.executable,
    ]
    assert argv[-1] == "node-usage"
    assert (answer["job_id"], answer["state"]) == ("41", "RUNNING") and answer["time"] >= before
    n2, n3, n4 = answer["nodes"]
    # A line of another job or host is skipped; the first line of a host counts.
    assert n2 == {
        "host": "n2",
        "rank": 0,
        "cpu_seconds": 1.5,
        "memory_bytes": 1024,
        "cpus": 2,
        "gpus": [],
        "sampled": 1.0,
    }
    assert (n3["rank"], n3["cpu_seconds"]) == (1, 2.5)
    assert n4 == {"host": "n4", "rank": 2, "error": top.NO_ANSWER}


@pytest.mark.fault
@pytest.mark.parametrize(
    "code, sleep, timeout, expected",
    [(1, 0.0, 60.0, "refused (fake)"), (0, 30.0, 1.0, "did not answer within 1 s")],
    ids=["refused", "hung"],
)
def test_a_refused_or_hung_step_is_an_error_on_every_node(
    tmp_path, monkeypatch, code, sleep, timeout, expected
):
    fake_srun(tmp_path, monkeypatch, line("n2"), code=code, sleep=sleep)
    answer = verbs.JOB_TOP.answer.check(top.usage(running("n2", "n3"), timeout=timeout))
    errors = [node["error"] for node in answer["nodes"]]
    assert len(errors) == 2 and all(expected in error for error in errors), errors


@pytest.mark.fault
def test_a_nodes_error_line_or_unreadable_figures_stay_that_nodes(tmp_path, monkeypatch):
    bad = json.dumps({"job": "41", "host": "n3", "cpu_seconds": "lots", "gpus": []})
    out = json.dumps({"host": "n2", "error": "cannot read this node's processes"})
    fake_srun(tmp_path, monkeypatch, f"{out}\n{bad}\n{line('n4')}\n")
    n2, n3, n4 = top.usage(running("n2", "n3", "n4"))["nodes"]
    assert n2 == {"host": "n2", "rank": 0, "error": "cannot read this node's processes"}
    assert n3["error"].startswith("the node's figures are unreadable"), n3
    assert n4["cpu_seconds"] == 1.5


@pytest.mark.security
def test_another_users_job_is_refused_before_any_step(tmp_path, monkeypatch):
    """bob's workspace has no job 41 (it is alice's): refused, and srun never runs."""
    argv_file = fake_srun(tmp_path, monkeypatch, line("n2"))
    workspace = tmp_path / "workspace"
    bob = workspace / "bob"
    bob.mkdir(parents=True, mode=0o700)
    with pytest.raises(Rejected, match="no job 41 of yours"):
        top.top(bob, "41", AgentConfig(workspace=str(workspace)))
    assert not argv_file.exists()


@pytest.mark.bad_input
def test_the_verb_answers_a_bad_or_unknown_job_in_one_json_line(tmp_path):
    env = agent_env(tmp_path)
    (tmp_path / "workspace").mkdir()
    for job, expected in (("12;id", "not a job id"), ("123", "no job 123 of yours")):
        proc = agent("job", "top", job, env=env)
        assert proc.returncode == AGENT_REJECTED and "Traceback" not in proc.stderr, proc.stderr
        assert expected in json.loads(proc.stdout)["error"], proc.stdout


def test_node_usage_outside_a_step_answers_one_error_line(tmp_path):
    proc = agent("node-usage", env=agent_env(tmp_path))
    answer = json.loads(proc.stdout)
    assert proc.returncode == 0 and set(answer) == {"host", "error"}, proc.stdout + proc.stderr


# --- alice never gets bob's figures -----------------------------------------------------


class Exposition(http.server.BaseHTTPRequestHandler):
    """A node daemon's /metrics as it was served to anyone: every job's series."""

    body = b""
    served: list[bytes]

    def do_GET(self) -> None:
        self.served.append(self.body)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def daemon(node: job_usage.Sources) -> Iterator[tuple[int, list[bytes]]]:
    """n2's daemon exposition (its job collector over the same node) on 127.0.0.1."""
    registry = CollectorRegistry()
    registry.register(job_usage.JobUsageCollector(node))
    served: list[bytes] = []
    handler = type("Handler", (Exposition,), {"body": generate_latest(registry), "served": served})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield port, served
    server.shutdown()
    server.server_close()


@pytest.mark.security
def test_alices_top_never_gets_bobs_job_figures(node, daemon, monkeypatch, tmp_path):
    """alice's `job top 41` on n2, where bob's job 42 runs beside hers: her answer has
    her job's figures, and nothing the verb's process receives (it runs as alice, so
    she can read all of it) names bob's job or its figures. On 09a60d9 this failed: the
    verb read the node daemon's whole /metrics, bob's series in it, into alice's
    process (it only filtered them out of the answer afterwards), the exposition that
    per-job series are now kept from (only Prometheus and root get them)."""
    port, served = daemon
    job = running("n2")
    monkeypatch.setattr(attach, "running_job", lambda user_dir, job_id, config: job)
    monkeypatch.setattr(attach, "address_of", lambda host: "127.0.0.1")
    received: list[str] = []

    def srun_on_n2(argv: list[str], timeout: float = 0.0, **_: object) -> str:
        """The step Slurm starts in alice's job 41 on n2: node-usage as alice there."""
        assert argv[0] == "srun" and "--jobid=41" in argv and argv[-1] == "node-usage"
        received.append(json.dumps(node_usage.here(node, STEP_PID, ALICE, "n2")) + "\n")
        return received[-1]

    monkeypatch.setattr(slurm.run, "output", srun_on_n2)
    answer = top.top(tmp_path, "41", AgentConfig(metrics_port=port))
    (n2,) = answer["nodes"]
    assert n2["cpu_seconds"] == 3.0 and [gpu["index"] for gpu in n2["gpus"]] == [1], n2
    everything = "".join(received) + b"".join(served).decode()
    assert '"42"' not in everything and 'job="42"' not in everything, everything
    assert str(BOB) not in everything and "secret" not in everything, everything
