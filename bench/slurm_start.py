#!/usr/bin/env python3
"""Slurm's own start of a batch job, before and after a SchedulerParameters change, side
by side in one run (issue [12] point 1: the bimodal start).

Plain `sbatch --wrap 'date +%s.%N'` from a compute node (pinned to it with -w, so the
job's output file is local and is seen the moment it is written), one job at a time,
with the same random gaps between submissions for every setting: submit -> the batch
script's first line, split by slurmctld's log into submit -> allocated (the scheduler)
and allocated -> first line (slurmd's launch). The settings are applied to slurm.conf on
every node in turn (`scontrol reconfigure`), in rounds (A B A B ...), and the lab's own
slurm.conf is put back at the end.

Usage (as root, from the repository root, on a lab that is up):
    .venv/bin/python bench/slurm_start.py --lab slurm [--samples 20] [--rounds 2] \
        [--setting default] [--setting batch_sched_delay=0] [--json PATH]
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import subprocess
import sys
import time

from benchlib import BIN, Record, add_json_argument, summary
from submit_steps import CTLD_GREP, slurm_points

CONF = "/etc/slurm/slurm.conf"
NODES = ("n1", "n2", "n3", "login1")
SAMPLER_NODE = "n2"
CONTROLLER = "n1"


def node_sh(lab: str, node: str, script: str, stdin: str | None = None) -> str:
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, "ssh", node, shlex.join(["sh", "-c", script])],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"{node}: {script[:80]}: {proc.stderr.strip()}")
    return proc.stdout


def apply_setting(lab: str, original: str, setting: str) -> None:
    """slurm.conf as the lab has it, with SchedulerParameters=<setting> ("default": none)."""
    lines = [x for x in original.splitlines() if not x.startswith("SchedulerParameters=")]
    if setting != "default":
        lines.append(f"SchedulerParameters={setting}")
    text = "\n".join(lines) + "\n"
    for node in NODES:
        node_sh(lab, node, f"cat > {CONF}.bench && mv {CONF}.bench {CONF}", stdin=text)
    node_sh(lab, CONTROLLER, "scontrol reconfigure")
    time.sleep(3)  # slurmctld re-reads its configuration; the first pass after it runs


SAMPLER = r"""
set -eu
dir=$(mktemp -d)
for gap in $GAPS; do
  sleep "$gap"
  t0=$(date +%s.%N)
  job=$(sbatch --parsable -w {node} -N1 -c1 --mem=50M -o "$dir/%j.out" --wrap 'date +%s.%N')
  while [ ! -s "$dir/$job.out" ]; do sleep 0.01; done
  echo "$job $t0 $(cat "$dir/$job.out")"
  while squeue -h -j "$job" 2>/dev/null | grep -q .; do sleep 0.05; done
done
rm -rf "$dir"
"""


def controller_times(lab: str) -> dict[str, dict]:
    """{job: {"submitted": t, "allocated": t, "by": "sched" | "sched/backfill"}} from
    slurmctld's log."""
    out = node_sh(lab, CONTROLLER, CTLD_GREP + "/var/log/slurm/slurmctld.log || true")
    return slurm_points(out, "")


def block(lab: str, gaps: list[float]) -> list[dict]:
    script = SAMPLER.replace("{node}", SAMPLER_NODE)
    out = node_sh(lab, SAMPLER_NODE, f"GAPS={shlex.quote(' '.join(map(str, gaps)))}; {script}")
    rows = [line.split() for line in out.splitlines() if line.strip()]
    ctld = controller_times(lab)
    samples = []
    for job, t0, first in rows:
        times = ctld.get(job, {})
        samples.append(
            {
                "job": job,
                "to_first_line": float(first) - float(t0),
                "to_allocated": times.get("allocated", float("nan")) - float(t0),
                "launch": float(first) - times.get("allocated", float("nan")),
                "by": times.get("by", "?"),
            }
        )
    return samples


def histogram(values: list[float], width: float = 0.5, top: float = 4.5) -> str:
    bins = [0] * int(top / width)
    for v in values:
        bins[min(int(v / width), len(bins) - 1)] += 1
    return "  ".join(f"{i * width:.1f}-:{n}" for i, n in enumerate(bins) if n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True, help="a lab that is up (e.g. slurm)")
    parser.add_argument("--samples", type=int, default=20, help="jobs per setting and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--setting",
        action="append",
        metavar="PARAMS",
        help="SchedulerParameters, or 'default' (none); repeatable",
    )
    parser.add_argument("--seed", type=int, default=12)
    add_json_argument(parser)
    args = parser.parse_args()
    settings = args.setting or ["default", "batch_sched_delay=0"]
    rng = random.Random(args.seed)  # noqa: S311 (gaps, not secrets)
    gaps = [round(rng.uniform(0.0, 4.0), 2) for _ in range(args.samples)]
    original = node_sh(args.lab, CONTROLLER, f"cat {CONF}")
    results: dict[str, list[dict]] = {s: [] for s in settings}
    with Record(args.json, samples=args.samples, rounds=args.rounds, settings=settings) as out:
        try:
            for _ in range(args.rounds):
                for setting in settings:
                    apply_setting(args.lab, original, setting)
                    results[setting] += block(args.lab, gaps)
        finally:
            for node in NODES:
                node_sh(
                    args.lab, node, f"cat > {CONF}.bench && mv {CONF}.bench {CONF}", stdin=original
                )
            node_sh(args.lab, CONTROLLER, "scontrol reconfigure")
        table = {}
        print(
            f"plain sbatch, submit -> batch script's first line, {args.samples} x "
            f"{args.rounds} per setting (gaps 0-4 s, the same for each):"
        )
        for setting, samples in results.items():
            first = [s["to_first_line"] for s in samples]
            alloc = [s["to_allocated"] for s in samples]
            launch = [s["launch"] for s in samples]
            backfill = sum(s["by"] == "sched/backfill" for s in samples)
            table[setting] = {
                "to_first_line": summary(first),
                "to_allocated": summary(alloc),
                "launch": summary(launch),
                "backfill": backfill,
                "samples": samples,
            }
            print(
                f"  {setting:24s} median {statistics.median(first):.2f} s "
                f"(min {min(first):.2f}, max {max(first):.2f}); submit->allocated median "
                f"{statistics.median(alloc):.2f}, allocated->first line median "
                f"{statistics.median(launch):.3f}; backfill {backfill}/{len(first)}"
            )
            print(f"  {'':24s} histogram: {histogram(first)}")
        out["settings"] = table
    return 0


if __name__ == "__main__":
    sys.exit(main())
