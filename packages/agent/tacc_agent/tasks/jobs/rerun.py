"""`tacc-agent job rerun JOB`: the same job again, months later. A new job directory
from the past job's instruction and the same content-addressed files (hard links into
the store: the same code digest, nothing uploaded), with the environment pinned to the
versions the past job ran with (its status/environment.json lock), then submitted like
any job. The instruction records `rerun_of`. A task with a container image needs nothing
more: its instruction holds the image pinned to the digest it was resolved to at submit,
so the rerun runs the same bits (pulled again by that digest if the cache lost them).
A sweep reruns whole: its instruction holds the trials it ran (drawn or a grid's), so
the same ones run again, none drawn anew (issue [24])."""

from __future__ import annotations

import copy
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.tasks.execute import envcache
from tacc_agent.tasks.jobs import records, sweeps
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.schedule.instruction import load
from tacc_agent.tasks.store import delta as store
from tacc_agent.tasks.store import workspace
from tacc_contract.instruction import FILE, canonical, code_digest, digest_of


def recorded_environment(job_dir: Path) -> dict | None:
    """The environment the job ran with; a sweep's from the first of its trials that
    built it (its trials share one: the same requirements)."""
    if not sweeps.is_sweep(job_dir):
        return envcache.job_environment(job_dir)
    for index in sweeps.trial_indexes(job_dir):
        found = envcache.job_environment(sweeps.trial_dir(job_dir, index))
        if found and found.get("lock"):
            return found
    return None


def rerun_document(job_id: str, job_dir: Path) -> dict:
    """The past job's instruction with its environment locked to what it ran with."""
    document = records.read_json(job_dir / FILE)
    if not document:
        raise Rejected(f"job {job_id} has no readable {FILE}")
    task = load(job_dir)  # re-validated: a job directory is never trusted blindly
    again = copy.deepcopy(document)
    again.pop("rerun_of", None)
    wants_env = task.environment["requirements"] or task.environment.get("lock")
    if wants_env:
        environment = recorded_environment(job_dir)
        if not environment or not environment.get("lock"):
            raise Rejected(
                f"job {job_id} never built its environment (it did not start), so there are "
                "no locked versions to rerun it with; submit the task again instead"
            )
        again["task"].setdefault("environment", {})["lock"] = environment["lock"]
    again["rerun_of"] = job_id
    return again


def rerun(user_dir: Path, job_id: str, config: AgentConfig) -> dict:
    job_dir = workspace.job_dir(user_dir, job_id)
    if sweeps.is_trial(job_dir):
        sweep_id = job_id.split("_", 1)[0]
        raise Rejected(
            f"job {job_id} is one trial of sweep {sweep_id}; rerun the sweep "
            f"(tcloud rerun {sweep_id}) to run its trials again"
        )
    document = rerun_document(job_id, job_dir)
    try:
        entries = document["manifest"].items()
        names = {path: store.blob_name(sha, mode) for path, (sha, _size, mode) in entries}
    except (AttributeError, TypeError, ValueError):
        raise Rejected(f"job {job_id}'s instruction has a malformed manifest") from None
    text = canonical(document).decode()
    # The same checks as an upload's commit: paths under code/ or datasets/, no '..'.
    _, manifest, files = store.checked_request({"manifest": names, "files": {FILE: text}})
    answer = store.commit(user_dir, [], manifest, digest_of(document), files)
    if not answer["workdir"]:
        missing = ", ".join(answer["bad"][:3])
        raise Rejected(f"job {job_id}'s files are no longer all in your store ({missing} ...)")
    job = schedule.submit(user_dir, Path(answer["workdir"]), config)
    lock = document["task"].get("environment", {}).get("lock", [])
    return {**job, "rerun_of": job_id, "code_digest": code_digest(document), "lock": lock}
