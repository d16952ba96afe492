#!/usr/bin/env python3
"""Containers in the execution layer (issue [13]), each next to a baseline run side by side.

1. first pull + convert of the lab's image into a user's cache (`skopeo copy` + `umoci
   unpack --rootless` by the job's batch step, under its lock) against the same two
   commands typed by hand on a compute node, rounds interleaved, the cache emptied
   before each;
2. the cached start: a 2-node task whose ranks print one line, with the image (already
   cached) and without one, rounds interleaved: per rank, program start -> first output
   line (what ch-run adds), and submit -> first output line of rank 0;
3. the first build of `image: {build: ...}` (a copy of the cached base, WORKDIR, COPY,
   one RUN) by the batch step, against the same steps typed by hand on a compute node
   (`cp -a` of the base, `mkdir`, `cp -a`, `ch-run -w --uid=0 --gid=0`), a new key each
   round, rounds interleaved in alternating order.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/containers.py [--rounds 5] [--lab NAME] [--json PATH]
Without --lab it boots the bench lab (10.77.7.0/24, 3 nodes, `--container-image`),
converges it and removes it at the end; with --lab, a lab that is up and converged
with the image (left up).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BIN, NAME, SUBNET, Record, add_json_argument, playbook, sh, summary

from tacc_lab.demo import researcher_env

IMAGE = "n1:5000/tacc/base:bookworm"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
LAB = {"name": NAME}
USER = "alice"


def node_sh(node: str, script: str) -> str:
    command = shlex.join(["sh", "-c", script])
    return sh([str(BIN / "tacc-lab"), "--name", LAB["name"], "ssh", node, command]).stdout


class Tcloud:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = {**os.environ, **env}

    def run(self, *argv: str) -> str:
        proc = subprocess.run(
            [str(BIN / "tcloud"), *argv], env=self.env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tcloud {' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def submit(self, project: Path) -> tuple[str, float]:
        launch = time.time()
        return json.loads(self.run("submit", "--json", str(project)))["job_id"], launch

    def wait(self, job: str, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while (info := json.loads(self.run("status", "--json", job)))["state"] not in TERMINAL:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} stuck in {info['state']}")
            time.sleep(0.3)
        if info["state"] != "COMPLETED":
            raise RuntimeError(f"job {job} {info['state']}: {self.run('logs', job)[-2000:]}")
        return info


def task(root: Path, name: str, nodes: int, image: bool) -> Path:
    root.mkdir(parents=True)
    document = {
        "name": name,
        "run": ['echo "first line from $(hostname)"'],
        "resources": {"nodes": nodes, "cpus": 1, "mem": "100M", "time": "5"},
        **({"image": IMAGE} if image else {}),
    }
    (root / "tcloud.yaml").write_text(json.dumps(document))
    return root


def marks(info: dict) -> dict[str, dict[str, float]]:
    """The job's start marks (status/timing/*.json), read as root on the NFS server."""
    timing = Path(info["workdir"]) / "status" / "timing"
    script = f'cd {shlex.quote(str(timing))} && for f in *.json; do echo "$f $(cat $f)"; done'
    found = {}
    for line in node_sh("n1", script).splitlines():
        name, _, text = line.partition(" ")
        found[name.removesuffix(".json")] = json.loads(text)
    return found


def settle() -> None:
    """The NFS server writes out what the last measurement wrote or removed (hundreds of
    MiB), so that it does not slow down the next one: without this, whichever side came
    after the by-hand run's `rm -rf` paid for it (a first build measured 4x slower)."""
    node_sh("n1", "sync")


def pull_by_hand(digest: str) -> float:
    """skopeo copy + umoci unpack --rootless as the user on a compute node, into the
    user's workspace: the filesystem the cache is on (a node's /tmp is a tmpfs)."""
    reference = IMAGE.rsplit(":", 1)[0] + "@" + digest
    work = f"/shared/tcloud/{USER}/.bench-pull"
    script = (
        f"rm -rf {work} && mkdir -p {work} && start=$(date +%s.%N) && "
        f"skopeo copy --quiet docker://{reference} oci:{work}/oci:img && "
        f"umoci unpack --rootless --image {work}/oci:img {work}/bundle >/dev/null && "
        f"end=$(date +%s.%N) && rm -rf {work} && echo $start $end"
    )
    start, end = node_sh("n2", f"runuser -u {USER} -- sh -c {shlex.quote(script)}").split()
    return float(end) - float(start)


def first_pull(tcloud: Tcloud, work: Path, rounds: int) -> dict:
    ours, by_hand, sizes = [], [], []
    for number in range(rounds):
        node_sh("n1", f"rm -rf /shared/tcloud/{USER}/images")
        settle()
        job, _ = tcloud.submit(task(work / f"pull{number}", f"pull{number}", 1, image=True))
        info = tcloud.wait(job)
        ours.append(float(info["image"]["seconds"]))
        sizes.append(info["image"].get("bytes", 0))
        settle()
        by_hand.append(pull_by_hand(info["image"]["digest"]))
    row = {"tcloud": summary(ours), "by_hand": summary(by_hand), "bytes": max(sizes)}
    row["ratio"] = row["tcloud"]["median"] / row["by_hand"]["median"]
    print(
        f"first pull + convert: tcloud {row['tcloud']['median']:.2f} s, by hand "
        f"{row['by_hand']['median']:.2f} s = {row['ratio']:.2f}x "
        f"({row['bytes'] / 2**20:.0f} MiB)",
        flush=True,
    )
    return row


BUILD_RUN = 'python3 -c "import numpy" && echo ok > built.txt'
BUILD_FILE = f"""FROM {IMAGE}
WORKDIR /opt/app
COPY data/ /opt/app/data/
RUN {BUILD_RUN}
"""


def build_task(root: Path, name: str) -> Path:
    (root / "env/data").mkdir(parents=True)
    (root / "env/Containerfile").write_text(BUILD_FILE)
    (root / "env/data/a.txt").write_text(f"{name} {time.time_ns()}\n")  # a new key
    document = {
        "name": name,
        "image": {"build": "env/Containerfile"},
        "run": ["true"],
        "resources": {"nodes": 1, "cpus": 1, "mem": "100M", "time": "5"},
    }
    (root / "tcloud.yaml").write_text(json.dumps(document))
    return root


def build_by_hand(base_digest: str, data: Path) -> float:
    """The build's steps by hand as the user on a compute node, on the cache's filesystem."""
    base = f"/shared/tcloud/{USER}/images/{base_digest.split(':', 1)[1]}/rootfs"
    work = f"/shared/tcloud/{USER}/.bench-build"
    run = shlex.quote(BUILD_RUN)
    text = shlex.quote(data.read_text())
    script = (
        f"rm -rf {work} && mkdir -p {work}/ctx/data && printf %s {text} > {work}/ctx/data/a.txt"
        f" && start=$(date +%s.%N) && cp -a --reflink=auto {base} {work}/rootfs && "
        f"mkdir -p {work}/rootfs/opt/app && cp -a {work}/ctx/data/. {work}/rootfs/opt/app/data/"
        f" && ch-run -w --uid=0 --gid=0 --private-tmp --cd=/opt/app {work}/rootfs -- "
        f"/bin/sh -c {run} && end=$(date +%s.%N) && rm -rf {work} && echo $start $end"
    )
    start, end = node_sh("n2", f"runuser -u {USER} -- sh -c {shlex.quote(script)}").split()
    return float(end) - float(start)


def first_build(tcloud: Tcloud, work: Path, rounds: int) -> dict:
    ours, by_hand = [], []
    base = tcloud.wait(tcloud.submit(task(work / "base", "base", 1, image=True))[0])
    digest = base["image"]["digest"]  # the base, cached: both sides copy the same tree
    for number in range(rounds):
        project = build_task(work / f"build{number}", f"build{number}")
        if number % 2:  # the order alternates: neither side always finds warm caches
            settle()
            by_hand.append(build_by_hand(digest, project / "env/data/a.txt"))
        settle()
        info = tcloud.wait(tcloud.submit(project)[0])
        ours.append(float(info["image"]["seconds"]))
        if not number % 2:
            settle()
            by_hand.append(build_by_hand(digest, project / "env/data/a.txt"))
    row = {"tcloud": summary(ours), "by_hand": summary(by_hand)}
    row["ratio"] = row["tcloud"]["median"] / row["by_hand"]["median"]
    print(
        f"first build (copy of the base + WORKDIR, COPY, RUN): tcloud "
        f"{row['tcloud']['median']:.2f} s, by hand {row['by_hand']['median']:.2f} s = "
        f"{row['ratio']:.2f}x",
        flush=True,
    )
    return row


def start_round(tcloud: Tcloud, work: Path, name: str, image: bool) -> tuple[list[float], float]:
    """Per rank program -> first output, and submit -> rank 0's first output."""
    job, launch = tcloud.submit(task(work / name, name, 2, image=image))
    found = marks(tcloud.wait(job))
    ranks = [m for who, m in found.items() if who.startswith("rank-")]
    per_rank = [m["first_output"] - m["program"] for m in ranks]
    return per_rank, found["rank-0"]["first_output"] - launch


def cached_start(tcloud: Tcloud, work: Path, rounds: int) -> dict:
    tcloud.wait(tcloud.submit(task(work / "warm", "warm", 1, image=True))[0])  # cached now
    rank = {"image": [], "none": []}
    job = {"image": [], "none": []}
    for number in range(rounds):
        for kind in ("none", "image"):  # interleaved: both see the same machine
            per_rank, whole = start_round(tcloud, work, f"{kind}{number}", kind == "image")
            rank[kind] += per_rank
            job[kind].append(whole)
    row = {f"rank_{k}": summary(v) for k, v in rank.items()}
    row |= {f"submit_{k}": summary(v) for k, v in job.items()}
    row["rank_ratio"] = row["rank_image"]["median"] / row["rank_none"]["median"]
    row["rank_overhead_s"] = row["rank_image"]["median"] - row["rank_none"]["median"]
    row["submit_ratio"] = row["submit_image"]["median"] / row["submit_none"]["median"]
    print(
        f"per rank, program -> first line: image {row['rank_image']['median']:.3f} s, none "
        f"{row['rank_none']['median']:.3f} s = {row['rank_ratio']:.2f}x "
        f"(+{row['rank_overhead_s']:.3f} s)",
        flush=True,
    )
    image, none = row["submit_image"]["median"], row["submit_none"]["median"]
    print(
        f"submit -> first line (2 nodes): image {image:.2f} s, none {none:.2f} s = "
        f"{row['submit_ratio']:.2f}x",
        flush=True,
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lab", help="use this lab, up and converged with its image")
    add_json_argument(parser)
    args = parser.parse_args()
    LAB["name"] = args.lab or NAME
    with (
        Record(args.json, nodes=3, rounds=args.rounds) as out,
        tempfile.TemporaryDirectory() as tmp,
    ):
        work = Path(tmp)
        inventory = work / "hosts.yml"
        if not args.lab:
            sh([str(BIN / "tacc-lab"), "--name", NAME, "down"])
            sh(
                [
                    str(BIN / "tacc-lab"),
                    "--name",
                    NAME,
                    "up",
                    "--nodes",
                    "3",
                    "--subnet",
                    SUBNET,
                    "--inventory",
                    str(inventory),
                    "--container-image",
                ]
            )
        try:
            if not args.lab:
                out["converge_s"] = playbook(inventory, "playbooks/site.yml")[0]
            out["load_at_start"] = os.getloadavg()
            tcloud = Tcloud(researcher_env(LAB["name"], USER))
            out["first_pull"] = first_pull(tcloud, work, min(args.rounds, 3))
            out["cached_start"] = cached_start(tcloud, work, args.rounds)
            out["first_build"] = first_build(tcloud, work, args.rounds)
            out["load_at_end"] = os.getloadavg()
        finally:
            if not args.lab:
                sh([str(BIN / "tacc-lab"), "--name", NAME, "down"])
    print(f"medians of {args.rounds} rounds; load {statistics.mean(out['load_at_start']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
