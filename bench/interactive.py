#!/usr/bin/env python3
"""Into a running job (issue [14]), each next to a baseline run side by side.

One running two-node job of the researcher's (n2 = rank 0, n3 = rank 1) serves all three:
1. shell to prompt: `tcloud shell JOB --node 1` against `ssh -t login srun --jobid=JOB
   --overlap -N1 -n1 -w n3 --pty bash -i` (what a researcher types without tcloud), both
   through a pseudo-terminal (pexpect), from the start to the answer of the first command;
2. exec round trip: `tcloud exec JOB --all -- true` against `ssh login srun --jobid=JOB
   --overlap -N2 --ntasks-per-node=1 true`;
3. forwarded throughput (MiB/s): one stream of --mib MiB from a port of the job on n3,
   read through `tcloud forward` and through `ssh -N -L` in alternating order (one
   after the other, not concurrently: each gets the link alone); split into the time to
   the first byte (the connection's way to the program) and the rate after it.
Rounds interleave the two sides, the order alternating each round.

Usage (as root, from the repository root, after `make venv`):
    .venv/bin/python -u bench/interactive.py [--rounds 5] [--mib 512] [--lab NAME]
        [--only shell|exec|forward ...] [--json PATH]
TCLOUD_FORWARD_OPENSSH=0 in the environment measures tcloud's own SSH connection carrying
a forward's bytes instead of OpenSSH's master.
Without --lab it boots the bench lab (10.77.7.0/24, 3 nodes), converges it and removes
it at the end; with --lab, a lab that is up and converged (left up).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pexpect
from benchlib import (
    BIN,
    NAME,
    SUBNET,
    Record,
    add_json_argument,
    compile_packages,
    playbook,
    sh,
    summary,
)

from tacc_lab.demo import researcher_env

USER = "alice"
PARTS = ("shell", "exec", "forward")
STREAM_PORT = 8790
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
# The job: every node streams --mib MiB of zeros to whoever connects to STREAM_PORT.
# A connection that goes away early (the probe that waits for a forward to listen) ends
# its own thread only.
STREAMER = (
    "import socket,sys,threading\n"
    "n=int(sys.argv[1]); s=socket.create_server(('0.0.0.0',%d)); b=bytes(1<<20)\n"
    "def send(c):\n"
    "    with c:\n"
    "        try:\n"
    "            for _ in range(n): c.sendall(b)\n"
    "        except OSError: pass\n"
    "while True: threading.Thread(target=send, args=(s.accept()[0],)).start()\n"
)


class Researcher:
    """tcloud and plain ssh as the lab's researcher (their key, the lab's known_hosts)."""

    def __init__(self, lab: str) -> None:
        self.env = {**os.environ, **researcher_env(lab, USER)}
        home = Path(self.env["TCLOUD_CONFIG"]).parent
        config = (home / "tcloud.yaml").read_text()
        self.login = next(line.split()[1] for line in config.splitlines() if "host:" in line)
        known = next(line.split()[1] for line in config.splitlines() if "known_hosts:" in line)
        self.ssh = [
            "ssh",
            "-i",
            str(home / "id_ed25519"),
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{USER}@{self.login}",
        ]

    def tcloud(self, *argv: str) -> str:
        proc = subprocess.run(
            [str(BIN / "tcloud"), *argv], env=self.env, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tcloud {' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout


def start_job(me: Researcher, work: Path, mib: int) -> str:
    project = work / "streamer"
    project.mkdir()
    (project / "streamer.py").write_text(STREAMER % STREAM_PORT)
    task = {
        "name": "bench-interactive",
        "resources": {"nodes": 2, "mem": "200M", "time": "30"},
        "run": [f"exec python3 streamer.py {mib}"],
    }
    (project / "tcloud.yaml").write_text(json.dumps(task))
    job = json.loads(me.tcloud("submit", "--json", str(project)))["job_id"]
    deadline = time.monotonic() + 120
    while (state := json.loads(me.tcloud("status", "--json", job))["state"]) != "RUNNING":
        if state in TERMINAL or time.monotonic() > deadline:
            raise RuntimeError(f"job {job}: {state}")
        time.sleep(0.5)
    return job


def to_first_answer(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting argv on a terminal to the answer of its first command."""
    start = time.monotonic()
    child = pexpect.spawn(argv[0], argv[1:], env=env, encoding="utf-8", timeout=60)
    child.sendline("echo READY$((40+2))")
    child.expect("READY42")
    seconds = time.monotonic() - start
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    return seconds


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.monotonic()
    subprocess.run(command, env=env, capture_output=True, check=True)
    return time.monotonic() - start


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def read_all(port: int) -> tuple[int, float, int]:
    """(bytes read from 127.0.0.1:port until the far side closes, seconds from the
    connection's start to its first byte, bytes of that first read)."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        first = len(conn.recv(1 << 20))
        first_byte = time.monotonic() - start
        total = first
        while chunk := conn.recv(1 << 20):
            total += len(chunk)
    return total, first_byte, first


def wait_listening(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


def throughput(forwarder: list[str], port: int, env: dict[str, str], mib: int) -> dict[str, float]:
    """One stream of `mib` MiB read through the forwarder listening on `port`: MiB/s
    overall (connection included), seconds to the first byte (the connection's way to
    the program), and MiB/s from the first byte on (the data path alone)."""
    proc = subprocess.Popen(
        forwarder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_listening(port)
        start = time.monotonic()
        got, first_byte, first = read_all(port)
        seconds = time.monotonic() - start
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    if got != mib << 20:
        raise RuntimeError(f"read {got} bytes, expected {mib << 20}")
    streaming = (got - first) / (1 << 20) / max(seconds - first_byte, 1e-9)
    return {"mib_s": mib / seconds, "first_byte_s": first_byte, "streaming_mib_s": streaming}


def side_by_side(rounds: int, ours: Callable[[], float], base: Callable[[], float]) -> dict:
    mine, theirs = [], []
    for number in range(rounds):
        pair = [(mine, ours), (theirs, base)]
        for values, measure in pair if number % 2 == 0 else reversed(pair):
            values.append(measure())
    return {"tcloud": summary(mine), "baseline": summary(theirs)}


def side_by_side_parts(
    rounds: int, ours: Callable[[], dict[str, float]], base: Callable[[], dict[str, float]]
) -> dict[str, dict]:
    """side_by_side for measurements of several parts: each part's own summaries."""
    mine: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for number in range(rounds):
        pair = [(mine, ours), (theirs, base)]
        for values, measure in pair if number % 2 == 0 else reversed(pair):
            values.append(measure())
    return {
        part: {
            "tcloud": summary([one[part] for one in mine]),
            "baseline": summary([one[part] for one in theirs]),
        }
        for part in mine[0]
    }


def report(title: str, result: dict, unit: str, higher_is_better: bool = False) -> None:
    mine, theirs = result["tcloud"]["median"], result["baseline"]["median"]
    result["ratio"] = mine / theirs
    better = "(higher is better)" if higher_is_better else ""
    print(
        f"{title}: tcloud {mine:.3f} {unit}, baseline {theirs:.3f} {unit}, "
        f"ratio {result['ratio']:.2f}x {better}"
    )


def exec_split(me: Researcher, job: str, rounds: int) -> dict:
    """Where `tcloud exec --all` spends its time (TCLOUD_TIMING steps, medians of
    `rounds` runs): the interpreter's start and imports up to its first step, the agent
    session (mux), the job's check (job target), each channel's opening on the master
    (mux channel) or on a direct connection (connect), and the rest (the nodes' attach,
    srun and the command, the exit)."""
    seconds: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(rounds):
            steps_file = Path(tmp) / f"{number}.jsonl"
            env = {**me.env, "TCLOUD_TIMING": str(steps_file)}
            start = time.time()
            subprocess.run(
                [str(BIN / "tcloud"), "exec", job, "--all", "--", "true"],
                env=env,
                capture_output=True,
                check=True,
            )
            total = time.time() - start
            steps = [json.loads(line) for line in steps_file.read_text().splitlines()]
            split = {"start and imports": min(step["start"] for step in steps) - start}
            for step in steps:
                name = "job target" if step["step"].startswith("job target") else step["step"]
                if name in ("mux", "job target", "mux channel", "connect"):
                    split[name] = max(split.get(name, 0.0), step["end"] - step["start"])
            split["the rest"] = total - sum(split.values())
            split["total"] = total
            for name, value in split.items():
                seconds.setdefault(name, []).append(value)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        "exec --all, where the time goes (medians, s): "
        + ", ".join(f"{name} {value:.3f}" for name, value in medians.items())
    )
    return medians


def measure(me: Researcher, job: str, rounds: int, mib: int, out: Record, only: set[str]) -> None:
    tcloud = str(BIN / "tcloud")
    if "shell" in only:
        measure_shell(me, job, rounds, tcloud, out)
    if "exec" in only:
        measure_exec(me, job, rounds, tcloud, out)
    if "forward" in only:
        measure_forward(me, job, rounds, mib, tcloud, out)


def measure_shell(me: Researcher, job: str, rounds: int, tcloud: str, out: Record) -> None:
    srun_shell = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "n3", "--pty"]
    plain_shell = [*me.ssh[:1], "-t", *me.ssh[1:], *srun_shell, "bash", "-i"]
    shell = side_by_side(
        rounds,
        lambda: to_first_answer([tcloud, "shell", job, "--node", "1"], me.env),
        lambda: to_first_answer(plain_shell, me.env),
    )
    report("shell to first answer", shell, "s")
    out["shell_to_answer"] = shell


def measure_exec(me: Researcher, job: str, rounds: int, tcloud: str, out: Record) -> None:
    plain_exec = [*me.ssh, "srun", f"--jobid={job}", "--overlap", "-N2", "--ntasks-per-node=1"]
    exec_all = side_by_side(
        rounds,
        lambda: timed([tcloud, "exec", job, "--all", "--", "true"], me.env),
        lambda: timed([*plain_exec, "true"], me.env),
    )
    report("exec --all round trip", exec_all, "s")
    out["exec_all"] = exec_all
    out["exec_all_split"] = exec_split(me, job, rounds)


def measure_forward(
    me: Researcher, job: str, rounds: int, mib: int, tcloud: str, out: Record
) -> None:

    def through_tcloud() -> dict[str, float]:
        port = free_port()
        argv = [tcloud, "forward", job, f"{STREAM_PORT}:{port}", "--node", "1"]
        return throughput(argv, port, me.env, mib)

    def through_ssh() -> dict[str, float]:
        port = free_port()
        argv = [*me.ssh[:1], "-N", "-L", f"127.0.0.1:{port}:n3:{STREAM_PORT}", *me.ssh[1:]]
        return throughput(argv, port, me.env, mib)

    parts = side_by_side_parts(rounds, through_tcloud, through_ssh)
    report(f"forwarded throughput ({mib} MiB)", parts["mib_s"], "MiB/s", higher_is_better=True)
    report("  of which the first byte", parts["first_byte_s"], "s")
    streaming = parts["streaming_mib_s"]
    report("  and the rate after it", streaming, "MiB/s", higher_is_better=True)
    out["forward_mib_s"] = parts["mib_s"]
    out["forward_first_byte_s"] = parts["first_byte_s"]
    out["forward_streaming_mib_s"] = streaming


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mib", type=int, default=512, help="MiB per forwarded stream")
    parser.add_argument("--lab", help="use this lab, up and converged")
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="measure this part only (again for more); default: all",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    compile_packages()  # tcloud starts as an installed one does (benchlib)
    lab = args.lab or NAME
    with (
        Record(args.json, nodes=3, rounds=args.rounds, mib=args.mib) as out,
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
                ]
            )
        job = ""
        try:
            if not args.lab:
                out["converge_s"] = playbook(inventory, "playbooks/site.yml")[0]
            me = Researcher(lab)
            out["load_at_start"] = os.getloadavg()
            job = start_job(me, work, args.mib)
            only = set(args.only or PARTS)
            measure(me, job, args.rounds, args.mib, out, only)  # out saves each row as it comes
            out["load_at_end"] = os.getloadavg()
        finally:
            if job:
                me.tcloud("cancel", job)
            if not args.lab:
                sh([str(BIN / "tacc-lab"), "--name", NAME, "down"])
    print(f"medians of {args.rounds} rounds; load {statistics.mean(out['load_at_start']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
