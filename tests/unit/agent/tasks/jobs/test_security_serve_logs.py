"""Issue [10] points 7, 8 and 15: one researcher cannot blind the node daemon's /metrics
with a slow HTTP client (7), cannot exhaust the login node's memory with a large log (8),
and a node with a skewed clock cannot reorder a job's state changes (15)."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tacc_agent import serve
from tacc_agent.tasks.jobs import logs, records
from tests.unit.agent_fixtures import (
    daemon_settings,
    fixture_config,
    metrics_server,
    parse_exposition,
)

# ------------------------------------------------------------ 7: /metrics under slow clients
SCRAPER = "127.0.0.2"  # the Prometheus server: another address than the slow clients'


def scrape(port: int, source: str = SCRAPER) -> str:
    """One scrape from `source`: the whole answer. A socket timeout (5 s, a guard against
    a hang) when it is not served."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=5, source_address=(source, 0)
    ) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\nHost: node\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer.decode()


@pytest.fixture
def no_deadline(monkeypatch) -> None:
    """Stalled clients keep their connections for the whole case (the request deadline
    pushed out to an hour): a scrape served at all was not kept waiting behind them."""
    monkeypatch.setattr(serve, "REQUEST_DEADLINE_SECONDS", 3600.0)


def stalled_client(port: int, sent: bytes = b"GET /metr") -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(sent)
    return conn


def dribble(conn: socket.socket, stop: threading.Event, every: float) -> None:
    """A slowloris: one byte of a never-ending header line every `every` seconds."""
    with contextlib.suppress(OSError):
        while not stop.wait(every):
            conn.sendall(b"x")


def is_cut(conn: socket.socket, guard: float = 10.0) -> bool:
    """Whether the server closes `conn`; False when it has not after `guard` seconds (a
    guard against a hang: without the deadline it never would)."""
    conn.settimeout(guard)
    try:
        while conn.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset by the server: cut too
        pass
    return True


@pytest.mark.security
@pytest.mark.parametrize("scraper", ["127.0.0.1", "127.0.0.200"])
def test_p7_stalled_connections_from_many_local_addresses_do_not_keep_a_scrape_out(
    tmp_path, scraper, no_deadline
):
    """A local user holds every slot from 127.0.0.2.., 127.0.0.9 (any of 127/8 is theirs):
    the scrape, from the same loopback or another address, cuts the oldest and is served."""
    with metrics_server(fixture_config(tmp_path)) as port:
        held = []
        for host in range(2, 2 + serve.CONNECTIONS // serve.CONNECTIONS_PER_CLIENT):
            for _ in range(serve.CONNECTIONS_PER_CLIENT):
                conn = socket.create_connection(
                    ("127.0.0.1", port), timeout=10, source_address=(f"127.0.0.{host}", 0)
                )
                conn.sendall(b"GET /metrics HTTP/1.1\r\n")
                held.append(conn)
        time.sleep(0.3)
        body = scrape(port, scraper)
        for conn in held:
            conn.close()
    assert "200 OK" in body.splitlines()[0], body[:200]


@pytest.mark.security
def test_p7_a_client_sending_a_byte_every_2s_does_not_delay_a_scrape(tmp_path, no_deadline):
    with metrics_server(fixture_config(tmp_path)) as port:
        slow = stalled_client(port)
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        stop = threading.Event()
        threading.Thread(target=dribble, args=(slow, stop, 2.0), daemon=True).start()
        try:
            time.sleep(0.2)  # the slow clients are connected and being served first
            answer = scrape(port)
            assert answer.startswith("HTTP/1.") and " 200 " in answer.splitlines()[0]
            assert "tacc_agent_check_runs_total" in answer
        finally:
            stop.set()
            slow.close()
            silent.close()


@pytest.mark.security
def test_p7_a_slow_or_silent_client_is_cut_after_the_request_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(serve, "REQUEST_DEADLINE_SECONDS", 1.0, raising=False)
    with metrics_server(fixture_config(tmp_path)) as port:
        slow = stalled_client(port)
        stop = threading.Event()
        threading.Thread(target=dribble, args=(slow, stop, 0.3), daemon=True).start()
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            assert is_cut(slow)  # still sending, but past its 1 s deadline
            assert is_cut(silent)
        finally:
            stop.set()
            slow.close()
            silent.close()


@pytest.mark.security
def test_p7_hundreds_of_idle_connections_neither_block_scrapes_nor_pile_up_threads(
    tmp_path, no_deadline
):
    with metrics_server(fixture_config(tmp_path)) as port:
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
        try:
            time.sleep(0.3)
            answer = scrape(port)
            assert " 200 " in answer.splitlines()[0]
            assert threading.active_count() - before <= 64  # capped per client and in all
        finally:
            for conn in idle:
                conn.close()


def ask(port: int, method: str, path: str) -> tuple[int, str, str]:
    """(status, Content-Type, body) of one request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        answer = conn.getresponse()
        return answer.status, answer.headers["Content-Type"], answer.read().decode()
    finally:
        conn.close()


def test_p7_routes_and_the_exposition_are_unchanged(tmp_path):
    with metrics_server(fixture_config(tmp_path)) as port:
        status, kind, body = ask(port, "GET", "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=0.0.4")
        families = parse_exposition(body)
        assert ask(port, "HEAD", "/metrics")[:2] == (200, kind)
        assert ask(port, "GET", "/")[0] == 200 and "/metrics" in ask(port, "GET", "/")[2]
        assert ask(port, "GET", "/nope")[0] == 404
        assert ask(port, "POST", "/metrics")[0] == 405
    assert {
        "tacc_agent_healthy",
        "tacc_agent_check_status",
        "tacc_agent_check_runs_total",
        "tacc_agent_rdma_port_errors_total",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "tacc_agent_children_cpu_seconds_total",
    } <= set(families)


def test_p7_the_serve_process_stays_within_its_30_mib_budget(tmp_path):
    """`tacc-agent serve` as systemd runs it, after a check run and 20 scrapes."""
    config = fixture_config(tmp_path)
    settings = daemon_settings(config) | {"services": []}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tacc_agent",
            "serve",
            "--port",
            "0",
            "--interval",
            "0.5",
            "--config",
            str(tmp_path / "agent.yaml"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r":(\d+)/metrics", daemon.stdout.readline()).group(1))
        for _ in range(20):
            scrape(port, "127.0.0.1")
            time.sleep(0.05)
        status = Path(f"/proc/{daemon.pid}/status").read_text()
        rss_kib = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))
        assert rss_kib < 30 * 1024, f"serve uses {rss_kib / 1024:.1f} MiB"
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


# ------------------------------------------------------------ 8: logs in constant memory
def job_with_logs(tmp_path: Path, files: dict[str, bytes]) -> Path:
    job_dir = tmp_path / "job"
    (job_dir / "logs").mkdir(parents=True)
    for name, data in files.items():
        (job_dir / "logs" / name).write_bytes(data)
    return job_dir


def printed(job_dir: Path, **options) -> str:
    out: list[str] = []
    settings = {"follow": False, "tail": None, "rank": None, "ended": lambda: True} | options
    logs.stream(job_dir, write=out.append, **settings)
    return "".join(out)


class Digest:
    """A write() that keeps only a digest and a count of what it is given."""

    def __init__(self) -> None:
        self.hash, self.lines = hashlib.sha256(), 0

    def __call__(self, text: str) -> None:
        self.hash.update(text.encode())
        self.lines += 1


def write_big_log(path: Path, size: int) -> tuple[str, int]:
    """`size` bytes of ~100-byte lines; the digest of what stream() must print for them."""
    expected, lines, written = hashlib.sha256(), 0, 0
    with path.open("wb") as handle:
        while written < size:
            block = b"".join(
                b"step %09d loss 0.%06d %s\n" % (lines + i, i, b"w" * (60 + i % 17))
                for i in range(10000)
            )
            handle.write(block)
            for line in block.splitlines():
                expected.update(b"[n2:0] " + line + b"\n")
            lines, written = lines + 10000, written + len(block)
    return expected.hexdigest(), lines


def stream_peak(job_dir: Path, write) -> int:
    """Peak bytes Python allocated while `tcloud logs` (the agent's stream) printed the
    job's logs through `write`."""
    tracemalloc.start()
    try:
        logs.stream(job_dir, False, None, 0, lambda: True, write=write)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.security
def test_p8_a_64_mib_log_prints_whole_in_bounded_memory(tmp_path):
    job_dir = job_with_logs(tmp_path, {})
    expected, count = write_big_log(job_dir / "logs" / "rank-0-n2.log", 64 * 2**20)
    sink = Digest()
    peak = stream_peak(job_dir, sink)
    assert (sink.hash.hexdigest(), sink.lines) == (expected, count)
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 64 MiB log"


@pytest.mark.security
def test_p8_a_log_that_is_one_endless_line_is_printed_in_bounded_memory(tmp_path):
    """No newline at all (a progress bar redrawn with \\r for hours): printed in pieces
    of at most a few MiB, every piece with its prefix."""
    job_dir = job_with_logs(tmp_path, {})
    # 1 MiB less a byte of a redrawn bar, then 2-byte characters: a cut at 1 MiB falls
    # in the middle of one, and must not break it
    line = (b"\r 42%|####      | 4200/10000 " * 37450)[: 2**20 - 1] + "ü".encode() * 2**24
    (job_dir / "logs" / "rank-0-n2.log").write_bytes(line)
    del line
    pieces = Digest()

    def write(text: str) -> None:  # the pieces, put back together, are the line
        assert text.startswith("[n2:0] ") and text.endswith("\n")
        pieces(text[len("[n2:0] ") : -1])

    peak = stream_peak(job_dir, write)
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.0f} MiB for a 33 MiB line"
    line = (job_dir / "logs" / "rank-0-n2.log").read_bytes()
    assert pieces.hash.hexdigest() == hashlib.sha256(line).hexdigest()
    assert 33 <= pieces.lines <= 40  # in pieces of about 1 MiB


SMALL = {
    "job.log": b"loading environment\nready\n",
    "rank-0-n2.log": b"epoch 1\n\xff\xfe bad bytes\nno newline at the end",
    "rank-1-n3.log": b"epoch 1\nepoch 2\n",
    "rank-10-n3.log": b"",
}
SMALL_PRINTED = (
    "[job] loading environment\n[job] ready\n[n2:0] epoch 1\n[n2:0] \ufffd\ufffd bad bytes\n"
    "[n2:0] no newline at the end\n[n3:1] epoch 1\n[n3:1] epoch 2\n"
)


@pytest.mark.parametrize("chunk", [None, 1, 5, 64])
def test_p8_a_small_log_prints_as_before_whatever_the_read_size(tmp_path, monkeypatch, chunk):
    if chunk:
        monkeypatch.setattr(logs, "READ_CHUNK_BYTES", chunk, raising=False)
    job_dir = job_with_logs(tmp_path, SMALL)
    assert printed(job_dir) == SMALL_PRINTED
    assert printed(job_dir, rank=1) == "[n3:1] epoch 1\n[n3:1] epoch 2\n"
    assert printed(job_dir, tail=2, rank=1) == "[n3:1] epoch 1\n[n3:1] epoch 2\n"


def test_p8_the_tail_of_a_log_without_a_final_newline_has_no_blank_line(tmp_path):
    job_dir = job_with_logs(tmp_path, SMALL)
    assert printed(job_dir, tail=1) == "[job] ready\n[n2:0] no newline at the end\n[n3:1] epoch 2\n"


def test_p8_follow_prints_lines_as_they_complete_and_new_ranks_as_they_appear(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(logs, "STATE_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(logs, "POLL_SECONDS", 0.0)
    job_dir = job_with_logs(tmp_path, {"rank-0-n2.log": b"a\nb"})
    calls = []

    def ended() -> bool:
        calls.append(1)
        if len(calls) == 2:
            with (job_dir / "logs" / "rank-0-n2.log").open("ab") as handle:
                handle.write(b"c\nd")
            (job_dir / "logs" / "rank-1-n3.log").write_bytes(b"late rank\n")
        return len(calls) >= 3

    assert printed(job_dir, follow=True, ended=ended) == (
        "[n2:0] a\n[n2:0] bc\n[n3:1] late rank\n[n2:0] d\n"
    )


# ------------------------------------------------------------ 15: event order
@contextlib.contextmanager
def clock_off_by(seconds: float) -> Iterator[None]:
    """This "node's" wall clock is `seconds` off (time.time and time.time_ns)."""
    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + seconds
    time.time_ns = lambda: real_ns() + int(seconds * 1e9)
    try:
        yield
    finally:
        time.time, time.time_ns = real, real_ns


def new_job(tmp_path: Path) -> Path:
    job_dir = tmp_path / "job"
    (job_dir / "status").mkdir(parents=True)
    return job_dir


@pytest.mark.security
def test_p15_a_login_node_an_hour_behind_cannot_sort_halted_before_running(tmp_path):
    job_dir = new_job(tmp_path)
    for state in ("QUEUED", "PROVISIONING", "RUNNING"):  # the compute node, right clock
        records.add_event(job_dir, state)
    with clock_off_by(-3600):  # the login node: `tcloud halt`
        records.add_event(job_dir, "HALTED", reason="halted by its owner")
    states = [e["state"] for e in records.history(job_dir)]
    assert states == ["QUEUED", "PROVISIONING", "RUNNING", "HALTED"]
    assert records.last_state(job_dir) == "HALTED"


@pytest.mark.security
def test_p15_a_compute_node_ahead_cannot_outlast_a_resume_and_the_next_run(tmp_path):
    job_dir = new_job(tmp_path)
    records.add_event(job_dir, "QUEUED")
    with clock_off_by(+7200):  # the first run's node is two hours ahead
        records.add_event(job_dir, "PROVISIONING")
        records.add_event(job_dir, "COMPLETED", exit_code=0)
    records.add_event(job_dir, "QUEUED", reason="resumed by its owner")
    records.add_event(job_dir, "PROVISIONING")
    records.add_event(job_dir, "RUNNING")
    states = [e["state"] for e in records.history(job_dir)]
    assert states == ["QUEUED", "PROVISIONING", "COMPLETED", "QUEUED", "PROVISIONING", "RUNNING"]
    assert records.last_state(job_dir) == "RUNNING"


def write_old_events(job_dir: Path, events: list[tuple[str, float]]) -> None:
    """A job directory written before the sequence: <ns>-<STATE>.json by wall clock."""
    folder = job_dir / "status" / "events"
    folder.mkdir(parents=True, exist_ok=True)
    for state, when in events:
        (folder / f"{int(when * 1e9):020d}-{state}.json").write_text(
            json.dumps({"state": state, "time": when, "host": "n1"})
        )


def test_p15_job_directories_written_before_the_sequence_still_read_in_time_order(tmp_path):
    job_dir = new_job(tmp_path)
    write_old_events(
        job_dir,
        [
            ("RUNNING", 1_700_000_020.0),
            ("QUEUED", 1_700_000_000.0),
            ("PROVISIONING", 1_700_000_010.0),
        ],
    )
    assert [e["state"] for e in records.history(job_dir)] == ["QUEUED", "PROVISIONING", "RUNNING"]
    assert records.history(job_dir)[0]["time"] == 1_700_000_000.0


@pytest.mark.security
def test_p15_an_event_added_to_an_old_job_directory_comes_after_its_old_events(tmp_path):
    job_dir = new_job(tmp_path)
    now = time.time()
    write_old_events(
        job_dir, [("QUEUED", now - 20), ("PROVISIONING", now - 10), ("RUNNING", now - 5)]
    )
    with clock_off_by(-3600):
        records.add_event(job_dir, "HALTED")
    states = [e["state"] for e in records.history(job_dir)]
    assert states == ["QUEUED", "PROVISIONING", "RUNNING", "HALTED"]


def add_events(job_dir: str, count: int) -> None:
    for _ in range(count):
        records.add_event(Path(job_dir), "RUNNING", writer=os.getpid())


def test_p15_writers_racing_on_one_job_each_get_their_own_place(tmp_path):
    job_dir = new_job(tmp_path)
    code = f"from {__name__} import add_events; add_events({str(job_dir)!r}, 25)"
    writers = [
        subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[5])
        for _ in range(4)
    ]
    assert [w.wait(timeout=60) for w in writers] == [0, 0, 0, 0]
    entries = records.history(job_dir)
    assert len(entries) == 100
    for writer in {e["writer"] for e in entries}:  # each writer's own events stay in order
        own = [e["sequence"] for e in entries if e["writer"] == writer]
        assert own == sorted(own) and len(own) == 25
    assert [e["sequence"] for e in entries] == list(range(1, 101))
    leftovers = [p.name for p in (job_dir / "status" / "events").iterdir() if p.name[0] == "."]
    assert leftovers == []
