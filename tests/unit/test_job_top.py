"""`job top` (tasks/top.py): each node's daemon asked at once over HTTP (fake metrics
servers on loopback addresses), only the job's samples kept, a silent or absent node an
error of its own; another user's job refused before any node is asked."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import EXIT_REJECTED, Rejected
from tacc_agent.tasks import attach, top
from tacc_contract import protocol
from tests.unit.agent_jobs import agent, agent_env

EXPOSITION = """\
# HELP tacc_agent_healthy 1 when every check passed
# TYPE tacc_agent_healthy gauge
tacc_agent_healthy 1.0
# HELP tacc_agent_job_cpu_seconds_total CPU time of a Slurm job's processes on this node
# TYPE tacc_agent_job_cpu_seconds_total counter
tacc_agent_job_cpu_seconds_total{job="41",user="alice"} 12.5
tacc_agent_job_cpu_seconds_total{job="410",user="bob"} 99.0
# HELP tacc_agent_job_memory_bytes Memory of a Slurm job on this node
# TYPE tacc_agent_job_memory_bytes gauge
tacc_agent_job_memory_bytes{job="41",user="alice"} 7.340032e+08
tacc_agent_job_memory_bytes{job="410",user="bob"} 1.0
# HELP tacc_agent_job_cpus CPUs Slurm allocated to a job on this node
# TYPE tacc_agent_job_cpus gauge
tacc_agent_job_cpus{job="41",user="alice"} 4.0
# HELP tacc_agent_job_gpu_utilization_ratio Utilization of a GPU of a job (0..1)
# TYPE tacc_agent_job_gpu_utilization_ratio gauge
tacc_agent_job_gpu_utilization_ratio{gpu="3",job="41",user="alice"} 0.75
tacc_agent_job_gpu_utilization_ratio{gpu="1",job="41",user="alice"} 0.5
tacc_agent_job_gpu_utilization_ratio{gpu="0",job="410",user="bob"} 1.0
# HELP tacc_agent_job_gpu_memory_used_bytes GPU memory in use on a GPU of a job
# TYPE tacc_agent_job_gpu_memory_used_bytes gauge
tacc_agent_job_gpu_memory_used_bytes{gpu="3",job="41",user="alice"} 2.147483648e+09
tacc_agent_job_gpu_memory_used_bytes{gpu="1",job="41",user="alice"} 0.0
# HELP tacc_agent_job_gpu_memory_total_bytes Memory of a GPU of a job
# TYPE tacc_agent_job_gpu_memory_total_bytes gauge
tacc_agent_job_gpu_memory_total_bytes{gpu="3",job="41",user="alice"} 8.5520809984e+10
"""
OTHER_JOB_ONLY = """\
# HELP tacc_agent_job_cpu_seconds_total CPU time of a Slurm job's processes on this node
# TYPE tacc_agent_job_cpu_seconds_total counter
tacc_agent_job_cpu_seconds_total{job="410",user="bob"} 99.0
"""


class Exposition(http.server.BaseHTTPRequestHandler):
    body = EXPOSITION
    asked: list[str]

    def do_GET(self) -> None:
        self.asked.append(self.path)
        data = self.body.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(address: str, port: int, body: str, asked: list[str]) -> http.server.HTTPServer:
    handler = type("Handler", (Exposition,), {"body": body, "asked": asked})
    server = http.server.ThreadingHTTPServer((address, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def nodes() -> Iterator[tuple[int, list[str], socket.socket]]:
    """Node daemons on one port: 127.0.0.1 (the job's figures), 127.0.0.2 (another job's
    only), 127.0.0.3 silent (accepts, never answers); 127.0.0.4 has no daemon."""
    port, asked = free_port(), []
    servers = [serve("127.0.0.1", port, EXPOSITION, asked),
               serve("127.0.0.2", port, OTHER_JOB_ONLY, asked)]  # fmt: skip
    silent = socket.socket()
    silent.bind(("127.0.0.3", port))
    silent.listen()
    yield port, asked, silent
    for server in servers:
        server.shutdown()
        server.server_close()
    silent.close()


def target(*addresses: str) -> dict:
    return {"job_id": "41", "slurm_job_id": "41", "state": "RUNNING",
            "nodes": [{"host": f"n{rank + 2}", "rank": rank, "address": address}
                      for rank, address in enumerate(addresses)]}  # fmt: skip


def test_only_the_jobs_samples_are_kept_per_node(nodes):
    port, asked, _ = nodes
    before = time.time()
    answer = top.usage(target("127.0.0.1", "127.0.0.2"), port)
    protocol.JOB_TOP.check(answer)
    assert (answer["job_id"], answer["state"]) == ("41", "RUNNING")
    assert answer["time"] >= before
    first, second = answer["nodes"]
    assert first["sampled"] >= before
    assert {k: v for k, v in first.items() if k != "sampled"} == {
        "host": "n2", "rank": 0, "cpu_seconds": 12.5, "memory_bytes": 734003200, "cpus": 4,
        "gpus": [
            {"index": 1, "utilization_ratio": 0.5, "memory_used_bytes": 0},
            {"index": 3, "utilization_ratio": 0.75, "memory_used_bytes": 2147483648,
             "memory_total_bytes": 85520809984},
        ],
    }  # fmt: skip
    # The node answered but runs nothing of job 41 now: null figures, not another job's.
    assert {k: v for k, v in second.items() if k != "sampled"} == {
        "host": "n3", "rank": 1, "cpu_seconds": None, "memory_bytes": None, "cpus": None,
        "gpus": [],
    }  # fmt: skip
    assert asked == ["/metrics", "/metrics"]


@pytest.mark.fault
def test_a_silent_or_absent_node_is_an_error_of_its_own_and_nodes_are_asked_at_once(
    nodes, monkeypatch
):
    port, _, _ = nodes
    events, lock, real_fetch = [], threading.Lock(), top.fetch

    def fetch(url: str, timeout: float) -> str:
        with lock:
            events.append(("asked", url))
        try:
            return real_fetch(url, timeout)
        finally:
            with lock:
                events.append(("ended", url))

    monkeypatch.setattr(top, "fetch", fetch)
    answer = top.usage(target("127.0.0.3", "127.0.0.4", "127.0.0.1", "127.0.0.3"), port, 1.0)
    protocol.JOB_TOP.check(answer)
    silent, absent, fine, silent_too = answer["nodes"]
    # The two silent nodes are waited for together, not one after another: both were
    # asked before either wait ended.
    silent_url = top.metrics_url("127.0.0.3", port)
    of_silent = [kind for kind, url in events if url == silent_url]
    assert of_silent == ["asked", "asked", "ended", "ended"], events
    assert "did not answer" in silent["error"] and "timed out" in silent["error"], silent
    assert "did not answer" in absent["error"] and "refused" in absent["error"], absent
    assert "cpu_seconds" not in silent and "cpu_seconds" not in absent
    assert fine["cpu_seconds"] == 12.5 and "error" not in fine
    assert silent_too["rank"] == 3 and silent_too["error"]


@pytest.mark.fault
def test_an_answer_that_is_not_the_exposition_format_is_an_error(tmp_path):
    port, asked = free_port(), []
    server = serve("127.0.0.1", port, "<html>not metrics{{\n", asked)
    try:
        node = top.usage(target("127.0.0.1"), port)["nodes"][0]
    finally:
        server.shutdown()
        server.server_close()
    assert node["error"].startswith("the node agent's answer is unreadable"), node


def test_ipv6_addresses_are_bracketed():
    assert top.metrics_url("fd00::2", 9770) == "http://[fd00::2]:9770/metrics"
    assert top.metrics_url("10.77.6.12", 9770) == "http://10.77.6.12:9770/metrics"


def test_top_asks_the_nodes_job_target_found(nodes, monkeypatch, tmp_path):
    port, _, _ = nodes
    seen = []

    def found(user_dir: Path, job_id: str, config: AgentConfig, rank: int | None = None) -> dict:
        seen.append((user_dir, job_id, rank))
        return target("127.0.0.1")

    monkeypatch.setattr(attach, "target", found)
    answer = top.top(tmp_path, "41", AgentConfig(metrics_port=port))
    assert seen == [(tmp_path, "41", None)]
    assert answer["nodes"][0]["cpu_seconds"] == 12.5


@pytest.mark.security
def test_another_users_job_is_refused_before_any_node_is_asked(nodes, tmp_path):
    """bob's workspace has no job 41 (it is alice's): refused, and no daemon is asked."""
    port, asked, _ = nodes
    workspace = tmp_path / "workspace"
    bob = workspace / "bob"
    bob.mkdir(parents=True, mode=0o700)
    config = AgentConfig(workspace=str(workspace), metrics_port=port)
    with pytest.raises(Rejected, match="no job 41 of yours"):
        top.top(bob, "41", config)
    assert asked == []


@pytest.mark.bad_input
def test_the_verb_answers_a_bad_or_unknown_job_in_one_json_line(tmp_path):
    env = agent_env(tmp_path)
    (tmp_path / "workspace").mkdir()
    for job, expected in (("12;id", "not a job id"), ("123", "no job 123 of yours")):
        proc = agent("job", "top", job, env=env)
        assert proc.returncode == EXIT_REJECTED and "Traceback" not in proc.stderr, proc.stderr
        assert expected in json.loads(proc.stdout)["error"], proc.stdout


@pytest.mark.fault
def test_a_proxy_in_the_environment_is_never_used_to_reach_a_node(nodes, monkeypatch):
    """The lab's login node has http_proxy set, and no_proxy with an address range that
    urllib cannot read: the scrape goes straight to the node all the same (it answered
    403 through the lab's proxy before)."""
    port, asked, _ = nodes
    monkeypatch.setenv("http_proxy", "http://127.0.0.9:9")  # nothing listens there
    monkeypatch.setenv("no_proxy", "127.0.0.0/8")
    answer = top.usage(target("127.0.0.1"), port)
    assert answer["nodes"][0]["cpu_seconds"] == 12.5, answer
    assert asked == ["/metrics"]
