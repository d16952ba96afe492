#!/usr/bin/env python3
"""Measure issue [9] on the bench lab: the PyTorch task's environment build through the
cluster package cache, and submit -> first training step.

1. Environment build of examples/pytorch-ddp's requirements on a compute node, as a
   researcher, each with an empty local wheel cache:
   a. cold package cache (an empty devpi directory): uv, as the agent builds it;
   b. a fresh lab (down, up, site.yml) on the now warm package cache: uv and pip side
      by side in one run (the same index, the same requirements, alternating).
2. `tcloud submit examples/pytorch-ddp` -> rank 0's first training step in `tcloud logs`,
   environment already cached (a second submit of the same task), median of N.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python bench/frameworks.py [--runs 3] [--samples 3] [--json PATH]
Uses the bench lab (10.77.7.0/24, 3 nodes) with a package cache directory of its own
(removed at the end, so the cold row is cold) and removes the lab at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import (
    BIN,
    NAME,
    ROOT,
    Record,
    add_json_argument,
    lab_down,
    lab_up,
    node_sh,
    playbook,
    summary,
)

from tacc_lab.demo import researcher_env

EXAMPLE = ROOT / "examples/pytorch-ddp"
INDEX = "http://n1:3141/tacc/cluster/+simple/"
UV = "/opt/tacc-agent/venv/bin/uv"


def requirements() -> list[str]:
    task = yaml.safe_load((EXAMPLE / "tcloud.yaml").read_text())
    return task["environment"]["requirements"]


def timed_build(tool: str, tag: str) -> float:
    """Seconds to build the example's environment on n2 as alice with `tool`, from an
    empty local wheel cache, through the package cache."""
    base = f"/tmp/bench-{tool}-{tag}"
    reqs = " ".join(shlex.quote(r) for r in requirements())
    if tool == "uv":
        build = (
            f"{UV} venv -q --python /usr/bin/python3 {base}/env && "
            f"UV_CACHE_DIR={base}/cache {UV} pip install -q --python {base}/env/bin/python "
            f"--index-url {INDEX} {reqs}"
        )
    else:
        build = (
            f"/usr/bin/python3 -m venv {base}/env && "
            f"PIP_CACHE_DIR={base}/cache {base}/env/bin/pip install -q "
            f"--disable-pip-version-check --index-url {INDEX} {reqs}"
        )
        # The lab's pip.conf names the egress proxy, which pip then uses even for n1
        # (pip reads no_proxy only without a configured proxy); the cache is plain HTTP.
        build = build.replace(" install -q ", " install -q --proxy= --trusted-host n1 ")
    # All as alice (the directory too, so the build can write it); a failed build fails
    # the bench with its output (sh() exits on a non-zero status).
    script = (
        f"rm -rf {base}; mkdir -p {base}; s=$(date +%s.%N); {build} >&2 || exit 1; "
        f'e=$(date +%s.%N); echo "$s $e"; rm -rf {base}'
    )
    command = f"cd /tmp && runuser -u alice -- sh -c {shlex.quote(script)}"
    started, ended = node_sh("n2", command).split()[-2:]
    return float(ended) - float(started)


def provision(inventory: Path, cache: Path) -> float:
    start = time.monotonic()
    lab_up(3, inventory, {"TACC_LAB_PACKAGE_CACHE": str(cache)})
    playbook(inventory, "playbooks/site.yml")
    return time.monotonic() - start


def first_step_seconds(env: dict[str, str], cwd: Path) -> tuple[float, str]:
    def tcloud(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "tcloud"), *argv],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )

    start = time.monotonic()
    proc = tcloud("submit", "--json", str(EXAMPLE))
    if proc.returncode != 0:
        raise SystemExit(f"bench: submit failed: {proc.stderr}")
    job = json.loads(proc.stdout)["job_id"]
    deadline = start + 900
    while time.monotonic() < deadline:
        log = tcloud("logs", job).stdout
        if re.search(r"^\[n2:0\] epoch 1 first step: loss", log, re.M):
            seconds = time.monotonic() - start
            tcloud("cancel", job)
            return seconds, job
        time.sleep(0.5)
    raise SystemExit(f"bench: job {job} logged no first step in 900 s:\n{log[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="pip and uv builds on a warm cache")
    parser.add_argument("--samples", type=int, default=3, help="submit -> first step runs")
    add_json_argument(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-frameworks-"))
    cache = work / "package-cache"  # this bench's own: cold at the start
    inventory = work / "hosts.yml"
    load = os.getloadavg()
    with Record(args.json, script="frameworks.py", load_at_start=load) as record:
        try:
            lab_down()
            record["provision_cold_seconds"] = round(provision(inventory, cache), 1)
            cold = timed_build("uv", "cold")
            record["env_build_cold_uv_seconds"] = round(cold, 1)
            print(f"environment build, cold package cache (uv)      {cold:7.1f} s")
            lab_down()
            record["provision_fresh_seconds"] = round(provision(inventory, cache), 1)
            times: dict[str, list[float]] = {"uv": [], "pip": []}
            for run in range(args.runs):
                for tool in ("pip", "uv") if run % 2 else ("uv", "pip"):
                    times[tool].append(timed_build(tool, f"warm{run}"))
            uv, pip = statistics.median(times["uv"]), statistics.median(times["pip"])
            record["env_build_warm"] = {
                "uv": summary(times["uv"]),
                "pip": summary(times["pip"]),
                "pip_over_uv": round(pip / uv, 2),
            }
            print(
                f"environment build, warm cache, fresh lab: pip {pip:7.1f} s | uv {uv:7.1f} s"
                f" | ratio {pip / uv:.2f}x  (median of {args.runs})"
            )
            env = researcher_env(NAME, "alice")
            warmup, _ = first_step_seconds(env, work)  # builds and caches the environment
            record["submit_to_first_step_uncached_seconds"] = round(warmup, 1)
            samples = [first_step_seconds(env, work)[0] for _ in range(args.samples)]
            record["submit_to_first_step"] = summary(samples)
            print(
                f"tcloud submit -> first training step: env being built {warmup:.1f} s, "
                f"env cached median {statistics.median(samples):.1f} s (n={args.samples})"
            )
        finally:
            lab_down()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
