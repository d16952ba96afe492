#!/usr/bin/env python3
"""Where tcloud's upload spends its time, side by side with `rsync -a`, on a lab that is
up (its agent deployed with playbooks/agent.yml, rsync on the node): the first upload of
a tree of --files files / --mib MiB, the resubmit with nothing changed, and the one with
one 10 MiB file changed, each tcloud round followed at once by its rsync round, --rounds
times (the stores are emptied before each first upload). Each tcloud round prints its
split (TCLOUD_TIMING steps: connect, session, store, store receive, the rest: hashing and
compile) and, with --profile DIR, writes a cProfile of the client to DIR/<round>.prof.

    .venv/bin/python bench/upload_profile.py --lab upl --host 10.77.23.11 --node n1
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import paramiko
from tcloud_upload import Rsync, lab_sh, make_tree

from tacc_lab.lab import resolve_config
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.config import Cluster
from tcloud.transfer import manifest, upload_stream
from tcloud.transfer.hashcache import HashCache
from tcloud.transfer.upload import upload
from tcloud.transport import wire
from tcloud.transport.ssh import session

MIB = 1 << 20
USERDIR = "/root/tcloud-bench"


def node_cpu(sshd_pid: int | None) -> float:
    """CPU seconds of every ssh connection the node's sshd listener has reaped (its
    children's user + system time, sessions and what they ran included); 0 without it."""
    if sshd_pid is None:
        return 0.0
    fields = Path(f"/proc/{sshd_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def own_cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def steps_of(path: Path) -> dict[str, float]:
    split: dict[str, float] = defaultdict(float)
    if path.exists():
        for line in path.read_text().splitlines():
            step = json.loads(line)
            split[step["step"]] += step["end"] - step["start"]
        path.unlink()
    return dict(split)


def tcloud_round(cluster: Cluster, project: Path, cache: Path, timing: Path, profile: Path | None):
    """(seconds, bytes sent, split {step: seconds}) of one submit's upload."""
    os.environ["TCLOUD_TIMING"] = str(timing)
    profiler = cProfile.Profile() if profile else None
    start = time.monotonic()
    if profiler:
        profiler.enable()
    task = load_task(project / "tcloud.yaml")
    with HashCache(cache) as hasher:
        instruction = compile_task(task, hasher)
    hashed = time.monotonic() - start
    with session(cluster) as client:
        result = upload(client, instruction, USERDIR)
    total = time.monotonic() - start
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile)
    split = {"hash+compile": hashed, **steps_of(timing)}
    split["other"] = total - sum(split.values())
    return total, result.bytes_sent, split


def shown(split: dict[str, float]) -> str:
    return " ".join(f"{name}={seconds:.3f}" for name, seconds in split.items())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lab", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--node", default="n1")
    parser.add_argument("--only", choices=["first", "resubmit"], help="just these rows")
    parser.add_argument("--profile", metavar="DIR", help="cProfile of each tcloud round")
    parser.add_argument(
        "--sshd-pid",
        type=int,
        help="the node's sshd listener as this host sees it: also print CPU seconds, "
        "here and on the node, of each round (the node's once its connections ended)",
    )
    parser.add_argument(
        "--ciphers",
        choices=["paramiko", "wire"],
        default="wire",
        help="paramiko's default cipher order, or tcloud.transport.wire's (AEAD first)",
    )
    parser.add_argument(
        "--before",
        action="store_true",
        help="the client as before issue [12]'s upload work: 1 MiB stream writes, paramiko's "
        "cipher order, one file hashed at a time (the agent's side is whatever is deployed)",
    )
    args = parser.parse_args()
    if args.before:
        upload_stream.CHUNK = 1 << 20
        manifest.HASH_THREADS = 1
        args.ciphers = "paramiko"
    if args.ciphers == "paramiko":  # tcloud.transport.ssh connects with wire.transport
        wire.transport = paramiko.Transport
    cfg = resolve_config(args.lab, None, "10.77.7.0/24")
    cluster = Cluster(
        args.lab, args.host, user="root", key=str(cfg.ssh_key), known_hosts=str(cfg.known_hosts)
    )
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        project, cache, timing = tmp_path / "task", tmp_path / "hashes.sqlite", tmp_path / "t"
        make_tree(project, args.files, args.mib)
        victim = project / "data" / "part0007.bin"
        rsync = Rsync(cfg.ssh_key, cfg.known_hosts, args.host, control=None)  # a new ssh a round

        def both(label: str, index: int) -> None:
            prof = profile_dir / f"{label}-{index}.prof" if profile_dir else None
            here, there = own_cpu(resource.RUSAGE_SELF), node_cpu(args.sshd_pid)
            seconds, sent, split = tcloud_round(cluster, project, cache, timing, prof)
            time.sleep(1.0)  # the connection's processes are reaped
            cpu_tcloud = (own_cpu(resource.RUSAGE_SELF) - here, node_cpu(args.sshd_pid) - there)
            here, there = own_cpu(resource.RUSAGE_CHILDREN), node_cpu(args.sshd_pid)
            rsync_s, rsync_b = rsync.round(project)
            time.sleep(1.0)
            cpu_rsync = (own_cpu(resource.RUSAGE_CHILDREN) - here, node_cpu(args.sshd_pid) - there)
            if args.sshd_pid:
                print(
                    f"{label:<10} CPU s (client, node): tcloud {cpu_tcloud[0]:.2f} "
                    f"{cpu_tcloud[1]:.2f} | rsync {cpu_rsync[0]:.2f} {cpu_rsync[1]:.2f}",
                    flush=True,
                )
            results[label].append((seconds, rsync_s))
            print(
                f"{label:<10} tcloud {seconds:6.2f} s {sent / MIB:8.1f} MiB | rsync "
                f"{rsync_s:6.2f} s {rsync_b / MIB:8.1f} MiB | {seconds / rsync_s:4.2f}x | "
                f"{shown(split)}",
                flush=True,
            )

        for index in range(args.rounds):
            if args.only != "resubmit":
                lab_sh(args.lab, args.node, f"rm -rf {USERDIR} /root/rsync-bench; sync")
                cache.unlink(missing_ok=True)
                both("first", index)
            if args.only != "first":
                if not results["first"] and index == 0:
                    both("first", index)
                both("unchanged", index)
                victim.write_bytes(os.urandom(10 * MIB))
                both("one10MiB", index)
    print(f"load: {os.getloadavg()}")
    for label, pairs in results.items():
        ours = statistics.median(p[0] for p in pairs)
        theirs = statistics.median(p[1] for p in pairs)
        print(
            f"median {label:<10} tcloud {ours:6.2f} s rsync {theirs:6.2f} s {ours / theirs:4.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
