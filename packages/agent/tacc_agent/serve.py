"""`tacc-agent serve`: the node daemon. Runs the enabled health checks every interval
(draining and resuming the node like `tacc-agent check`), writes the node facts file, and
serves the last run's figures at http://<node>:<port>/metrics for Prometheus. On the
controller (queue_tick_seconds > 0) it also runs the task backend's queue ticks: the
daemon composes the two halves of the agent, health and tasks.

The checks run in the main thread and each is bounded in time; the HTTP server answers
from the last finished run, so a scrape never waits for a check and a stuck mount never
stops the metrics. It is prometheus_client's WSGI app on its threading WSGI server, one
thread per connection, with limits the library lacks: every request has a deadline after
which its connection is cut (a client sending a byte every few seconds holds nothing), and
connections are capped per client address and in all (the oldest over a cap is cut), so a
slow or silent client never delays another scrape. SIGTERM / SIGINT end it cleanly.

On the monitoring host (dashboard_broker) it also answers POST /dashboard, the web
dashboard's broker (dashboard/broker.py), whose requests get a longer deadline once
their MUNGE credential is good.

The per-job series (labels job and user) go only to the cluster's Prometheus (its token
from an allowed address) and root on the node (health/metrics_access.py); every other
client gets the node's own figures. The
default port is a privileged one (below 1024), so no user can take it while the agent
restarts; when it is taken all the same, the daemon says so in one line and exits.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import ipaddress
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from tacc_agent.config import AgentConfig
from tacc_agent.dashboard import broker
from tacc_agent.errors import AGENT_CLUSTER, AgentError
from tacc_agent.health import cycle as health
from tacc_agent.health import job_usage, metrics, node_facts, slurm_cluster
from tacc_agent.health.metrics_access import (
    JobSeriesAccess,
    TokenFileError,
    read_token,
    scraper_networks,
)
from tacc_agent.procfs.system import UNPRIVILEGED_PORT_START, sysctl_number

# A request (connect, headers, answer) gets this long; then its connection is cut.
REQUEST_DEADLINE_SECONDS = 5.0
# Connections served at once from one client address, and in all; past either, the oldest
# connection of the client over it is cut.
CONNECTIONS_PER_CLIENT = 4
CONNECTIONS = 32
REAP_EVERY_SECONDS = 0.2
# The WSGI environ key that says whether the request's client may read the per-job series.
JOBS_VISIBLE = "tacc.jobs_visible"

WsgiApp = Callable[[dict, Callable], Iterable[bytes]]


def log(message: str) -> None:
    print(f"tacc-agent: {message}", flush=True)  # journald adds the time


class Daemon:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.node = socket.gethostname()
        self.snapshot = metrics.Snapshot()
        # Two views of the same figures: the node's own (every client), and those with the
        # per-job series (the allowed scrapers and root).
        self.node_registry = metrics.registry(lambda: self.snapshot)
        self.registry = metrics.registry(lambda: self.snapshot)
        self.registry.register(job_usage.JobUsageCollector(job_usage.Sources.of(config)))
        if config.cluster_metrics:  # the controller: the cluster's Slurm figures
            sources = slurm_cluster.Sources.of(config)
            cluster = slurm_cluster.ClusterCollector(sources, log=log)
            self.registry.register(cluster)
            self.node_registry.register(cluster)
        self.last_said: tuple[str, str] = ("", "")

    def cycle(self) -> None:
        try:
            self.run_once()
        except Exception as exc:  # a bad run (a full state disk...) must not end the daemon
            log(f"check run failed: {type(exc).__name__}: {exc}")

    def run_once(self) -> None:
        """One check run: results, Slurm, facts file, then the new snapshot (one swap)."""
        checks = health.enabled(self.config)
        results = health.run(checks, self.config)
        outcome = health.SlurmOutcome("slurm: not asked")
        if self.config.drain:
            outcome = health.apply_to_slurm(results, self.node, self.config.slurm_timeout_seconds)
        action, drained = outcome.said, outcome.drained_by_agent
        now = time.time()
        tasks = node_facts.running_tasks(self.config.proc_root)
        node_facts.write(
            Path(self.config.facts_file), node_facts.build(self.node, results, tasks, now)
        )
        declared = tuple(family for check in checks for family in check.families)
        self.snapshot = metrics.Snapshot(
            results, self.snapshot.runs + 1, now, tasks, drained, declared
        )
        failing = "; ".join(f"{r.check}: {r.detail}" for r in results if r.failed) or "healthy"
        said = (failing, action.replace("already ", ""))
        if said != self.last_said:  # the journal gets changes, not every run
            log(f"{failing} | {action}")
            self.last_said = said

    def exposition(self) -> bytes:
        return metrics.exposition(self.registry)


def plain(start_response: Callable, status: str, text: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
    return [text]


def routes(jobs_app: WsgiApp, node_app: WsgiApp, dashboard_app: WsgiApp | None = None) -> WsgiApp:
    """/metrics (GET or HEAD) is the library's app, with the per-job series where the
    client may read them (environ[JOBS_VISIBLE]); /dashboard is the dashboard's broker
    where this node runs it (dashboard_app), else 404; / says where to look; the rest
    404."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if path == broker.PATH:
            if dashboard_app is None:
                return plain(start_response, "404 Not Found", b"no dashboard broker here\n")
            return dashboard_app(environ, start_response)
        if method not in ("GET", "HEAD"):
            return plain(start_response, "405 Method Not Allowed", b"only GET\n")
        if path == "/metrics":
            metrics_app = jobs_app if environ.get(JOBS_VISIBLE) is True else node_app
            body = metrics_app({**environ, "REQUEST_METHOD": "GET"}, start_response)
            return [] if method == "HEAD" else body
        if path == "/":
            return plain(start_response, "200 OK", b"tacc-agent: see /metrics\n")
        return plain(start_response, "404 Not Found", b"not found: try /metrics\n")

    return app


class QuietHandler(WSGIRequestHandler):
    """One request per connection, no access log (the journal gets state changes only)."""

    def setup(self) -> None:
        self.timeout = REQUEST_DEADLINE_SECONDS  # each read; the server cuts the whole
        super().setup()

    def log_message(self, format: str, *args: object) -> None:
        pass

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ[JOBS_VISIBLE] = self.server.jobs_visible(
            self.request, self.client_address, environ.get("HTTP_AUTHORIZATION", "")
        )
        environ[broker.EXTEND_DEADLINE] = functools.partial(self.server.extend, self.request)
        return environ


def peer_key(address: str) -> str:
    """The client a connection counts against: its address, with every loopback address
    (all of 127/8, ::1) one client, since any local user can pick among them."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return "loopback" if (mapped or ip).is_loopback else str(mapped or ip)


class MetricsServer(ThreadingWSGIServer):
    """prometheus_client's thread-per-connection WSGI server with a deadline per request
    and caps on connections: a reaper thread cuts (shutdown) every connection older than
    REQUEST_DEADLINE_SECONDS, which ends its handler's blocked read or write."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], app: WsgiApp, access: JobSeriesAccess | None = None
    ) -> None:
        # Set before the bind: a failed bind calls server_close, which reads them.
        self.lock = threading.Lock()
        self.deadlines: dict[socket.socket, tuple[str, float]] = {}
        self.stopped = threading.Event()
        self.access = access or JobSeriesAccess()
        self.notes: list[str] = []  # what to log about who reads what, once
        super().__init__(address, QuietHandler)
        # serve_forever accepts once select says a connection waits; one that is gone by
        # then (reset by its client) left accept() blocked for good, and shutdown() (the
        # agent's stop) waiting on it. Non-blocking, accept raises instead, and the loop
        # goes on (connections it accepts are blocking all the same).
        self.socket.setblocking(False)
        self.set_app(app)

    def jobs_visible(
        self, request: socket.socket, client_address: tuple, authorization: str = ""
    ) -> bool:
        """Whether this request's client may read the per-job series."""
        try:
            return self.access.allows(request.getsockname(), client_address, authorization)
        except OSError:  # the connection is gone
            return False

    def verify_request(self, request, client_address) -> bool:
        """Admit every connection and start its clock. Over a cap, the oldest connection
        of the client at its cap (or, over the total, of the client holding the most) is
        cut to make room: stalled connections, from one address or from many loopback or
        node addresses, cannot keep a scraper out, since a scrape is never the oldest."""
        peer = peer_key(client_address[0])
        with self.lock:
            held = Counter(p for p, _ in self.deadlines.values())
            over = peer if held[peer] >= CONNECTIONS_PER_CLIENT else None
            if over is None and len(self.deadlines) >= CONNECTIONS:
                over = held.most_common(1)[0][0]
            evict = None
            if over is not None:
                evict = min(
                    (c for c, (p, _) in self.deadlines.items() if p == over),
                    key=lambda c: self.deadlines[c][1],
                )
                self.deadlines.pop(evict)
            self.deadlines[request] = (peer, time.monotonic() + REQUEST_DEADLINE_SECONDS)
        if evict is not None:
            with contextlib.suppress(OSError):  # its handler sees the cut and closes it
                evict.shutdown(socket.SHUT_RDWR)
        return True

    def extend(self, request: socket.socket, seconds: float, holder: str) -> bool:
        """Give a connection `seconds` from now and count it as `holder`'s (the broker,
        once a request is authenticated: its caller, "uid:N"), no longer its address's:
        every dashboard of a login node comes from one address, so a flood from there cuts
        only connections not yet authenticated, never another user's request in flight.
        False when the holder already has CONNECTIONS_PER_CLIENT (or the connection is
        gone); then the request is refused."""
        with self.lock:
            if request not in self.deadlines:
                return False
            if sum(1 for held, _ in self.deadlines.values() if held == holder) >= (
                CONNECTIONS_PER_CLIENT
            ):
                return False
            self.deadlines[request] = (holder, time.monotonic() + seconds)
            return True

    def shutdown_request(self, request) -> None:
        with self.lock:
            self.deadlines.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that went away or was cut: nothing to report, and no traceback."""
        if not isinstance(sys.exc_info()[1], OSError):
            log(f"metrics request from {client_address[0]} failed: {sys.exc_info()[1]!r}")

    def reap_forever(self) -> None:
        while not self.stopped.wait(REAP_EVERY_SECONDS):
            now = time.monotonic()
            with self.lock:
                late = [conn for conn, (_, due) in self.deadlines.items() if due <= now]
            for conn in late:
                with contextlib.suppress(OSError):  # already closed by its handler
                    conn.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        self.stopped.set()
        super().server_close()


def bind_error(address: str, port: int, exc: OSError) -> AgentError:
    """One line that says why the port cannot be had."""
    where = f"cannot serve metrics on {address}:{port}"
    if exc.errno == errno.EADDRINUSE:
        why = (
            f"port {port} is taken by another process (`ss -ltnp 'sport = :{port}'` names "
            "it); stop it, or give the agent another port (metrics_port)"
        )
    elif exc.errno == errno.EACCES:
        why = f"port {port} takes root (CAP_NET_BIND_SERVICE) to bind"
    else:
        why = exc.strerror or str(exc)
    return AgentError(f"{where}: {why}", AGENT_CLUSTER)


def job_series_access(config: AgentConfig) -> tuple[JobSeriesAccess, list[str]]:
    """Who gets the per-job series: the scrapers' token read and their host names resolved
    now (without a usable token, root on the node only); and what to say about it, one
    line each."""
    networks, unresolved = scraper_networks(config.metrics_job_scrapers)
    notes = [
        f"metrics: scraper {name} does not resolve: no per-job series for it until restart"
        for name in unresolved
    ]
    token, problem = scrapers_token(config)
    access = JobSeriesAccess(networks, config.metrics_jobs_public, config.proc_root, token)
    return access, notes + ([problem] if problem else [])


def scrapers_token(config: AgentConfig) -> tuple[bytes, str]:
    """The scrapers' token; b"" and one line saying why when there is none to use."""
    root_only = "per-job series for root on this node only"
    if config.metrics_jobs_public:
        return b"", ""
    if not config.metrics_job_token_file:
        return b"", f"metrics: no metrics_job_token_file set: {root_only}"
    try:
        return read_token(config.metrics_job_token_file), ""
    except TokenFileError as exc:
        return b"", f"metrics: scrapers' token: {exc}: {root_only}"


def listen(daemon: Daemon, address: str, port: int) -> MetricsServer:
    dashboard = broker.app(daemon.config) if daemon.config.dashboard_broker else None
    app = routes(make_wsgi_app(daemon.registry), make_wsgi_app(daemon.node_registry), dashboard)
    try:
        server = MetricsServer((address, port), app)
    except OSError as exc:
        raise bind_error(address, port, exc) from None
    server.access, server.notes = job_series_access(daemon.config)  # serve() says the notes
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    threading.Thread(target=server.reap_forever, name="metrics-deadlines", daemon=True).start()
    return server


# One round of the scheduling plug-ins' `tick` (LAS): what it changed.
QueueRound = Callable[[], list[str]]


def tick_loop(config: AgentConfig, queue_round: QueueRound, stop: threading.Event) -> None:
    """Every queue_tick_seconds: one queue round."""
    while not stop.wait(config.queue_tick_seconds):
        try:
            for change in queue_round():
                log(change)
        except Exception as exc:  # Slurm down for a moment: try again next time
            log(f"queue tick failed: {type(exc).__name__}: {exc}")


def open_to_users(config: AgentConfig, port: int) -> str:
    """A warning when any user may bind `port` here (the sysctl lowered below it)."""
    start = sysctl_number(config.proc_root, UNPRIVILEGED_PORT_START)
    if start is None:
        return ""
    if port > 0 and start <= port:
        return (
            f"warning: any user may bind port {port} here "
            f"(net.ipv4.ip_unprivileged_port_start={start}) and stand in for the agent"
        )
    return ""


def serve(
    config: AgentConfig,
    port: int | None,
    interval: float | None,
    queue_round: QueueRound | None = None,
) -> int:
    """The daemon until SIGTERM; `queue_round` on the controller only (cli.py gives it
    when queue_tick_seconds > 0), so a compute node's daemon never loads the scheduling
    backend."""
    interval = interval if interval is not None else config.check_interval_seconds
    port = port if port is not None else config.metrics_port
    if interval <= 0:
        raise AgentError(f"--interval must be above 0, not {interval:g}", AGENT_CLUSTER)
    checks = health.enabled(config)  # an unknown name in `checks` stops it here, not each run
    daemon = Daemon(config)
    server = listen(daemon, config.metrics_address, port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log(
        f"metrics on {config.metrics_address}:{server.server_address[1]}/metrics, "
        f"checks every {interval:g} s: {', '.join(c.name for c in checks) or 'none'}"
    )
    if warning := open_to_users(config, port):
        log(warning)
    for note in server.notes:
        log(note)
    if queue_round is not None:  # the controller: scheduling plug-ins' ticks
        threading.Thread(target=tick_loop, args=(config, queue_round, stop), daemon=True).start()
    while not stop.is_set():
        started = time.monotonic()
        daemon.cycle()
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    server.shutdown()
    server.server_close()
    log("stopped")
    sys.stdout.flush()
    return 0
