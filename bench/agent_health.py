#!/usr/bin/env python3
"""Measure the node agent (issue [6]) on the bench lab, next to baselines run side by side.

1. `tacc-agent check` wall time on a compute node, measured inside the node (no ssh):
   median / max of N runs, without Slurm (`--no-slurm`) and with it (scontrol show node);
   baseline: the bare interpreter start (`python3 -I -c pass`), the floor of any Python
   check, and one `scontrol show node`.                        target <= 0.5 s
2. The daemon (the systemd unit, default 60 s interval) scraped every 15 s like Prometheus
   would: RSS at start and after M minutes (target <= 30 MiB), CPU per check interval
   (its own + the probes it runs), from /proc/<pid>/stat.
3. Time from a check failing to DRAIN in sinfo: a tmpfs the agent watches is unmounted.
   a) the daemon at a 5 s interval: umount -> sinfo shows drain (includes the wait for
      the next run: expected about interval/2 + reaction);
   b) reaction alone: `tacc-agent check` started -> sinfo shows drain.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/agent_health.py [--runs 20] [--minutes 10] [--trials 5] \
        [--json PATH]
Uses the bench lab (10.77.7.0/24, 3 nodes) and removes it at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml
from benchlib import (
    NAME,
    Record,
    add_json_argument,
    agent_metrics_port,
    lab_down,
    lab_up,
    node_sh,
    playbook,
    summary,
)

TIMED = """for i in $(seq {runs}); do s=$(date +%s.%N); {cmd} >/dev/null 2>&1; \
e=$(date +%s.%N); echo "$s $e"; done"""
WATCH = "services: [munge, slurmd]\nmounts: [{path: /mnt/bench-watch, fstype: tmpfs}]\n"
# Inside the node: umount (or a one-shot check) and poll sinfo until the node drains.
UNTIL_DRAIN = """s=$(date +%s.%N); {trigger}
while ! sinfo -h -N -n {node} -o %t | grep -q drain; do sleep 0.05; done
e=$(date +%s.%N); echo "$s $e" """


def timed(node: str, cmd: str, runs: int) -> list[float]:
    out = node_sh(node, TIMED.format(runs=runs, cmd=cmd))
    return [float(e) - float(s) for s, e in (line.split() for line in out.splitlines())]


def show(label: str, values: list[float], unit: str = "s") -> None:
    print(
        f"  {label:<44} median {statistics.median(values):7.3f} {unit}   "
        f"max {max(values):7.3f} {unit}   (n={len(values)})",
        flush=True,
    )


def check_wall_time(runs: int) -> dict:
    print(f"1. tacc-agent check wall time on n2 ({runs} runs each, inside the node)")
    floor = timed("n2", "python3 -I -c pass", runs)
    show("baseline: python3 -I -c pass", floor)
    scontrol = timed("n2", "scontrol show node n2", runs)
    show("baseline: scontrol show node n2", scontrol)
    bare = timed("n2", "tacc-agent check --no-slurm", runs)
    show("tacc-agent check --no-slurm", bare)
    full = timed("n2", "tacc-agent check", runs)
    show("tacc-agent check (drain/resume logic)", full)
    ratio = statistics.median(full) / statistics.median(floor)
    print(
        f"  ratio check / interpreter start: {ratio:.1f}x; "
        f"target <= 0.5 s: {'met' if max(full) <= 0.5 else 'NOT met'}",
        flush=True,
    )
    return {
        "runs": runs,
        "python_start": summary(floor),
        "scontrol": summary(scontrol),
        "check_no_slurm": summary(bare),
        "check": summary(full),
        "ratio": ratio,
        "target_s": 0.5,
        "meets": max(full) <= 0.5,
    }


def proc_figures(node: str) -> tuple[int, float]:
    """(RSS KiB, CPU seconds incl. reaped children) of the tacc-agent unit's main process."""
    pid = node_sh(node, "systemctl show -p MainPID --value tacc-agent").strip()
    out = node_sh(node, f"grep VmRSS /proc/{pid}/status; cat /proc/{pid}/stat; getconf CLK_TCK")
    lines = out.splitlines()
    rss = int(lines[0].split()[1])
    fields = lines[1].rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return rss, ticks / int(lines[2])


def scrape_loop(url: str, stop: threading.Event, sizes: list[int]) -> None:
    while not stop.wait(15):
        with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (http://, ours)
            sizes.append(len(answer.read()))


def daemon_footprint(minutes: float, address: str, other_work) -> dict:
    node_sh("n2", "systemctl restart tacc-agent")
    time.sleep(2)
    rss0, cpu0 = proc_figures("n2")
    stop, sizes = threading.Event(), []
    url = f"http://{address}:{agent_metrics_port()}/metrics"
    scraper = threading.Thread(target=scrape_loop, args=(url, stop, sizes), daemon=True)
    start = time.monotonic()
    scraper.start()
    other_work()  # on n3, while n2's daemon is measured
    time.sleep(max(0.0, minutes * 60 - (time.monotonic() - start)))
    stop.set()
    rss1, cpu1 = proc_figures("n2")
    runs = int(minutes * 60 // 60) + 1  # a run at start, then one per 60 s interval
    print(
        f"2. the daemon on n2 for {minutes:g} min (60 s interval, {len(sizes)} scrapes of "
        f"~{statistics.mean(sizes or [0]) / 1024:.1f} KiB)"
    )
    print(
        f"  RSS at start {rss0 / 1024:.1f} MiB, after {minutes:g} min {rss1 / 1024:.1f} MiB "
        f"(target <= 30 MiB: {'met' if rss1 <= 30 * 1024 else 'NOT met'}; "
        "dcgm-exporter: 135-512 MiB)"
    )
    print(
        f"  CPU: {cpu1 - cpu0:.2f} s over {runs} check runs = "
        f"{(cpu1 - cpu0) / runs * 1000:.0f} ms per interval (own + probes, scrapes included)",
        flush=True,
    )
    return {
        "minutes": minutes,
        "interval_s": 60,
        "scrapes": len(sizes),
        "scrape_kib": statistics.mean(sizes or [0]) / 1024,
        "rss_start_mib": rss0 / 1024,
        "rss_end_mib": rss1 / 1024,
        "rss_target_mib": 30,
        "cpu_s": cpu1 - cpu0,
        "check_runs": runs,
        "cpu_ms_per_interval": (cpu1 - cpu0) / runs * 1000,
    }


def drain_latency(trials: int) -> dict:
    node = "n3"
    node_sh(
        node,
        f"systemctl stop tacc-agent; mkdir -p /mnt/bench-watch; printf '{WATCH}' > /tmp/watch.yaml",
    )
    daemon, reaction = [], []
    try:
        node_sh(
            node,
            "systemd-run --unit tacc-agent-bench tacc-agent --config /tmp/watch.yaml "
            "serve --port 19770 --interval 5",
        )
        for _ in range(trials):
            node_sh(node, "mountpoint -q /mnt/bench-watch || mount -t tmpfs t /mnt/bench-watch")
            wait_idle(node)
            s, e = node_sh(
                node, UNTIL_DRAIN.format(trigger="umount /mnt/bench-watch", node=node)
            ).split()
            daemon.append(float(e) - float(s))
        node_sh(node, "systemctl stop tacc-agent-bench")
        for _ in range(trials):
            node_sh(node, "scontrol update NodeName=n3 State=RESUME")
            wait_idle(node)
            trigger = "tacc-agent --config /tmp/watch.yaml check >/dev/null"
            s, e = node_sh(node, UNTIL_DRAIN.format(trigger=trigger, node=node)).split()
            reaction.append(float(e) - float(s))
    finally:
        node_sh(
            node,
            "systemctl stop tacc-agent-bench 2>/dev/null; umount /mnt/bench-watch "
            "2>/dev/null; scontrol update NodeName=n3 State=RESUME; "
            "systemctl start tacc-agent",
        )
    print("3. time from a failing check to DRAIN in sinfo (n3)")
    show("daemon at a 5 s interval: umount -> drain", daemon)
    show(
        "tacc-agent check started -> drain",
        reaction,
    )
    print("  at the default 60 s interval expect about 30 s + the reaction above", flush=True)
    return {"trials": trials, "daemon_5s": summary(daemon), "reaction": summary(reaction)}


def wait_idle(node: str) -> None:
    deadline = time.monotonic() + 60
    while "idle" not in node_sh(node, f"sinfo -h -N -n {node} -o %t"):
        if time.monotonic() > deadline:
            sys.exit(f"bench: {node} did not become idle")
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the bench lab up")
    add_json_argument(parser)
    args = parser.parse_args()
    with Record(args.json, nodes=3) as out, tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp) / "hosts.yml"
        lab_down()
        lab_up(3, inventory)
        try:
            playbook(inventory, "playbooks/site.yml")
            address = yaml.safe_load(inventory.read_text())["all"]["hosts"]["n2"]["ansible_host"]
            out["check"] = check_wall_time(args.runs)

            def drain() -> None:
                out["drain"] = drain_latency(args.trials)

            out["daemon"] = daemon_footprint(args.minutes, address, drain)
        finally:
            if not args.keep:
                lab_down()
    print(f"(bench lab {NAME!r} removed)" if not args.keep else "", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
