"""A scheduling plug-in narrowing a pending job's constraint (`Queue.set_features`), and
giving it back: the only change of a job's features the agent makes, and only inside
what the job's owner asked for.

The first time a job is narrowed, its constraint as Slurm then had it is kept in the
agent's state directory (`constraints.json`, root's), with the value the agent set: a
narrowing must name some of those features, a give-back names them all. A constraint
that is neither is its owner's own change (`scontrol update` of their pending job),
the new original. Only a plain either-or constraint ("a100|h100", what `gpu_types`
writes) is narrowed; one with counts, brackets or "&" is the owner's own logic and stays
as it is. A job out of the queue is forgotten after ten minutes (a requeued job is out
of squeue's view for a moment)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.errors import AgentError
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugins import QueuedJob, either_or

STATE_FILE = "constraints.json"
FORGET_SECONDS = 600.0


class Narrowing:
    """`set_features` for one tick: the queue as read, the originals kept across ticks
    (read at the first narrowing of the tick: a tick that narrows nothing reads nothing)."""

    def __init__(
        self,
        jobs: list[QueuedJob],
        state_dir: Path,
        timeout: float,
        note: Callable[[str], None],
        now: float = 0.0,
    ) -> None:
        self.jobs = {job.job_id: job for job in jobs}
        self.path = state_dir / STATE_FILE
        self.timeout = timeout
        self.note = note
        self.now = now
        self.kept: dict[str, dict] | None = None

    @property
    def originals(self) -> dict[str, dict]:
        if self.kept is None:
            self.kept = self.load()
        return self.kept

    def load(self) -> dict[str, dict]:
        found = read_json(self.path)
        kept = found.get("originals") if isinstance(found, dict) else None
        originals: dict[str, dict] = {}
        for job_id, entry in (kept if isinstance(kept, dict) else {}).items():
            if not (
                isinstance(entry, dict)
                and isinstance(entry.get("original"), str)
                and isinstance(entry.get("set"), str)
                and isinstance(entry.get("at"), int | float)
            ):
                continue
            job = self.jobs.get(job_id)
            if job is None and self.now - entry["at"] <= FORGET_SECONDS:
                originals[job_id] = entry
            elif job is not None and job.features in (entry["original"], entry["set"]):
                originals[job_id] = {**entry, "at": self.now}
        return originals

    def set_features(self, job_id: str, features: str) -> bool:
        job = self.jobs.get(job_id)
        if job is None or job.state != "PENDING":
            self.note(f"agent: job {job_id}: only a pending job's constraint is changed")
            return False
        original = self.originals.get(job_id, {}).get("original", job.features)
        allowed, wanted = either_or(original), either_or(features)
        if not allowed or not wanted or not set(wanted) <= set(allowed):
            self.note(
                f"agent: job {job_id}: constraint {features!r} refused: not within "
                f"what its owner asked for ({original or 'none'})"
            )
            return False
        if features == job.features:
            return True
        self.originals[job_id] = {"original": original, "set": features, "at": self.now}
        self.save()  # before Slurm changes it: a tick killed between keeps the original
        try:
            slurm.run.output(
                ["scontrol", "update", f"JobId={job_id}", f"Features={features}"], self.timeout
            )
        except AgentError as exc:  # it started meanwhile, or Slurm did not answer
            self.note(f"agent: job {job_id}: constraint not changed: {exc}")
            return False
        job.features = features
        return True

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"originals": self.originals})
