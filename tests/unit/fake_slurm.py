"""A fake Slurm on PATH for agent tests: sbatch, squeue, scontrol, scancel and sacct
over one JSON state file, so the real agent (in this process or as `tacc-agent`)
submits, finds and cancels jobs the way it would on a cluster. Jobs of other users are
added with `add_job`; every command is kept in the state's "calls".

FAKE_SBATCH says what sbatch does after taking a job: "ok" prints its id, "kill" kills
the agent that called it (SIGKILL, as a crash would), "hang" never answers (the
agent's timeout ends it), "lost" kills the agent before the job reaches the queue.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = r"""
import fcntl, json, os, signal, sys, time

STATE = os.environ["FAKE_SLURM_STATE"]
command, args = os.path.basename(sys.argv[0]), sys.argv[1:]
ENDED = ("COMPLETED", "CANCELLED", "FAILED")


def update(change):
    with open(STATE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(STATE) as handle:
            state = json.load(handle)
        state["calls"].append([command, *args])
        result = change(state)
        # Replaced whole: a test reading the state without the lock never sees it empty.
        with open(STATE + ".new", "w") as handle:
            json.dump(state, handle)
        os.replace(STATE + ".new", STATE)
    return result


def option(name, default=""):
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), default)


def field(job_id, job, letter):
    return {"i": job_id, "F": job_id, "T": job["state"], "r": "None", "M": "0:01",
            "N": "n1" if job["state"] == "RUNNING" else "", "Z": job["workdir"],
            "k": job["comment"] or "(null)"}[letter]


def sbatch(state):
    job_id = str(state["next_id"])
    state["next_id"] += 1
    state["jobs"][job_id] = {"uid": os.getuid(), "user": "alice", "state": "PENDING",
                             "comment": option("comment"), "workdir": option("chdir")}
    return job_id


def main():
    behaviour = os.environ.get("FAKE_SBATCH", "ok")
    if command == "sbatch":
        if behaviour == "lost":
            update(lambda state: None)
            os.kill(os.getppid(), signal.SIGKILL)
            return 0
        job_id = update(sbatch)
        if behaviour == "kill":
            os.kill(os.getppid(), signal.SIGKILL)
        elif behaviour == "hang":
            time.sleep(60)
        print(job_id)
        return 0
    state = update(lambda state: state)
    jobs = state["jobs"]
    if command == "squeue":
        wanted = option("jobs")
        letters = option("format").replace("%", "").split("|")
        for job_id, job in jobs.items():
            if job["state"] in ENDED or ("--me" in args and job["uid"] != os.getuid()):
                continue
            if wanted and job_id != wanted:
                continue
            print("|".join(field(job_id, job, letter) for letter in letters))
        return 0
    if command == "scontrol" and args[:2] == ["show", "job"]:
        job = jobs.get(args[-1])
        if job is None or job.get("forgotten"):  # forgotten: past MinJobAge, in sacct only
            print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
            return 1
        comment = f" Comment={job['comment']}" if job["comment"] else ""
        print(f"JobId={args[-1]} JobName=t UserId={job['user']}({job['uid']}) "
              f"JobState={job['state']} Reason=None Restarts=0 NodeList=n1 "
              f"WorkDir={job['workdir']}{comment}")
        return 0
    if command == "scontrol" and args[:2] == ["show", "node"]:
        print("NodeName=n1 CPUTot=8 RealMemory=16000 Gres=(null) Partitions=batch")
        return 0
    if command == "scontrol" and args[:2] == ["show", "partition"]:
        print("PartitionName=batch Default=YES Nodes=n1")
        return 0
    if command == "scancel":
        job_id = args[-1]
        if jobs.get(job_id, {}).get("uid") != os.getuid():
            print(f"scancel: error: Kill job error on job id {job_id}: Access/permission "
                  "denied", file=sys.stderr)
            return 1
        update(lambda state: state["jobs"][job_id].update(state="CANCELLED"))
        return 0
    if command == "sacct" and state.get("accounting") and "--format=JobID,NodeList" in args:
        wanted = option("jobs").split(",")
        for job_id, job in jobs.items():
            if job_id in wanted and job["state"] in ENDED and job["uid"] == os.getuid():
                print(f"{job_id}|{job.get('nodes', 'None assigned')}")
        return 0
    if command == "sacct":
        print("sacct: error: Slurm accounting storage is disabled", file=sys.stderr)
        return 1
    return 0


sys.exit(main())
"""
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")


class FakeSlurm:
    def __init__(self, root: Path) -> None:
        self.bin = root / "fake-slurm-bin"
        self.bin.mkdir()
        self.state = root / "fake-slurm.json"
        self.state.write_text(json.dumps({"next_id": 100, "jobs": {}, "calls": []}))
        for name in COMMANDS:
            (self.bin / name).write_text(f"#!{sys.executable}\n{SCRIPT}")
            (self.bin / name).chmod(0o755)
        self.path = f"{self.bin}:{os.environ['PATH']}"

    def env(self, sbatch: str = "ok") -> dict[str, str]:
        return {"PATH": self.path, "FAKE_SLURM_STATE": str(self.state), "FAKE_SBATCH": sbatch}

    def jobs(self) -> dict[str, dict]:
        return json.loads(self.state.read_text())["jobs"]

    def calls(self, command: str) -> list[list[str]]:
        return [c for c in json.loads(self.state.read_text())["calls"] if c[0] == command]

    def set_job(self, job_id: str, **fields) -> None:
        """Change what Slurm (and its accounting) says about one job."""
        state = json.loads(self.state.read_text())
        state["jobs"][job_id].update(fields)
        self.state.write_text(json.dumps(state))

    def enable_accounting(self) -> None:
        """sacct answers (slurmdbd is there) instead of saying accounting is disabled."""
        state = json.loads(self.state.read_text())
        state["accounting"] = True
        self.state.write_text(json.dumps(state))

    def add_job(self, job_id: str, **job) -> None:
        """A job Slurm has, as another user's by default (bob, uid 4242)."""
        state = json.loads(self.state.read_text())
        state["jobs"][job_id] = {
            "uid": 4242,
            "user": "bob",
            "state": "RUNNING",
            "comment": "",
            "workdir": "/home/bob",
            **job,
        }
        self.state.write_text(json.dumps(state))
