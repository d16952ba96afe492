"""Bench row allox: mean job completion time of one-GPU jobs that accept either GPU type,
placed by Slurm alone ("any acceptable type": the first free GPU) and by the allox tick
(AlloX's min-cost matching), on the bench lab with two kinds of FAKE GPU: n2's H100
and an L40S given to n3 here.

The work: two job classes whose speed differs by type, as AlloX's jobs do between CPU
and GPU. "attention" takes 8 s on an h100 and 40 s on an l40s (5x); "conv" 10 s and 11 s.
The program sleeps its class's time on the type it got (TACC_GPU_TYPE, from the
gpu_types plug-in). First one run of each class on each type (the history allox learns
from, as its profile), then 12 jobs at once, 6 of each in a fixed shuffled order, once
without and once with the tick (every 2 s, as the daemon's).

    bench_allox(alice, work, inventory, settings)   from bench/plugins.py (--only allox)
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path

from benchlib import BIN, NAME, node_sh, playbook, sh, ticker
from task_workflow import Tcloud

SECONDS = {"attention": {"h100": 8, "l40s": 40}, "conv": {"h100": 10, "l40s": 11}}
TYPES = ["h100", "l40s"]
JOBS = 12
CONFIG = "/root/allox.yaml"
ALLOX = {"plugins": ["allox"], "state_dir": "/root/allox-bench"}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
RUN = ("python3 -c 'import json, os, time; e = os.environ; "
       "time.sleep(json.loads(e[\"SECONDS_BY_TYPE\"])[e[\"TACC_GPU_TYPE\"]])'")  # fmt: skip


def job_project(root: Path, kind: str, types: list[str]) -> Path:
    root.mkdir(parents=True)
    task = {"name": kind, "run": [RUN],
            "resources": {"nodes": 1, "cpus": 1, "mem": "50M", "gpus_per_node": 1,
                          "gpu_types": types, "time": "10"},
            "environment": {"env": {"SECONDS_BY_TYPE": json.dumps(SECONDS[kind])}}}  # fmt: skip
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def event(info: dict, state: str, last: bool = False) -> float:
    times = [h["time"] for h in info["history"] if h["state"] == state]
    return times[-1] if last else times[0]


def run_jobs(alice: Tcloud, work: Path, kinds: list[tuple[str, list[str]]]) -> list[dict]:
    jobs = [alice.submit(job_project(work / f"{i}-{kind}", kind, types))[0]
            for i, (kind, types) in enumerate(kinds)]  # fmt: skip
    return [alice.wait(job, TERMINAL, 900) for job in jobs]


def figures(infos: list[dict], kinds: list[str]) -> dict:
    jct = [event(i, i["state"], last=True) - event(i, "QUEUED") for i in infos]
    placed = {kind: {t: 0 for t in TYPES} for kind in SECONDS}
    for info, kind in zip(infos, kinds, strict=True):
        got = info.get("plugins", {}).get("gpu_types", "unknown")
        placed[kind][got] = placed[kind].get(got, 0) + 1
    return {"mean_jct_s": round(statistics.mean(jct), 1),
            "makespan_s": round(max(event(i, i["state"], last=True) for i in infos)
                                - min(event(i, "QUEUED") for i in infos), 1),
            "states": sorted({i["state"] for i in infos}), "placed": placed}  # fmt: skip


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
    (inventory.parent / "host_vars" / "n3.yml").write_text(
        json.dumps({"slurm_node_gres": ["gpu:l40s:1"]}))  # fmt: skip
    sh([str(BIN / "tacc-lab"), "--name", NAME, "fake-hw", "n3", "--gpus", "1",
        "--gpu-model", "l40s"])  # fmt: skip
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
    on_infos, log = with_ticks(lambda: run_jobs(alice, work / "on", kinds))
    on = figures(on_infos, order)
    on.update(ticks=log["ticks"], failed_ticks=log["failed_ticks"],
              narrowed=sum(1 for c in log["changes"] if c.startswith("allox: job")))  # fmt: skip
    return {"warm_states": sorted({i["state"] for i in warmed}), "order": order,
            "any_type": off, "allox": on, "seconds": round(time.monotonic() - started),
            "improvement": round(off["mean_jct_s"] / on["mean_jct_s"], 2)}  # fmt: skip
