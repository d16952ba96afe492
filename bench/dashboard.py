#!/usr/bin/env python3
"""The dashboard's page load for a researcher with many jobs (issue [25]), next to the
command that shows the same list, `tcloud ps`, run side by side.

As alice on a lab that is up and converged (--lab): first --jobs quick one-node jobs are
submitted (through one SDK connection) and waited for, so her index holds at least that
many; then `tcloud dashboard --no-browser` runs, headless Chromium (Debian's, as the
browser tests drive it) logs in once, and each round times, in alternating order:
- page: the dashboard's home page, from navigation to the moment it has drawn her jobs,
  quota and free GPUs (`<body data-ready="1">` with every job row present);
- baseline: `tcloud ps --json` as a process, from start to exit (its connection master
  already up, as a researcher's second command finds it).
Prints the medians and their ratio.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/dashboard.py --lab slurm [--jobs 100] [--rounds 7] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchlib import BIN, ROOT, add_json_argument, command_line, summary

sys.path.insert(0, str(ROOT))
from tacc_lab.demo import researcher_env
from tcloud import Cluster
from tests.integration.browser import chromium

USER = "alice"
TASK = {"name": "bench-dash", "resources": {"nodes": 1, "mem": "50M", "time": "2"}, "run": ["true"]}
ENDED = ("COMPLETED", "FAILED", "CANCELLED")


def fill_index(env: dict[str, str], jobs: int, workdir: Path) -> float:
    """Submit `jobs` quick jobs as the researcher and wait for them; seconds it took."""
    before = dict(os.environ)
    os.environ.update({k: env[k] for k in ("TCLOUD_CONFIG", "TCLOUD_CACHE_DIR")})
    started = time.monotonic()
    try:
        with Cluster() as cluster:
            submitted = [cluster.submit(TASK, base_dir=workdir) for _ in range(jobs)]
            for job in submitted:
                job.wait(timeout=900, poll=1.0)
    finally:
        os.environ.clear()
        os.environ.update(before)
    return time.monotonic() - started


def tcloud_ps(env: dict[str, str]) -> tuple[float, int]:
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "tcloud"), "ps", "--json"], env=env, capture_output=True, text=True, check=True
    )
    return time.monotonic() - started, len(json.loads(proc.stdout))


def page_load(driver, home: str, rows: int) -> float:
    started = time.monotonic()
    driver.get(home)
    while True:
        ready = driver.execute_script(
            "return document.body.dataset.ready === '1' && "
            "document.querySelectorAll('#jobs tr[data-job]').length"
        )
        if ready and ready >= rows:
            return time.monotonic() - started
        if time.monotonic() - started > 60:
            raise SystemExit(f"the page did not draw {rows} jobs within 60 s")
        time.sleep(0.005)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True, help="a lab that is up and converged")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    add_json_argument(parser)
    args = parser.parse_args()
    env = {**os.environ, **researcher_env(args.lab, USER)}
    workdir = Path("/tmp/bench-dashboard-task")
    workdir.mkdir(exist_ok=True)
    (workdir / "tcloud.yaml").write_text(json.dumps(TASK))
    filled = fill_index(env, args.jobs, workdir) if args.jobs else 0.0
    print(f"{args.jobs} jobs submitted and ended in {filled:.1f} s", flush=True)
    _, rows = tcloud_ps(env)
    print(f"tcloud ps lists {rows} jobs (the newest 50 at most; the page shows the same)")
    dashboard = subprocess.Popen(
        [str(BIN / "tcloud"), "dashboard", "--no-browser"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    page: list[float] = []
    baseline: list[float] = []
    try:
        login = dashboard.stdout.readline().removeprefix("dashboard: ").strip()
        home = login.split("login?", 1)[0]
        with chromium() as driver:
            started = time.monotonic()
            driver.get(login)
            first = page_load(driver, home, rows) + (time.monotonic() - started)
            print(f"first load (login, server start): {first:.2f} s", flush=True)
            for round_ in range(args.rounds):
                sides = ("page", "baseline") if round_ % 2 == 0 else ("baseline", "page")
                for side in sides:
                    if side == "page":
                        page.append(page_load(driver, home, rows))
                    else:
                        baseline.append(tcloud_ps(env)[0])
                print(f"round {round_ + 1}: page {page[-1]:.3f} s, tcloud ps {baseline[-1]:.3f} s")
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=15)
    result = {
        "jobs_listed": rows,
        "first_load_s": round(first, 3),
        "page_s": summary(page),
        "tcloud_ps_s": summary(baseline),
        "ratio": summary(page)["median"] / summary(baseline)["median"],
        "command": command_line(),
    }
    print(
        f"page load, {rows} jobs: median {result['page_s']['median']:.3f} s; tcloud ps "
        f"{result['tcloud_ps_s']['median']:.3f} s; ratio {result['ratio']:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
