"""Bench row allox: mean job completion time of one-GPU jobs that accept any of three
GPU types, placed by Slurm alone ("any acceptable type": the first free GPU), by the
allox tick (AlloX's min-cost matching), and by the tick with placement at submit
(`submit_delay_seconds`: the job begins a few seconds later unless a tick places it
first), on the bench lab with three kinds of FAKE GPU: n2's H100, an L40S given to n3
and a fourth node, n4, added here with an A100 (`tacc-lab up --nodes 4` and a site.yml
re-run: the way ops add a node).

The work: two job classes whose speed differs by type, as AlloX's jobs do between CPU
and GPU. "attention" takes 8 s on an h100, 20 s on an a100 and 40 s on an l40s;
"conv" 10, 11 and 12 s. The program sleeps its class's time on the type it got
(TACC_GPU_TYPE, from the gpu_types plug-in). First one run of each class on each type
(the history allox learns from, as its profile), then 18 jobs at once, 9 of each in a
fixed shuffled order, in each mode (the tick every 2 s, as a daemon's).

    bench_allox(alice, work, inventory, settings)   from bench/plugins.py (--only allox)
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path

from benchlib import BIN, NAME, lab_up, node_sh, playbook, sh, ticker
from task_workflow import Tcloud

SECONDS = {
    "attention": {"h100": 8, "a100": 20, "l40s": 40},
    "conv": {"h100": 10, "a100": 11, "l40s": 12},
}
TYPES = ["h100", "a100", "l40s"]
GIVEN = {"n3": "l40s", "n4": "a100"}  # n2 has its H100 from bench/plugins.py
JOBS = 18
DELAY = 5  # submit_delay_seconds: above the tick's 2 s and its ssh
# Slurm's main scheduler stops at the first job of a partition that cannot start (the
# jobs behind it wait for the backfill pass, every bf_interval: 30 s by default); a job
# narrowed to a busy type is such a job, so allox needs a short pass (docs/plugins.md).
SCHEDULER = ["batch_sched_delay=0", "bf_interval=5"]
CONFIG = "/root/allox.yaml"
ALLOX = {"plugins": ["allox"], "state_dir": "/root/allox-bench"}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
RUN = (
    "python3 -c 'import json, os, time; e = os.environ; "
    'time.sleep(json.loads(e["SECONDS_BY_TYPE"])[e["TACC_GPU_TYPE"]])\''
)


def job_project(root: Path, kind: str, types: list[str]) -> Path:
    root.mkdir(parents=True)
    task = {
        "name": kind,
        "run": [RUN],
        "resources": {
            "nodes": 1,
            "cpus": 1,
            "mem": "50M",
            "gpus_per_node": 1,
            "gpu_types": types,
            "time": "10",
        },
        "environment": {"env": {"SECONDS_BY_TYPE": json.dumps(SECONDS[kind])}},
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def event(info: dict, state: str, last: bool = False) -> float:
    times = [h["time"] for h in info["history"] if h["state"] == state]
    return times[-1] if last else times[0]


def run_jobs(alice: Tcloud, work: Path, kinds: list[tuple[str, list[str]]]) -> list[dict]:
    jobs = [
        alice.submit(job_project(work / f"{i}-{kind}", kind, types))[0]
        for i, (kind, types) in enumerate(kinds)
    ]
    return [alice.wait(job, TERMINAL, 900) for job in jobs]


def figures(infos: list[dict], kinds: list[str]) -> dict:
    jct = [event(i, i["state"], last=True) - event(i, "QUEUED") for i in infos]
    placed = {kind: {t: 0 for t in TYPES} for kind in SECONDS}
    for info, kind in zip(infos, kinds, strict=True):
        got = info.get("plugins", {}).get("gpu_types", "unknown")
        placed[kind][got] = placed[kind].get(got, 0) + 1
    return {
        "mean_jct_s": round(statistics.mean(jct), 1),
        "makespan_s": round(
            max(event(i, i["state"], last=True) for i in infos)
            - min(event(i, "QUEUED") for i in infos),
            1,
        ),
        "states": sorted({i["state"] for i in infos}),
        "placed": placed,
    }


def with_ticks(run):
    """Run `run()` while the allox tick runs every 2 s; (its result, the tick log)."""
    stop = threading.Event()
    log = {"ticks": 0, "failed_ticks": 0, "changes": []}
    thread = threading.Thread(target=ticker, args=(stop, log, CONFIG), daemon=True)
    thread.start()
    try:
        return run(), log
    finally:
        stop.set()
        thread.join()


def bench_allox(alice: Tcloud, work: Path, inventory: Path, settings: dict) -> dict:
    settings = {**settings, "slurm_scheduler_parameters": SCHEDULER}
    lab_up(4, inventory)  # n4 joins the lab; the site.yml run below joins it to Slurm
    for node, kind in GIVEN.items():
        (inventory.parent / "host_vars" / f"{node}.yml").write_text(
            json.dumps({"slurm_node_gres": [f"gpu:{kind}:1"]})
        )
        sh(
            [
                str(BIN / "tacc-lab"),
                "--name",
                NAME,
                "fake-hw",
                node,
                "--gpus",
                "1",
                "--gpu-model",
                kind,
            ]
        )
    playbook(inventory, "playbooks/site.yml", "-e", json.dumps(settings))
    node_sh("n1", f"rm -rf {ALLOX['state_dir']}; printf '%s\\n' '{json.dumps(ALLOX)}' > {CONFIG}")
    # The history: each class once on each type (one type each, so Slurm has no choice).
    warm = [(kind, [t]) for kind in SECONDS for t in TYPES]
    warmed, _ = with_ticks(lambda: run_jobs(alice, work / "warm", warm))
    order = ["attention", "conv"] * (JOBS // 2)
    random.Random(4).shuffle(order)  # noqa: S311  (a fixed order, not a secret)
    kinds = [(kind, TYPES) for kind in order]
    started = time.monotonic()
    off = figures(run_jobs(alice, work / "off", kinds), order)
    on = ticked(alice, work / "on", kinds, order)
    # Placement at submit: the login node's agent runs allox's submit hook.
    agent = {"plugins": ["allox"], "plugin_settings": {"allox": {"submit_delay_seconds": DELAY}}}
    at_submit = {**settings, "tacc_agent_settings": agent}
    playbook(inventory, "playbooks/site.yml", "-e", json.dumps(at_submit))
    delayed = ticked(alice, work / "delayed", kinds, order)
    return {
        "warm_states": sorted({i["state"] for i in warmed}),
        "order": order,
        "any_type": off,
        "allox": on,
        "allox_submit_delay": delayed,
        "seconds": round(time.monotonic() - started),
        "improvement": round(off["mean_jct_s"] / on["mean_jct_s"], 2),
        "improvement_submit_delay": round(off["mean_jct_s"] / delayed["mean_jct_s"], 2),
    }


def ticked(alice: Tcloud, work: Path, kinds: list[tuple[str, list[str]]], order: list[str]) -> dict:
    infos, log = with_ticks(lambda: run_jobs(alice, work, kinds))
    found = figures(infos, order)
    early = [c for c in log["changes"] if c.endswith("starts without its submit delay")]
    found.update(
        ticks=log["ticks"],
        failed_ticks=log["failed_ticks"],
        narrowed=sum(1 for c in log["changes"] if "(est." in c),
        started_early=len(early),
    )
    return found
