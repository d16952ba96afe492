#!/usr/bin/env python3
"""The wall-time claims that left tests/unit ("timing is not a test": the tests keep the
behaviour, this script keeps the seconds). Each row times what one removed assertion
bounded, with the test's own fakes (tests/unit), next to a baseline: a run of what the
claim rules out (one node after another, the quadratic line split, waiting for the slow
tool, an idle server), or, where the claim is "bounded by a setting", that setting.

Rows (NAME for --only; the test each came from is in the JSON and the report):
  job_top         `job top`, 4 nodes of which 2 silent (1 s timeout): asked at once /
                  one after another
  exec_ctrl_c     `tcloud exec --all` on 2 nodes whose command never ends, Ctrl-C once
                  both run: start to exit 130 / an exec whose command ends at once
  pump            one 16 MiB and one 40 MiB output line without a newline: the split of
                  21ef57e / the split before it (quadratic; the 40 MiB one runs once)
  stuck_mount     a health check of a FUSE mount whose statfs blocks (0.3 s timeout)
  exec_leftover   `tacc-agent exec` of a line that leaves a TERM-ignoring process / the
                  same line without it (KILL after the 10 s grace)
  chrun_timeout   a RUN step (fake ch-run) past its 1 s timeout
  chrun_leftovers a RUN step whose leftovers hold its output pipe / a step without them
  registry        the manifest request to a registry that never answers (0.5 s timeout)
  serve_stuck     a scrape of `tacc-agent serve` while a mount hangs / without the mount
  scontrol_slow   a scrape's wait for a scontrol that answers after 1 s (0.2 s wait) /
                  waiting for that lookup
  scontrol_hung   a lookup cut off at its 0.3 s timeout
  gpu_range       job_usage.indices("0-4000000000") / indices("0-1,3,2000-2001")
  bmc_sigterm     the lab BMC passing SIGTERM to its node until it exits / the node alone
  slow_clients    /metrics scrapes behind 32 stalled connections, a slowloris and 300 idle
                  connections / on an idle server; slow and silent clients cut after a
                  1 s request deadline

Usage (as root, from the repository root: the stuck-mount rows mount a FUSE file system):
    .venv/bin/python -u bench/unit_timing.py [--runs 5] [--only NAME ...] [--json PATH]
Needs no lab; about four minutes with --runs 5 (exec_leftover alone: about 13 s a run).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from benchlib import ROOT, Record, add_json_argument, summary

MIB = 1 << 20


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def fail(message: str) -> None:
    raise SystemExit(f"bench: {message}")


def fresh(tmp: Path, name: str) -> Path:
    """A new directory under tmp (the run's temporary directory removes it)."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


# ------------------------------------------------------------------------- measurements
# Each returns {"ours": [seconds], "baseline": [seconds]} or {"ours": [...], "bound": s}.


def job_top(runs: int, tmp: Path) -> dict:
    from tacc_agent.tasks.interactive import top
    from tests.unit.agent.tasks.interactive.test_job_top import EXPOSITION, free_port, serve, target

    port = free_port()
    server = serve("127.0.0.1", port, EXPOSITION, [])
    silent = socket.socket()
    silent.bind(("127.0.0.3", port))
    silent.listen()
    nodes = target("127.0.0.3", "127.0.0.4", "127.0.0.1", "127.0.0.3")
    try:
        ours = [timed(lambda: top.usage(nodes, port, 1.0)) for _ in range(runs)]
        baseline = [
            timed(lambda: [top.node_usage(n, "41", port, 1.0) for n in nodes["nodes"]])
            for _ in range(runs)
        ]
    finally:
        server.shutdown()
        server.server_close()
        silent.close()
    return {"ours": ours, "baseline": baseline}


def exec_ctrl_c(runs: int, tmp: Path) -> dict:
    import pytest

    from tests.unit.client.jobs.test_tcloud_interactive import BlockingChannel
    from tests.unit.interactive_fakes import FakeCluster, cli_run

    def once(blocking: bool) -> float:
        with pytest.MonkeyPatch.context() as patch:
            fake = FakeCluster(fresh(tmp, "exec"), patch)
            argv = ["exec", "42", "--all", "--", "true"]
            if not blocking:
                start = time.perf_counter()
                code = cli_run(*argv)[0]
                seconds = time.perf_counter() - start
                if code != 0:
                    fail(f"exec of `true` exited {code}")
                return seconds
            fake.transport.open_session = lambda: BlockingChannel(fake.transport.channels)

            def ctrl_c() -> None:
                deadline = time.monotonic() + 10
                while len(fake.transport.channels) < 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
                os.kill(os.getpid(), signal.SIGINT)

            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                threading.Thread(target=ctrl_c, daemon=True).start()
                start = time.perf_counter()
                code = cli_run(*argv[:-1], "sleep", "1000")[0]
                seconds = time.perf_counter() - start
            finally:
                signal.signal(signal.SIGINT, previous)
            if code != 130:
                fail(f"exec interrupted by Ctrl-C exited {code}, not 130")
            return seconds

    return {
        "ours": [once(True) for _ in range(runs)],
        "baseline": [once(False) for _ in range(runs)],
    }


def split_lines_before(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """tcloud.jobs.interactive.split_lines before 21ef57e: pending + data searched whole."""
    *complete, rest = (pending + data).split(b"\n")
    return complete, rest


def pump_before(receive: Callable[[int], bytes], emit: Callable[[list[bytes]], None]) -> None:
    from tcloud.jobs import interactive

    pending = b""
    for data in iter(lambda: receive(interactive.CHUNK), b""):
        complete, pending = split_lines_before(pending, data)
        if complete:
            emit(complete)
    if pending:
        emit([pending])


def pump_seconds(pump, mib: int) -> float:
    from tcloud.jobs import interactive

    chunks = [b"x" * interactive.CHUNK] * (mib * MIB // interactive.CHUNK) + [b"x\nend"]
    feed = iter(chunks)
    emitted: list[bytes] = []
    seconds = timed(lambda: pump(lambda _n: next(feed, b""), emitted.extend))
    if [len(line) for line in emitted] != [mib * MIB + 1, 3]:
        fail(f"the {mib} MiB line came out as {[len(line) for line in emitted]}")
    return seconds


def pump(runs: int, tmp: Path, mib: int) -> dict:
    from tcloud.jobs import interactive

    before_runs = runs if mib < 40 else 1  # the quadratic split: about 25 s at 40 MiB
    return {
        "ours": [pump_seconds(interactive.pump, mib) for _ in range(runs)],
        "baseline": [pump_seconds(pump_before, mib) for _ in range(before_runs)],
    }


def stuck_mount(runs: int, tmp: Path) -> dict:
    import json

    from tacc_agent.health.checks import mounts
    from tacc_agent.health.checks.base import STUCK
    from tests.unit.blocking_fuse import FSTYPE, blocking_fuse

    point = tmp / "hung"
    point.mkdir()
    want = [{"path": str(point), "fstype": FSTYPE}]
    ours = []
    with blocking_fuse(point) as fuse:
        for run in range(runs):
            state = tmp / f"state-{run}"  # a state of its own: every run probes anew
            start = time.perf_counter()
            result = mounts.check_mounts(want, "/proc", str(state), 0.3)
            ours.append(time.perf_counter() - start)
            for marker in state.glob("stuck-*.json"):
                fuse["stuck_pids"].append(json.loads(marker.read_text())["pid"])
            if result.status != STUCK:
                fail(f"the hung mount's check said {result.status}: {result.detail}")
    return {"ours": ours, "bound": 0.3}


def exec_leftover(runs: int, tmp: Path) -> dict:
    from tacc_agent.tasks.execute import launch as execute
    from tests.unit.agent_jobs import agent, agent_env, make_job

    def once(line: str) -> float:
        where = fresh(tmp, "exec")
        _, job_dir = make_job(where, {"name": "t", "run": [line, "echo second"]})
        env = agent_env(where)
        start = time.perf_counter()
        proc = agent("exec", str(job_dir), env=env)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            fail(f"tacc-agent exec exited {proc.returncode}: {proc.stderr[-300:]}")
        return seconds

    leftover = "(trap '' TERM; exec sleep 863) & echo started"
    return {
        "ours": [once(leftover) for _ in range(runs)],
        "baseline": [once("echo started") for _ in range(runs)],
        "kill_grace_seconds": execute.KILL_GRACE_SECONDS,
    }


def chrun_timeout(runs: int, tmp: Path) -> dict:
    from tacc_agent.tasks.images import build as imagebuild

    fake = tmp / "ch-run"
    fake.write_text("#!/bin/sh\necho started\nexec sleep 30\n")
    fake.chmod(0o755)
    ours = []
    for _ in range(runs):
        runner = imagebuild.ChRun(timeout=1, binary=str(fake))
        start = time.perf_counter()
        try:
            runner(tmp / "rootfs", ["x"], "/", tmp / "env", lambda _line: None)
        except imagebuild.StepTimeout:
            ours.append(time.perf_counter() - start)
        else:
            fail("the step past its timeout ended without StepTimeout")
    return {"ours": ours, "bound": 1.0}


TIMED_RUN = """
import ctypes, json, sys, time
from pathlib import Path
from tacc_agent.tasks.images import build as imagebuild
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # as the batch step: a child subreaper
here = Path(sys.argv[1])
start = time.perf_counter()
code = imagebuild.ChRun(timeout=60, binary=str(here / "ch-run"))(
    here / "rootfs", ["x"], "/", here / "env", lambda _line: None)
print(json.dumps({"code": code, "seconds": time.perf_counter() - start}))
"""


def chrun_leftovers(runs: int, tmp: Path) -> dict:
    import json

    from tests.unit.agent.tasks.images.test_agent_image_build_faults import FAKE_CH_RUN

    def once(script: str) -> float:
        where = fresh(tmp, "chrun")
        fake = where / "ch-run"
        fake.write_text(script)
        fake.chmod(0o755)
        proc = subprocess.run(
            [sys.executable, "-c", TIMED_RUN, str(where)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        left = [where / name for name in ("background", "daemon")]
        alive = [int(path.read_text()) for path in left if path.exists()]
        alive = [pid for pid in alive if not gone(pid)]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        if proc.returncode != 0 or alive:
            fail(f"the RUN step failed or left {alive} running: {proc.stderr[-300:]}")
        return json.loads(proc.stdout)["seconds"]

    plain = "#!/bin/sh\necho step done\nexit 0\n"
    return {
        "ours": [once(FAKE_CH_RUN) for _ in range(runs)],
        "baseline": [once(plain) for _ in range(runs)],
    }


def registry(runs: int, tmp: Path) -> dict:
    import pytest

    from tacc_agent.errors import AgentError
    from tacc_agent.tasks.images import registry as registry_client
    from tests.unit.agent.tasks.images.test_agent_images import REFERENCE, fake_skopeo

    bin_dir = fake_skopeo(tmp, "exec sleep 30")
    ours = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        for _ in range(runs):
            start = time.perf_counter()
            try:
                registry_client.resolve(REFERENCE, timeout=0.5)
            except AgentError:
                ours.append(time.perf_counter() - start)
            else:
                fail("a registry that never answers was answered")
    return {"ours": ours, "bound": 0.5}


def serve_stuck(runs: int, tmp: Path) -> dict:
    import re

    import yaml

    from tests.unit.agent.test_agent_serve import daemon_settings, fixture_config, scrape
    from tests.unit.blocking_fuse import FSTYPE, blocking_fuse

    def scrapes(where: Path, hung: Path | None) -> list[float]:
        config = fixture_config(where)
        settings = daemon_settings(config) | {"services": [], "check_timeout_seconds": 0.3}
        if hung is not None:
            settings["mounts"] = [{"path": str(hung), "fstype": FSTYPE}]
        (where / "agent.yaml").write_text(yaml.safe_dump(settings))
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
                str(where / "agent.yaml"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        seconds = []
        try:
            port = int(re.search(r":(\d+)/metrics", daemon.stdout.readline()).group(1))
            time.sleep(1.0)  # a few check runs (the stuck probe among them) before timing
            for _ in range(10 * runs):
                start = time.perf_counter()
                code, text = scrape(port)
                seconds.append(time.perf_counter() - start)
                if code != 200:
                    fail(f"a scrape of tacc-agent serve answered {code}")
                time.sleep(0.05)
            if hung is not None and 'check="mounts",status="stuck"' not in text:
                fail("the hung mount was never reported stuck")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        return seconds

    point = tmp / "hung"
    point.mkdir()
    with blocking_fuse(point):
        ours = scrapes(fresh(tmp, "serve"), point)
    baseline = scrapes(fresh(tmp, "serve"), None)
    return {"ours": ours, "baseline": baseline}


def fake_scontrol(where: Path, gate: Path) -> tuple[str, Path]:
    """A scontrol that answers job 41 once `gate` exists (60 s at most)."""
    line = "JobId=41 JobName=wrap JOB_GRES=(null)  Nodes=n2 CPU_IDs=0-1 Mem=100 GRES= MinCPUsNode=1"
    tool = where / "scontrol"
    tool.write_text(
        "#!/bin/sh\ni=0\n"
        f'while [ ! -e "{gate}" ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done\n'
        f'echo "{line}"\n'
    )
    tool.chmod(0o755)
    return str(tool), gate


def scontrol_slow(runs: int, tmp: Path) -> dict:
    from concurrent.futures import wait

    from tacc_agent.health import job_usage

    def once(direct: bool) -> float:
        where = fresh(tmp, "scontrol")
        tool, gate = fake_scontrol(where, where / "answer")
        sources = job_usage.Sources(
            str(where), scontrol=tool, scontrol_seconds=60, scontrol_wait_seconds=0.2, node="n2"
        )
        opens = threading.Timer(1.0, gate.touch)
        allocations = job_usage.Allocations(sources)
        opens.start()
        start = time.perf_counter()
        if direct:  # waiting for the lookup itself
            found = job_usage.lookup(sources, "41")
            seconds = time.perf_counter() - start
            if found is None or found.cpus != 2:
                fail(f"the slow scontrol's lookup found {found}")
        else:  # what a scrape does: start the lookup, wait at most 0.2 s
            allocations.start(["41"])
            known = allocations.finish()
            seconds = time.perf_counter() - start
            if known:
                fail("the scrape waited for the slow scontrol")
            wait(list(allocations.running.values()), timeout=60)
        opens.join()
        allocations.close()
        return seconds

    return {
        "ours": [once(False) for _ in range(runs)],
        "baseline": [once(True) for _ in range(runs)],
    }


def scontrol_hung(runs: int, tmp: Path) -> dict:
    from tacc_agent.health import job_usage

    ours = []
    for _ in range(runs):
        where = fresh(tmp, "scontrol")
        tool, _gate = fake_scontrol(where, where / "never")
        sources = job_usage.Sources(str(where), scontrol=tool, scontrol_seconds=0.3, node="n2")
        start = time.perf_counter()
        found = job_usage.lookup(sources, "41")
        ours.append(time.perf_counter() - start)
        if found is not None:
            fail("the hung scontrol answered")
    return {"ours": ours, "bound": 0.3}


def gpu_range(runs: int, tmp: Path) -> dict:
    from tacc_agent.health import job_usage

    def per_call(text: str) -> float:
        calls = 1000
        return timed(lambda: [job_usage.indices(text) for _ in range(calls)]) / calls

    if job_usage.indices("0-4000000000") != set():
        fail("the huge GPU range named GPUs")
    return {
        "ours": [per_call("0-4000000000") for _ in range(runs)],
        "baseline": [per_call("0-1,3,2000-2001") for _ in range(runs)],
    }


NODE = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit({status}))
print("up", flush=True)
time.sleep(60)
"""


def bmc_sigterm(runs: int, tmp: Path) -> dict:
    from tacc_lab.bmc import REBOOT_STATUS

    node = tmp / "node.py"
    node.write_text(NODE.format(status=REBOOT_STATUS))

    def once(argv: list[str]) -> float:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        if proc.stdout is None or proc.stdout.readline() != "up\n":
            fail("the node did not start")
        start = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        seconds = time.perf_counter() - start
        if code != REBOOT_STATUS or "power-on" in proc.stdout.read():
            fail(f"SIGTERM: exit {code}, or the node was booted again")
        return seconds

    bmc = [sys.executable, "-m", "tacc_lab.bmc", "--", sys.executable, str(node)]
    return {
        "ours": [once(bmc) for _ in range(runs)],
        "baseline": [once([sys.executable, str(node)]) for _ in range(runs)],
    }


def slow_clients(runs: int, tmp: Path) -> dict[str, dict]:
    import pytest

    from tacc_agent import serve
    from tests.unit.agent.tasks.jobs.test_security_serve_logs import (
        dribble,
        metrics_server,
        scrape,
        stalled_client,
    )

    @contextlib.contextmanager
    def server() -> Iterator[int]:
        quiet = contextlib.redirect_stdout(io.StringIO())  # its check run's journal line
        with quiet, metrics_server(fresh(tmp, "metrics")) as port:
            yield port

    def scraped(hold: Callable[[int], list[socket.socket]], source: str = "127.0.0.2") -> float:
        with server() as port:
            held = hold(port)
            try:
                time.sleep(0.3)  # the held connections are being served first
                start = time.perf_counter()
                answer = scrape(port, source)
                seconds = time.perf_counter() - start
            finally:
                for conn in held:
                    conn.close()
        if " 200 " not in answer.splitlines()[0]:
            fail(f"a scrape got {answer.splitlines()[0]!r}")
        return seconds

    def stalled(port: int) -> list[socket.socket]:
        held = []
        for host in range(2, 2 + serve.CONNECTIONS // serve.CONNECTIONS_PER_CLIENT):
            for _ in range(serve.CONNECTIONS_PER_CLIENT):
                conn = socket.create_connection(
                    ("127.0.0.1", port), timeout=10, source_address=(f"127.0.0.{host}", 0)
                )
                conn.sendall(b"GET /metrics HTTP/1.1\r\n")
                held.append(conn)
        return held

    stop = threading.Event()

    def slowloris(port: int) -> list[socket.socket]:
        slow = stalled_client(port)
        threading.Thread(target=dribble, args=(slow, stop, 2.0), daemon=True).start()
        return [slow, socket.create_connection(("127.0.0.1", port), timeout=10)]

    def idle(port: int) -> list[socket.socket]:
        return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]

    def cut_after(slow: bool) -> float:
        """Connect to cut, on a server of its own (the deadline is read as it starts)."""
        with server() as port:
            start = time.perf_counter()
            if slow:
                conn = stalled_client(port)
                threading.Thread(target=dribble, args=(conn, stop, 0.3), daemon=True).start()
            else:
                conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            conn.settimeout(30)
            with conn, contextlib.suppress(OSError):
                while conn.recv(65536):
                    pass
            return time.perf_counter() - start

    try:
        rows = {
            "slow_clients_stalled": {
                "ours": [scraped(stalled, "127.0.0.1") for _ in range(runs)],
                "baseline": [scraped(lambda _p: [], "127.0.0.1") for _ in range(runs)],
            },
            "slow_clients_slowloris": {
                "ours": [scraped(slowloris) for _ in range(runs)],
                "baseline": [scraped(lambda _p: []) for _ in range(runs)],
            },
            "slow_clients_idle": {
                "ours": [scraped(idle) for _ in range(runs)],
                "baseline": [scraped(lambda _p: []) for _ in range(runs)],
            },
        }
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(serve, "REQUEST_DEADLINE_SECONDS", 1.0)
            for slow, name in ((True, "slow_clients_cut_slow"), (False, "slow_clients_cut_silent")):
                rows[name] = {"ours": [cut_after(slow) for _ in range(runs)], "bound": 1.0}
        return rows
    finally:
        stop.set()  # (the dribbling threads also end when their connection is closed)


# ------------------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    name: str  # the row's key in the JSON
    group: str  # the measurement (--only) that times it
    measurement: str
    baseline: str
    test: str  # the test under tests/unit that asserted it, as it is named now
    removed: str  # the assertion (or the timing part of one) taken out of it


ROWS = (
    Row(
        name="job_top",
        group="job_top",
        measurement="`job top`: 4 nodes, 2 of them silent (1 s timeout), asked at once",
        baseline="one after another",
        test="test_job_top.py::test_a_silent_or_absent_node_is_an_error_of_its_own_and_nodes_"
        "are_asked_at_once",
        removed="assert took < 1.8, took",
    ),
    Row(
        name="exec_ctrl_c",
        group="exec_ctrl_c",
        measurement="`tcloud exec --all` on 2 nodes whose command never ends, Ctrl-C once "
        "both run: start to exit 130",
        baseline="an exec whose command ends at once",
        test="test_tcloud_interactive.py::test_ctrl_c_in_exec_closes_every_channel_and_does_"
        "not_wait",
        removed="assert elapsed < 2",
    ),
    Row(
        name="pump_16",
        group="pump",
        measurement="one 16 MiB output line without a newline, split as since 21ef57e",
        baseline="the split before 21ef57e (quadratic)",
        test="test_tcloud_interactive.py::test_a_long_line_without_a_newline_is_pumped_whole",
        removed="assert time.monotonic() - started < 1",
    ),
    Row(
        name="pump_40",
        group="pump",
        measurement="one 40 MiB output line without a newline, split as since 21ef57e",
        baseline="the split before 21ef57e (quadratic; one run)",
        test="test_tcloud_interactive.py::test_a_long_line_without_a_newline_is_pumped_whole",
        removed="assert time.monotonic() - started < 1",
    ),
    Row(
        name="stuck_mount",
        group="stuck_mount",
        measurement="health check of a FUSE mount whose statfs blocks",
        baseline="the check timeout",
        test="test_agent_checks.py::test_a_fuse_mount_whose_statfs_blocks_is_stuck_not_"
        "reprobed_then_failed",
        removed="assert time.monotonic() - start < 1.5",
    ),
    Row(
        name="exec_leftover",
        group="exec_leftover",
        measurement="`tacc-agent exec` of a line that leaves a TERM-ignoring process "
        "(KILL after the 10 s grace)",
        baseline="the same line without it",
        test="test_agent_execute.py::test_a_background_process_does_not_hold_the_line_open",
        removed="time.monotonic() - start < 20",
    ),
    Row(
        name="chrun_timeout",
        group="chrun_timeout",
        measurement="a RUN step (fake ch-run that sleeps 30 s) to StepTimeout",
        baseline="the step timeout",
        test="test_agent_image_build.py::test_the_real_runner_stops_a_step_at_its_timeout",
        removed="time.monotonic() - start < 15",
    ),
    Row(
        name="chrun_leftovers",
        group="chrun_leftovers",
        measurement="a RUN step that leaves a process and a daemon holding its output pipe",
        baseline="a step that leaves nothing",
        test="test_agent_image_build_faults.py::test_what_a_run_step_leaves_running_is_"
        "stopped_with_it",
        removed='assert result["seconds"] < 4',
    ),
    Row(
        name="registry",
        group="registry",
        measurement="the manifest request to a registry that never answers",
        baseline="the request timeout",
        test="test_agent_images.py::test_a_registry_that_does_not_answer_is_bounded_by_the_timeout",
        removed="time.monotonic() - start < 10",
    ),
    Row(
        name="serve_stuck",
        group="serve_stuck",
        measurement="one /metrics scrape of `tacc-agent serve` while a mount hangs "
        "(10 scrapes a run)",
        baseline="the same daemon without the mount",
        test="test_agent_serve.py::test_serve_answers_while_a_mount_hangs_and_stops_on_sigterm",
        removed="time.monotonic() - start < 1.0",
    ),
    Row(
        name="scontrol_slow",
        group="scontrol_slow",
        measurement="a scrape's wait for Slurm's allocation when scontrol answers after 1 s "
        "(scontrol_wait_seconds 0.2)",
        baseline="waiting for that lookup",
        test="test_job_usage.py::test_a_slow_scontrol_never_holds_a_scrape_until_it_answers",
        removed="assert time.monotonic() - started < 0.9",
    ),
    Row(
        name="scontrol_hung",
        group="scontrol_hung",
        measurement="a lookup whose scontrol never answers",
        baseline="the scontrol timeout",
        test="test_job_usage.py::test_a_hung_scontrol_is_cut_off_and_never_raises",
        removed="assert time.monotonic() - started < 2",
    ),
    Row(
        name="gpu_range",
        group="gpu_range",
        measurement='`job_usage.indices("0-4000000000")`, one call',
        baseline='`indices("0-1,3,2000-2001")`',
        test="test_job_usage.py::test_a_huge_gpu_range_a_task_writes_into_its_environment_"
        "names_no_gpu",
        removed="assert time.monotonic() - started < 0.1",
    ),
    Row(
        name="bmc_sigterm",
        group="bmc_sigterm",
        measurement="the lab BMC: SIGTERM until it and its node have exited",
        baseline="the node alone",
        test="test_lab_operations.py::test_sigterm_reaches_the_node_and_ends_the_bmc",
        removed="assert time.monotonic() - started < 5",
    ),
    Row(
        name="slow_clients_stalled",
        group="slow_clients",
        measurement="a /metrics scrape while 32 stalled connections from 8 loopback "
        "addresses hold every slot",
        baseline="an idle server",
        test="test_security_serve_logs.py::test_p7_stalled_connections_from_many_local_"
        "addresses_do_not_keep_a_scrape_out",
        removed="assert seconds < 1.0, seconds",
    ),
    Row(
        name="slow_clients_slowloris",
        group="slow_clients",
        measurement="a /metrics scrape beside a client sending a byte every 2 s and a silent one",
        baseline="an idle server",
        test="test_security_serve_logs.py::test_p7_a_client_sending_a_byte_every_2s_does_"
        "not_delay_a_scrape",
        removed='assert seconds < 1.0, f"a scrape waited {seconds:.1f} s behind a slow client"',
    ),
    Row(
        name="slow_clients_idle",
        group="slow_clients",
        measurement="a /metrics scrape after 300 idle connections",
        baseline="an idle server",
        test="test_security_serve_logs.py::test_p7_hundreds_of_idle_connections_neither_"
        "block_scrapes_nor_pile_up_threads",
        removed="seconds < 1.0",
    ),
    Row(
        name="slow_clients_cut_slow",
        group="slow_clients",
        measurement="a client sending a byte every 0.3 s: connect to cut",
        baseline="the request deadline",
        test="test_security_serve_logs.py::test_p7_a_slow_or_silent_client_is_cut_after_"
        "the_request_deadline",
        removed="assert seconds_until_cut(slow, 3.0) < 2.5",
    ),
    Row(
        name="slow_clients_cut_silent",
        group="slow_clients",
        measurement="a silent client: connect to cut",
        baseline="the request deadline",
        test="test_security_serve_logs.py::test_p7_a_slow_or_silent_client_is_cut_after_"
        "the_request_deadline",
        removed="assert seconds_until_cut(silent, 1.0) < 1.5",
    ),
)
GROUPS: dict[str, Callable[[int, Path], dict]] = {
    "job_top": job_top,
    "exec_ctrl_c": exec_ctrl_c,
    "pump": lambda runs, tmp: {"pump_16": pump(runs, tmp, 16), "pump_40": pump(runs, tmp, 40)},
    "stuck_mount": stuck_mount,
    "exec_leftover": exec_leftover,
    "chrun_timeout": chrun_timeout,
    "chrun_leftovers": chrun_leftovers,
    "registry": registry,
    "serve_stuck": serve_stuck,
    "scontrol_slow": scontrol_slow,
    "scontrol_hung": scontrol_hung,
    "gpu_range": gpu_range,
    "bmc_sigterm": bmc_sigterm,
    "slow_clients": slow_clients,
}


def measured(row: Row, data: dict) -> dict:
    entry = {
        "measurement": row.measurement,
        "baseline_label": row.baseline,
        "test": f"tests/unit/{row.test}",
        "removed": row.removed,
        "ours": summary(data["ours"]),
    }
    if "bound" in data:
        entry["bound"] = data["bound"]
    else:
        entry["baseline"] = summary(data["baseline"])
    entry.update({k: v for k, v in data.items() if k not in ("ours", "baseline", "bound")})
    return entry


# ------------------------------------------------------------------------- the table


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def spread(s: dict) -> str:
    if s["n"] == 1:
        return duration(s["median"])
    return f"{duration(s['median'])} ({duration(s['min'])} to {duration(s['max'])})"


def table(result: dict) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the report's table (bench/report.py renders the same)."""
    header = [
        "measurement",
        "ours, median (min to max)",
        "baseline",
        "ours / baseline",
        "was asserted in tests/unit",
    ]
    rows = []
    for entry in (result.get("rows") or {}).values():
        ours = entry["ours"]
        if "bound" in entry:
            base = f"{entry['baseline_label']}: {duration(entry['bound'])}"
            ratio = ours["median"] / entry["bound"]
        else:
            base = f"{entry['baseline_label']}: {spread(entry['baseline'])}"
            ratio = ours["median"] / entry["baseline"]["median"]
        ratio_text = f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"
        test = entry["test"].removeprefix("tests/unit/")
        rows.append(
            [
                entry["measurement"],
                spread(ours),
                base,
                ratio_text,
                f"`{test}`: `{entry['removed']}`",
            ]
        )
    return header, rows


def print_table(result: dict) -> None:
    header, rows = table(result)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(" --- " for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs per row")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(GROUPS),
        metavar="NAME",
        help=f"only these ({', '.join(GROUPS)})",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: run as root (the stuck-mount rows mount a FUSE file system)")
    sys.path.insert(0, str(ROOT))  # the tests' fakes: tests.unit.*
    with Record(args.json, runs=args.runs) as record:
        record["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        rows: dict[str, dict] = {}
        with tempfile.TemporaryDirectory(prefix="unit-timing-") as tmp:
            for group, measure in GROUPS.items():
                if args.only and group not in args.only:
                    continue
                print(f"measuring {group} ...", flush=True)
                data = measure(args.runs, fresh(Path(tmp), group))
                found = {group: data} if "ours" in data else data
                for row in ROWS:
                    if row.name in found:
                        rows[row.name] = measured(row, found[row.name])
                record["rows"] = rows
        load = " ".join(str(x) for x in record["load_average_before"])
        print(f"\n{args.runs} runs a row unless said (load {load}):\n")
        print_table(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
