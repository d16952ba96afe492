"""Bench row fluid: time to the best result and total trial-seconds, the plain grid
against the adaptive sweep (ASHA, eta 3, rungs 1/3/9), the same grid (3 LR x 3 SEED,
examples/sweep-adaptive/train.py, 9 steps of 1 s) and the same budget (max steps).

Time to best: from the sweep's start to the first report of the grid's best final
value (the best trial's last step). Trial-seconds: the trials' running time, summed.

    bench_fluid(tcloud, work)   real jobs through tcloud on the bench lab (bench/plugins.py)
    python bench/plugins_fluid.py --local --parallel 2
                                no cluster: the trials run as local processes in a fixed
                                number of slots, as a job array with %PARALLEL would
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "sweep-adaptive"
PROGRAMLIB = ROOT / "packages" / "plugins" / "tacc_plugins" / "programlib"
GRID = {"LR": ["0.3", "0.05", "0.01"], "SEED": ["1", "2", "3"]}
ADAPTIVE = {"metric": "accuracy", "mode": "max", "min_steps": 1, "max_steps": 9, "eta": 3}
RUNGS = "1,3,9"
STEP_LINE = re.compile(r"step (\d+)/\d+ .*accuracy=([-0-9.e]+) time=([0-9.]+)")


def trials() -> list[dict[str, str]]:
    return [{"LR": lr, "SEED": seed} for lr in GRID["LR"] for seed in GRID["SEED"]]


def figures(steps: list[list[dict]], spans: list[tuple[float, float]], start: float) -> dict:
    """steps[i]: trial i's reports ({step, accuracy, time}); spans[i]: its (start, end)."""
    finals = [s[-1] for s in steps if s and s[-1]["step"] == ADAPTIVE["max_steps"]]
    best = max(f["accuracy"] for f in finals)
    first_best = min(f["time"] for f in finals if f["accuracy"] == best)
    return {
        "best": best,
        "time_to_best_s": round(first_best - start, 2),
        "trial_seconds": round(sum(end - begin for begin, end in spans), 1),
        "makespan_s": round(max(end for _, end in spans) - start, 2),
        "stopped_early": sum(1 for s in steps if s and s[-1]["step"] < 9),
    }


def compare(plain: dict, adaptive: dict) -> dict:
    return {
        "plain": plain,
        "adaptive": adaptive,
        "time_to_best_ratio": round(plain["time_to_best_s"] / adaptive["time_to_best_s"], 2),
        "trial_seconds_ratio": round(plain["trial_seconds"] / adaptive["trial_seconds"], 2),
        "same_best": plain["best"] == adaptive["best"],
    }


# ---------------------------------------------------------------- local (no cluster)
def run_local(parallel: int, adaptive: bool, step_seconds: float) -> dict:
    """Every trial as a process of its own, at most `parallel` at once, in index order."""
    with tempfile.TemporaryDirectory(prefix="fluid-bench-") as tmp:
        work = Path(tmp)
        shared = work / "fluid"
        start = time.time()

        def one(index: int) -> tuple[list[dict], tuple[float, float]]:
            trial_dir = work / "trials" / str(index)
            (trial_dir / "code").mkdir(parents=True)
            shutil.copy(EXAMPLE / "train.py", trial_dir / "code" / "train.py")
            env = {k: v for k, v in os.environ.items() if not k.startswith("TACC_FLUID")}
            env.pop("PYTHONPATH", None)
            env.update(trials()[index], STEP_SECONDS=str(step_seconds), STEPS="9")
            if adaptive:
                env.update(
                    PYTHONPATH=str(PROGRAMLIB),
                    TACC_FLUID_RUNGS=RUNGS,
                    TACC_FLUID_ETA=str(ADAPTIVE["eta"]),
                    TACC_FLUID_MODE="max",
                    TACC_FLUID_METRIC="accuracy",
                    TACC_FLUID_DIR=str(shared),
                    TACC_FLUID_TRIAL=str(index),
                    TACC_FLUID_TRIAL_DIR=str(trial_dir / "fluid"),
                )
            begin = time.time()
            subprocess.run(
                [sys.executable, "train.py"],
                cwd=trial_dir / "code",
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            end = time.time()
            progress = trial_dir / "code" / "outputs" / "progress.jsonl"
            return [json.loads(line) for line in progress.read_text().splitlines()], (begin, end)

        with ThreadPoolExecutor(parallel) as pool:
            done = list(pool.map(one, range(len(trials()))))
    return figures([d[0] for d in done], [d[1] for d in done], start)


def bench_local(parallel: int, step_seconds: float = 1.0) -> dict:
    return compare(
        run_local(parallel, False, step_seconds), run_local(parallel, True, step_seconds)
    )


# ---------------------------------------------------------------- the bench lab
def project(root: Path, adaptive: bool, parallel: int) -> Path:
    """The example's program, with the adaptive block (and the plug-in) or without."""
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "train.py", root / "train.py")
    # As the example writes them: numbers (SEED an int, which train.py reads with int()).
    sweep: dict = {
        "parameters": {
            "LR": [float(v) for v in GRID["LR"]],
            "SEED": [int(v) for v in GRID["SEED"]],
        },
        "parallel": parallel,
    }
    task: dict = {
        "name": "fluid-" + ("adaptive" if adaptive else "grid"),
        "resources": {"nodes": 1, "cpus": 1, "mem": "100M", "time": "5"},
        "sweep": sweep,
        "run": ["python3 train.py"],
    }
    if adaptive:
        sweep["adaptive"] = ADAPTIVE
        task["plugins"] = ["fluid"]
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def lab_mode(tcloud: object, work: Path, adaptive: bool, parallel: int) -> dict:
    """One sweep through tcloud; the step lines come from each trial's log, the trials'
    running time from their records (RUNNING to their end)."""
    run: Callable = tcloud.run  # type: ignore[attr-defined]
    submitted = run("submit", "--json", "--sweep", str(project(work, adaptive, parallel)))
    job = json.loads(submitted.stdout)["job_id"]
    info = tcloud.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), 600)  # type: ignore[attr-defined]
    if info["state"] != "COMPLETED":
        raise RuntimeError(f"fluid bench: sweep {job} {info['state']}: {info.get('reason')}")
    steps, spans, queued = [], [], []
    for index in range(len(trials())):
        trial = tcloud.status(f"{job}_{index}")  # type: ignore[attr-defined]
        times = {h["state"]: h["time"] for h in trial["history"]}
        queued += [h["time"] for h in trial["history"] if h["state"] == "QUEUED"]
        spans.append((times["RUNNING"], times.get("COMPLETED", times.get(trial["state"], 0.0))))
        log = run("logs", f"{job}_{index}").stdout
        steps.append(
            [
                {"step": int(m[1]), "accuracy": float(m[2]), "time": float(m[3])}
                for m in STEP_LINE.finditer(log)
            ]
        )
    # The sweep's own status lists its trials, not a history: it started when the first
    # trial was queued.
    start = min(queued or [begin for begin, _ in spans])
    return {**figures(steps, spans, start), "state": info["state"]}


def bench_fluid(tcloud: object, work: Path, parallel: int = 2) -> dict:
    """The row for bench/plugins.py: the plain grid, then the adaptive sweep (~3 min)."""
    return compare(
        lab_mode(tcloud, work / "grid", False, parallel),
        lab_mode(tcloud, work / "adaptive", True, parallel),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--local",
        action="store_true",
        required=True,
        help="run the trials as local processes (no cluster)",
    )
    parser.add_argument("--parallel", type=int, default=2, help="trials at once (slots)")
    parser.add_argument("--step-seconds", type=float, default=1.0, help="one step's time")
    args = parser.parse_args()
    if args.parallel < 1 or args.step_seconds <= 0:
        parser.error("--parallel must be >= 1 and --step-seconds > 0")
    print(json.dumps(bench_local(args.parallel, args.step_seconds), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
