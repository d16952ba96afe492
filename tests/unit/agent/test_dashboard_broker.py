"""The dashboard's broker (tacc_agent/dashboard/broker.py, broker_asks.py) and its client
(broker_client.py): POST /dashboard on the monitoring host's agent answers Prometheus
questions for the user a MUNGE credential names, and for nobody else.

MUNGE is faked at munge.decode / munge.encode, the passwd and group databases at pwd,
grp and os.getgrouplist, Prometheus by an HTTP server on 127.0.0.1 that records every
query it is asked and answers with series of both alice and bob (so a query that does not
filter by user would show it)."""

from __future__ import annotations

import grp
import io
import json
import os
import pwd
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from tacc_agent import serve
from tacc_agent.config import AgentConfig, load_config
from tacc_agent.dashboard import broker, broker_asks, broker_client, munge
from tacc_agent.errors import AgentError
from tacc_agent.slurm import queue
from tacc_agent.slurm.times import run_time
from tacc_contract.plugins import QueuedJob
from tests.conftest import ROOT
from tests.unit.agent_fixtures import fixture_config, metrics_server

NOW = 1_765_000_000.0
ACCOUNTS = {  # uid -> (name, passwd gid, supplementary gids)
    0: ("root", 0, []),
    1001: ("alice", 1001, []),
    1002: ("bob", 1002, []),
    1003: ("carol", 1003, [2000]),  # in tacc_admins
}
ADMINS_GID = 2000


# ------------------------------------------------------------------ fakes


class FakePrometheus(BaseHTTPRequestHandler):
    """query_range: one series for alice's job 7 and one for bob's, whatever is asked,
    unless the query names a user (then only that user's); alerts: one firing, one
    pending. Every request's arguments go to server.asked."""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        arguments = dict(urllib.parse.parse_qsl(url.query))
        self.server.asked.append((url.path, arguments))
        if url.path.endswith("/alerts"):
            data = {"alerts": ALERTS}
        else:
            expression = arguments.get("query", "")
            result = [
                {
                    "metric": {"exported_job": "7", "user": user, "instance": f"n{i}"},
                    "values": [[NOW - 60, "1.5"], [NOW, "NaN"], [NOW + 5, "2"]],
                }
                for i, user in enumerate(("alice", "bob"), start=2)
                if f'user="{user}"' in expression or "user=" not in expression
            ]
            data = {"resultType": "matrix", "result": result}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


ALERTS = [
    {
        "labels": {"alertname": "TaccNodeDrained", "severity": "warning", "instance": "n2"},
        "annotations": {"summary": "n2 is drained"},
        "state": "firing",
        "activeAt": "2026-12-06T07:00:00Z",
    },
    {"labels": {"alertname": "Later"}, "annotations": {}, "state": "pending", "activeAt": ""},
]


@pytest.fixture
def prometheus_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    server.asked = []
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def config(prometheus_server) -> AgentConfig:
    port = prometheus_server.server_address[1]
    return AgentConfig(prometheus_url=f"http://127.0.0.1:{port}", dashboard_broker=True)


@pytest.fixture(autouse=True)
def accounts(monkeypatch) -> None:
    def getpwuid(uid: int) -> pwd.struct_passwd:
        if uid not in ACCOUNTS:
            raise KeyError(uid)
        name, gid, _ = ACCOUNTS[uid]
        return pwd.struct_passwd((name, "x", uid, gid, "", f"/home/{name}", "/bin/sh"))

    def getgrnam(name: str) -> grp.struct_group:
        if name != "tacc_admins":
            raise KeyError(name)
        return grp.struct_group((name, "x", ADMINS_GID, ["carol"]))

    def getgrouplist(name: str, gid: int) -> list[int]:
        return [gid, *next(extra for n, _, extra in ACCOUNTS.values() if n == name)]

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(grp, "getgrnam", getgrnam)
    monkeypatch.setattr(os, "getgrouplist", getgrouplist)


DECODED: list[bytes] = []


@pytest.fixture(autouse=True)
def fake_munge(monkeypatch) -> None:
    """A credential is "MUNGE:<uid>+<hex of the payload>:"; "MUNGE:used:" is one munged
    has seen before; encode makes carol's. Each decoded credential is listed in DECODED."""
    DECODED.clear()

    def decode(credential: bytes) -> munge.Decoded:
        DECODED.append(credential)
        inner = credential.decode()[6:-1]
        if inner == "used":
            raise munge.CredentialRefused("replayed (already used once)")
        if "+" not in inner:
            raise munge.CredentialRefused("invalid (bad credential)")
        uid, payload = inner.split("+", 1)
        return munge.Decoded(int(uid), int(uid), bytes.fromhex(payload))

    def encode(payload: bytes) -> str:
        return f"MUNGE:1003+{payload.hex()}:"  # made by carol

    monkeypatch.setattr(munge, "decode", decode)
    monkeypatch.setattr(munge, "encode", encode)


def credential(uid: int, request: object) -> bytes:
    return f"MUNGE:{uid}+{json.dumps(request).encode().hex()}:".encode()


def post(config: AgentConfig, body: bytes, length: str | None = None) -> tuple[int, dict]:
    """The broker's status and JSON answer to one POST."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/dashboard",
        "CONTENT_LENGTH": str(len(body)) if length is None else length,
        "wsgi.input": io.BytesIO(body),
    }
    said = []
    app = serve.routes(None, None, broker.app(config) if config.dashboard_broker else None)
    answer = b"".join(app(environ, lambda status, headers: said.append(status)))
    try:
        reply = json.loads(answer)
    except ValueError:
        reply = {"text": answer.decode()}
    return int(said[0].split()[0]), reply


def ask(config: AgentConfig, uid: int, request: object) -> tuple[int, dict]:
    return post(config, credential(uid, request))


# ------------------------------------------------------------------ security


@pytest.mark.security
def test_bob_asking_for_alices_job_gets_only_series_of_his_own(
    config, prometheus_server, monkeypatch
):
    """Whatever job bob names, and whatever user his request claims, every query is
    filtered by user="bob", his credential's passwd name; no name of the request reaches
    PromQL, and a series Prometheus might give of another user is dropped all the same."""
    request = {"ask": "job", "job": "7", "user": "alice", "start": NOW - 3600, "end": NOW}
    status, reply = ask(config, 1002, request)
    assert status == 200 and reply["problem"] == ""
    names = {s["name"] for s in reply["series"]}
    assert names == {"cpu", "memory", "gpu_utilization", "gpu_memory"}
    assert all(s["label"].endswith("(n3)") for s in reply["series"])  # bob's node, not n2
    queries = [arguments["query"] for _, arguments in prometheus_server.asked]
    assert len(queries) == 4
    for query in queries:
        assert 'exported_job="7",user="bob"' in query
        assert "alice" not in query
    # a Prometheus that ignored the filter: alice's series still never reach bob
    alices = [{"metric": {"exported_job": "7", "user": "alice"}, "values": [[NOW, "1"]]}]
    monkeypatch.setattr(broker_asks.prometheus, "query_range", lambda *_: alices)
    status, reply = ask(config, 1002, request)
    assert status == 200 and reply["series"] == []


@pytest.mark.security
@pytest.mark.parametrize("what", ["cluster", "alerts", "queue"])
def test_a_researcher_asking_for_the_ops_views_is_refused(config, prometheus_server, what):
    status, reply = ask(config, 1002, {"ask": what})
    assert status == 403
    assert "bob is not in the group tacc_admins" in reply["error"]
    assert prometheus_server.asked == []


@pytest.mark.security
@pytest.mark.parametrize("body", [b"MUNGE:used:", b"MUNGE:forged:", b"not a credential"])
def test_a_replayed_or_invalid_credential_is_refused_before_any_query(
    config, prometheus_server, body
):
    status, reply = post(config, body)
    assert status == 401
    assert reply["error"].startswith("credential refused: ")
    assert ("replayed" in reply["error"]) == (body == b"MUNGE:used:")
    assert prometheus_server.asked == []


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "job",
    ['1"} or vector(1) #', '7",user=~".+', "7 or vector(1)", "12_3", "", "-1", True, None, "٣"],
)
def test_a_job_that_is_not_digits_is_a_bad_request(config, prometheus_server, job):
    status, reply = ask(config, 1002, {"ask": "job", "job": job, "start": NOW - 60, "end": NOW})
    assert status == 400
    assert 'expected "job": a Slurm job id (digits only)' in reply["error"]
    assert prometheus_server.asked == []


@pytest.mark.security
def test_the_broker_off_is_404_and_no_credential_is_read(config):
    status, reply = ask(replace(config, dashboard_broker=False), 1002, {"ask": "cluster"})
    assert status == 404 and "no dashboard broker here" in reply["text"]
    assert DECODED == []


@pytest.mark.security
@pytest.mark.bad_input
def test_a_body_over_64_kib_is_413_unread(config):
    status, reply = post(config, b"MUNGE:" + b"A" * (64 << 10) + b":")
    assert status == 413 and "over 65536 bytes" in reply["error"]
    assert DECODED == []


@pytest.mark.security
def test_an_uid_without_an_account_is_403(config, prometheus_server):
    status, reply = ask(config, 4242, {"ask": "job", "job": "7", "start": 0, "end": NOW})
    assert status == 403 and "uid 4242 has no account" in reply["error"]
    assert prometheus_server.asked == []


def test_a_user_name_is_a_quoted_promql_string():
    assert broker_asks.prometheus.label_value('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    plots = broker_asks.job_plots("7", 'x"} or vector(1) #', 5)
    assert all('user="x\\"} or vector(1) #"}' in plot.expression for plot in plots)


# ------------------------------------------------------------------ bad input


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"ask": "everything"}, 'expected a JSON object with "ask": job, cluster'),
        (["job"], 'expected a JSON object with "ask"'),
        ({"ask": "job", "job": "7", "start": "yesterday"}, 'expected "start": Unix seconds'),
        ({"ask": "job", "job": "7", "start": NOW, "end": NOW - 1}, 'expected "end" after'),
        ({"ask": "job", "job": "7", "start": float("inf")}, 'expected "start"'),
    ],
)
def test_a_request_not_understood_says_what_is_expected(config, request_, expected):
    status, reply = ask(config, 1002, request_)
    assert status == 400 and expected in reply["error"]


@pytest.mark.bad_input
@pytest.mark.parametrize("length", ["", "ten", "-1"])
def test_a_body_without_its_length_is_a_bad_request(config, length):
    status, reply = post(config, b"MUNGE:x:", length)
    assert status == 400 and "expected a MUNGE credential as the body" in reply["error"]


def test_a_get_on_the_broker_is_405(config):
    app = broker.app(config)
    said = []
    answer = b"".join(app({"REQUEST_METHOD": "GET"}, lambda s, h: said.append(s)))
    assert said == ["405 Method Not Allowed"] and b"only POST" in answer


# ------------------------------------------------------------------ answers


def test_a_jobs_span_is_clipped_to_a_week_in_at_most_300_points(config, prometheus_server):
    request = {"ask": "job", "job": "7", "start": NOW - 30 * 86400, "end": NOW}
    status, reply = ask(config, 1002, request)
    assert status == 200
    _, arguments = prometheus_server.asked[0]
    start, end, step = (float(arguments[k]) for k in ("start", "end", "step"))
    assert end == NOW and end - start == 7 * 86400
    assert (end - start) / step <= 300
    assert "rate(tacc_agent_job_cpu_seconds_total{" in arguments["query"]
    cpu = next(s for s in reply["series"] if s["name"] == "cpu")
    assert cpu == {
        "name": "cpu",
        "label": "CPU cores (n3)",
        "unit": "cores",
        "points": [[NOW - 60, 1.5], [NOW + 5, 2.0]],  # NaN left out
    }


def test_a_short_span_steps_at_least_5_seconds(config, prometheus_server):
    ask(config, 1002, {"ask": "job", "job": "7", "start": NOW - 60, "end": NOW})
    assert float(prometheus_server.asked[0][1]["step"]) == 5


def test_an_admin_gets_the_clusters_last_day(config, prometheus_server):
    status, reply = ask(config, 1003, {"ask": "cluster"})
    assert status == 200 and reply["problem"] == ""
    queries = [arguments["query"] for _, arguments in prometheus_server.asked]
    assert queries == [
        'max by (partition) (tacc_agent_slurm_gpus{state="allocated"})',
        'max by (partition) (tacc_agent_slurm_gpus{state="total"})',
        "avg(tacc_agent_job_gpu_utilization_ratio)",
        "max by (state) (tacc_agent_slurm_nodes)",
    ]
    start, end = (float(prometheus_server.asked[0][1][k]) for k in ("start", "end"))
    assert end - start == 86400
    assert {s["name"] for s in reply["series"]} == {
        "gpus_allocated",
        "gpus_total",
        "gpu_utilization",
        "nodes",
    }


def test_root_gets_the_firing_alerts_only(config):
    status, reply = ask(config, 0, {"ask": "alerts"})
    assert status == 200
    assert reply == {
        "alerts": [
            {
                "name": "TaccNodeDrained",
                "severity": "warning",
                "instance": "n2",
                "summary": "n2 is drained",
                "since": "2026-12-06T07:00:00Z",
            }
        ],
        "problem": "",
    }


def test_an_admin_gets_the_whole_queue(config, monkeypatch):
    running = QueuedJob("12", "alice", "RUNNING", 0, 2, 3725, nodes=2, partition="gpu")
    waiting = QueuedJob("13", "bob", "PENDING", 0, 1, 0, partition="gpu")
    details = {
        "12": queue.Details("alice", "train | big", "", 3600, ("n2", "n3"), 0.0, 0.0),
    }
    monkeypatch.setattr(queue, "queued_jobs", lambda timeout: [running, waiting])
    monkeypatch.setattr(queue, "queue_details", lambda timeout: details)
    status, reply = ask(config, 1003, {"ask": "queue"})
    assert status == 200
    assert reply["jobs"] == [
        {
            "job": "12",
            "user": "alice",
            "name": "train | big",
            "state": "RUNNING",
            "partition": "gpu",
            "nodes": "n2,n3",
            "time": "1:02:05",
        },
        {
            "job": "13",
            "user": "bob",
            "name": "",
            "state": "PENDING",
            "partition": "gpu",
            "nodes": "",
            "time": "0:00",
        },
    ]


@pytest.mark.fault
def test_slurm_missing_here_is_a_problem_not_an_error(config, monkeypatch):
    def missing(timeout: float) -> list:
        raise AgentError("squeue not found: is this a Slurm node?")

    monkeypatch.setattr(queue, "queued_jobs", missing)
    status, reply = ask(config, 1003, {"ask": "queue"})
    assert status == 200
    assert reply["jobs"] == [] and "squeue not found" in reply["problem"]


@pytest.mark.fault
@pytest.mark.parametrize("url", ["", "http://127.0.0.1:9"])
def test_prometheus_unset_or_down_is_a_problem_with_empty_lists(config, url):
    config = replace(config, prometheus_url=url)
    for uid, request, key in (
        (1002, {"ask": "job", "job": "7", "start": NOW - 60, "end": NOW}, "series"),
        (1003, {"ask": "cluster"}, "series"),
        (1003, {"ask": "alerts"}, "alerts"),
    ):
        status, reply = ask(config, uid, request)
        assert status == 200 and reply[key] == []
        assert ("did not answer" if url else "no Prometheus is set") in reply["problem"]


def test_run_times_print_as_squeue_prints_them():
    assert [run_time(s) for s in (0, 65, 3725, 90061)] == ["0:00", "1:05", "1:02:05", "1-01:01:01"]


# ------------------------------------------------------------------ the client, end to end


def test_the_client_asks_the_daemons_broker_and_gets_its_answer(tmp_path, config):
    daemon_config = replace(
        fixture_config(tmp_path), prometheus_url=config.prometheus_url, dashboard_broker=True
    )
    with metrics_server(daemon_config) as port:
        url = f"http://127.0.0.1:{port}/dashboard"
        reply = broker_client.ask(url, {"ask": "alerts"})
        assert reply["alerts"][0]["name"] == "TaccNodeDrained"
        with pytest.raises(broker_client.BrokerUnavailable) as refused:
            broker_client.ask(url, {"ask": "everything"})
        assert refused.value.status == 400
        assert "refused (HTTP 400): expected a JSON object" in str(refused.value)
    with pytest.raises(broker_client.BrokerUnavailable, match="did not answer"):
        broker_client.ask(url, {"ask": "alerts"}, timeout=2)


def test_the_client_says_why_in_one_line(monkeypatch):
    with pytest.raises(broker_client.BrokerUnavailable, match="no dashboard broker is set"):
        broker_client.ask("", {"ask": "cluster"})

    def down(payload: bytes) -> str:
        raise munge.MungeUnavailable("munge not found: is MUNGE installed here?")

    monkeypatch.setattr(munge, "encode", down)
    with pytest.raises(broker_client.BrokerUnavailable, match="munge not found"):
        broker_client.ask("http://127.0.0.1:9/dashboard", {"ask": "cluster"})


def test_the_daemon_without_the_broker_answers_404(tmp_path):
    with metrics_server(fixture_config(tmp_path)) as port:
        url = f"http://127.0.0.1:{port}/dashboard"
        with pytest.raises(broker_client.BrokerUnavailable) as refused:
            broker_client.ask(url, {"ask": "cluster"})
    assert refused.value.status == 404


# ------------------------------------------------------------------ settings and role


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("dashboard_broker", "yes"),
        ("dashboard_broker_url", "n1:977/dashboard"),
        ("dashboard_admin_group", "admins; rm"),
        ("dashboard_idle_seconds", 0),
    ],
)
def test_bad_dashboard_settings_are_one_line_naming_them(tmp_path, setting, value):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({setting: value}))
    with pytest.raises(AgentError, match=f"{setting}: expected"):
        load_config(path)


def test_the_dashboard_settings_load(tmp_path):
    path = tmp_path / "config.yaml"
    settings = {
        "dashboard_broker": True,
        "dashboard_broker_url": "http://10.0.0.1:977/dashboard",
        "dashboard_admin_group": "hpc-admins",
        "dashboard_idle_seconds": 60,
    }
    path.write_text(yaml.safe_dump(settings))
    loaded = load_config(path)
    assert {k: getattr(loaded, k) for k in settings} == settings


def test_the_role_writes_every_dashboard_setting():
    template = (ROOT / "roles/tacc_agent/templates/config.yaml.j2").read_text()
    defaults = yaml.safe_load((ROOT / "roles/tacc_agent/defaults/main.yml").read_text())
    for name in ("broker", "broker_url", "admin_group", "idle_seconds"):
        assert f"'dashboard_{name}': tacc_agent_dashboard_{name}" in template
        assert f"tacc_agent_dashboard_{name}" in defaults
    assert defaults["tacc_agent_dashboard_admin_group"] == AgentConfig().dashboard_admin_group
    assert defaults["tacc_agent_dashboard_idle_seconds"] == AgentConfig().dashboard_idle_seconds


@pytest.mark.security
def test_only_a_good_credential_earns_a_longer_deadline(config):
    """The daemon cuts every request after 5 s; the broker moves its own request's
    deadline only once munged vouched for it, so no unauthenticated client holds a
    connection longer."""
    good = credential(1003, {"ask": "alerts"})
    for body, extended in ((b"MUNGE:used:", []), (good, [(15.0, "uid:1003")])):
        asked: list[tuple[float, str]] = []
        environ = {
            "REQUEST_METHOD": "POST",
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            broker.EXTEND_DEADLINE: lambda seconds, holder, asked=asked: (
                asked.append((seconds, holder)) or True
            ),
        }
        b"".join(broker.app(config)(environ, lambda status, headers: None))
        assert asked == extended


def test_the_daemon_moves_a_connections_deadline(tmp_path):
    server = serve.MetricsServer(("127.0.0.1", 0), serve.routes(None, None))
    try:
        conn = object()
        server.deadlines[conn] = ("loopback", 0.0)
        assert server.extend(conn, 60, "uid:1003")
        holder, due = server.deadlines[conn]
        assert holder == "uid:1003" and due > serve.time.monotonic() + 50
        assert not server.extend(object(), 60, "uid:1003")  # a connection already gone
        assert len(server.deadlines) == 1
    finally:
        server.server_close()


@pytest.mark.security
def test_a_flood_from_the_login_nodes_address_never_cuts_a_request_in_flight():
    """Every dashboard of a login node reaches the broker from one address: a fifth
    connection from there cuts a connection still unauthenticated, never one whose
    caller munged vouched for (counted as that uid's own from then on), and a caller
    past their own cap is refused instead (429)."""
    server = serve.MetricsServer(("127.0.0.1", 0), serve.routes(None, None))
    try:
        victim = socket.socketpair()
        server.verify_request(victim[0], ("10.0.0.10", 4000))
        assert server.extend(victim[0], 15.0, "uid:2001")  # alice's request, in flight
        flood = [socket.socketpair() for _ in range(serve.CONNECTIONS_PER_CLIENT + 3)]
        for ours, _theirs in flood:
            server.verify_request(ours, ("10.0.0.10", 4001))
        assert victim[0] in server.deadlines
        held = [ours for ours, _ in flood if ours in server.deadlines]
        assert len(held) == serve.CONNECTIONS_PER_CLIENT  # the oldest unauthenticated cut
        for ours in held:
            assert server.extend(ours, 15.0, "uid:2066")
        one_more = socket.socketpair()
        server.verify_request(one_more[0], ("10.0.0.10", 4002))
        assert not server.extend(one_more[0], 15.0, "uid:2066")  # the flooder's own cap
        assert victim[0] in server.deadlines
        for pair in (victim, one_more, *flood):
            for end in pair:
                end.close()
    finally:
        server.server_close()


@pytest.mark.bad_input
def test_a_payload_nested_too_deep_is_a_bad_request_not_a_crash():
    with pytest.raises(broker.Refused, match="not JSON"):
        broker.parsed(b"[" * 40000)
