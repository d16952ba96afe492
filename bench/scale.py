#!/usr/bin/env python3
"""Scale (issue [23]): a real slurmctld holding 1,000 nodes and 10,000 jobs, and what
the agent's steps that read the queue cost as it grows.

The nodes are Slurm's own emulation: one real `slurmd` per node (Slurm's multiple-slurmd
mode, NodeName=e[0001-N] Port=[...], every one on one lab node), so every job really
starts, as a real slurmstepd running `sleep` (Debian's slurm-wlm-emulator is a front-end
build that cannot start against Debian's libslurmfull, and upstream dropped front-end
mode in 25.05). This second cluster ("scale", its own slurmctld on n1's port 6917) runs
beside the lab's; for the length of the run the login node's Slurm commands point at it
(an /etc/slurm/slurm.conf there, removed at the end), so `tcloud ps` and `tcloud submit`
go the whole way: tcloud, SSH, the agent on the login node, the scale slurmctld.

The queue is filled with plain `sbatch --wrap 'sleep 86400'` jobs, half the researcher's
(alice, so her `squeue --me` grows with the queue), half another user's (bob), in a
`busy` partition (90% of the nodes: the rest of its jobs pend); her tcloud jobs go to
`free`. At each size (--jobs, e.g. 100 1000 10000 jobs queued):

1. the queue tick (`tacc_agent.tasks.schedule.queue_ticks`, the daemon's function, run by
   bench/scale_probe.py on the login node as root) with each scheduling plug-in alone
   (las, tiresias, allox), --ticks ticks keeping the daemon's cache: each tick's wall
   time, each Slurm command's time and count, each plug-in's own time;
2. `tcloud ps` against `ssh login squeue --me`, --rounds each, interleaved;
3. `tcloud submit` of a one-line task against `ssh login sbatch --wrap true`.

Usage (as root, from the repository root, after `make venv`, with a lab that is up and
converged with a login node, n1 the controller and n3 a compute node: the bench lab of
bench/interactive.py or the slurm lab of the integration tests):
    .venv/bin/python -u bench/scale.py --lab NAME [--nodes 1000] [--jobs 100 1000 10000]
        [--ticks 3] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BIN, ROOT, Record, add_json_argument
from interactive import USER, Researcher

CONF = "/etc/slurm-scale/slurm.conf"
CTLD_PORT = 6917
FIRST_PORT = 20001
CONTROLLER, HOST, LOGIN = "n1", "n3", "login1"
FILLER_USERS = (USER, "bob")  # half the queue is the researcher's (interactive.USER)
# Each plug-in alone, with the settings bench/plugins.py runs it with (a threshold, a
# nice step: a cold tick sets every pending job's nice).
PLUGINS = {
    "las": {"las_thresholds": [100], "las_nice_step": 1000},
    "tiresias": {
        "plugin_settings": {"tiresias": {"thresholds": [30], "promote_knob": 8, "nice_step": 1000}}
    },
    "allox": {},
}
AGENT_PYTHON = "/opt/tacc-agent/venv/bin/python3"
# The lab's own settings that shape what the controller does per job, copied as they are.
COPIED = ("PrivateData", "PriorityType", "PriorityWeight", "PriorityDecay", "Preempt")


def node_sh(lab: str, node: str, script: str, check: bool = True) -> str:
    argv = [str(BIN / "tacc-lab"), "--name", lab, "ssh", node, shlex.join(["sh", "-c", script])]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        sys.exit(f"bench: on {node}: {script[:200]}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc.stdout


def slurm_conf(lab: str, nodes: int, controller_ip: str, host_ip: str) -> str:
    """The scale cluster's slurm.conf: the lab's scheduling lines, then N emulated nodes."""
    lab_conf = node_sh(
        lab, CONTROLLER, "cat /etc/slurm/slurm.conf /run/slurm/conf/slurm.conf 2>/dev/null; true"
    )
    copied = [line for line in lab_conf.splitlines() if line.startswith(COPIED)]
    free = max(1, nodes // 10)
    width = len(str(nodes))
    last = f"e{nodes:0{width}d}"
    return "\n".join(
        [
            "ClusterName=scale",
            f"SlurmctldHost={CONTROLLER}({controller_ip})",
            f"SlurmctldPort={CTLD_PORT}",
            "SlurmUser=slurm",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "StateSaveLocation=/var/spool/slurmctld-scale",
            "SlurmdSpoolDir=/var/spool/slurmd-scale/%n",
            "SlurmctldPidFile=/run/slurmctld-scale.pid",
            "SlurmdPidFile=/run/slurmd-scale/%n.pid",
            "SlurmctldLogFile=/var/log/slurm-scale/slurmctld.log",
            "SlurmdLogFile=/var/log/slurm-scale/%n.log",
            "SlurmdDebug=error",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "MaxJobCount=30000",
            "MinJobAge=300",
            "SlurmdTimeout=600",
            "MessageTimeout=30",
            "TreeWidth=32",
            "AccountingStorageType=accounting_storage/none",
            *copied,
            f"NodeName=e[{1:0{width}d}-{nodes}] NodeHostName={HOST} NodeAddr={host_ip} "
            f"Port=[{FIRST_PORT}-{FIRST_PORT + nodes - 1}] CPUs=1 RealMemory=1000",
            f"PartitionName=busy Nodes=e[{1:0{width}d}-{nodes - free:0{width}d}] "
            "MaxTime=INFINITE State=UP",
            f"PartitionName=free Nodes=e[{nodes - free + 1:0{width}d}-{last[1:]}] Default=YES "
            "MaxTime=INFINITE State=UP",
            "",
        ]
    )


def address(lab: str, node: str) -> str:
    return node_sh(lab, LOGIN, f"getent hosts {node}").split()[0]


def put(lab: str, node: str, path: str, text: str) -> None:
    data = base64.b64encode(text.encode()).decode()
    node_sh(
        lab,
        node,
        f"mkdir -p {shlex.quote(str(Path(path).parent))} && "
        f"echo {data} | base64 -d > {shlex.quote(path)}",
    )


def start(lab: str, nodes: int, conf: str) -> None:
    for node in (CONTROLLER, HOST, LOGIN):
        put(lab, node, CONF, conf)
    node_sh(
        lab,
        CONTROLLER,
        "rm -rf /var/spool/slurmctld-scale && install -d -o slurm /var/spool/slurmctld-scale "
        "/var/log/slurm-scale && systemd-run --unit=tacc-scale-slurmctld -p TasksMax=infinity "
        f"/usr/sbin/slurmctld -D -c -f {CONF}",
    )
    width = len(str(nodes))
    names = " ".join(f"e{i:0{width}d}" for i in range(1, nodes + 1))
    # One unit holds every slurmd and, through them, every job's slurmstepd: stopping it
    # ends them all. Started 50 at a time so the controller is not flooded.
    script = (
        f"i=0; for n in {names}; do mkdir -p /var/spool/slurmd-scale/$n; "
        f"/usr/sbin/slurmd -D -c -f {CONF} -N $n & i=$((i+1)); "
        "[ $((i % 50)) -eq 0 ] && sleep 1; done; wait"
    )
    node_sh(
        lab,
        HOST,
        "rm -rf /var/spool/slurmd-scale /var/log/slurm-scale && mkdir -p /run/slurmd-scale "
        "/var/log/slurm-scale && systemd-run --unit=tacc-scale-slurmd -p TasksMax=infinity "
        f"-p LimitNOFILE=65536 sh -c {shlex.quote(script)}",
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        out = node_sh(lab, LOGIN, f"SLURM_CONF={CONF} sinfo -h -o '%T %D'", check=False)
        idle = sum(
            int(n) for state, n in (line.split() for line in out.splitlines()) if state == "idle"
        )
        if idle >= nodes:
            return
        time.sleep(5)
    sys.exit(f"bench: the scale cluster's {nodes} nodes did not all come up idle: {out}")


def redirect_login(lab: str, on: bool) -> None:
    """The login node's Slurm commands (the agent's too) go to the scale cluster."""
    if on:
        node_sh(
            lab,
            LOGIN,
            "[ ! -e /etc/slurm/slurm.conf ] || "
            "mv /etc/slurm/slurm.conf /etc/slurm/slurm.conf.scale-bak; "
            f"mkdir -p /etc/slurm && cp {CONF} /etc/slurm/slurm.conf",
        )
    else:
        node_sh(
            lab,
            LOGIN,
            "rm -f /etc/slurm/slurm.conf; [ ! -e /etc/slurm/slurm.conf.scale-bak ] || "
            "mv /etc/slurm/slurm.conf.scale-bak /etc/slurm/slurm.conf",
            check=False,
        )


def stop(lab: str) -> None:
    redirect_login(lab, False)
    node_sh(
        lab, HOST, "systemctl stop tacc-scale-slurmd; rm -rf /var/spool/slurmd-scale", check=False
    )
    node_sh(lab, CONTROLLER, "systemctl stop tacc-scale-slurmctld", check=False)
    for node in (CONTROLLER, HOST, LOGIN):
        node_sh(
            lab, node, "rm -rf /etc/slurm-scale /var/log/slurm-scale /root/scale-*", check=False
        )


def queued(lab: str) -> int:
    return len(node_sh(lab, LOGIN, "squeue -h -a -o %i").split())


FILLER = (
    'n=$1; i=0; while [ "$i" -lt "$n" ]; do '
    "sbatch -Q -p busy -N1 -n1 --mem=10 -t 1-0 -J fill -D /tmp -o /dev/null "
    "--wrap 'sleep 86400' >/dev/null || exit 1; i=$((i + 1)); done\n"
)


def fill(lab: str, target: int) -> dict:
    """Submit the filler jobs up to `target` queued, two sbatch loops at once; sbatch's
    own rate is a number too."""
    missing = target - queued(lab)
    if missing <= 0:
        return {"submitted": 0}
    halves = [missing - missing // 2, missing // 2]
    script = " & ".join(
        f"runuser -u {user} -- env SLURM_CONF={CONF} sh /etc/slurm-scale/fill.sh {n}"
        for user, n in zip(FILLER_USERS, halves, strict=True)
        if n
    )
    started = time.monotonic()
    node_sh(lab, CONTROLLER, f"{script}; wait")
    seconds = time.monotonic() - started
    return {
        "submitted": missing,
        "seconds": round(seconds, 2),
        "per_s": round(missing / seconds, 1),
    }


def tick_costs(lab: str, plugin: str, ticks: int) -> list[dict]:
    config = {"plugins": [plugin], "state_dir": f"/root/scale-state-{plugin}", **PLUGINS[plugin]}
    put(lab, LOGIN, f"/root/scale-{plugin}.yaml", json.dumps(config))
    out = node_sh(
        lab,
        LOGIN,
        f"rm -rf /root/scale-state-{plugin}; SLURM_CONF={CONF} {AGENT_PYTHON} "
        f"/root/scale-probe.py /root/scale-{plugin}.yaml {ticks}",
        check=False,
    )
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [{"error": out[-500:]}]


def timed(me: Researcher, argv: list[str]) -> tuple[float, str]:
    """Seconds argv took as the researcher, and what it printed; it must succeed."""
    start = time.monotonic()
    proc = subprocess.run(argv, env=me.env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}: {proc.stderr.strip()[-400:]}")
    return seconds, proc.stdout


def user_rows(me: Researcher, project: Path, rounds: int) -> dict:
    """tcloud ps / squeue --me and tcloud submit / sbatch, interleaved rounds."""
    times: dict[str, list[float]] = {key: [] for key in ("ps", "squeue", "submit", "sbatch")}
    rows = 0
    for _ in range(rounds):
        seconds, out = timed(me, [str(BIN / "tcloud"), "ps", "--json"])
        times["ps"].append(seconds)
        rows = len(json.loads(out))
        times["squeue"].append(timed(me, [*me.ssh, "squeue --me -h"])[0])
        times["submit"].append(
            timed(me, [str(BIN / "tcloud"), "submit", "--json", str(project)])[0]
        )
        times["sbatch"].append(
            timed(
                me, [*me.ssh, "sbatch -Q -p free -N1 -n1 --mem=50M -t 5 -o /dev/null --wrap true"]
            )[0]
        )
    medians = {key: round(statistics.median(values), 3) for key, values in times.items()}
    return {
        **medians,
        "ps_rows": rows,
        "ps_ratio": round(medians["ps"] / medians["squeue"], 2),
        "submit_ratio": round(medians["submit"] / medians["sbatch"], 2),
        "values": {key: [round(v, 3) for v in values] for key, values in times.items()},
    }


# ------------------------------------------------------------------ the report's section
def warm(ticks: list[dict]) -> float:
    """A warm daemon's tick: the median of the ticks after the first."""
    return statistics.median(t["wall_s"] for t in ticks[1:] or ticks)


def slurm_seconds(tick: dict) -> float:
    return sum(seconds for seconds, _ in tick.get("commands", {}).values())


def cell(ticks: list[dict], which: str, jobs: int) -> str:
    """Wall seconds (of them in Slurm's commands), and ms per queued job."""
    if not ticks or "wall_s" not in ticks[0]:
        return "failed"
    tick = ticks[0] if which == "cold" else min(ticks[1:] or ticks, key=lambda t: t["wall_s"])
    wall = ticks[0]["wall_s"] if which == "cold" else warm(ticks)
    updates = tick.get("commands", {}).get("scontrol update", [0, 0])[1]
    said = f"; {updates} update{'s' if updates > 1 else ''}" if updates else ""
    return (
        f"{wall:.2f} s ({slurm_seconds(tick):.2f} in Slurm{said}); {1000 * wall / jobs:.2f} ms/job"
    )


def section(before: dict, after: dict, command: str) -> list[str]:
    lines = [
        "## Scale: a real slurmctld with 1,000 nodes and 100 / 1,000 / 10,000 jobs "
        "(bench/scale.py)",
        "",
        "| step | jobs queued (running) | before | after |",
        "| --- | --- | --- | --- |",
    ]
    for old, new in zip(before["levels"], after["levels"], strict=True):
        jobs = new["queued"]
        where = f"{old['queued']} ({old['running']}) / {jobs} ({new['running']})"
        for plugin in PLUGINS:
            for which in ("cold", "warm"):
                label = f"queue tick, {plugin} alone, {which} daemon"
                row = [cell(run["ticks"][plugin], which, run["queued"]) for run in (old, new)]
                lines.append(f"| {label} | {where} | {row[0]} | {row[1]} |")
        for ours, theirs, name in (
            ("ps", "squeue", "`tcloud ps` / `squeue --me`"),
            ("submit", "sbatch", "`tcloud submit` / `sbatch --wrap`"),
        ):
            row = [
                f"{run['user'][ours]:.2f} s / {run['user'][theirs]:.2f} s = "
                f"{run['user'][ours] / run['user'][theirs]:.2f}x"
                for run in (old, new)
            ]
            lines.append(
                f"| {name}, median of {len(new['user']['values'][ours])} | {where} | "
                f"{row[0]} | {row[1]} |"
            )
    lines += ["", f"Reproduce: `{command}`"]
    return lines


def record(before_path: str, after_path: str, notes: list[str]) -> None:
    """Put the section into bench/results.json as the `scale` entry (re-render REPORT.md
    with bench/report.py --from-json bench/results.json)."""
    before, after = (json.loads(Path(p).read_text()) for p in (before_path, after_path))
    results_path = ROOT / "bench/results.json"
    results = json.loads(results_path.read_text())
    command = after["command"]
    results["scripts"]["scale"] = {
        "script": "scale.py",
        "command": command,
        "ok": bool(before.get("complete") and after.get("complete")),
        "recorded": "by `bench/scale.py --record BEFORE.json AFTER.json` from two runs' --json "
        "files (before: the agent at the commit before issue [23]'s changes; after: with them)",
        "section": section(before, after, command),
        "notes": notes,
        "load_before": after.get("load_at_start"),
        "result": {"before": before, "after": after},
    }
    results_path.write_text(json.dumps(results, indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", help="a lab that is up and converged")
    parser.add_argument(
        "--record",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="write two runs' --json files into bench/results.json (no lab)",
    )
    parser.add_argument("--note", action="append", default=[], help="a note under the table")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--ticks", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the scale cluster up")
    add_json_argument(parser)
    args = parser.parse_args()
    if args.record:
        record(*args.record, args.note)
        return 0
    if not args.lab:
        parser.error("--lab is needed to measure")
    lab = args.lab
    with (
        Record(args.json, nodes=args.nodes, jobs=args.jobs) as out,
        tempfile.TemporaryDirectory() as tmp,
    ):
        out["load_at_start"] = os.getloadavg()
        project = Path(tmp) / "tiny"
        project.mkdir()
        task = {
            "name": "scale-tiny",
            "resources": {"nodes": 1, "cpus": 1, "mem": "50M", "time": "5"},
        }
        (project / "tcloud.yaml").write_text(json.dumps({**task, "run": ["true"]}))
        conf = slurm_conf(lab, args.nodes, address(lab, CONTROLLER), address(lab, HOST))
        stop(lab)
        put(lab, CONTROLLER, "/etc/slurm-scale/fill.sh", FILLER)
        put(lab, LOGIN, "/root/scale-probe.py", (ROOT / "bench/scale_probe.py").read_text())
        try:
            started = time.monotonic()
            start(lab, args.nodes, conf)
            out["nodes_up_s"] = round(time.monotonic() - started, 1)
            redirect_login(lab, True)
            me = Researcher(lab)
            levels = []
            for size in sorted(args.jobs):
                level: dict = {"target": size, "fill": fill(lab, size)}
                time.sleep(10)  # the scheduler places what it can
                level["queued"] = queued(lab)
                level["running"] = len(node_sh(lab, LOGIN, "squeue -h -a -t R -o %i").split())
                level["load"] = os.getloadavg()
                level["ticks"] = {plugin: tick_costs(lab, plugin, args.ticks) for plugin in PLUGINS}
                level["user"] = user_rows(me, project, args.rounds)
                levels.append(level)
                out["levels"] = levels
                print(json.dumps(level)[:2000], flush=True)
            out["load_at_end"] = os.getloadavg()
        finally:
            if not args.keep:
                stop(lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
