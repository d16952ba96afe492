"""`tacc-agent serve`: the node daemon. Runs the health checks every interval (draining
and resuming the node like `tacc-agent check`), writes the node facts file, and serves
the last run's figures at http://<node>:<port>/metrics for Prometheus.

The checks run in the main thread and each is bounded in time; the HTTP server answers
from the last finished run in its own thread, so a scrape never waits for a check and a
stuck mount never stops the metrics. SIGTERM / SIGINT end it cleanly.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

from tacc_agent import health, metrics, node_facts
from tacc_agent.config import AgentConfig
from tacc_agent.errors import EXIT_CLUSTER, AgentError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def log(message: str) -> None:
    print(f"tacc-agent: {message}", flush=True)  # journald adds the time


class Daemon:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node = socket.gethostname()
        self.snapshot = metrics.Snapshot()
        self.last_said: tuple[str, str] = ("", "")

    def cycle(self) -> None:
        try:
            self.run_once()
        except Exception as exc:  # a bad run (a full state disk...) must not end the daemon
            log(f"check run failed: {type(exc).__name__}: {exc}")

    def run_once(self) -> None:
        """One check run: results, Slurm, facts file, then the new snapshot (one swap)."""
        results = health.run_checks(self.config)
        action = "slurm: not asked"
        if self.config.drain:
            action = health.apply_to_slurm(results, self.node, self.config.slurm_timeout_seconds)
        now = time.time()
        tasks = node_facts.running_tasks(self.config.proc_root)
        node_facts.write(Path(self.config.facts_file),
                         node_facts.build(self.node, results, tasks, now))  # fmt: skip
        drained = action.startswith(("slurm: drained", "slurm: already drained"))
        self.snapshot = metrics.Snapshot(results, self.snapshot.runs + 1, now, tasks, drained)
        failing = "; ".join(f"{r.check}: {r.detail}" for r in results if r.failed) or "healthy"
        said = (failing, action.replace("already ", ""))
        if said != self.last_said:  # the journal gets changes, not every run
            log(f"{failing} | {action}")
            self.last_said = said

    def exposition(self) -> bytes:
        return metrics.exposition(self.snapshot).encode()


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class MetricsServer(socketserver.TCPServer):
    """HTTP/1.0, GET /metrics only: a few lines of socketserver instead of http.server,
    whose imports (email, http.client, ssl) would double the daemon's memory."""

    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], daemon: Daemon) -> None:
        self.daemon = daemon
        super().__init__(address, MetricsHandler)


class MetricsHandler(socketserver.StreamRequestHandler):
    timeout = 10  # a client that stalls cannot hold the server longer than this
    server: MetricsServer

    def handle(self) -> None:
        try:
            request = self.rfile.readline(8192).decode("latin-1").split()
            for _ in range(100):  # the headers, up to the blank line; none is needed
                if self.rfile.readline(8192) in (b"\r\n", b"\n", b""):
                    break
        except (OSError, UnicodeError):
            return
        code, body, kind = self.route(request)
        head = (f"HTTP/1.0 {code} {REASONS[code]}\r\nServer: tacc-agent\r\n"
                f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()  # fmt: skip
        with contextlib.suppress(OSError):  # the scraper went away
            self.wfile.write(head if request[:1] == ["HEAD"] else head + body)

    def route(self, request: list[str]) -> tuple[int, bytes, str]:
        if len(request) < 2:
            return 400, b"bad request\n", "text/plain"
        if request[0] not in ("GET", "HEAD"):
            return 405, b"only GET\n", "text/plain"
        path = request[1].split("?")[0]
        if path == "/metrics":
            return 200, self.server.daemon.exposition(), CONTENT_TYPE
        if path == "/":
            return 200, b"tacc-agent: see /metrics\n", "text/plain"
        return 404, b"not found: try /metrics\n", "text/plain"


def listen(daemon: Daemon, address: str, port: int) -> MetricsServer:
    try:
        server = MetricsServer((address, port), daemon)
    except OSError as exc:
        raise AgentError(f"cannot serve metrics on {address}:{port}: {exc}", EXIT_CLUSTER) from None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def tick_loop(config: AgentConfig, stop: threading.Event) -> None:
    """Every queue_tick_seconds: one round of the scheduling plug-ins' `tick` (LAS)."""
    from tacc_agent.queue_ticks import tick

    while not stop.wait(config.queue_tick_seconds):
        try:
            for change in tick(config):
                log(change)
        except Exception as exc:  # Slurm down for a moment: try again next time
            log(f"queue tick failed: {type(exc).__name__}: {exc}")


def serve(config: AgentConfig, port: int | None, interval: float | None) -> int:
    interval = interval if interval is not None else config.check_interval_seconds
    port = port if port is not None else config.metrics_port
    if interval <= 0:
        raise AgentError(f"--interval must be above 0, not {interval:g}", EXIT_CLUSTER)
    daemon = Daemon(config)
    server = listen(daemon, config.metrics_address, port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log(f"metrics on {config.metrics_address}:{server.server_address[1]}/metrics, "
        f"checks every {interval:g} s")  # fmt: skip
    if config.queue_tick_seconds > 0:  # the controller: scheduling plug-ins' ticks
        threading.Thread(target=tick_loop, args=(config, stop), daemon=True).start()
    while not stop.is_set():
        started = time.monotonic()
        daemon.cycle()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    server.shutdown()
    log("stopped")
    sys.stdout.flush()
    return 0
