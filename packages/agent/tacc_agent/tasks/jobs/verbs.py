"""The job verbs tcloud calls over SSH: status, ps, cancel, halt, resume.

A job's state is its record (events written by the agent and the job itself)
reconciled with what Slurm says now; a terminal state found by reconciliation is
recorded, so it never changes afterwards.
"""

from __future__ import annotations

import time
from itertools import islice
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute import envcache, lost_nodes
from tacc_agent.tasks.images import cache as imagecache
from tacc_agent.tasks.jobs import job_tags, records, sweep_progress, sweeps
from tacc_agent.tasks.schedule import found_again as submitting
from tacc_agent.tasks.schedule.instruction import load
from tacc_agent.tasks.schedule.reasons import checked_reason
from tacc_agent.tasks.store import workspace
from tacc_contract.instruction import FILE, code_digest
from tacc_contract.jobs import PS_LIMIT
from tacc_contract.schema import session_of
from tacc_contract.trials import trials_of
from tacc_plugins import fluid

SLURM_FAILED = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
SLURM_ACTIVE = ("CONFIGURING", "RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING")
# Not ended, not running: the job comes back (or is resumed) later.
SLURM_PAUSED = (
    "SUSPENDED",
    "STOPPED",
    "PREEMPTED",
    "RESV_DEL_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
    "REVOKED",
)
LOG_LINES = 10


def slurm_info(job_id: str, config: AgentConfig) -> dict[str, str] | None:
    return slurm.jobs.job_record(job_id, config.slurm_timeout_seconds)


def own_info(job_id: str, job_dir: Path, config: AgentConfig) -> dict[str, str] | None:
    """Slurm's record of job_id when it is this job of the caller's (job_tags); None
    when Slurm forgot the job, or the id now names another user's or another job."""
    info = slurm_info(job_id, config)
    return info if info and job_tags.is_theirs(info, sweep_root(job_dir, job_id)) else None


def checked_info(job_id: str, job_dir: Path, config: AgentConfig) -> dict[str, str] | None:
    """As own_info, for acting on the job: an id Slurm gives to another job is refused
    (a job whose record says it ended is not asked about: nothing is done to it)."""
    if records.last_state(job_dir) in records.TERMINAL:
        return None
    info = slurm_info(job_id, config)
    if info and not job_tags.is_theirs(info, sweep_root(job_dir, job_id)):
        raise Rejected(
            f"job {job_id}: Slurm's job {job_id} is not this job of yours (it is "
            f"{job_tags.owner(info)}'s, or a later job given the same id after Slurm lost its "
            "state); nothing was done to it"
        )
    return info


def find_job(user_dir: Path, job_id: str, config: AgentConfig) -> Path:
    """The caller's job by Slurm id, once submissions cut off after sbatch are settled."""
    submitting.resolve(user_dir, config)
    return workspace.job_dir(user_dir, job_id)


def rank_state(rank: dict) -> str:
    if rank.get("state") != "EXITED":
        return "CANCELLED" if rank.get("terminated") else rank.get("state", "PROVISIONING")
    if rank.get("terminated"):
        return "CANCELLED"
    return "COMPLETED" if rank.get("exit_code") == 0 else "FAILED"


def reconcile(
    job_dir: Path, info: dict[str, str] | None, timeout: float = slurm.run.TIMEOUT
) -> tuple[str, str]:
    """(state, reason) from the record and Slurm's view (None: Slurm forgot the job)."""
    last = records.current(records.history(job_dir)) or {"state": "QUEUED"}
    if last["state"] in records.TERMINAL:
        return last["state"], str(last.get("reason", ""))
    ranks = records.ranks(job_dir)
    slurm_state = (info or {}).get("JobState", "")
    reason = (info or {}).get("Reason", "None")
    if info and (slurm_state == "PENDING" or slurm_state.startswith("REQUEUE")):
        held = "held" in reason.lower() or slurm_state == "REQUEUE_HOLD"
        if last["state"] == "HALTED" or held:
            return "HALTED", reason
        requeued = info.get("Restarts", "0") not in ("0", "")
        lost = lost_nodes.describe(ranks, timeout) if requeued else ""
        if lost:  # Slurm requeued it (sbatch --requeue): it runs again when nodes allow
            return "QUEUED", f"requeued: {lost}"
        return "QUEUED", reason if reason != "None" else ""
    if info and slurm_state in SLURM_PAUSED:
        return ("HALTED" if last["state"] == "HALTED" else "QUEUED"), slurm_state
    if info and slurm_state in SLURM_ACTIVE:
        if last["state"] in ("PROVISIONING", "RUNNING", "HALTED"):
            return last["state"], ""
        return "PROVISIONING", ""
    # Slurm says it ended (or forgot it) and the job did not record how: decide, record.
    failed = [r for r in ranks if rank_state(r) == "FAILED"]
    all_done = bool(ranks) and all(rank_state(r) == "COMPLETED" for r in ranks)
    if last["state"] == "HALTED" and all_done:
        state, why = "COMPLETED", "finished during its checkpoint grace period"
    elif slurm_state == "CANCELLED" or last["state"] == "HALTED":
        state, why = "CANCELLED", f"Slurm: {slurm_state or 'gone'}"
    elif slurm_state in SLURM_FAILED or failed:
        state, why = "FAILED", f"Slurm: {slurm_state}" if slurm_state else "a rank failed"
        lost = lost_nodes.describe(ranks, timeout) if slurm_state == "NODE_FAIL" else ""
        why = f"{why}: {lost}" if lost else why
    elif slurm_state == "COMPLETED" or all_done:
        state, why = "COMPLETED", ""
    else:
        state, why = "FAILED", "the job left Slurm without recording how it ended"
    codes = [r.get("exit_code") for r in failed]
    records.add_event(job_dir, state, reason=why, exit_code=codes[0] if codes else None)
    return state, why


def array_queue(job_id: str, config: AgentConfig) -> dict[str, dict[str, str]]:
    """Slurm's view of every task of array job_id still in the queue, by "12_3"."""
    return slurm.queue.own_jobs(config.slurm_timeout_seconds, job_id, check=False)


def queued(queue: dict[str, dict[str, str]], job_id: str, job_dir: Path) -> dict | None:
    """squeue's line for job_id (the caller's: --me) when it is this job (its tag)."""
    info = queue.get(job_id)
    return info if info and job_tags.tagged_for(info, sweep_root(job_dir, job_id)) else None


def sweep_status(
    job_id: str, job_dir: Path, config: AgentConfig, queue: dict[str, dict[str, str]] | None = None
) -> dict:
    """A sweep: each trial reconciled like a job, and the sweep's state from theirs."""
    queue = array_queue(job_id, config) if queue is None else queue
    task = load(job_dir)
    parameters, adaptive = trials_of(task), fluid.adaptive_of(task)
    trials = []
    for index in sweeps.trial_indexes(job_dir):
        trial_id, trial = f"{job_id}_{index}", sweeps.trial_dir(job_dir, index)
        info = queued(queue, trial_id, trial)
        if info is None and records.last_state(trial) not in records.TERMINAL:
            info = own_info(trial_id, trial, config)
        state, reason = reconcile(trial, info, config.slurm_timeout_seconds)
        final = records.current(records.history(trial)) or {}
        trials.append(
            {
                "trial": int(index),
                "job_id": trial_id,
                "state": state,
                "reason": reason,
                "exit_code": final.get("exit_code") if state in records.TERMINAL else None,
                "parameters": parameters[int(index)] if int(index) < len(parameters) else {},
                "nodes": (info or {}).get("NodeList", ""),
                **sweep_progress.progress(trial, adaptive),
            }
        )
    states = [t["state"] for t in trials]
    ranked = sweep_progress.best_first(trials, (adaptive or {}).get("mode", "max"))
    return {
        "job_id": job_id,
        "name": _name(job_dir),
        "state": sweeps.summary_state(states),
        "reason": sweeps.counts(states),
        "exit_code": None,
        "workdir": str(job_dir),
        "sweep": True,
        "trials": trials,  # by index; `ranking`: their ids best first
        "ranking": [t["job_id"] for t in ranked],
        "best": sweep_progress.best_of(ranked),
        "history": [],
        "nodes": [],
        "plugins": _plugins(job_dir),
    }


def _warnings(history: list[dict]) -> list[str]:
    """What the job's last run warns its owner of (a transport fallback on a node the
    inventory gives RDMA)."""
    running = [e for e in history if e["state"] == "RUNNING"]
    warnings = running[-1].get("warnings", []) if running else []
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


def _plugins(job_dir: Path) -> dict:
    """What the plug-ins did to the job: compile passes, scheduling, execution."""
    document = records.read_json(job_dir / "instruction.json") or {}
    submitted = records.read_json(job_dir / "status" / "submit.json") or {}
    shaped = dict((document.get("plugins") or {}).get("shaped") or {})
    shaped.update(submitted.get("plugins") or {})
    running = [e for e in records.history(job_dir) if e.get("plugins")]
    if running:
        shaped.update(running[-1]["plugins"])
    return shaped


def session_settings(instruction: dict) -> dict | None:
    """The task's session settings (defaults filled), None for an ordinary job. Read
    from the instruction the agent validated at submit, so only a well-formed one."""
    task = instruction.get("task")
    session = task.get("session") if isinstance(task, dict) else None
    return session_of(session) if isinstance(session, dict) else None


def kind_of(job_dir: Path) -> str:
    """ps's kind: "session" for an interactive session, else "job"."""
    instruction = records.read_json(job_dir / FILE) or {}
    return "session" if session_settings(instruction) is not None else "job"


def status(user_dir: Path, job_id: str, config: AgentConfig) -> dict:
    job_dir = find_job(user_dir, job_id, config)
    if sweeps.is_whole_sweep(job_id, job_dir):
        return sweep_status(job_id, job_dir, config)
    info = own_info(job_id, job_dir, config)
    state, reason = reconcile(job_dir, info, config.slurm_timeout_seconds)
    instruction = records.read_json(job_dir / FILE) or {}
    history = records.history(job_dir)
    ranks = records.ranks(job_dir)
    codes = [r.get("exit_code") for r in ranks if r.get("exit_code")]
    settled = records.current(history) or {}
    final = settled if settled.get("state") in records.TERMINAL else {}
    nodes = [
        {
            "rank": r["rank"],
            "host": r.get("host", "?"),
            "state": rank_state(r),
            "exit_code": r.get("exit_code"),
            "signal": r.get("signal"),
        }
        for r in ranks
    ]
    if not nodes and info and info.get("NodeList", "(null)") not in ("(null)", ""):
        nodes = [{"rank": None, "host": info["NodeList"], "state": state, "exit_code": None}]
    result = {
        "job_id": job_id,
        "name": _name(job_dir),
        "state": state,
        "reason": reason,
        "exit_code": final.get("exit_code", codes[0] if codes else None)
        if state in records.TERMINAL
        else None,
        "slurm_state": (info or {}).get("JobState"),
        "workdir": str(job_dir),
        "history": [
            {"state": e["state"], "time": e["time"], **({"lost": e["lost"]} if "lost" in e else {})}
            for e in history
        ],
        "nodes": nodes,
        "plugins": _plugins(sweep_root(job_dir, job_id)) | _plugins(job_dir),
        "warnings": _warnings(history),
        "environment": envcache.job_environment(job_dir),
        "image": imagecache.job_image(job_dir),
        "code_digest": code_digest(instruction),
        "rerun_of": instruction.get("rerun_of"),
        "session": session_settings(instruction),
    }
    if state == "FAILED":
        result["last_lines"] = {
            f"{host}:{rank}": records.tail_lines(path, LOG_LINES)
            for rank, host, path in records.rank_logs(job_dir)
        }
        result["last_lines"]["job"] = records.tail_lines(job_dir / "logs" / "job.log", LOG_LINES)
    return result


def ps(user_dir: Path, config: AgentConfig, limit: int = PS_LIMIT) -> list[dict]:
    """The caller's jobs (their own index: nobody else's), newest first; a job whose
    sbatch has not answered yet is SUBMITTING, with no id."""
    waiting = submitting.resolve(user_dir, config)
    queue = slurm.queue.own_jobs(config.slurm_timeout_seconds)
    rows = [submitting_row(job_dir) for job_dir in waiting]
    ended: dict[str, Path] = {}  # jobs that left the queue: where they ran comes after
    for entry in islice(reversed(workspace.entries(user_dir)), limit):  # not [-limit:]: 0 is all
        job_id, job_dir = entry.job_id, entry.job_dir
        if sweeps.is_sweep(job_dir):
            sweep = sweep_status(job_id, job_dir, config, queue)
            history = records.history(job_dir)
            submitted = history[0]["time"] if history else 0
            rows.append(
                {
                    "job": job_id,
                    "name": f"{sweep['name']} ({sweep['reason']})",
                    "state": sweep["state"],
                    "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(submitted)),
                    "nodes": ",".join(sorted({t["nodes"] for t in sweep["trials"] if t["nodes"]})),
                    "kind": "job",
                }
            )
            continue
        last = records.last_state(job_dir)
        info = queued(queue, job_id, job_dir)
        if info is None and last not in records.TERMINAL:
            info = own_info(job_id, job_dir, config)
        state, _ = reconcile(job_dir, info)
        history = records.history(job_dir)
        submitted = history[0]["time"] if history else 0
        rows.append(
            {
                "job": job_id,
                "name": _name(job_dir),
                "state": state,
                "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(submitted)),
                "nodes": (info or {}).get("NodeList", ""),
                "kind": kind_of(job_dir),
            }
        )
        if state in records.TERMINAL and rows[-1]["nodes"] in slurm.nodes.NO_NODE_LIST:
            ended[job_id] = job_dir
    accounted = ran_on(list(ended), config)
    for row in rows:
        if row["job"] in ended:
            row["nodes"] = accounted.get(row["job"]) or recorded_hosts(ended[row["job"]])
    return rows


def ran_on(job_ids: list[str], config: AgentConfig) -> dict[str, str]:
    """Where the caller's jobs that left the queue ran, by job id, from Slurm's
    accounting (one sacct call, the caller's own jobs only); {} without accounting."""
    if not job_ids:
        return {}
    try:
        return slurm.accounting.own_job_nodes(job_ids, config.slurm_timeout_seconds)
    except AgentError:
        return {}  # no slurmdbd: the job's own records say where its ranks ran


def recorded_hosts(job_dir: Path) -> str:
    """The hosts the job's ranks recorded (where accounting has no answer)."""
    hosts = {rank.get("host") for rank in records.ranks(job_dir)}
    return ",".join(sorted(host for host in hosts if isinstance(host, str) and host))


def submitting_row(job_dir: Path) -> dict:
    since = (records.read_json(job_dir / "status" / "submit.json") or {}).get("since", 0)
    return {
        "job": "-",
        "name": _name(job_dir),
        "state": "SUBMITTING",
        "nodes": "",
        "submitted": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)),
        "kind": kind_of(job_dir),
    }


def _name(job_dir: Path) -> str:
    return (records.read_json(job_dir / "status" / "submit.json") or {}).get("name", "")


def sweep_root(job_dir: Path, job_id: str) -> Path:
    """The sweep's directory for a trial (12_3), else the job's own."""
    return job_dir.parent.parent if "_" in job_id else job_dir


def cancel_sweep(job_id: str, job_dir: Path, config: AgentConfig) -> dict:
    sweep = sweep_status(job_id, job_dir, config)
    running = [t for t in sweep["trials"] if t["state"] not in records.TERMINAL]
    for trial in running:
        records.add_event(
            sweeps.trial_dir(job_dir, str(trial["trial"])),
            "CANCELLED",
            reason="cancelled by its owner (the whole sweep)",
        )
    if running:
        slurm.run.output(["scancel", job_id], config.slurm_timeout_seconds)
    return {
        "job_id": job_id,
        "state": "CANCELLED" if running else sweep["state"],
        "cancelled": bool(running),
        "trials": len(running),
    }


def cancel(user_dir: Path, job_ids: list[str], config: AgentConfig) -> list[dict]:
    """Cancel the caller's jobs; nothing is done when one of the ids is not theirs, or
    Slurm now gives it to another job (checked_info)."""
    submitting.resolve(user_dir, config)
    dirs = [(job_id, workspace.job_dir(user_dir, job_id)) for job_id in job_ids]
    infos = [checked_info(job_id, job_dir, config) for job_id, job_dir in dirs]
    done = []
    for (job_id, job_dir), info in zip(dirs, infos, strict=True):
        if sweeps.is_whole_sweep(job_id, job_dir):
            done.append(cancel_sweep(job_id, job_dir, config))
            continue
        state, _ = reconcile(job_dir, info)
        if state in records.TERMINAL:
            done.append({"job_id": job_id, "state": state, "cancelled": False})
            continue
        records.add_event(job_dir, "CANCELLED", reason="cancelled by its owner")
        slurm.run.output(["scancel", job_id], config.slurm_timeout_seconds)
        done.append({"job_id": job_id, "state": "CANCELLED", "cancelled": True})
    return done


MAX_HALT_GRACE_SECONDS = 3600  # the researcher's SSH call waits this long at most


def halt(
    user_dir: Path,
    job_id: str,
    config: AgentConfig,
    grace: float | None = None,
    reason: str | None = None,
) -> dict:
    """Checkpoint signal (USR1) to every rank, a grace period, then requeue on hold.
    `reason`: why, for the HALTED event (the queue tick's preemption); else its owner."""
    reason = checked_reason(reason)
    job_dir = not_a_sweep(find_job(user_dir, job_id, config), job_id)
    state, _ = reconcile(job_dir, checked_info(job_id, job_dir, config))
    if state in (*records.TERMINAL, "HALTED"):
        raise Rejected(f"job {job_id} is {state}; only queued or running jobs can be halted")
    grace = config.halt_grace_seconds if grace is None else grace
    if not 0 <= grace <= MAX_HALT_GRACE_SECONDS:
        raise Rejected(
            f"a halt's grace period is 0 to {MAX_HALT_GRACE_SECONDS} seconds, got {grace:g}"
        )
    if state == "QUEUED":  # nothing runs yet: just hold it
        slurm.run.output(["scontrol", "hold", job_id], config.slurm_timeout_seconds)
        records.add_event(
            job_dir, "HALTED", reason=f"held: {reason}" if reason else "held by its owner"
        )
        return {"job_id": job_id, "state": "HALTED", "checkpoint_signal": False}
    # Recorded first: the batch step must not mistake the checkpointed exit for the end.
    records.add_event(
        job_dir, "HALTED", reason=f"halted: {reason}" if reason else "halted by its owner"
    )
    # Every step's processes; with mpirun also the batch step, where mpirun runs and
    # passes the signal on to its ranks.
    instruction = records.read_json(job_dir / FILE) or {}
    launcher = instruction.get("task", {}).get("runtime", {}).get("launcher")
    full = ["--full"] if launcher == "mpirun" else []
    slurm.run.output(["scancel", *full, "--signal=USR1", job_id], config.slurm_timeout_seconds)
    deadline = time.monotonic() + grace
    exited = False
    while not exited and time.monotonic() < deadline:
        ranks = records.ranks(job_dir)
        exited = bool(ranks) and all(r.get("state") == "EXITED" for r in ranks)
        if not exited:
            time.sleep(0.2)
    try:
        slurm.run.output(["scontrol", "requeuehold", job_id], config.slurm_timeout_seconds)
    except AgentError as exc:
        now, _ = reconcile(job_dir, own_info(job_id, job_dir, config))
        if now in records.TERMINAL:
            message = f"job {job_id} ended ({now}) during its checkpoint grace period"
            raise Rejected(message) from None
        raise exc from None
    # Whether the program ended on its own within the grace period (it checkpointed,
    # if it handles the signal) or was still running and Slurm stopped it.
    return {
        "job_id": job_id,
        "state": "HALTED",
        "checkpoint_signal": True,
        "exited_in_grace": exited,
        "grace_seconds": grace,
    }


def not_a_sweep(job_dir: Path, job_id: str) -> Path:
    if sweeps.is_whole_sweep(job_id, job_dir):
        raise Rejected(
            f"job {job_id} is a sweep; halt or resume its trials one at a time "
            f"({job_id}_0, {job_id}_1, ...)"
        )
    return job_dir


def resume(user_dir: Path, job_id: str, config: AgentConfig, reason: str | None = None) -> dict:
    """Release a halted job; `reason` as halt's, for its QUEUED event."""
    reason = checked_reason(reason)
    job_dir = not_a_sweep(find_job(user_dir, job_id, config), job_id)
    state, _ = reconcile(job_dir, checked_info(job_id, job_dir, config))
    if state != "HALTED":
        raise Rejected(f"job {job_id} is {state}; only halted jobs can be resumed")
    records.add_event(
        job_dir, "QUEUED", reason=f"resumed: {reason}" if reason else "resumed by its owner"
    )
    slurm.run.output(["scontrol", "release", job_id], config.slurm_timeout_seconds)
    return {"job_id": job_id, "state": "QUEUED"}
