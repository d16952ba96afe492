#!/usr/bin/env python3
"""The dashboard's page load for a researcher with many jobs (issue [25]), next to the
command that shows the same list, `tcloud ps`, run side by side.

As a researcher (--user, alice) on a lab that is up and converged (--lab): first quick
one-node jobs are submitted (through one SDK connection) and waited for until their index
holds --jobs; then `tcloud dashboard --no-browser` runs, headless Chromium (Debian's, as the
browser tests drive it) logs in once, and each round times, in alternating order:
- page: the dashboard's home page, from navigation to the moment it has drawn her jobs,
  quota and free GPUs (`<body data-ready="1">` with every job row present);
- baseline: `tcloud ps --json --limit 200` (the same rows) as a process, from start to
  exit (its connection master already up, as a researcher's second command finds it).
Prints the medians and their ratio.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/dashboard.py --lab slurm [--user bob] [--jobs 100] [--rounds 7]
        [--json PATH]
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
from tacc_agent.dashboard.views import JOBS_SHOWN  # the newest jobs the page lists
from tacc_lab.demo import researcher_env
from tcloud import Cluster
from tests.integration.browser import chromium

TASK = {"name": "bench-dash", "resources": {"nodes": 1, "mem": "50M", "time": "2"}, "run": ["true"]}


def fill_index(env: dict[str, str], jobs: int, workdir: Path) -> float:
    """Submit quick jobs as the researcher until they have `jobs`, and wait for them;
    seconds it took."""
    jobs -= tcloud_ps(env, limit=100000)[1]
    if jobs <= 0:
        return 0.0
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


def tcloud_ps(env: dict[str, str], limit: int = JOBS_SHOWN) -> tuple[float, int]:
    """`tcloud ps` of as many jobs as the page lists: seconds, rows."""
    started = time.monotonic()
    argv = [str(BIN / "tcloud"), "ps", "--json", "--limit", str(limit)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
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
    parser.add_argument("--jobs", type=int, default=100, help="the jobs the user has (topped up)")
    parser.add_argument("--user", default="alice", help="the lab researcher")
    parser.add_argument("--rounds", type=int, default=7)
    add_json_argument(parser)
    args = parser.parse_args()
    env = {**os.environ, **researcher_env(args.lab, args.user)}
    workdir = Path("/tmp/bench-dashboard-task")
    workdir.mkdir(exist_ok=True)
    (workdir / "tcloud.yaml").write_text(json.dumps(TASK))
    filled = fill_index(env, args.jobs, workdir)
    print(f"{args.user} has {args.jobs} jobs or more ({filled:.1f} s to submit)", flush=True)
    _, rows = tcloud_ps(env)
    print(f"tcloud ps --limit {JOBS_SHOWN} lists {rows} jobs, as the page does")
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
