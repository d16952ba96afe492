#!/usr/bin/env python3
"""Measure the lab: seconds from `tacc-lab up --nodes N` to every node answering
`ansible all -m ping` (cached image), and, with --image, the uncached image build.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python bench/lab_up.py [--nodes 3] [--runs 3] [--image] [--json PATH]

Prints one line per run and a summary; the target from issue [1] is <= 30 s for 3 nodes.
Uses its own lab name and subnet, so a running `make lab-up` lab is not disturbed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BIN, Record, add_json_argument, lab_up, sh, summary
from benchlib import lab_down as down

TARGET_SECONDS = 30.0


def up_until_ping(nodes: int, inventory: Path, env: dict[str, str] | None = None) -> float:
    start = time.monotonic()
    lab_up(nodes, inventory, env)
    ping = sh([str(BIN / "ansible"), "-i", str(inventory), "all", "-m", "ansible.builtin.ping"])
    elapsed = time.monotonic() - start
    answered = ping.stdout.count("SUCCESS")
    if answered != nodes:
        sys.exit(f"bench: only {answered}/{nodes} nodes answered ping")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image", action="store_true", help="also time an uncached image build")
    add_json_argument(parser)
    args = parser.parse_args()
    with (
        Record(args.json, nodes=args.nodes, target_s=TARGET_SECONDS) as out,
        tempfile.TemporaryDirectory() as tmp,
    ):
        inventory = Path(tmp) / "hosts.yml"
        if args.image:
            cache = {"TACC_LAB_IMAGE_CACHE": str(Path(tmp) / "images")}
            down(cache)
            start = time.monotonic()
            lab_up(1, inventory, cache)
            build = time.monotonic() - start
            print(f"image build (uncached) + 1 node boot: {build:.1f} s")
            out["image_build_s"] = build
            down(cache)
        down()
        up_until_ping(1, inventory)  # make sure the cached image exists before timing
        down()
        times = []
        for run in range(1, args.runs + 1):
            seconds = up_until_ping(args.nodes, inventory)
            times.append(seconds)
            print(f"run {run}: up --nodes {args.nodes} (cached image) -> all ping: {seconds:.1f} s")
            out["up"] = summary(times)
            down()
        median = statistics.median(times)
        verdict = "meets" if median <= TARGET_SECONDS else "MISSES"
        print(
            f"lab up, {args.nodes} nodes, cached image: median {median:.1f} s, "
            f"min {min(times):.1f} s, max {max(times):.1f} s ({verdict} the "
            f"{TARGET_SECONDS:.0f} s target; {median / TARGET_SECONDS:.2f}x of it)"
        )
        out["meets"] = median <= TARGET_SECONDS
    return 0


if __name__ == "__main__":
    sys.exit(main())
