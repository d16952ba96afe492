"""Bench row elastic (resize): node utilization and mean wait of a stream of jobs with a
fixed amount of work, at fixed sizes and with running-job resizing (issue [16] item 5),
on the bench lab's two compute nodes.

The work: 3 "train" jobs of 60 node-seconds each (a program that does `nodes` units a
second, saves at the checkpoint signal and resumes from it), arriving 25 s apart, and
2 one-node "eval" jobs of 10 s arriving between them. Modes: every train job at
`nodes: 1`, at `nodes: 2`, and `nodes: 1-2` with `resize: true` while the controller's
tick (every 2 s, elastic resizing on) grows and shrinks them; and `nodes: 1-2` sized at
submit only (what resizing adds beyond it). Figures: makespan and useful node
utilization (the work done / (2 nodes x makespan)), mean wait (every pending stretch,
after each requeue too) and mean completion time. The program's checkpoint loses no
work, so a real program's resize costs more (the work since its last checkpoint).

    bench_elastic_resize(alice, work)   from bench/plugins.py (--only elastic_resize)

The long stream (`--only elastic_resize_long`, issue [16]'s break-even question): the
same shape with work of 240 node-seconds, arrivals 100 s apart and evals of 40 s, on
Slurm's default credential lifetime (cred_expire 120 s, which a requeued job waits out
before it starts again): a resize costs the same, the jobs it pays on are 4x longer.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from benchlib import node_sh, ticker
from task_workflow import Tcloud

NODES = 2


@dataclass(frozen=True)
class Stream:
    train_work: int  # node-seconds a train job needs
    train_jobs: int
    arrival_gap: int  # seconds between train jobs
    eval_seconds: int
    eval_at: tuple[int, ...]  # when each eval arrives


SHORT = Stream(60, 3, 25, 10, (12, 37))
LONG = Stream(240, 3, 100, 40, (50, 150))
CONFIG = "/root/elastic.yaml"
RESIZE = {
    "state_dir": "/root/elastic-bench",
    "plugin_settings": {
        "elastic": {
            "resize": True,
            "grow_after_seconds": 4,
            "shrink_after_seconds": 4,
            "min_run_seconds": 5,
            "cooldown_seconds": 10,
        }
    },
}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
# `nodes` units of work a second; the count saved at the checkpoint signal, resumed.
PROGRAM = """import os, pathlib, signal, sys, time
saved = pathlib.Path(os.environ["TACC_WORKDIR"]) / "outputs" / "done"
nodes = int(os.environ.get("TACC_NUM_NODES", "1"))
done = float(saved.read_text()) if saved.exists() else 0.0
def checkpoint(*_):
    saved.parent.mkdir(exist_ok=True)
    saved.write_text(str(done))
    sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
print(f"start at {done} on {nodes} node(s)", flush=True)
while done < float(os.environ["WORK"]):
    time.sleep(1)
    done += nodes
"""


def train_project(root: Path, nodes: str, resize: bool, stream: Stream) -> Path:
    root.mkdir(parents=True)
    (root / "work.py").write_text(PROGRAM)
    size: int | str = int(nodes) if nodes.isdigit() else nodes  # a count, or a range "1-2"
    resources = {
        "nodes": size,
        "cpus": 4,
        "mem": "50M",
        "time": "15",
        **({"resize": True} if resize else {}),
    }
    env = {"WORK": str(stream.train_work)}
    task = {
        "name": "train",
        "run": ["python3 work.py"],
        "outputs": ["outputs/"],
        "resources": resources,
        "environment": {"env": env},
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def eval_project(root: Path, stream: Stream) -> Path:
    root.mkdir(parents=True)
    task = {
        "name": "eval",
        "run": [f"sleep {stream.eval_seconds}"],
        "resources": {"nodes": 1, "cpus": 4, "mem": "50M", "time": "5"},
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def event(info: dict, state: str, last: bool = False) -> float:
    times = [h["time"] for h in info["history"] if h["state"] == state]
    return times[-1] if last else times[0]


def pending_seconds(info: dict) -> float:
    """Every stretch the job waited: from QUEUED to the next RUNNING, after each requeue
    too (a resize's wait shows here, not only its first start)."""
    total, since = 0.0, None
    for entry in info["history"]:
        if entry["state"] == "QUEUED" and since is None:
            since = entry["time"]
        elif entry["state"] == "RUNNING" and since is not None:
            total, since = total + entry["time"] - since, None
    return total


def run_mode(alice: Tcloud, work: Path, nodes: str, resize: bool, stream: Stream) -> dict:
    """The stream: each job submitted at its own time from its own thread (a slow
    submit does not push the next one), then every job waited for by one deadline."""
    arrivals = sorted(
        [(i * stream.arrival_gap, "train", i) for i in range(stream.train_jobs)]
        + [(at, "eval", i) for i, at in enumerate(stream.eval_at)]
    )
    start = time.monotonic()

    def submit(at: float, kind: str, index: int) -> tuple[str, str]:
        root = work / f"{kind}-{index}"
        project = (
            train_project(root, nodes, resize, stream)
            if kind == "train"
            else eval_project(root, stream)
        )
        time.sleep(max(0.0, at - (time.monotonic() - start)))
        return kind, alice.submit(project)[0]

    with ThreadPoolExecutor(len(arrivals)) as pool:
        jobs = list(pool.map(lambda a: submit(*a), arrivals))
    deadline = time.monotonic() + 900 + 4 * stream.train_work
    infos = [
        (kind, alice.wait(job, TERMINAL, max(1.0, deadline - time.monotonic())))
        for kind, job in jobs
    ]
    first = min(event(info, "QUEUED") for _, info in infos)
    end = max(event(info, info["state"], last=True) for _, info in infos)
    makespan = end - first
    useful = stream.train_jobs * stream.train_work + len(stream.eval_at) * stream.eval_seconds
    waits = [pending_seconds(info) for _, info in infos]
    jct = [event(info, info["state"], last=True) - event(info, "QUEUED") for _, info in infos]
    return {
        "makespan_s": round(makespan, 1),
        "utilization": round(useful / (NODES * makespan), 3),
        "mean_wait_s": round(statistics.mean(waits), 1),
        "mean_jct_s": round(statistics.mean(jct), 1),
        "states": sorted({info["state"] for _, info in infos}),
        "halts": sum(1 for _, info in infos for h in info["history"] if h["state"] == "HALTED"),
    }


def bench_elastic_resize(alice: Tcloud, work: Path, stream: Stream = SHORT) -> dict:
    node_sh("n1", f"rm -rf /root/elastic-bench; printf '%s\\n' '{json.dumps(RESIZE)}' > {CONFIG}")
    result = {
        "fixed_1": run_mode(alice, work / "one", "1", False, stream),
        "fixed_2": run_mode(alice, work / "two", "2", False, stream),
        # A range sized at submit only: what resizing adds beyond it.
        "range_at_submit": run_mode(alice, work / "range", "1-2", False, stream),
    }
    stop = threading.Event()
    log = {"ticks": 0, "failed_ticks": 0, "changes": []}
    thread = threading.Thread(target=ticker, args=(stop, log, CONFIG), daemon=True)
    thread.start()
    try:
        resized = run_mode(alice, work / "resize", "1-2", True, stream)
    finally:
        stop.set()
        thread.join()
    resized["resizes"] = [c for c in log["changes"] if c.startswith("elastic:")]
    resized["failed_ticks"] = log["failed_ticks"]
    result["resize"] = resized
    for mode in ("fixed_1", "fixed_2", "range_at_submit"):
        result[f"makespan_ratio_{mode}"] = round(
            result[mode]["makespan_s"] / resized["makespan_s"], 2
        )
        result[f"wait_ratio_{mode}"] = round(
            result[mode]["mean_wait_s"] / max(resized["mean_wait_s"], 0.1), 2
        )
    return result
