"""Bench row oort: simulated time to the target accuracy, random participant selection
against Oort's, on examples/federated (200 non-IID clients on heterogeneous devices,
10 per round, FedAvg; the round time is simulated, so the figure is the same on any
machine). The same data (DATA_SEED 1) for every run; SEED 1, 2, 3 vary the selection
and the local SGD order; the row gives the median of each mode and their ratio.

    bench_oort(tcloud, work)   real jobs through tcloud on the bench lab (bench/plugins.py):
                               the example submitted with `plugins: [-oort]` and without,
                               each seed, all at once; fl.json from `tcloud download`
    python bench/plugins_oort.py --local [--seeds 1 2 3]
                               no cluster: train.py run directly, without the library
                               (random) and with it on PYTHONPATH and
                               TACC_PARTICIPANT_SELECTION=oort (what the plug-in sets)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "federated"
PROGRAMLIB = ROOT / "packages" / "plugins" / "tacc_plugins" / "programlib"
SEEDS = (1, 2, 3)
FEDERATED = {
    "clients": 200,
    "per_round": 10,
    "target_accuracy": 0.75,
    "round_deadline_s": 10,
    "max_rounds": 300,
}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def mode_figures(results: list[dict]) -> dict:
    """Median simulated seconds to the target over the runs of one mode. A run that never
    reached it counts with its whole simulated time (a lower bound, and said so)."""
    seconds = [
        r["seconds_to_target"] if r.get("seconds_to_target") is not None else r["simulated_seconds"]
        for r in results
    ]
    return {
        "selector": sorted({r.get("selector", "?") for r in results}),
        "median_seconds_to_target": round(statistics.median(seconds), 1),
        "seconds_to_target": [r.get("seconds_to_target") for r in results],
        "rounds_to_target": [r.get("round_to_target") for r in results],
        "final_accuracy": [r.get("final_accuracy") for r in results],
        "not_reached": sum(1 for r in results if r.get("seconds_to_target") is None),
        "seeds": [r.get("seed") for r in results],
    }


def compare(random_runs: list[dict], oort_runs: list[dict]) -> dict:
    off, on = mode_figures(random_runs), mode_figures(oort_runs)
    ratios = [
        (a.get("seconds_to_target") or a["simulated_seconds"])
        / max(b.get("seconds_to_target") or b["simulated_seconds"], 0.1)
        for a, b in zip(random_runs, oort_runs, strict=True)
    ]
    return {
        "random": off,
        "oort": on,
        "improvement": round(
            off["median_seconds_to_target"] / max(on["median_seconds_to_target"], 0.1), 2
        ),
        "per_seed_ratio": [round(r, 2) for r in ratios],
    }


# ---------------------------------------------------------------- local (no cluster)
def run_local(seed: int, oort: bool) -> dict:
    """train.py as its own process: without the library (random, as with -oort), or with
    what the plug-in gives the job (the library first on PYTHONPATH, the env)."""
    with tempfile.TemporaryDirectory(prefix="oort-bench-") as tmp:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TACC_FL_", "TACC_PARTICIPANT", "TACC_JOB_DIR", "TACC_WORKDIR"))
        }
        env.pop("PYTHONPATH", None)
        env.update(SEED=str(seed), DATA_SEED="1")
        if oort:
            env.update(
                {f"TACC_FL_{k.upper()}": str(v) for k, v in FEDERATED.items()},
                PYTHONPATH=str(PROGRAMLIB),
                TACC_PARTICIPANT_SELECTION="oort",
            )
        output = Path(tmp) / "fl.json"
        subprocess.run(
            [sys.executable, str(EXAMPLE / "train.py"), "--output", str(output)],
            cwd=tmp,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(output.read_text())


def bench_local(seeds: tuple[int, ...] = SEEDS) -> dict:
    return compare([run_local(s, False) for s in seeds], [run_local(s, True) for s in seeds])


# ---------------------------------------------------------------- the bench lab
def project(root: Path, seed: int, on: bool) -> Path:
    """The example with SEED set; off: the same task with `plugins: [-oort]` and without
    the plug-in's `federated:` field (the program's defaults are the same settings)."""
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "train.py", root / "train.py")
    task: dict = {
        "name": "federated-" + ("oort" if on else "random"),
        "code": {"exclude": ["outputs/"]},
        "resources": {"nodes": 1, "cpus": 1, "mem": "500M", "time": "10"},
        "environment": {"requirements": ["numpy"], "env": {"SEED": str(seed), "DATA_SEED": "1"}},
        "federated": FEDERATED,
        "run": ["python3 train.py"],
        "outputs": ["outputs/"],
    }
    if not on:  # federated: is the oort plug-in's field: off, the program's defaults
        del task["federated"]  # (equal to FEDERATED: tests/unit/plugins/test_oort.py)
        task["plugins"] = ["-oort"]
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def bench_oort(tcloud: object, work: Path, seeds: tuple[int, ...] = SEEDS) -> dict:
    """Every (mode, seed) as one job, submitted at once; each job's outputs/fl.json via
    `tcloud download`. `tcloud` is bench/task_workflow.Tcloud."""
    submit = tcloud.submit  # type: ignore[attr-defined]
    jobs = {
        (on, seed): submit(project(work / f"{'on' if on else 'off'}-{seed}", seed, on))[0]
        for on in (False, True)
        for seed in seeds
    }
    results: dict[bool, list[dict]] = {False: [], True: []}
    for (on, seed), job in jobs.items():
        info = tcloud.wait(job, TERMINAL, 900)  # type: ignore[attr-defined]
        if info["state"] != "COMPLETED":
            raise RuntimeError(f"oort bench: job {job} (seed {seed}, on={on}) {info['state']}")
        dest = work / f"download-{job}"
        tcloud.run("download", job, str(dest))  # type: ignore[attr-defined]
        results[on].append(json.loads((dest / "outputs" / "fl.json").read_text()))
    return compare(results[False], results[True])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--local",
        action="store_true",
        required=True,
        help="train.py here, no cluster (lab: bench/plugins.py)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = parser.parse_args()
    result = bench_local(tuple(args.seeds))
    for mode in ("random", "oort"):
        figures = result[mode]
        print(
            f"{mode}: median {figures['median_seconds_to_target']} s (simulated) to "
            f"accuracy {FEDERATED['target_accuracy']}; per seed {figures['seconds_to_target']}"
            f" s, rounds {figures['rounds_to_target']}"
        )
    print(
        f"oort: simulated time to target accuracy, random vs oort: {result['improvement']}x "
        f"(per seed {result['per_seed_ratio']})"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
