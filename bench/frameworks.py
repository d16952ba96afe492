#!/usr/bin/env python3
"""Measure issue [9] on the bench lab: the PyTorch task's environment build through the
cluster package cache, and submit -> first training step.

1. Environment build of examples/pytorch-ddp's requirements on a compute node, as a
   researcher, each with an empty local wheel cache:
   a. cold package cache (an empty devpi directory): uv, as the agent builds it;
   b. a fresh lab (down, up, site.yml) on the now warm package cache: uv and pip side
      by side in one run (the same index, the same requirements, alternating).
2. `tcloud submit examples/pytorch-ddp` -> rank 0's first training step in `tcloud logs`,
   environment already cached (a second submit of the same task), median of N, side by
   side with its baseline (issue [23]): a plain `sbatch` as alice of the same train.py
   through torchrun on the same two nodes, in that same ready environment on the same
   shared storage, the first step polled in its output file as often.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python bench/frameworks.py [--runs 3] [--samples 3] [--json PATH]
    .venv/bin/python bench/frameworks.py --cached-only [--samples 5]
Uses the bench lab (10.77.7.0/24, 3 nodes) with a package cache directory of its own
(removed at the end, so the cold row is cold) and removes the lab at the end.
`--cached-only` measures step 2 alone on the bench lab already up and converged (as
docs/bench.md sets it up) and leaves it up. The nodes must run Debian 12 (the full run
boots them so; for --cached-only, boot the lab with TACC_LAB_OS=bookworm): the CPU
build of torch the lab's package cache is seeded with is the wheel on this machine, for
its Python 3.11, and PyPI has no CPU build.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import (
    BIN,
    NAME,
    ROOT,
    Record,
    add_json_argument,
    lab_down,
    lab_up,
    node_sh,
    playbook,
    summary,
)

from tacc_lab.demo import researcher_env

EXAMPLE = ROOT / "examples/pytorch-ddp"
INDEX = "http://n1:3141/tacc/cluster/+simple/"
UV = "/opt/tacc-agent/venv/bin/uv"


def requirements() -> list[str]:
    task = yaml.safe_load((EXAMPLE / "tcloud.yaml").read_text())
    return task["environment"]["requirements"]


def timed_build(tool: str, tag: str) -> float:
    """Seconds to build the example's environment on n2 as alice with `tool`, from an
    empty local wheel cache, through the package cache."""
    base = f"/tmp/bench-{tool}-{tag}"
    reqs = " ".join(shlex.quote(r) for r in requirements())
    if tool == "uv":
        build = (
            f"{UV} venv -q --python /usr/bin/python3 {base}/env && "
            f"UV_CACHE_DIR={base}/cache {UV} pip install -q --python {base}/env/bin/python "
            f"--index-url {INDEX} {reqs}"
        )
    else:
        build = (
            f"/usr/bin/python3 -m venv {base}/env && "
            f"PIP_CACHE_DIR={base}/cache {base}/env/bin/pip install -q "
            f"--disable-pip-version-check --index-url {INDEX} {reqs}"
        )
        # The lab's pip.conf names the egress proxy, which pip then uses even for n1
        # (pip reads no_proxy only without a configured proxy); the cache is plain HTTP.
        build = build.replace(" install -q ", " install -q --proxy= --trusted-host n1 ")
    # All as alice (the directory too, so the build can write it); a failed build fails
    # the bench with its output (sh() exits on a non-zero status).
    script = (
        f"rm -rf {base}; mkdir -p {base}; s=$(date +%s.%N); {build} >&2 || exit 1; "
        f'e=$(date +%s.%N); echo "$s $e"; rm -rf {base}'
    )
    command = f"cd /tmp && runuser -u alice -- sh -c {shlex.quote(script)}"
    started, ended = node_sh("n2", command).split()[-2:]
    return float(ended) - float(started)


def provision(inventory: Path, cache: Path) -> float:
    start = time.monotonic()
    # Debian 12 nodes unless told: their Python 3.11 is the seeded torch wheel's (above).
    release = os.environ.get("TACC_LAB_OS", "bookworm")
    lab_up(3, inventory, {"TACC_LAB_PACKAGE_CACHE": str(cache), "TACC_LAB_OS": release})
    playbook(inventory, "playbooks/site.yml")
    return time.monotonic() - start


FIRST_STEP = re.compile(r"^\[n\d+:0\] epoch 1 first step: loss", re.M)
BASE_FIRST_STEP = re.compile(r"^epoch 1 first step: loss", re.M)
POLL = 0.5  # seconds between two looks at the log, either side


def first_step_seconds(env: dict[str, str], cwd: Path) -> tuple[float, str]:
    def tcloud(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "tcloud"), *argv],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
        )

    start = time.monotonic()
    proc = tcloud("submit", "--json", str(EXAMPLE))
    if proc.returncode != 0:
        raise SystemExit(f"bench: submit failed: {proc.stderr}")
    job = json.loads(proc.stdout)["job_id"]
    deadline = start + 900
    while time.monotonic() < deadline:
        log = tcloud("logs", job).stdout
        if FIRST_STEP.search(log):
            seconds = time.monotonic() - start
            tcloud("cancel", job)
            return seconds, job
        time.sleep(POLL)
    raise SystemExit(f"bench: job {job} logged no first step in 900 s:\n{log[-3000:]}")


def as_alice(node: str, script: str) -> str:
    return node_sh(node, f"cd /tmp && runuser -u alice -- sh -c {shlex.quote(script)}")


def ready_environment() -> str:
    """The environment tcloud's jobs built and cached for the example (its requirements'
    digest under alice's workspace), found by its record."""
    found = as_alice(
        "login1",
        "grep -l '\"torch==' /shared/tcloud/alice/envs/*/tacc-env.json 2>/dev/null"
        " | head -n 1 | xargs -r dirname",
    ).strip()
    if not found:
        raise SystemExit("bench: no cached environment of the example under alice's envs")
    return found


def baseline_setup(env_dir: str) -> str:
    """The example's code on the same shared storage and a batch script that starts
    train.py as the task does (2 nodes, torchrun with 2 processes each, the same CPUs and
    memory), in the ready environment. Returns the script's path."""
    task = yaml.safe_load((EXAMPLE / "tcloud.yaml").read_text())
    res = task["resources"]
    base = "/shared/tcloud/alice/bench-baseline"
    per_node = int(res["processes_per_node"])
    torchrun = (
        f"{env_dir}/bin/torchrun --nnodes={res['nodes']} --nproc-per-node={per_node} "
        '--node-rank=$SLURM_NODEID --master-addr="$head" --master-port=29555 '
        + f"{base}/code/{task['run'][0]}"
    )
    script = "\n".join(
        [
            "#!/bin/bash",
            f"#SBATCH --nodes={res['nodes']} --ntasks-per-node=1",
            f"#SBATCH --cpus-per-task={int(res['cpus']) * per_node} --mem={res['mem']}",
            f"#SBATCH --time=30 --output={base}/slurm-%j.out",
            # Each job in a directory of its own, as each tcloud job is: train.py resumes
            # from a checkpoint it finds in outputs/.
            f'mkdir {base}/run-"$SLURM_JOB_ID" && cd {base}/run-"$SLURM_JOB_ID"',
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"export head; srun bash -c {shlex.quote('exec ' + torchrun)}",
            "",
        ]
    )
    code = (EXAMPLE / "train.py").read_text()
    as_alice(
        "login1",
        f"rm -rf {base} && mkdir -p {base}/code && "
        f"printf %s {shlex.quote(code)} > {base}/code/train.py && "
        f"printf %s {shlex.quote(script)} > {base}/job.sh",
    )
    return f"{base}/job.sh"


def baseline_first_step_seconds(job_script: str) -> float:
    """`sbatch` as alice on the login node -> the first step's line in the job's output,
    polled every POLL seconds as tcloud's logs are."""
    start = time.monotonic()
    job = as_alice("login1", f"sbatch --parsable {job_script}").strip().split(";")[0]
    out = f"{Path(job_script).parent}/slurm-{job}.out"
    deadline = start + 900
    text = ""
    while time.monotonic() < deadline:
        text = as_alice("login1", f"cat {out} 2>/dev/null; true")
        if BASE_FIRST_STEP.search(text):
            seconds = time.monotonic() - start
            as_alice("login1", f"scancel {job}")
            return seconds
        time.sleep(POLL)
    raise SystemExit(f"bench: baseline job {job} logged no first step in 900 s:\n{text[-3000:]}")


def idle_nodes(timeout: float = 180) -> None:
    """Wait until the cancelled job has left the queue (its steps end, up to Slurm's
    KillWait): the next sample, either side's, must not wait for its nodes."""
    deadline = time.monotonic() + timeout
    while as_alice("login1", "squeue -h -u alice").strip():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: alice's jobs still queued after {timeout:.0f} s")
        time.sleep(1)


def cached_side_by_side(
    record: Record, env: dict[str, str], work: Path, samples: int, first_builds: bool
) -> None:
    """Submit -> first step with the environment cached, tcloud and its baseline taking
    turns. The first submit builds the environment if no job has yet (`first_builds`:
    none has, on the lab this bench provisioned)."""
    warmup, _ = first_step_seconds(env, work)
    idle_nodes()
    key = "submit_to_first_step_uncached_seconds" if first_builds else "first_submit_seconds"
    record[key] = round(warmup, 1)
    job_script = baseline_setup(ready_environment())
    ours: list[float] = []
    theirs: list[float] = []
    for sample in range(samples):
        for side in ("base", "ours") if sample % 2 else ("ours", "base"):
            if side == "ours":
                ours.append(first_step_seconds(env, work)[0])
            else:
                theirs.append(baseline_first_step_seconds(job_script))
            idle_nodes()
    record["submit_to_first_step"] = summary(ours)
    record["baseline_sbatch_to_first_step"] = summary(theirs)
    ratio = statistics.median(ours) / statistics.median(theirs)
    record["first_step_ratio"] = round(ratio, 2)
    print(
        f"submit -> first training step, env cached: tcloud {statistics.median(ours):.1f} s"
        f" | sbatch in the ready venv {statistics.median(theirs):.1f} s | {ratio:.2f}x"
        f" (medians of {samples}; the first submit {warmup:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="pip and uv builds on a warm cache")
    parser.add_argument("--samples", type=int, default=3, help="submit -> first step runs")
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="only submit -> first step, side by side, on the bench lab as it is",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-frameworks-"))
    cache = work / "package-cache"  # this bench's own: cold at the start
    inventory = work / "hosts.yml"
    load = os.getloadavg()
    with Record(args.json, script="frameworks.py", load_at_start=load) as record:
        if args.cached_only:
            try:
                cached_side_by_side(
                    record, researcher_env(NAME, "alice"), work, args.samples, first_builds=False
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
            return
        try:
            lab_down()
            record["provision_cold_seconds"] = round(provision(inventory, cache), 1)
            cold = timed_build("uv", "cold")
            record["env_build_cold_uv_seconds"] = round(cold, 1)
            print(f"environment build, cold package cache (uv)      {cold:7.1f} s")
            lab_down()
            record["provision_fresh_seconds"] = round(provision(inventory, cache), 1)
            times: dict[str, list[float]] = {"uv": [], "pip": []}
            for run in range(args.runs):
                for tool in ("pip", "uv") if run % 2 else ("uv", "pip"):
                    times[tool].append(timed_build(tool, f"warm{run}"))
            uv, pip = statistics.median(times["uv"]), statistics.median(times["pip"])
            record["env_build_warm"] = {
                "uv": summary(times["uv"]),
                "pip": summary(times["pip"]),
                "pip_over_uv": round(pip / uv, 2),
            }
            print(
                f"environment build, warm cache, fresh lab: pip {pip:7.1f} s | uv {uv:7.1f} s"
                f" | ratio {pip / uv:.2f}x  (median of {args.runs})"
            )
            cached_side_by_side(
                record, researcher_env(NAME, "alice"), work, args.samples, first_builds=True
            )
        finally:
            lab_down()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
