#!/usr/bin/env python3
"""Each optimization plug-in (issue [8]) on and off in one run on the bench lab, with the
figure it is meant to move. Every workload is submitted through tcloud as a researcher
would; "off" is the same workload with the plug-in turned off (`plugins: [-name]` in
the task, or for LAS, no tick).

1. duration: a replayed workload in which a 2-node job waits for a 1-node job to end;
   short evaluation jobs that set no time limit arrive. With prediction they get a
   limit from their earlier run and Slurm's backfill starts them on the idle node at
   once; with the 1-hour default they wait behind the 2-node job. Figure: mean start
   delay of the short jobs.
2. las: the same trace FIFO and with least-attained-service: alice submits 4 long jobs,
   bob 4 short ones 3 s later, one job per node. Figure: mean job completion time.
3. gpu_share: 4 tasks of 20 s on a node with one (FAKE) GPU: whole GPUs serialize,
   quarter GPUs (shards) share it. Figure: makespan.
4. elastic: a 2-node task while one node is busy: `nodes: 2` waits, `nodes: 1-2`
   starts on the free one. Figure: start delay.
5. sweep: 8 trials as one sweep (one submission, one job array) against 8 separate
   submissions. Figure: time to submit them all.
6. tiresias (issue [16]): FIFO, per-user las and per-job tiresias (with preemption of
   the long jobs, which checkpoint and resume) on two workloads: las' trace (alice's 4
   long jobs, bob's 4 short ones) and one user's 2 long jobs followed by her 6 short
   ones (per-user las cannot tell them apart). Figure: mean job completion time.
7. fluid (issue [16]): a 9-trial sweep as the plain grid and with ASHA early stopping
   (bench/plugins_fluid.py). Figures: time to the best result, trial-seconds.
8. oort (issue [16]): the simulated federated example with random selection and with
   Oort's (bench/plugins_oort.py). Figure: simulated time to the target accuracy.
9. elastic_resize (issue [16]): a stream of jobs of fixed work at 1 node, at 2 nodes and
   at 1-2 nodes resized while running (bench/plugins_elastic.py). Figures: node
   utilization, mean wait. elastic_resize_long: the same with 4x longer jobs on Slurm's
   default cred_expire (120 s), for the break-even of a resize.
10. allox (issue [16]): 12 one-GPU jobs of two classes that accept h100 or l40s (n3 gets
   a FAKE L40S for it), placed by Slurm alone and by the allox tick
   (bench/plugins_allox.py). Figure: mean job completion time.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/plugins.py [--only las ...] [--json PATH]
Uses the bench lab (10.77.7.0/24, 3 nodes: n1 head, n2 with one FAKE H100, n3) and
removes it at the end. About 40 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchlib import (
    BIN,
    NAME,
    Record,
    add_json_argument,
    lab_down,
    lab_up,
    node_sh,
    playbook,
    sh,
    ticker,
)
from plugins_allox import bench_allox
from plugins_elastic import LONG, bench_elastic_resize
from plugins_fluid import bench_fluid
from plugins_oort import bench_oort
from task_workflow import Tcloud

from tacc_lab.demo import researcher_env

CPUS = 4  # declared per compute node; a job with cpus: 4 has a node to itself
SETTINGS = {
    "slurm_node_cpus": CPUS,
    "slurm_extra_config": {"AuthInfo": "cred_expire=20", "SlurmdParameters": "config_overrides"},
}
N2 = {
    "slurm_node_gres": ["gpu:h100:1"],
    "slurm_gpu_sharing": "shard",
    "slurm_gpu_shards_per_gpu": 4,
}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
# allox last: it gives n3 a FAKE L40S, which the sections before it do not expect.
SECTIONS = (
    "duration",
    "las",
    "gpu_share",
    "elastic",
    "sweep",
    "tiresias",
    "fluid",
    "oort",
    "elastic_resize",
    "elastic_resize_long",
    "allox",
)
# One threshold between what the short-job user attains (4 x 10 node-s) and the long-job
# user (2 x 60 node-s by the first minute): Tiresias tunes its queues to the workload.
LAS = "plugins: [las]\nlas_thresholds: [100]\nlas_nice_step: 1000\nstate_dir: /root/las-bench\n"
# Tiresias per job: a long job (one node, 60 s) passes 30 node-s half-way and drops to
# queue 1; a job that waits in queue 0 then preempts it (it checkpoints and resumes).
TIRESIAS_SETTINGS = {
    "thresholds": [30],
    "promote_knob": 8,
    "nice_step": 1000,
    "min_run_seconds": 10,
}
TIRESIAS = {
    "plugins": ["tiresias"],
    "state_dir": "/root/tiresias-bench",
    "plugin_settings": {"tiresias": TIRESIAS_SETTINGS},
}


def project(root: Path, name: str, run: str, **fields) -> Path:
    root.mkdir(parents=True)
    resources = {"nodes": 1, "cpus": 1, "mem": "50M", **fields.pop("resources", {})}
    task = {"name": name, "resources": resources, "run": [run], **fields}
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def history_time(info: dict, state: str, last: bool = False) -> float:
    times = [h["time"] for h in info["history"] if h["state"] == state]
    return times[-1] if last else times[0]


def wait_all(tcloud: Tcloud, jobs: list[str], timeout: float = 900) -> list[dict]:
    return [tcloud.wait(job, TERMINAL, timeout) for job in jobs]


def start_delays(infos: list[dict]) -> list[float]:
    return [history_time(i, "RUNNING") - history_time(i, "QUEUED") for i in infos]


def completion_times(infos: list[dict]) -> list[float]:
    return [history_time(i, i["state"], last=True) - history_time(i, "QUEUED") for i in infos]


def bench_elastic_long(alice: Tcloud, work: Path, inventory: Path) -> dict:
    """The long stream on Slurm's default cred_expire (120 s), then the lab's again."""
    default_cred = {
        **SETTINGS,
        "slurm_extra_config": {
            k: v for k, v in SETTINGS["slurm_extra_config"].items() if k != "AuthInfo"
        },
    }
    playbook(inventory, "playbooks/site.yml", "-e", json.dumps(default_cred))
    try:
        return bench_elastic_resize(alice, work, LONG)
    finally:
        playbook(inventory, "playbooks/site.yml", "-e", json.dumps(SETTINGS))


# ---------------------------------------------------------------- 1. duration
def duration_mode(tcloud: Tcloud, work: Path, on: bool) -> dict:
    words = {} if on else {"plugins": ["-duration"]}
    tag = "on" if on else "off"
    blocker = tcloud.submit(
        project(work / f"a-{tag}", "train", "sleep 150", resources={"cpus": CPUS, "time": "10"})
    )[0]
    tcloud.wait(blocker, ("RUNNING",))
    tcloud.submit(
        project(
            work / f"b-{tag}", "big", "sleep 5", resources={"nodes": 2, "cpus": CPUS, "time": "5"}
        )
    )
    time.sleep(2)
    short = [
        tcloud.submit(project(work / f"c-{tag}-{i}", "eval", "sleep 15", **words))[0]
        for i in range(3)
    ]
    infos = wait_all(tcloud, short)
    limits = [json.dumps(i.get("plugins", {}).get("duration", "default 01:00:00")) for i in infos]
    wait_all(tcloud, [blocker])
    delays = start_delays(infos)
    return {
        "mean_start_delay_s": round(statistics.mean(delays), 1),
        "start_delays_s": [round(d, 1) for d in delays],
        "limits": limits,
    }


def bench_duration(tcloud: Tcloud, work: Path) -> dict:
    warm = tcloud.submit(project(work / "warm", "eval", "sleep 15"))[0]  # earlier run: history
    wait_all(tcloud, [warm])
    off = duration_mode(tcloud, work, on=False)
    on = duration_mode(tcloud, work, on=True)
    return {
        "off": off,
        "on": on,
        "improvement": round(off["mean_start_delay_s"] / max(on["mean_start_delay_s"], 0.1), 2),
    }


# ---------------------------------------------------------------- 2. LAS
def las_mode(alice: Tcloud, bob: Tcloud, work: Path, on: bool) -> dict:
    tag = "las" if on else "fifo"
    node_sh("n1", f"rm -rf /root/las-bench; printf '{LAS}' > /root/las.yaml")
    stop = threading.Event()
    ticks = {"ticks": 0, "failed_ticks": 0, "changes": []}
    thread = threading.Thread(target=ticker, args=(stop, ticks), daemon=True)
    first = time.time()
    if on:
        thread.start()
    whole = {"cpus": CPUS, "time": "10"}
    long = [
        alice.submit(project(work / f"{tag}-long-{i}", "long", "sleep 60", resources=whole))[0]
        for i in range(4)
    ]
    time.sleep(3)
    short = [
        bob.submit(project(work / f"{tag}-short-{i}", "short", "sleep 10", resources=whole))[0]
        for i in range(4)
    ]
    infos_long, infos_short = wait_all(alice, long), wait_all(bob, short)
    stop.set()
    jct_long, jct_short = completion_times(infos_long), completion_times(infos_short)
    starts = sorted(
        (round(history_time(i, "RUNNING") - first, 1), who)
        for who, infos in (("long", infos_long), ("short", infos_short))
        for i in infos
    )
    return {
        "mean_jct_s": round(statistics.mean(jct_long + jct_short), 1),
        "mean_jct_long_s": round(statistics.mean(jct_long), 1),
        "mean_jct_short_s": round(statistics.mean(jct_short), 1),
        "start_order": starts,
        **(
            {
                "ticks": ticks["ticks"],
                "failed_ticks": ticks["failed_ticks"],
                "nice_changes": len(ticks["changes"]),
            }
            if on
            else {}
        ),
    }


def bench_las(alice: Tcloud, bob: Tcloud, work: Path) -> dict:
    fifo = las_mode(alice, bob, work, on=False)
    las = las_mode(alice, bob, work, on=True)
    return {
        "fifo": fifo,
        "las": las,
        "improvement": round(fifo["mean_jct_s"] / las["mean_jct_s"], 2),
    }


# ---------------------------------------------------------------- 6. tiresias
# A long job's work: count to UNTIL seconds, save the count at the checkpoint signal and
# stop; started again (requeued), it goes on from the count.
COUNTER = """import os, pathlib, signal, sys, time
saved = pathlib.Path(os.environ["TACC_WORKDIR"]) / "outputs" / "count"
count = int(saved.read_text()) if saved.exists() else 0
def checkpoint(*_):
    saved.parent.mkdir(exist_ok=True)
    saved.write_text(str(count))
    sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
while count < int(os.environ["UNTIL"]):
    count += 1
    time.sleep(1)
"""


def counter(root: Path, name: str, seconds: int) -> Path:
    """A whole-node job of `seconds` of work that checkpoints and resumes (preemptible)."""
    path = project(
        root,
        name,
        "python3 count.py",
        resources={"cpus": CPUS, "time": "10", "preemptible": True},
        outputs=["outputs/"],
        environment={"env": {"UNTIL": str(seconds)}},
    )
    (path / "count.py").write_text(COUNTER)
    return path


def policy_mode(submitters: list[tuple[Tcloud, str, int, int]], work: Path, policy: str) -> dict:
    """One workload under one policy: (researcher, name, count, seconds) groups submitted
    3 s apart; with las or tiresias their tick runs every 2 s as the daemon's would."""
    config = {
        "las": ("/root/las.yaml", LAS),
        "tiresias": ("/root/tiresias.yaml", json.dumps(TIRESIAS)),
    }.get(policy)
    node_sh("n1", "rm -rf /root/las-bench /root/tiresias-bench")
    stop = threading.Event()
    ticks = {"ticks": 0, "failed_ticks": 0, "changes": []}
    if config:
        node_sh("n1", f"printf '%s\\n' '{config[1]}' > {config[0]}")
        threading.Thread(target=ticker, args=(stop, ticks, config[0]), daemon=True).start()
    jobs: dict[str, list[tuple[Tcloud, str]]] = {}
    for index, (tcloud, name, count, seconds) in enumerate(submitters):
        if index:
            time.sleep(3)
        jobs.setdefault(name, []).extend(
            (tcloud, tcloud.submit(counter(work / f"{policy}-{name}-{i}", name, seconds))[0])
            for i in range(count)
        )
    infos = {
        name: [tcloud.wait(job, TERMINAL, 900) for tcloud, job in group]
        for name, group in jobs.items()
    }
    stop.set()
    jct = {name: completion_times(group) for name, group in infos.items()}
    preempted = sum(
        1
        for group in infos.values()
        for info in group
        for h in info["history"]
        if h["state"] == "HALTED"
    )
    return {
        "mean_jct_s": round(statistics.mean([t for ts in jct.values() for t in ts]), 1),
        **{f"mean_jct_{name}_s": round(statistics.mean(ts), 1) for name, ts in jct.items()},
        "preemptions": preempted,
        **({"ticks": ticks["ticks"], "failed_ticks": ticks["failed_ticks"]} if config else {}),
    }


def bench_tiresias(alice: Tcloud, bob: Tcloud, work: Path) -> dict:
    """FIFO, las (per user) and tiresias (per job, preemptive) on two workloads."""
    workloads = {
        "las_trace": [(alice, "long", 4, 60), (bob, "short", 4, 10)],
        "short_behind_long": [(alice, "long", 2, 60), (alice, "short", 6, 5)],
    }
    result = {}
    for label, submitters in workloads.items():
        modes = {
            policy: policy_mode(submitters, work / label, policy)
            for policy in ("fifo", "las", "tiresias")
        }
        for policy in ("las", "tiresias"):
            modes[f"{policy}_improvement"] = round(
                modes["fifo"]["mean_jct_s"] / modes[policy]["mean_jct_s"], 2
            )
        result[label] = modes
        print(f"tiresias {label}: {json.dumps(modes)}", flush=True)
    return result


# ---------------------------------------------------------------- 3. GPU sharing
def bench_gpu_share(tcloud: Tcloud, work: Path) -> dict:
    result = {}
    for label, gpus in (("whole", 1), ("quarter", 0.25)):
        start = time.time()
        jobs = [
            tcloud.submit(
                project(
                    work / f"gpu-{label}-{i}",
                    "gpu",
                    "sleep 20",
                    resources={"gpus_per_node": gpus, "time": "5"},
                )
            )[0]
            for i in range(4)
        ]
        infos = wait_all(tcloud, jobs)
        if not all(i["state"] == "COMPLETED" for i in infos):
            raise RuntimeError(f"gpu_share {label}: not every task completed: {infos}")
        end = max(history_time(i, "COMPLETED", last=True) for i in infos)
        result[label] = {"makespan_s": round(end - start, 1)}
    result["improvement"] = round(
        result["whole"]["makespan_s"] / result["quarter"]["makespan_s"], 2
    )
    return result


# ---------------------------------------------------------------- 4. elastic
def bench_elastic(tcloud: Tcloud, work: Path) -> dict:
    result = {}
    for label, nodes in (("fixed", 2), ("range", "1-2")):
        blocker = tcloud.submit(
            project(
                work / f"busy-{label}", "busy", "sleep 45", resources={"cpus": CPUS, "time": "5"}
            )
        )[0]
        tcloud.wait(blocker, ("RUNNING",))
        job = tcloud.submit(
            project(
                work / f"el-{label}",
                "elastic",
                "sleep 5",
                resources={"nodes": nodes, "cpus": CPUS, "time": "5"},
            )
        )[0]
        info = tcloud.wait(job, TERMINAL, 300)
        wait_all(tcloud, [blocker])
        result[label] = {
            "start_delay_s": round(start_delays([info])[0], 1),
            "nodes": len(info["nodes"]),
        }
    return result


# ---------------------------------------------------------------- 5. sweep
def bench_sweep(tcloud: Tcloud, work: Path) -> dict:
    grid = {"parameters": {"LR": [0.1, 0.03, 0.01, 0.003], "SEED": [1, 2]}}
    start = time.monotonic()
    sweep = json.loads(
        tcloud.run(
            "submit",
            "--json",
            "--sweep",
            str(project(work / "sweep", "grid", "echo $LR $SEED", sweep=grid)),
        ).stdout
    )["job_id"]
    one_submit = time.monotonic() - start
    start = time.monotonic()
    with ThreadPoolExecutor(1) as pool:  # one after the other, as a loop of submits would
        separate = list(
            pool.map(
                lambda i: tcloud.submit(project(work / f"single-{i}", "single", f"echo trial {i}"))[
                    0
                ],
                range(8),
            )
        )
    eight_submits = time.monotonic() - start
    info = tcloud.wait(sweep, TERMINAL, 300)
    wait_all(tcloud, separate)
    return {
        "sweep_submit_s": round(one_submit, 2),
        "separate_submits_s": round(eight_submits, 2),
        "sweep_state": info["state"],
        "trials": len(info["trials"]),
        "improvement": round(eight_submits / one_submit, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run these sections only")
    add_json_argument(parser)
    args = parser.parse_args()
    with Record(args.json, lab=NAME) as record, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        inventory = work / "hosts.yml"
        (work / "host_vars").mkdir()
        (work / "host_vars" / "n2.yml").write_text(json.dumps(N2))
        lab_down()
        lab_up(3, inventory)
        try:
            sh([str(BIN / "tacc-lab"), "--name", NAME, "fake-hw", "n2", "--gpus", "1"])
            playbook(inventory, "playbooks/site.yml", "-e", json.dumps(SETTINGS))
            alice = Tcloud(researcher_env(NAME, "alice"))
            bob = Tcloud(researcher_env(NAME, "bob"))
            for name, run in (
                ("duration", lambda: bench_duration(alice, work / "d")),
                ("las", lambda: bench_las(alice, bob, work / "l")),
                ("gpu_share", lambda: bench_gpu_share(alice, work / "g")),
                ("elastic", lambda: bench_elastic(alice, work / "e")),
                ("sweep", lambda: bench_sweep(alice, work / "s")),
                ("tiresias", lambda: bench_tiresias(alice, bob, work / "t")),
                ("fluid", lambda: bench_fluid(alice, work / "f")),
                ("oort", lambda: bench_oort(alice, work / "o")),
                ("elastic_resize", lambda: bench_elastic_resize(alice, work / "r")),
                ("elastic_resize_long", lambda: bench_elastic_long(alice, work / "rl", inventory)),
                ("allox", lambda: bench_allox(alice, work / "a", inventory, SETTINGS)),
            ):
                if args.only and name not in args.only:
                    continue
                started = time.monotonic()
                record[name] = run()
                print(
                    f"{name} ({time.monotonic() - started:.0f} s): {json.dumps(record[name])}",
                    flush=True,
                )
        finally:
            lab_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
