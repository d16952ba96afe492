"""The whole alert path on this machine, with the real daemons Debian ships: Prometheus and
Alertmanager started with the files and flags roles/monitoring renders (short intervals,
as the lab sets them) scrape a fake agent whose node is drained by a failing check;
TaccNodeDrainedByCheck fires and the webhook receives it, naming the node and the check.
Both listen on the loopback only, as the role's defaults have them."""

from __future__ import annotations

import json
import queue
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.playbook.monitoring_render import default_args, render, tool

AGENT_METRICS = b"""\
# TYPE tacc_agent_slurm_drained_by_agent gauge
tacc_agent_slurm_drained_by_agent 1
# TYPE tacc_agent_check_status gauge
tacc_agent_check_status{check="gpu",status="fail"} 1
tacc_agent_check_status{check="gpu",status="ok"} 0
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeAgent(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(AGENT_METRICS)

    def log_message(self, *args: object) -> None:
        pass


RECEIVED: queue.Queue[dict] = queue.Queue()


class Webhook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        RECEIVED.put({"path": self.path, "body": json.loads(self.rfile.read(length))})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[dict]:
    agent, hook = serve(FakeAgent), serve(Webhook)
    ports = {"prometheus": free_port(), "alertmanager": free_port()}
    out = render(
        tmp_path,
        monitoring_scrape_group="no_such_group",  # only the fake agent below
        monitoring_extra_scrape_configs=[
            {
                "job_name": "fake_agent",
                "static_configs": [
                    {"targets": [f"127.0.0.1:{agent.server_port}"], "labels": {"instance": "n2"}}
                ],
            }
        ],
        monitoring_prometheus_port=ports["prometheus"],
        monitoring_alertmanager_port=ports["alertmanager"],
        monitoring_scrape_interval="1s",
        monitoring_scrape_timeout="1s",
        monitoring_evaluation_interval="1s",
        monitoring_alert_for={"node_drained_by_check": "2s"},
        monitoring_alertmanager_group_wait="1s",
        monitoring_alert_webhook_url=f"http://127.0.0.1:{hook.server_port}/tacc-hook",
        monitoring_prometheus_extra_args=[f"--storage.tsdb.path={tmp_path}/tsdb"],
        monitoring_alertmanager_extra_args=[f"--storage.path={tmp_path}/am"],
    )
    procs = []
    with (tmp_path / "daemons.log").open("w") as log:
        started = (
            ("prometheus", "prometheus.default"),
            ("prometheus-alertmanager", "alertmanager.default"),
        )
        for binary, defaults in started:
            argv = [tool(binary), *default_args(out / defaults)]
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        try:
            yield {"ports": ports, "log": tmp_path / "daemons.log"}
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
            agent.shutdown()
            hook.shutdown()
            shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


def next_call() -> dict | None:
    try:
        return RECEIVED.get(timeout=1)
    except queue.Empty:
        return None


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 (a loopback URL)
        return json.load(answer)


def wait_for(predicate, seconds: float, what: str, log: Path):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = predicate()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} within {seconds} s; daemons' log:\n{log.read_text()[-3000:]}")


def test_a_node_drained_by_a_failing_check_reaches_the_webhook(daemons):
    prometheus = f"http://127.0.0.1:{daemons['ports']['prometheus']}"

    def target_up():
        targets = get_json(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
        return [t for t in targets if t["labels"]["job"] == "fake_agent" and t["health"] == "up"]

    wait_for(target_up, 30, "the fake agent's target up", daemons["log"])
    while True:
        message = wait_for(next_call, 60, "a webhook call", daemons["log"])
        alerts = [
            a
            for a in message["body"]["alerts"]
            if a["labels"]["alertname"] == "TaccNodeDrainedByCheck"
        ]
        if alerts:
            break
    assert message["path"] == "/tacc-hook"
    (alert,) = alerts
    assert alert["status"] == "firing"
    assert alert["labels"]["instance"] == "n2" and alert["labels"]["severity"] == "warning"
    assert "Failing checks: gpu (fail)." in alert["annotations"]["description"]
    assert message["body"]["receiver"] == "tacc-webhook"
