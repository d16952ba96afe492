"""The node range the agent recorded for each job it resizes, kept by root where no user
can write (`<state_dir>/node-ranges.json`, the queue tick's own directory).

A job's owner writes its range at submit (plugin_data.elastic.range in status/submit.json,
her own file, which she can rewrite at any time); Slurm keeps what she submitted with
(`sbatch --nodes=SIZE-MAX`): its accounting's submit line (slurm.accounting.submitted_nodes), and,
while the job waits and before it first ran, its record (NumNodes=SIZE-MAX; a job that
ran shows only the size it held). The agent records the range the first time it resizes
the job: the submitted one, else, without accounting, the owner's range with its maximum
no higher than the waiting job's. From then on that record is the job's range, and an
owner's range that differs from it is refused (`preempt.refusal`).

Each entry names the job by Slurm's id, its owner's uid and its directory (unique to one
submission); an entry not used for FORGET_SECONDS goes.
"""

from __future__ import annotations

from pathlib import Path

from tacc_contract.jsonfiles import read_json, write_json

STORE_FILE = "node-ranges.json"
FORGET_SECONDS = 30 * 24 * 3600

Key = tuple[str, int, str]  # Slurm's job id, its owner's uid, its job directory
Range = tuple[int, int]


def store_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / STORE_FILE


def valid_entry(entry: object) -> bool:
    if not isinstance(entry, dict):
        return False
    bounds = entry.get("range")
    numbers = [entry.get("uid"), entry.get("used"), *(bounds if isinstance(bounds, list) else [])]
    return (
        isinstance(entry.get("job_dir"), str)
        and isinstance(bounds, list)
        and len(bounds) == 2
        and all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers)
        and 1 <= bounds[0] <= bounds[1]
    )


def load(path: Path) -> dict[str, dict]:
    """The store, each entry checked (a damaged one is dropped: that job is read afresh)."""
    data = read_json(path)
    entries = data.get("jobs") if isinstance(data, dict) else None
    found = entries if isinstance(entries, dict) else {}
    return {str(job_id): entry for job_id, entry in found.items() if valid_entry(entry)}


def recorded(path: Path, key: Key) -> Range | None:
    """The range recorded for this job; None when there is none (or it was another job
    under the same id)."""
    entry = load(path).get(key[0])
    if entry is None or (entry["uid"], entry["job_dir"]) != key[1:]:
        return None
    low, high = entry["range"]
    return int(low), int(high)


def record(path: Path, key: Key, bounds: Range, now: float) -> None:
    """Keep `bounds` as the job's range (atomic, readable by root alone); entries unused
    for FORGET_SECONDS go. OSError when it cannot be written."""
    entries = {
        job_id: entry
        for job_id, entry in load(path).items()
        if now - entry["used"] < FORGET_SECONDS
    }
    entries[key[0]] = {"uid": key[1], "job_dir": key[2], "range": list(bounds), "used": now}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_json(path, {"jobs": entries}, mode=0o600)
