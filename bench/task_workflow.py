#!/usr/bin/env python3
"""Measure the scheduling and execution layers on the bench lab (issue [5]), each next
to a baseline run side by side: plain `sbatch` over ssh.

1. submit -> RUNNING latency of a 1-node job on an idle cluster, median of N: tcloud
   (compile, delta upload, submit, environment and rank start) against
   `ssh login sbatch --wrap` polled with squeue until RUNNING.
2. a line printed by a rank -> visible in `tcloud logs -f` (target <= 1 s).
3. K concurrent submissions of a 10 s task (K = 10, 20, 40): end-to-end completion
   time (submit start -> job's final state), mean / min / max / stdev, as in the FfDL
   paper's Table 1; the lab's compute nodes are declared with enough CPUs that all fit.

4. with --steps: where the time of one submit goes (bench/submit_steps.py), from the
   client's TCLOUD_TIMING lines, the job's own marks (status/timing/), slurmctld's and
   slurmd's logs: median per step of single submits and of K concurrent ones, next to
   plain sbatch's.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python bench/task_workflow.py [--samples 10] [--concurrency 10 20 40] \
        [--steps | --only-steps] [--lab NAME] [--json PATH]
Uses the bench lab (10.77.7.0/24, 3 nodes) and removes it at the end; with --lab, a lab
that is up instead (left up, not converged: declare its CPUs as DECLARED does first).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import submit_steps
from benchlib import (
    BIN,
    NAME,
    Record,
    add_json_argument,
    compile_packages,
    lab_down,
    lab_up,
    playbook,
    summary,
)

from tacc_lab.demo import researcher_env

# Declared in slurm.conf so that 100 one-CPU, 50 MB tasks fit on the 2 compute nodes at
# once; config_overrides makes slurmd accept more CPUs and memory than the node has.
DECLARED = {
    "slurm_node_cpus": 50,
    "slurm_node_memory_mb": 8192,
    "slurm_extra_config": {"AuthInfo": "cred_expire=20", "SlurmdParameters": "config_overrides"},
}
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


class Tcloud:
    def __init__(self, env: dict[str, str]) -> None:
        import os

        self.env = {**os.environ, **env}

    def run(
        self, *argv: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(BIN / "tcloud"), *argv],
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"tcloud {' '.join(argv)}: {proc.stderr.strip()}")
        return proc

    def submit(
        self, project: Path, retries: int = 3, env: dict[str, str] | None = None
    ) -> tuple[str, int]:
        """(job id, retries needed): sshd refuses some of many simultaneous logins."""
        for attempt in range(retries + 1):
            proc = self.run("submit", "--json", str(project), check=attempt == retries, env=env)
            if proc.returncode == 0:
                return json.loads(proc.stdout)["job_id"], attempt
            time.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    def status(self, job: str) -> dict:
        return json.loads(self.run("status", "--json", job).stdout)

    def wait(self, job: str, states: tuple[str, ...], timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        while (info := self.status(job))["state"] not in states:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} stuck in {info['state']}")
            time.sleep(0.2)
        return info


def event_time(info: dict, state: str) -> float:
    return next(h["time"] for h in info["history"] if h["state"] == state)


def task(root: Path, name: str, run: str, time_limit: str = "5") -> Path:
    root.mkdir(parents=True)
    (root / "tcloud.yaml").write_text(
        json.dumps(
            {
                "name": name,
                "run": [run],
                "resources": {"nodes": 1, "cpus": 1, "mem": "50M", "time": time_limit},
            }
        )
    )
    return root


LAB = {"name": NAME}  # the lab the bench drives (--lab)


def login_sh(script: str, retries: int = 3, node: str = "login1") -> str:
    """A command on the login node over ssh (retried if sshd drops the connection)."""
    for attempt in range(retries + 1):
        proc = subprocess.run(
            [
                str(BIN / "tacc-lab"),
                "--name",
                LAB["name"],
                "ssh",
                node,
                shlex.join(["sh", "-c", script]),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode == 0:
            return proc.stdout
        if attempt == retries:
            raise RuntimeError(f"{node}: {script}: {proc.stderr.strip()}")
        time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


# Slurm's scheduler takes a submitted job up at what is a one-second tick on the bench lab
# (PENDING, reason None, for 0 to 1 s: issue [23]); samples taken at a steady pace land on
# one phase of it run after run, a different one for each side. Each sample of either side
# starts at a random point of that second instead (seeded: a run can be repeated).
PHASE = random.Random(23)  # noqa: S311 - a sampling phase, not a secret


def random_phase() -> None:
    time.sleep(PHASE.uniform(0.0, 1.0))


def baseline_submit_to_running() -> float:
    start = time.time()
    job = login_sh("sbatch --parsable -N1 -c1 --mem=50M --wrap 'sleep 2'").strip()
    while login_sh(f"squeue -h -j {job} -o %T").strip() != "RUNNING":
        time.sleep(0.05)
    seconds = time.time() - start
    while login_sh(f"squeue -h -j {job}").strip():
        time.sleep(0.2)
    return seconds


def submit_to_running(tcloud: Tcloud, work: Path, samples: int) -> dict:
    ours, theirs = [], []
    project = task(work / "latency", "latency", "sleep 1")
    for _ in range(samples):
        random_phase()
        start = time.time()
        job, _ = tcloud.submit(project)
        info = tcloud.wait(job, TERMINAL)
        ours.append(event_time(info, "RUNNING") - start)
        random_phase()
        theirs.append(baseline_submit_to_running())
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"submit -> RUNNING, 1 node, median of {samples}:")
    print(f"  tcloud submit        {a:6.2f} s  (min {min(ours):.2f}, max {max(ours):.2f})")
    print(f"  ssh sbatch (base)    {b:6.2f} s  (min {min(theirs):.2f}, max {max(theirs):.2f})")
    print(f"  ratio                {a / b:6.2f}x")
    return {"tcloud": summary(ours), "sbatch": summary(theirs), "ratio": a / b}


def log_latency(tcloud: Tcloud, work: Path) -> dict:
    run = (
        "for i in $(seq 40); do python3 -c 'import time; print(\"tick\", time.time())'; "
        "sleep 0.25; done"
    )
    job, _ = tcloud.submit(task(work / "ticks", "ticks", run))
    follower = subprocess.Popen(
        [str(BIN / "tcloud"), "logs", "-f", job], env=tcloud.env, stdout=subprocess.PIPE, text=True
    )
    delays = []
    for line in follower.stdout:  # type: ignore[union-attr]
        words = line.split()
        if len(words) == 3 and words[1] == "tick":
            delays.append(time.time() - float(words[2]))
    follower.wait()
    delays.sort()
    p95 = delays[int(len(delays) * 0.95) - 1]
    print(f"rank prints a line -> `tcloud logs -f` shows it ({len(delays)} lines):")
    print(
        f"  median {statistics.median(delays):.3f} s, p95 {p95:.3f} s, max {max(delays):.3f} s"
        "  (target <= 1 s)"
    )
    return {
        "lines": len(delays),
        "median_s": statistics.median(delays),
        "p95_s": p95,
        "max_s": max(delays),
        "target_s": 1.0,
    }


def concurrent(tcloud: Tcloud, work: Path, count: int) -> dict:
    project = task(work / f"c{count}", f"c{count}", "sleep 10")
    starts: dict[str, float] = {}
    retries = []
    lock = threading.Lock()

    def one(_: int) -> str:
        start = time.time()
        job, tries = tcloud.submit(project)
        with lock:
            starts[job] = start
            retries.append(tries)
        return job

    with ThreadPoolExecutor(max_workers=count) as pool:
        jobs = list(pool.map(one, range(count)))
    done = {job: tcloud.wait(job, TERMINAL, 600) for job in jobs}
    failed = [j for j, info in done.items() if info["state"] != "COMPLETED"]
    times = [event_time(info, info["state"]) - starts[job] for job, info in done.items()]
    base = baseline_concurrent(count)
    ours, theirs = summary(times), summary(base)
    print(
        f"{count:3d} concurrent 10 s tasks: tcloud mean {ours['mean']:6.2f} s "
        f"min {ours['min']:6.2f} max {ours['max']:6.2f} stdev {ours['stdev']:5.2f}"
        f"  | sbatch mean {theirs['mean']:6.2f} min {theirs['min']:6.2f} "
        f"max {theirs['max']:6.2f} stdev {theirs['stdev']:5.2f}"
        f"  | ratio {ours['mean'] / theirs['mean']:.2f}x"
        f"  (failed {len(failed)}, ssh retries {sum(retries)})"
    )
    return {
        "k": count,
        "tcloud": ours,
        "sbatch": theirs,
        "ratio": ours["mean"] / theirs["mean"],
        "failed": len(failed),
        "ssh_retries": sum(retries),
    }


def baseline_concurrent(count: int) -> list[float]:
    """The same K tasks as plain sbatch --wrap over one ssh each, completion by polling."""
    starts, jobs = {}, []
    lock = threading.Lock()

    def one(_: int) -> None:
        start = time.time()
        job = login_sh("sbatch --parsable -N1 -c1 --mem=50M --wrap 'sleep 10'").strip()
        with lock:
            starts[job] = start
            jobs.append(job)

    with ThreadPoolExecutor(max_workers=count) as pool:
        list(pool.map(one, range(count)))
    ends: dict[str, float] = {}
    while len(ends) < count:
        queued = set(login_sh("squeue -h -o %i").split())
        now = time.time()
        for job in jobs:
            if job not in queued and job not in ends:
                ends[job] = now
        time.sleep(0.2)
    return [ends[job] - starts[job] for job in jobs]


# ---------------------------------------------------------------- --steps
CONTROLLER = "n1"  # the lab's slurmctld, also its NFS server (/shared read there is current)
BASELINE_OUT = "/shared/bench-steps"
READ_MARKS = """
import json, pathlib, sys
dirs = json.loads(sys.argv[1])
print(json.dumps({job: {p.stem: json.loads(p.read_text())
                        for p in pathlib.Path(d, "status", "timing").glob("*.json")}
                  for job, d in dirs.items()}))
"""


def timed_submit(tcloud: Tcloud, project: Path, timing_file: Path) -> dict:
    """One `tcloud submit` with TCLOUD_TIMING: its launch and exit, its steps."""
    launch = time.time()
    job, retries = tcloud.submit(project, env={"TCLOUD_TIMING": str(timing_file)})
    end = time.time()
    lines = timing_file.read_text().splitlines() if timing_file.exists() else []
    return {
        "job": job,
        "retries": retries,
        "points": {"launch": launch, "exit": end},
        "client": [json.loads(line) for line in lines],
    }


def timed_sbatch(sleep: int) -> dict:
    """Plain sbatch over ssh; its batch script prints the time first."""
    launch = time.time()
    job = login_sh(
        f"sbatch --parsable -N1 -c1 --mem=50M -o {BASELINE_OUT}/%j.out "
        f"--wrap 'date +%s.%N; sleep {sleep}'"
    ).strip()
    return {"job": job, "points": {"launch": launch}}


def wait_sbatch(samples: list[dict]) -> None:
    jobs = {s["job"] for s in samples}
    while jobs & set(login_sh("squeue -h -o %i").split()):
        time.sleep(0.2)


def slurm_logs() -> dict[str, dict]:
    ctld = login_sh(
        submit_steps.CTLD_GREP + "/var/log/slurm/slurmctld.log || true", node=CONTROLLER
    )
    nodes = sorted(set(login_sh("sinfo -h -N -o %N", node=CONTROLLER).split()))
    slurmd = "".join(
        login_sh(submit_steps.SLURMD_GREP + "/var/log/slurm/slurmd.log || true", node=node)
        for node in nodes
    )
    return submit_steps.slurm_points(ctld, slurmd)


def cluster_points(tcloud: Tcloud, samples: list[dict], slurm: dict[str, dict]) -> None:
    """Each finished tcloud sample's points from its record, its marks and Slurm's logs."""
    infos = {s["job"]: tcloud.status(s["job"]) for s in samples}
    dirs = {job: info["workdir"] for job, info in infos.items()}
    script = shlex.join(["python3", "-c", READ_MARKS, json.dumps(dirs)])
    marks = json.loads(login_sh(script, node=CONTROLLER))
    for sample in samples:
        job, points = sample["job"], sample["points"]
        for state in ("QUEUED", "RUNNING"):
            with contextlib.suppress(StopIteration):
                points[state.lower()] = event_time(infos[job], state)
        sample["state"] = infos[job]["state"]
        for who, found in marks.get(job, {}).items():
            points |= {f"{who}.{name}": value for name, value in found.items()}
        points |= {k: v for k, v in slurm.get(job, {}).items() if k != "by"}
        sample["by"] = slurm.get(job, {}).get("by")


def baseline_points(samples: list[dict], slurm: dict[str, dict]) -> None:
    jobs = " ".join(f"{BASELINE_OUT}/{s['job']}.out" for s in samples)
    out = login_sh(f'for f in {jobs}; do echo "$f $(head -1 $f)"; done', node=CONTROLLER)
    first = {Path(f).stem: float(t) for f, t in (line.split() for line in out.splitlines())}
    for sample in samples:
        sample["points"] |= {k: v for k, v in slurm.get(sample["job"], {}).items() if k != "by"}
        sample["points"]["first_line"] = first[sample["job"]]
        sample["by"] = slurm.get(sample["job"], {}).get("by")


def steps_run(
    tcloud: Tcloud, work: Path, count: int, sleep: int, rounds: int = 1
) -> tuple[list[dict], list[dict]]:
    """`count` submits at once (tcloud, then plain sbatch), `rounds` times."""
    project = task(
        work / f"steps-{count}-{sleep}",
        f"steps{count}",
        f"echo first; sleep {sleep}",
        time_limit="5",
    )
    ours: list[dict] = []
    theirs: list[dict] = []
    for round_ in range(rounds):
        timing = work / f"timing-{count}-{round_}"
        timing.mkdir()
        with ThreadPoolExecutor(max_workers=count) as pool:
            files = [timing / f"{i}.jsonl" for i in range(count)]
            batch = list(pool.map(lambda file: timed_submit(tcloud, project, file), files))
        for sample in batch:
            tcloud.wait(sample["job"], TERMINAL, 600)
        with ThreadPoolExecutor(max_workers=count) as pool:
            base = list(pool.map(lambda _: timed_sbatch(sleep), range(count)))
        wait_sbatch(base)
        ours += batch
        theirs += base
    slurm = slurm_logs()
    cluster_points(tcloud, ours, slurm)
    baseline_points(theirs, slurm)
    return ours, theirs


def steps(tcloud: Tcloud, work: Path, samples: int, concurrency: list[int]) -> dict:
    """The per-step split: `samples` single submits (each followed by a plain sbatch),
    then each K of `concurrency` at once; median per step, printed as a table."""
    login_sh(f"mkdir -p {BASELINE_OUT} && chmod 1777 {BASELINE_OUT}", node=CONTROLLER)
    runs = {"1": steps_run(tcloud, work, 1, 1, rounds=samples)}
    for count in concurrency:
        runs[str(count)] = steps_run(tcloud, work, count, 10)
    columns: dict[str, dict[str, float]] = {}
    result = {}
    for count, (ours, theirs) in runs.items():
        label = "1 at a time" if count == "1" else f"{count} at once"
        columns[f"tcloud, {label}"] = submit_steps.medians([submit_steps.split(s) for s in ours])
        columns[f"sbatch, {label}"] = submit_steps.medians(
            [submit_steps.baseline_split(s) for s in theirs]
        )
        result[count] = {
            "tcloud": ours,
            "sbatch": theirs,
            "ssh_retries": sum(s["retries"] for s in ours),
            "failed": sum(s["state"] != "COMPLETED" for s in ours),
        }
    print(f"where a submit's time goes, median seconds per step ({samples} single samples):")
    print(submit_steps.table(columns))
    for count, found in result.items():
        print(f"  K={count}: ssh retries {found['ssh_retries']}, failed {found['failed']}")
    result["table"] = columns
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--concurrency", type=int, nargs="*", default=[10, 20, 40])
    parser.add_argument("--keep", action="store_true", help="leave the bench lab up")
    parser.add_argument(
        "--steps", action="store_true", help="also the per-step split of a submit (1 and K at once)"
    )
    parser.add_argument(
        "--only-steps", action="store_true", help="only the per-step split (no other rows)"
    )
    parser.add_argument("--lab", help="use this lab, already up, instead of the bench lab")
    add_json_argument(parser)
    args = parser.parse_args()
    compile_packages()  # tcloud starts as an installed one does (benchlib)
    LAB["name"] = args.lab or NAME
    with (
        Record(args.json, nodes=3, samples=args.samples, task_s=10) as out,
        tempfile.TemporaryDirectory() as tmp,
    ):
        work = Path(tmp)
        inventory = work / "hosts.yml"
        if not args.lab:
            lab_down()
            lab_up(3, inventory)
        try:
            if not args.lab:
                playbook(inventory, "playbooks/site.yml", "-e", json.dumps(DECLARED))
            tcloud = Tcloud(researcher_env(LAB["name"], "alice"))
            tcloud.wait(tcloud.submit(task(work / "warm", "warm", "true"))[0], TERMINAL)
            if not args.only_steps:
                out["submit_to_running"] = submit_to_running(tcloud, work, args.samples)
                out["log_latency"] = log_latency(tcloud, work)
                out["concurrency"] = []
                for count in args.concurrency:
                    out["concurrency"] = [*out["concurrency"], concurrent(tcloud, work, count)]
            if args.steps or args.only_steps:
                # The split's K: the largest of --concurrency (40 in the report's run).
                largest = [max(args.concurrency)] if args.concurrency else []
                ks = args.concurrency if args.only_steps else largest
                out["steps"] = steps(tcloud, work, args.samples, ks)
        finally:
            if not (args.keep or args.lab):
                lab_down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
