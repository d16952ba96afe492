"""One fake Slurm for the agent's tests: jobs, nodes, partitions and reservations in
memory, and the commands the agent runs answered from them (sbatch, squeue, scontrol,
scancel, sacct), every call kept. Anything else (sinfo, sacctmgr, srun, a canned or
hung answer) is a rule: `when("squeue --states=PENDING", answer)`.

Two ways in, one fake:
- in this process, `FakeSlurm().install(monkeypatch)` answers the agent's one runner of
  Slurm commands (tacc_agent.slurm.run.command), so the agent's own readers parse what
  the fake prints;
- for an agent run as its own process (`tacc-agent`, tcloud's SSH fake),
  `FakeSlurmOnPath(root)` puts the commands on PATH: each one loads the fake from a JSON
  state file, answers, and writes it back. FAKE_SBATCH says what sbatch does after
  taking a job: "ok" prints its id, "kill" kills the agent that called it (SIGKILL, as a
  crash would), "hang" never answers (the agent's timeout ends it), "lost" kills the
  agent before the job reaches the queue. Jobs of other users are added with `add_job`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tacc_agent.hostlist import expand_hostlist
from tacc_agent.slurm import run
from tacc_agent.slurm.run import Finished

ROOT = Path(__file__).resolve().parents[2]
ENDED = ("COMPLETED", "CANCELLED", "FAILED")
SET_BY = re.compile(r"\[[^\]\s]+@[^\]\s]+\]$")
# An answer: what the command prints, a function of its argv that says it, or the
# exception the runner raises (a command that hangs: hung(); one not installed: missing()).
Answer = Finished | Callable[[list[str]], Finished] | BaseException


def answer(code: int = 0, stdout: str = "", stderr: str = "") -> Finished:
    return Finished(code, stdout, stderr)


def hung(command: str, seconds: float = 2) -> run.NoAnswer:
    """What the runner raises for a command that did not answer in time."""
    return run.NoAnswer(f"{command} did not answer within {seconds:g} s")


def missing(command: str) -> run.NotFound:
    """What the runner raises for a command that is not installed."""
    return run.NotFound(f"{command} not found")


def option(argv: list[str], name: str, default: str = "") -> str:
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")), default)


def oneliner(fields: dict[str, str]) -> str:
    """A record as `scontrol show ... --oneliner` prints it."""
    return " ".join(f"{key}={value}" for key, value in fields.items())


class FakeSlurm:
    """The fake (see the module). `strict`: a command it has no answer for is an error
    of the test (AssertionError); else it succeeds silently."""

    def __init__(self, strict: bool = True) -> None:
        self.strict = strict
        self.jobs: dict[str, dict] = {}
        self.nodes: dict[str, dict] = {}
        self.partitions: dict[str, dict[str, str]] = {}
        self.reservations: dict[str, str] = {}
        self.accounting = False  # sacct answers where ended jobs ran
        self.next_id = 100
        self.calls: list[list[str]] = []
        self.rules: list[tuple[list[str], Answer]] = []
        self.refuse_create = ""  # why `scontrol create reservation` fails ("": it works)
        self.refuse_drain = False
        self.lock = threading.Lock()

    # --- the state ------------------------------------------------------------------

    def add_job(self, job_id: str, **job) -> None:
        """A job Slurm has, as another user's by default (bob, uid 4242). Known keys: uid,
        user, state, comment, workdir, name, reason, nodelist (where it runs), nodes
        (where sacct says it ran), forgotten (past MinJobAge: in sacct only), fields
        (more scontrol fields, or ones that replace the fake's: JobId=...)."""
        self.jobs[job_id] = {
            "uid": 4242,
            "user": "bob",
            "state": "RUNNING",
            "comment": "",
            "workdir": "/home/bob",
            **job,
        }

    def set_job(self, job_id: str, **fields) -> None:
        """Change what Slurm (and its accounting) says about one job."""
        self.jobs[job_id].update(fields)

    def add_node(
        self,
        name: str,
        state: str = "IDLE",
        reason: str = "",
        partitions: str = "batch",
        gres: str = "(null)",
        alloc: int = 0,
        **more,
    ) -> None:
        """A node; `more`: cpus, memory (MB), features, addr, gres_used (GresUsed=)."""
        self.nodes[name] = {
            "state": state,
            "reason": reason,
            "partitions": partitions,
            "gres": gres,
            "addr": f"10.0.0.{len(self.nodes) + 2}",
            "alloc": alloc,
            "cpus": 8,
            "memory": 16000,
            "features": "(null)",
            **more,
        }

    def add_partition(self, name: str, **fields: str) -> None:
        """A partition with scontrol's fields (Default=YES, MaxNodes=4, QoS=...,
        ...: scontrol spells a partition's QOS `QoS`)."""
        self.partitions[name] = dict(fields)

    def when(self, words: str, said: Answer) -> None:
        """Answer a command whose argv starts with the first word and holds every other;
        the rule naming the most words wins, the later among equals."""
        self.rules.append((words.split(), said))

    # --- what was asked ---------------------------------------------------------------

    def calls_of(self, command: str) -> list[list[str]]:
        return [call for call in self.calls if call[0] == command]

    def updates(self) -> list[list[str]]:
        """The `scontrol update` calls, in order."""
        return [call for call in self.calls if call[:2] == ["scontrol", "update"]]

    def changes(self) -> list[str]:
        """The state-changing scontrol calls, in order, as short words ("drain n2",
        "create n2,n3", "delete"), and "srun" for each run of steps."""
        found: list[str] = []
        for call in self.calls:
            if call[:2] == ["scontrol", "update"] and call[2].startswith("NodeName="):
                found.append(f"{call[3].split('=')[1].lower()} {call[2].split('=')[1]}")
            elif call[:3] == ["scontrol", "create", "reservation"]:
                found.append(f"create {call[-1].split('=')[1]}")
            elif call[:2] == ["scontrol", "delete"]:
                found.append("delete")
            elif call[0] == "srun" and "srun" not in found[-1:]:
                found.append("srun")
        return found

    # --- in this process --------------------------------------------------------------

    def install(self, monkeypatch) -> FakeSlurm:
        """Answer every Slurm command the agent runs in this process."""
        monkeypatch.setattr(run, "command", self.command)
        return self

    def command(self, argv: list[str], timeout: float = run.TIMEOUT, env=None, **_how) -> Finished:
        """tacc_agent.slurm.run.command, answered by the fake."""
        said = self.choose(list(argv))
        if isinstance(said, BaseException):
            raise said
        return said(list(argv)) if callable(said) else said

    def choose(self, argv: list[str]) -> Answer:
        """The call kept, and its answer: a rule's, else the fake's own (under the lock;
        a rule's function runs after, so a slow one holds no other call)."""
        with self.lock:
            self.calls.append(argv)
            matching = [
                (len(words), at, said)
                for at, (words, said) in enumerate(self.rules)
                if argv[0] == words[0] and all(word in argv[1:] for word in words[1:])
            ]
            if matching:
                return max(matching, key=lambda found: found[:2])[2]
            return self.answer(argv)

    # --- the commands -----------------------------------------------------------------

    def answer(self, argv: list[str]) -> Finished:
        command, args = argv[0], argv[1:]
        if command == "sbatch":
            return self.sbatch(args)
        if command == "squeue" and option(args, "format"):
            return answer(0, self.squeue(args))
        if command == "scontrol" and args[:1] == ["show"] and len(args) > 1:
            return self.show(args[1], [a for a in args[2:] if not a.startswith("-")])
        if command == "scontrol" and args[:1] == ["update"]:
            return self.update(dict(word.split("=", 1) for word in args[1:]))
        if command == "scontrol" and args[:2] == ["create", "reservation"]:
            return self.create_reservation(dict(word.split("=", 1) for word in args[2:]))
        if command == "scontrol" and args[:1] == ["delete"]:
            name = args[1].split("=", 1)[1]
            if self.reservations.pop(name, None) is None:
                return answer(1, "", "Error deleting the reservation: Invalid reservation name")
            return answer()
        if command == "scancel":
            return self.scancel(args[-1])
        if command == "sacct" and self.accounting and "--format=JobID,NodeList" in args:
            return answer(0, self.sacct_nodes(option(args, "jobs").split(",")))
        if command == "sacct":
            return answer(1, "", "sacct: error: Slurm accounting storage is disabled")
        if self.strict:
            raise AssertionError(f"unexpected Slurm command {argv}")
        return answer()

    def sbatch(self, args: list[str]) -> Finished:
        job_id = str(self.next_id)
        self.next_id += 1
        self.jobs[job_id] = {
            "uid": os.getuid(),
            "user": "alice",
            "state": "PENDING",
            "comment": option(args, "comment"),
            "workdir": option(args, "chdir"),
        }
        return answer(0, f"{job_id}\n")

    def squeue(self, args: list[str]) -> str:
        """--format=%i|%T|... lines of the jobs still queued (--me: the caller's)."""
        wanted = option(args, "jobs")
        letters = option(args, "format").replace("%", "").split("|")
        lines = []
        for job_id, job in self.jobs.items():
            if job["state"] in ENDED or ("--me" in args and job["uid"] != os.getuid()):
                continue
            if wanted and job_id != wanted:
                continue
            running = job["state"] == "RUNNING"
            fields = {
                "i": job_id,
                "F": job_id,
                "T": job["state"],
                "r": job.get("reason", "None"),
                "M": "0:01",
                "N": job.get("nodelist", "n1") if running else "",
                "Z": job["workdir"],
                "k": job["comment"] or "(null)",
                "U": str(job["uid"]),
            }
            lines.append("|".join(fields[letter] for letter in letters) + "\n")
        return "".join(lines)

    def job_line(self, job_id: str, job: dict) -> str:
        fields = {
            "JobId": job_id,
            "JobName": job.get("name", "t"),
            "UserId": f"{job['user']}({job['uid']})",
            "JobState": job["state"],
            "Reason": job.get("reason", "None"),
            "Restarts": "0",
            "NodeList": job.get("nodelist", "n1"),
        }
        if "workdir" in job:
            fields["WorkDir"] = job["workdir"]
        if job.get("comment"):
            fields["Comment"] = job["comment"]
        return oneliner({**fields, **job.get("fields", {})})

    def node_line(self, name: str, node: dict) -> str:
        reason = node["reason"]
        if reason and not SET_BY.search(reason):
            reason += " [root@2026-11-24T20:17:33]"  # who set it and when, as scontrol says
        fields = {
            "NodeName": name,
            "Arch": "x86_64",
            "CoresPerSocket": "1",
            "CPUAlloc": str(node["alloc"]),
            "CPUTot": str(node["cpus"]),
            "RealMemory": str(node["memory"]),
            "AvailableFeatures": node["features"],
            "Gres": node["gres"],
            "GresUsed": node.get("gres_used", "gpu:0"),
            "NodeAddr": node["addr"],
            "NodeHostName": name,
            "State": node["state"],
            "Partitions": node["partitions"],
        }
        return oneliner({**fields, **({"Reason": reason} if reason else {})})

    def show(self, kind: str, names: list[str]) -> Finished:
        """`scontrol show KIND [NAME] [--oneliner]`."""
        name = names[0] if names else ""
        if kind == "job":
            jobs = {i: j for i, j in self.jobs.items() if not j.get("forgotten")}
            if name and name not in jobs:
                return answer(1, "", "slurm_load_jobs error: Invalid job id specified")
            chosen = {name: jobs[name]} if name else jobs
            return answer(0, "".join(self.job_line(i, j) + "\n" for i, j in chosen.items()))
        if kind == "node":
            if name and name not in self.nodes:
                return answer(1, "", f"Node {name} not found")
            chosen = {name: self.nodes[name]} if name else self.nodes
            return answer(0, "".join(self.node_line(n, d) + "\n" for n, d in chosen.items()))
        if kind == "partition":
            lines = (oneliner({"PartitionName": n, **p}) for n, p in self.partitions.items())
            return answer(0, "".join(line + "\n" for line in lines))
        if kind == "reservation":
            if name in self.reservations:
                fields = {"ReservationName": name, "StartTime": "now"}
                fields |= {"Nodes": self.reservations[name], "Users": "root"}
                return answer(0, oneliner(fields) + "\n")
            return answer(1, "", f"Reservation {name} not found")
        if kind == "hostnames":
            return answer(0, "".join(host + "\n" for host in expand_hostlist(name)))
        if self.strict:
            raise AssertionError(f"unexpected scontrol show {kind}")
        return answer()

    def update(self, fields: dict[str, str]) -> Finished:
        """`scontrol update`: a node drained or resumed; a job's change is only kept
        among the calls."""
        if "NodeName" not in fields:
            return answer()
        node = self.nodes.get(fields["NodeName"])
        if node is None:
            return answer(1, "", "slurm_update error: Invalid node name specified")
        base = node["state"].split("+")[0]
        if fields["State"] == "DRAIN":
            if self.refuse_drain:
                return answer(1, "", "slurm_update error: Unable to contact slurm controller")
            node["state"], node["reason"] = f"{base}+DRAIN", fields["Reason"]
        else:
            node["state"], node["reason"] = base, ""
        return answer()

    def create_reservation(self, fields: dict[str, str]) -> Finished:
        if self.refuse_create or fields["ReservationName"] in self.reservations:
            return answer(1, "", self.refuse_create or "Reservation request failed: Duplicate")
        self.reservations[fields["ReservationName"]] = fields["Nodes"]
        return answer(0, f"Reservation created: {fields['ReservationName']}\n")

    def scancel(self, job_id: str) -> Finished:
        if self.jobs.get(job_id, {}).get("uid") != os.getuid():
            return answer(
                1,
                "",
                f"scancel: error: Kill job error on job id {job_id}: Access/permission denied",
            )
        self.jobs[job_id]["state"] = "CANCELLED"
        return answer()

    def sacct_nodes(self, wanted: list[str]) -> str:
        return "".join(
            f"{job_id}|{job.get('nodes', 'None assigned')}\n"
            for job_id, job in self.jobs.items()
            if job_id in wanted and job["state"] in ENDED and job["uid"] == os.getuid()
        )

    # --- as JSON, for the commands on PATH --------------------------------------------

    STATE = ("jobs", "nodes", "partitions", "reservations", "accounting", "next_id", "calls")

    def state(self) -> dict:
        return {key: getattr(self, key) for key in self.STATE} | {"strict": self.strict}

    @classmethod
    def of_state(cls, state: dict) -> FakeSlurm:
        fake = cls(state["strict"])
        for key in cls.STATE:
            setattr(fake, key, state[key])
        return fake


# --- on PATH ----------------------------------------------------------------------------

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")
SCRIPT = """#!{python}
import sys
sys.path.insert(0, {root!r})
from tests.unit.fake_slurm import main
sys.exit(main())
"""


def transact(path: str, change: Callable[[FakeSlurm], object]) -> object:
    """Load the fake from its state file, change it, write it back: under a lock, and
    replaced whole (a test reading the state without the lock never sees it empty)."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as handle:
            fake = FakeSlurm.of_state(json.load(handle))
        result = change(fake)
        with open(path + ".new", "w") as handle:
            json.dump(fake.state(), handle)
        os.replace(path + ".new", path)
    return result


def main() -> int:
    """One fake command on PATH (see the module)."""
    path = os.environ["FAKE_SLURM_STATE"]
    argv = [os.path.basename(sys.argv[0]), *sys.argv[1:]]
    behaviour = os.environ.get("FAKE_SBATCH", "ok")
    if argv[0] == "sbatch" and behaviour == "lost":
        transact(path, lambda fake: fake.calls.append(argv))
        os.kill(os.getppid(), signal.SIGKILL)
        return 0

    def asked(fake: FakeSlurm) -> Finished:
        fake.calls.append(argv)
        return fake.answer(argv)

    done = transact(path, asked)
    if argv[0] == "sbatch" and behaviour == "kill":
        os.kill(os.getppid(), signal.SIGKILL)
    elif argv[0] == "sbatch" and behaviour == "hang":
        time.sleep(60)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.code


class FakeSlurmOnPath:
    """The fake's commands on PATH (env()), its state in root: one node (n1) in one
    partition (batch); a command it has no answer for succeeds and prints nothing."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "fake-slurm-bin"
        self.bin.mkdir()
        self.state = root / "fake-slurm.json"
        fake = FakeSlurm(strict=False)
        fake.add_node("n1")
        fake.add_partition("batch", Default="YES", Nodes="n1")
        self.state.write_text(json.dumps(fake.state()))
        for name in COMMANDS:
            script = self.bin / name
            script.write_text(SCRIPT.format(python=sys.executable, root=str(ROOT)))
            script.chmod(0o755)
        self.path = f"{self.bin}:{os.environ['PATH']}"

    def env(self, sbatch: str = "ok") -> dict[str, str]:
        return {"PATH": self.path, "FAKE_SLURM_STATE": str(self.state), "FAKE_SBATCH": sbatch}

    def fake(self) -> FakeSlurm:
        return FakeSlurm.of_state(json.loads(self.state.read_text()))

    def change(self, change: Callable[[FakeSlurm], object]) -> None:
        transact(str(self.state), change)

    def jobs(self) -> dict[str, dict]:
        return self.fake().jobs

    def calls(self, command: str) -> list[list[str]]:
        return self.fake().calls_of(command)

    def set_job(self, job_id: str, **fields) -> None:
        self.change(lambda fake: fake.set_job(job_id, **fields))

    def enable_accounting(self) -> None:
        """sacct answers (slurmdbd is there) instead of saying accounting is disabled."""
        self.change(lambda fake: setattr(fake, "accounting", True))

    def add_job(self, job_id: str, **job) -> None:
        self.change(lambda fake: fake.add_job(job_id, **job))
