"""Issue [18] point 3: the node daemon's /metrics port cannot be squatted, and its per-job
series (labels job and user) reach only the cluster's Prometheus (the scrapers' token from
an allowed address) and root on the node (health/metrics_access.py, serve.py).

- The default port is below 1024 (only root binds it), the same in the agent and in every
  role that names it.
- A taken port ends `tacc-agent serve` with one line naming the port, not an
  AttributeError from server_close.
- A client that is neither an allowed scraper nor root gets the node's own figures only;
  an allowed address without the token is no scraper (a user on the monitoring host).
- A bad token file is one line naming it, and root only; the token is never logged.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tacc_agent import serve
from tacc_agent.config import AgentConfig, load_config
from tacc_agent.errors import AGENT_CLUSTER, AgentError
from tacc_agent.health import metrics_access
from tacc_agent.health.metrics_access import JobSeriesAccess
from tacc_agent.procfs.system import UNPRIVILEGED_PORT_START
from tests.conftest import ROOT
from tests.unit.agent.health.test_job_usage import ALICE, add_process
from tests.unit.agent_fixtures import daemon_settings, fixture_config, metrics_server
from tests.unit.proc_fakes import hex_endpoint, socket_table

JOB_LABELS = ('job="', 'user="')
TOKEN = "s3cret-scrapers-token-0123456789abcdef"  # noqa: S105 (a test value)


def role_default(role: str, name: str) -> object:
    return yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())[name]


def spec_default(role: str, name: str) -> object:
    spec = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"][name]["default"]


# ------------------------------------------------------------------ the port


@pytest.mark.security
def test_the_default_metrics_port_is_privileged_and_declared_alike_everywhere():
    """Only root binds a port below 1024 (net.ipv4.ip_unprivileged_port_start's default),
    so no user can take it while the agent restarts. The role declares it; the agent's
    own default and the roles that point Prometheus at it agree."""
    declared = role_default("tacc_agent", "tacc_agent_metrics_port")
    assert isinstance(declared, int) and 0 < declared < 1024
    assert AgentConfig().metrics_port == declared
    assert spec_default("tacc_agent", "tacc_agent_metrics_port") == declared
    for role, name in [
        ("monitoring", "monitoring_agent_port"),
        ("cluster_dns", "cluster_dns_agent_port"),
    ]:
        assert role_default(role, name) == declared, name
        assert spec_default(role, name) == declared, name


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        yield squatter.getsockname()[1]


@pytest.mark.security
@pytest.mark.fault
def test_a_taken_port_is_a_clear_error_not_an_attribute_error(tmp_path, taken_port):
    """A failed bind made MetricsServer's server_close read `stopped` before it was set:
    AttributeError, a crash loop under systemd. Now: an AgentError naming the port."""
    daemon = serve.Daemon(fixture_config(tmp_path))
    with pytest.raises(AgentError) as raised:
        serve.listen(daemon, "127.0.0.1", taken_port)
    assert str(raised.value).startswith(
        f"cannot serve metrics on 127.0.0.1:{taken_port}: port {taken_port} is taken"
    )
    assert raised.value.exit_code == AGENT_CLUSTER


@pytest.mark.security
@pytest.mark.fault
def test_serve_on_a_taken_port_says_so_in_one_line_and_exits(tmp_path, taken_port):
    settings = daemon_settings(fixture_config(tmp_path)) | {"metrics_address": "127.0.0.1"}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "tacc_agent", "serve", "--port", str(taken_port)]
    command += ["--config", str(tmp_path / "agent.yaml")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    lines = (proc.stdout + proc.stderr).splitlines()
    assert proc.returncode == AGENT_CLUSTER, lines
    assert len(lines) == 1, lines  # no traceback, no crash-loop noise
    assert json.loads(lines[0])["error"].startswith(
        f"cannot serve metrics on 127.0.0.1:{taken_port}: port {taken_port} is taken"
    )


def test_a_failed_bind_closes_the_server_cleanly(tmp_path, taken_port):
    with pytest.raises(OSError):
        serve.MetricsServer(("127.0.0.1", taken_port), serve.routes(None, None))


def test_a_lowered_unprivileged_port_start_is_warned_about(tmp_path):
    sysctl = tmp_path / "proc" / UNPRIVILEGED_PORT_START
    sysctl.parent.mkdir(parents=True)
    config = AgentConfig(proc_root=str(tmp_path / "proc"))
    sysctl.write_text("0\n")  # what a container runtime often sets
    assert "any user may bind port 977" in serve.open_to_users(config, 977)
    sysctl.write_text("1024\n")
    assert serve.open_to_users(config, 977) == ""
    assert serve.open_to_users(replace(config, proc_root=str(tmp_path / "no")), 977) == ""


# ------------------------------------------------------------------ who sees the jobs


def job_proc(root: Path) -> str:
    """A node running job 41 for ALICE (a root step daemon and its task)."""
    add_process(root, 1, 0, 0, b"/sbin/init\0")
    add_process(root, 110, 1, 0, b"slurmstepd: [41.0]\0")
    task = {"SLURM_CPUS_ON_NODE": "2"}
    add_process(root, 111, 110, ALICE, b"python\0train.py\0", pss_kb=100, environ=task)
    return str(root)


def job_config(tmp_path: Path, **settings: object) -> AgentConfig:
    return AgentConfig(
        proc_root=job_proc(tmp_path / "proc"),
        nvidia_smi=str(tmp_path / "absent"),
        checks={},
        drain=False,
        services=(),
        **settings,
    )


def scrape(port: int, source: str = "127.0.0.1", source_port: int = 0, token: str = "") -> str:
    authorization = f"Authorization: Bearer {token}\r\n" if token else ""
    with socket.socket() as conn:
        conn.settimeout(10)
        conn.bind((source, source_port))
        conn.connect(("127.0.0.1", port))
        conn.sendall(f"GET /metrics HTTP/1.0\r\nHost: node\r\n{authorization}\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    assert " 200 " in head.splitlines()[0], head
    return body


def job_lines(body: str) -> list[str]:
    return [line for line in body.splitlines() if any(label in line for label in JOB_LABELS)]


@pytest.mark.security
def test_a_client_neither_scraper_nor_root_gets_no_job_or_user_labels(tmp_path):
    """Any user on the node (or anyone who reaches the port) read every job's id and
    user; now only the node's own figures. (The fake proc_root has no net/tcp, so no
    client counts as root, whoever runs the tests.)"""
    with metrics_server(job_config(tmp_path)) as port:
        body = scrape(port)
    assert "tacc_agent_healthy" in body and "tacc_agent_running_tasks" in body
    assert job_lines(body) == []
    assert "tacc_agent_job_" not in body


def token_file(tmp_path: Path, text: str = TOKEN, mode: int = 0o600) -> str:
    path = tmp_path / "metrics-job-token"
    path.write_text(text + "\n")
    path.chmod(mode)
    return str(path)


def scraper_config(tmp_path: Path, **settings: object) -> AgentConfig:
    """Prometheus at 127.0.0.2 (or in 10/8), with the scrapers' token."""
    return job_config(
        tmp_path,
        metrics_job_scrapers=("127.0.0.2", "10.0.0.0/8"),
        metrics_job_token_file=token_file(tmp_path),
        **settings,
    )


@pytest.mark.security
def test_an_allowed_address_without_the_token_gets_no_job_or_user_labels(tmp_path):
    """Review point 5: alice logged in on the monitoring host (or a request forgery there)
    comes from the scrapers' address; it read every job id and user of every node. Now
    the address without the scrapers' token, or with another, is no scraper."""
    with metrics_server(scraper_config(tmp_path)) as port:
        bare = scrape(port, "127.0.0.2")
        wrong = scrape(port, "127.0.0.2", token=TOKEN[:-1] + "x")
        basic = scrape(port, "127.0.0.2", token="")
    for body in (bare, wrong, basic):
        assert job_lines(body) == [] and "tacc_agent_healthy" in body


def test_the_token_from_an_allowed_address_gets_the_job_series(tmp_path):
    with metrics_server(scraper_config(tmp_path)) as port:
        scraper = scrape(port, "127.0.0.2", token=TOKEN)
        elsewhere = scrape(port, "127.0.0.3", token=TOKEN)  # not an allowed address
    assert 'tacc_agent_job_cpus{job="41",user="' in scraper
    assert job_lines(elsewhere) == [] and "tacc_agent_healthy" in elsewhere


def test_bearer_header_values_are_read_strictly():
    networks = metrics_access.scraper_networks(["10.0.0.0/8"])[0]
    access = JobSeriesAccess(networks, token=TOKEN.encode(), proc_root="/nonexistent")
    agent = ("10.0.0.1", 977)
    assert access.allows(agent, ("10.0.0.2", 5000), f"Bearer {TOKEN}")
    assert access.allows(agent, ("10.0.0.2", 5000), f"bearer {TOKEN}")
    for value in ("", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer \u00e9", "Bearer "):
        assert not access.allows(agent, ("10.0.0.2", 5000), value), value
    assert not JobSeriesAccess(access.scrapers, proc_root="/nonexistent").allows(
        agent, ("10.0.0.2", 5000), "Bearer "
    )  # no token configured: no empty one matches


def test_every_client_gets_the_job_series_when_the_site_makes_them_public(tmp_path):
    with metrics_server(job_config(tmp_path, metrics_jobs_public=True)) as port:
        assert 'tacc_agent_job_cpus{job="41"' in scrape(port, "127.0.0.3")


@pytest.mark.parametrize(
    ("uid", "inode", "visible"), [(0, 4242, True), (1000, 4242, False), (0, 0, False)]
)
def test_root_on_the_node_is_told_by_its_sockets_owner(tmp_path, uid, inode, visible):
    """The client's end of the connection, in the node's socket table: root's gets the
    job series, a user's does not, and one no process holds (TIME_WAIT, orphan: listed
    as uid 0) is nobody's."""
    config = job_config(tmp_path)
    with socket.socket() as probe:  # a free port for the client to come from
        probe.bind(("127.0.0.1", 0))
        client_port = probe.getsockname()[1]
    with metrics_server(config) as port:
        agent, client = hex_endpoint("127.0.0.1", port), hex_endpoint("127.0.0.1", client_port)
        agent_side = (agent, client, 0, 1)
        socket_table(config.proc_root, [agent_side, (client, agent, uid, inode)])
        body = scrape(port, "127.0.0.1", client_port)
    assert bool(job_lines(body)) is visible


@pytest.mark.fault
def test_a_connection_gone_before_its_accept_leaves_the_server_serving_and_stoppable(tmp_path):
    """serve_forever accepts when select says a connection waits; a client that reset it
    in between left accept() blocked for good (seen once in make test: the metrics thread
    in accept, shutdown() waiting on it for 20 minutes). Here the accept of a connection
    that is not there: it returns at once, and the server still answers and stops."""
    with metrics_server(job_config(tmp_path)) as port:
        server = serve.MetricsServer(("127.0.0.1", 0), lambda environ, start: [])
        try:
            spurious = threading.Thread(target=server._handle_request_noblock, daemon=True)
            spurious.start()
            spurious.join(5)
            assert not spurious.is_alive(), "accept() blocked with no connection waiting"
        finally:
            server.server_close()
        assert "tacc_agent_healthy" in scrape(port)


def test_the_real_socket_table_names_the_client_owner():
    """Against the kernel's own /proc/net/tcp: this process's connection is found, its
    owner is this process's uid (root: allowed)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, peer = listener.accept()
        with client, accepted:
            agent_end = accepted.getsockname()
            uid = metrics_access.client_uid(
                "/proc", metrics_access.endpoint(agent_end), metrics_access.endpoint(peer)
            )
            allowed = JobSeriesAccess().allows(agent_end, peer)
    assert uid == os.geteuid()
    assert allowed is (os.geteuid() == 0)
    assert JobSeriesAccess(proc_root="/nonexistent").allows(agent_end, peer) is False


def test_scraper_names_are_resolved_and_unresolved_ones_reported():
    hosts = {"prom1": ["10.0.0.9", "::ffff:10.0.0.8"], "gone": []}
    networks, unresolved = metrics_access.scraper_networks(
        ["10.1.0.0/16", "fd00::5", "prom1", "gone"], resolve=hosts.__getitem__
    )
    found = [str(net) for net in networks]
    assert found == ["10.1.0.0/16", "fd00::5/128", "10.0.0.9/32", "10.0.0.8/32"]
    assert unresolved == ["gone"]
    access = JobSeriesAccess(networks, proc_root="/nonexistent", token=TOKEN.encode())
    assert access.allows(("10.0.0.1", 977), ("::ffff:10.1.2.3", 5000), f"Bearer {TOKEN}")
    assert not access.allows(("10.0.0.1", 977), ("10.2.0.1", 5000), f"Bearer {TOKEN}")


@pytest.mark.bad_input
@pytest.mark.parametrize("value", ["n1", [5], ["10.0.0.1; rm"], {"a": 1}])
def test_a_bad_scraper_list_is_refused_naming_the_setting(tmp_path, value):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"metrics_job_scrapers": value}))
    with pytest.raises(AgentError) as raised:
        load_config(path)
    assert f"{path}: metrics_job_scrapers: expected a list of addresses" in str(raised.value)


def test_a_good_scraper_list_is_read(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"metrics_job_scrapers": ["10.0.0.1", "fd00::/64", "n1"]}))
    assert load_config(path).metrics_job_scrapers == ("10.0.0.1", "fd00::/64", "n1")


# ------------------------------------------------------------------ the token file


def test_the_token_is_read_from_its_file_and_never_said(tmp_path):
    access, notes = serve.job_series_access(scraper_config(tmp_path))
    assert access.token == TOKEN.encode()
    assert notes == []


def test_without_a_token_file_only_root_gets_the_job_series_said_once(tmp_path):
    access, notes = serve.job_series_access(job_config(tmp_path))
    assert access.token == b""
    assert notes == [
        "metrics: no metrics_job_token_file set: per-job series for root on this node only"
    ]


def test_serve_says_it_after_the_port_line(tmp_path):
    """One line at start, after the `metrics on` one (which tools read first)."""
    settings = daemon_settings(fixture_config(tmp_path)) | {"metrics_address": "127.0.0.1"}
    settings["metrics_job_token_file"] = str(tmp_path / "absent")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    command = [sys.executable, "-m", "tacc_agent", "serve", "--port", "0"]
    daemon = subprocess.Popen(
        [*command, "--config", str(tmp_path / "agent.yaml")], stdout=subprocess.PIPE, text=True
    )
    try:
        first, second = daemon.stdout.readline(), daemon.stdout.readline()
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        daemon.stdout.close()
    assert first.startswith("tacc-agent: metrics on 127.0.0.1:"), first
    assert second == (
        f"tacc-agent: metrics: scrapers' token: {tmp_path / 'absent'}: cannot read it: "
        "No such file or directory: per-job series for root on this node only\n"
    )


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "mode", "why"),
    [
        (None, 0o600, "cannot read it: No such file or directory"),
        (TOKEN, 0o644, "not root's alone (owner uid 0, mode -rw-r--r--): chown root"),
        (TOKEN, 0o640, "not root's alone (owner uid 0, mode -rw-r-----): chown root"),
        ("short-" + TOKEN[:20], 0o600, "expected one token of at least 32 visible ASCII"),
        (TOKEN[:20] + " " + TOKEN[20:], 0o600, "expected one token of at least 32 visible"),
    ],
)
def test_a_bad_token_file_is_one_line_naming_it_and_root_only(tmp_path, text, mode, why):
    """Fail closed: the agent keeps serving the node's own figures and its checks, and
    says in one line which file is wrong and why, without what is in it."""
    path = tmp_path / "metrics-job-token"
    if text is not None:
        token_file(tmp_path, text, mode)
    access, notes = serve.job_series_access(job_config(tmp_path, metrics_job_token_file=str(path)))
    assert access.token == b""
    (line,) = notes
    assert line.startswith(f"metrics: scrapers' token: {path}: {why}"), line
    assert line.endswith(": per-job series for root on this node only")
    assert TOKEN[:20] not in line


@pytest.mark.bad_input
@pytest.mark.parametrize("value", ["relative/token", 5, ["/etc/x"]])
def test_a_bad_token_file_setting_is_refused_naming_it(tmp_path, value):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"metrics_job_token_file": value}))
    with pytest.raises(AgentError) as raised:
        load_config(path)
    assert f"{path}: metrics_job_token_file: expected an absolute path" in str(raised.value)


# ------------------------------------------------------------------ the socket tables


@pytest.mark.security
def test_a_remote_client_never_makes_the_agent_read_the_socket_tables(monkeypatch):
    """Review point 6: every request from a non-scraper, remote ones included, had the
    agent parse all of /proc/net/tcp{,6}, which any user can inflate. Only a client on
    the loopback or at the address it connected to (so on this node) is looked up."""
    read: list[str] = []
    monkeypatch.setattr(
        metrics_access, "tcp_sockets", lambda proc_root: read.append(proc_root) or iter(())
    )
    access = JobSeriesAccess(proc_root="/proc")
    assert not access.allows(("10.0.0.1", 977), ("10.0.0.2", 40000))
    assert not access.allows(("::ffff:10.0.0.1", 977), ("::ffff:10.0.0.9", 40000))
    assert read == []
    local = [
        (("10.0.0.1", 977), ("10.0.0.1", 40000)),  # the node's own address
        (("127.0.0.1", 977), ("127.0.0.5", 40000)),
        (("::1", 977, 0, 0), ("::1", 40000, 0, 0)),
    ]
    for agent, client in local:
        access.allows(agent, client)
    assert len(read) == 3


@pytest.mark.security
def test_a_token_file_that_is_a_link_is_not_followed(tmp_path):
    """A link in the token file's place (to a file someone else wrote) is refused."""
    real = token_file(tmp_path, TOKEN, 0o600)
    link = tmp_path / "linked-token"
    link.symlink_to(real)
    access, notes = serve.job_series_access(job_config(tmp_path, metrics_job_token_file=str(link)))
    assert access.token == b"" and "cannot read it" in notes[0], notes
