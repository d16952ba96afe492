#!/usr/bin/env python3
"""Operating the cluster (issue [15]), each next to a baseline run side by side:

1. scrape cost per node: --scrapes GETs of a compute node's /metrics from the monitoring
   host, the agent (:977) against the OS node exporter (:9100), interleaved; wall time
   per scrape, bytes, series and the serving process's CPU time per scrape (its
   /proc/PID/stat before and after). Prometheus' own cost per target: its CPU rate and
   head series divided by its targets, read from itself.
2. rolling reboot, per wave: `playbooks/rolling.yml --limit NODE` (drain, reboot,
   acceptance, resume) for each compute node, against the bare reboot of the same node
   (`systemctl reboot` on it, then until its new slurmd answers the controller).
3. --add-node: a node joins (`tacc-lab up` one more, site.yml), against a site.yml
   re-run that changes nothing; with changed= per host (the old ones must be 0).

Usage (as root, from the repository root, after `make venv`, with a lab that is up and
converged, e.g. the slurm lab of the integration tests):
    .venv/bin/python -u bench/operations.py --lab slurm [--scrapes 50] [--add-node] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import BIN, ROOT, Record, add_json_argument, agent_metrics_port, playbook, sh

# Runs on the monitoring host: interleaved GETs of one node's two exporters (the CPU time
# of each serving process is read on that node, found by its listening socket).
SCRAPER = r"""
import json, sys, time, urllib.request
host, scrapes, agent_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
ports = {"agent": agent_port, "node_exporter": 9100}
seconds = {name: [] for name in ports}
size = {}
for index in range(scrapes):
    order = list(ports) if index % 2 == 0 else list(reversed(ports))
    for name in order:
        start = time.perf_counter()
        body = opener.open(f"http://{host}:{ports[name]}/metrics", timeout=10).read()
        seconds[name].append(time.perf_counter() - start)
        size[name] = (len(body), sum(1 for line in body.splitlines()
                                     if line and not line.startswith(b"#")))
print(json.dumps({"seconds": seconds, "size": size}))
"""

PROMETHEUS = r"""
import json, sys, urllib.parse, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
def one(query):
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
    result = json.load(opener.open(url, timeout=10))["data"]["result"]
    return float(result[0]["value"][1]) if result else None
print(json.dumps({
    "cpu_per_s": one('rate(process_cpu_seconds_total{job="prometheus"}[2m])'),
    "targets": one("count(up)"),
    "head_series": one("prometheus_tsdb_head_series"),
    "scrape_s_agent": one('avg(scrape_duration_seconds{job="tacc_agent"})'),
    "scrape_s_node": one('avg(scrape_duration_seconds{job="node"})'),
    "interval_s": one('avg(prometheus_target_interval_length_seconds{quantile="0.5"})'),
}))
"""


def lab_sh(lab: str, node: str, script: str, check: bool = True) -> str:
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, "ssh", node, shlex.join(["sh", "-c", script])],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if check and proc.returncode != 0:
        sys.exit(f"bench: on {node}: {script[:80]}: {proc.stderr[-2000:]}")
    return proc.stdout


def cpu_seconds(lab: str, node: str, port: int) -> float:
    """utime + stime of the process listening on `port` on `node`."""
    script = (
        f"pid=$(ss -Hltnp 'sport = :{port}' | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2); "
        "cut -d' ' -f14,15 /proc/$pid/stat; getconf CLK_TCK"
    )
    ticks, hz = lab_sh(lab, node, script).split("\n", 1)
    return sum(int(t) for t in ticks.split()) / int(hz)


def scrape_cost(lab: str, node: str, scrapes: int) -> dict:
    lab_sh(lab, "n1", f"cat > /root/bench_scrape.py <<'EOF'\n{SCRAPER}\nEOF")
    port = agent_metrics_port()
    before = {"agent": cpu_seconds(lab, node, port), "node_exporter": cpu_seconds(lab, node, 9100)}
    scraped = lab_sh(lab, "n1", f"python3 /root/bench_scrape.py {node} {scrapes} {port}")
    found = json.loads(scraped)
    after = {"agent": cpu_seconds(lab, node, port), "node_exporter": cpu_seconds(lab, node, 9100)}
    out = {}
    for name in ("agent", "node_exporter"):
        out[name] = {
            "median_ms": statistics.median(found["seconds"][name]) * 1000,
            "cpu_ms_per_scrape": (after[name] - before[name]) * 1000 / scrapes,
            "bytes": found["size"][name][0],
            "samples": found["size"][name][1],
        }
    lab_sh(lab, "n1", f"cat > /root/bench_prom.py <<'EOF'\n{PROMETHEUS}\nEOF")
    out["prometheus"] = json.loads(lab_sh(lab, "n1", "python3 /root/bench_prom.py"))
    return out


def slurmd_start(lab: str, node: str) -> str:
    text = lab_sh(lab, "n1", f"scontrol show node {node} --oneline")
    match = re.search(r"SlurmdStartTime=(\S+)", text)
    return match.group(1) if match else ""


def bare_reboot(lab: str, node: str) -> float:
    """`systemctl reboot` over ssh, until the node's new slurmd answers the controller."""
    before = slurmd_start(lab, node)
    # A timer unit reboots it a second from now: an ssh session running `systemctl reboot`
    # itself would hang until its TCP connection times out (about 90 s here).
    lab_sh(lab, node, "systemd-run --quiet --on-active=1 systemctl reboot")
    start = time.monotonic() + 1.0
    while True:
        time.sleep(0.5)
        text = lab_sh(lab, "n1", f"scontrol show node {node} --oneline", check=False)
        state = re.search(r"State=(\S+)", text)
        if slurmd_start(lab, node) != before and state and "NOT_RESPONDING" not in state.group(1):
            return time.monotonic() - start
        if time.monotonic() - start > 600:
            sys.exit(f"bench: {node} did not come back within 600 s")


def numbered_nodes(lab: str) -> int:
    """The lab's n1.. nodes (`tacc-lab up --nodes` counts these; the login node apart)."""
    status = json.loads(sh([str(BIN / "tacc-lab"), "--name", lab, "status", "--json"]).stdout)
    return sum(1 for node in status["nodes"] if re.fullmatch(r"n\d+", node["name"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True, help="a lab that is up and converged")
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--add-node", action="store_true", help="also add a node (kept)")
    add_json_argument(parser)
    args = parser.parse_args()
    inventory = Path(f"/tmp/bench-operations-{args.lab}/hosts.yml")
    numbered = numbered_nodes(args.lab)
    sh(
        [
            str(BIN / "tacc-lab"),
            "--name",
            args.lab,
            "up",
            "--nodes",
            str(numbered),
            "--inventory",
            str(inventory),
        ]
    )
    with Record(args.json, lab=args.lab, scrapes=args.scrapes) as out:
        print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        cost = scrape_cost(args.lab, "n2", args.scrapes)
        out["scrape"] = cost
        agent, node = cost["agent"], cost["node_exporter"]
        wall = agent["median_ms"] / node["median_ms"]
        cpu = agent["cpu_ms_per_scrape"] / max(node["cpu_ms_per_scrape"], 1e-9)
        print(
            f"scrape of n2, {args.scrapes} each, interleaved: agent {agent['median_ms']:.1f} ms "
            f"({agent['cpu_ms_per_scrape']:.1f} ms CPU, {agent['samples']} samples, "
            f"{agent['bytes'] / 1024:.1f} KiB) / node exporter {node['median_ms']:.1f} ms "
            f"({node['cpu_ms_per_scrape']:.1f} ms CPU, {node['samples']} samples, "
            f"{node['bytes'] / 1024:.1f} KiB): {wall:.2f}x wall, {cpu:.2f}x CPU"
        )
        prom = cost["prometheus"]
        per_target_cpu = prom["cpu_per_s"] / prom["targets"] * 1000
        per_target_series = prom["head_series"] / prom["targets"]
        print(
            f"Prometheus: {prom['targets']:.0f} targets every {prom['interval_s']:.0f} s, "
            f"{per_target_cpu:.2f} ms CPU per second per target, "
            f"{per_target_series:.0f} head series per target"
        )
        waves = {}
        for node_name in ("n2", "n3"):
            bare = bare_reboot(args.lab, node_name)
            rolled, _ = playbook(inventory, "playbooks/rolling.yml", "--limit", node_name)
            waves[node_name] = {"rolling_s": rolled, "bare_reboot_s": bare}
            print(
                f"wave {node_name}: rolling.yml (drain, reboot, accept, resume) {rolled:.1f} s"
                f" / bare reboot until slurmd answers {bare:.1f} s: {rolled / bare:.2f}x"
            )
        out["waves"] = waves
        if args.add_node:
            rerun, _ = playbook(inventory, "playbooks/site.yml")
            sh(
                [
                    str(BIN / "tacc-lab"),
                    "--name",
                    args.lab,
                    "up",
                    "--nodes",
                    str(numbered + 1),
                    "--inventory",
                    str(inventory),
                ]
            )
            added, changed = playbook(inventory, "playbooks/site.yml")
            out["add_node"] = {"seconds": added, "rerun_s": rerun, "changed": changed}
            print(
                f"add-node converge: {added:.1f} s / no-change re-run {rerun:.1f} s: "
                f"{added / rerun:.2f}x; changed {changed}"
            )
        out["complete"] = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
