"""allox's placement at submit (issue [16]): a one-GPU job that accepts several types
begins `submit_delay_seconds` after its submission, the next tick matches it with the
others and starts it at once on its type; the agent starts early only a job whose begin
time is such a delay, never one its owner set for later."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent import slurm as slurm_module
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.schedule import early_start, queue_ticks
from tacc_contract.errors import AgentError
from tacc_contract.plugins import (
    PLACEMENT_DELAY_LIMIT,
    Node,
    Queue,
    QueuedJob,
    Submission,
    delayed_for_placement,
)
from tacc_plugins.allox import Allox

SUBMIT = 1_800_000_000.0
NODES = [
    Node(name, 8, 1000, 1, ("batch",), features=(kind,), state="IDLE", gpu_kinds=((kind, 1),))
    for name, kind in (("g1", "h100"), ("g2", "l40s"))
]


def config(delay: object = 5) -> AgentConfig:
    return AgentConfig(plugin_settings={"allox": {"submit_delay_seconds": delay}})


def submission(
    delay: object = 5,
    nodes: object = 1,
    gpus: int = 1,
    constraint: str = "h100|l40s",
    sbatch: dict | None = None,
    **options: str,
) -> Submission:
    task = SimpleNamespace(resources={"nodes": nodes, "gpus_per_node": gpus, "sbatch": sbatch})
    return Submission(task, {"constraint": constraint, **options}, "batch", config=config(delay))


def pending(
    job_id: str,
    reason: str = "BeginTime",
    begins_after: float = 5,
    name: str = "train",
    user: str = "alice",
) -> QueuedJob:
    return QueuedJob(
        job_id,
        user,
        "PENDING",
        0,
        1,
        0,
        reason=reason,
        name=name,
        features="h100|l40s",
        time_limit_seconds=600,
        details=True,
        submit_time=SUBMIT,
        start_time=SUBMIT + begins_after,
    )


def test_a_job_that_accepts_several_types_begins_after_the_delay_for_a_tick_to_place_it():
    found = submission()
    Allox().schedule(found)
    assert found.options["begin"] == "now+5"
    assert found.notes["allox"] == "begins in 5 s: the next queue tick places it"


@pytest.mark.parametrize(
    "given",
    [
        {"delay": 0},  # off, the default
        {"gpus": 2},  # AlloX's model is one GPU on one node
        {"nodes": 2},
        {"nodes": "1-2"},
        {"constraint": "h100"},  # one type: nothing to place
        {"constraint": "h100&ib"},  # its owner's own logic
        {"begin": "now+3600"},  # its owner's own begin time stays
        {"sbatch": {"begin": "2026-12-24T20:00:00"}},  # as a task writes it
        {"sbatch": {"beg": "now+3600"}},  # any spelling sbatch reads as --begin
        {"sbatch": {"hold": ""}},  # held, or waiting for another job: its owner's timing
        {"sbatch": {"dependency": "afterok:12"}},
        {"sbatch": {"deadline": "now+3600"}},
        {"sbatch": {"immediate": ""}},  # only if it can start at once: a delay would fail it
    ],
)
def test_no_delay_where_there_is_nothing_to_place_or_its_owner_set_a_begin(given):
    found = submission(**given)
    before = dict(found.options)
    Allox().schedule(found)
    assert found.options == before and "allox" not in found.notes


@pytest.mark.bad_input
@pytest.mark.parametrize("delay", [-1, 31, PLACEMENT_DELAY_LIMIT + 1, 2.5, "5", True])
def test_a_bad_delay_stops_the_submit_naming_the_key(delay):
    with pytest.raises(AgentError, match=r"plugin_settings\.allox\.submit_delay_seconds"):
        Allox().schedule(submission(delay))


def tick(tmp_path: Path, *jobs: QueuedJob) -> tuple[list[str], dict[str, str], list[str]]:
    """One allox tick: (notes, constraints set, jobs started now)."""
    set_to: dict[str, str] = {}
    started: list[str] = []

    def set_features(job_id: str, features: str) -> bool:
        set_to[job_id] = features
        return True

    def start_now(job_id: str) -> bool:
        started.append(job_id)
        return True

    queue = Queue(
        list(jobs),
        lambda *_: None,
        SUBMIT + 1,
        tmp_path,
        config(),
        set_features=set_features,
        cluster_nodes=lambda: NODES,
        start_now=start_now,
    )
    Allox().tick(queue)
    return queue.notes, set_to, started


def test_the_tick_places_a_delayed_job_and_starts_it_without_its_delay(tmp_path):
    notes, set_to, started = tick(tmp_path, pending("7"))
    assert set_to == {"7": "h100"} and started == ["7"]
    assert "allox: job 7 placed: starts without its submit delay" in notes


@pytest.mark.security
@pytest.mark.parametrize("begins_after", [PLACEMENT_DELAY_LIMIT + 1, 3600])
def test_a_job_its_owner_set_to_begin_later_is_neither_placed_nor_started(tmp_path, begins_after):
    notes, set_to, started = tick(tmp_path, pending("7", begins_after=begins_after))
    assert set_to == {} and started == [], notes


def test_a_job_waiting_for_nodes_is_placed_and_has_nothing_to_start(tmp_path):
    _, set_to, started = tick(tmp_path, pending("7", reason="Resources"))
    assert set_to == {"7": "h100"} and started == []


def record(
    user: str = "alice",
    restarts: int = 0,
    state: str = "PENDING",
    reason: str = "BeginTime",
    begins_after: float = 5,
) -> str:
    """`scontrol show job 7 --oneliner` with SLURM_TIME_FORMAT=%s."""
    return (
        f"JobId=7 JobName=train UserId={user}(1001) GroupId={user}(1001) Priority=1 "
        f"JobState={state} Reason={reason} Dependency=(null) Requeue=1 "
        f"Restarts={restarts} SubmitTime={SUBMIT:.0f} "
        f"EligibleTime={SUBMIT + begins_after:.0f} "
        f"StartTime={SUBMIT + begins_after:.0f}\n"
    )


class Scontrol:
    """Slurm for the agent's starter: `show job` answers `shown`; every call kept."""

    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.calls: list[tuple[list[str], dict | None]] = []

    def __call__(self, argv: list[str], timeout: float, env: dict | None = None) -> str:
        self.calls.append((argv, env))
        return self.shown if argv[1] == "show" else ""

    def updates(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls if argv[1] == "update"]


def start(
    monkeypatch, found: QueuedJob, shown: str, job_id: str = "7"
) -> tuple[bool, Scontrol, list[str]]:
    scontrol = Scontrol(shown)
    monkeypatch.setattr(early_start.slurm.run, "output", scontrol)
    notes: list[str] = []
    started = early_start.starter([found], AgentConfig(), notes.append)(job_id)
    return started, scontrol, notes


def test_the_agent_starts_a_delayed_job_by_moving_its_start_time_to_now(monkeypatch):
    scontrol = Scontrol(record())
    monkeypatch.setattr(early_start.slurm.run, "output", scontrol)
    start_now = early_start.starter([pending("7")], AgentConfig(), [].append)
    assert start_now("7")
    assert scontrol.calls == [
        (["scontrol", "show", "job", "--oneliner", "7"], {"SLURM_TIME_FORMAT": "%s"}),
        (["scontrol", "update", "JobId=7", "StartTime=now"], None),
    ]
    assert not start_now("7")  # started: not twice in a tick


def test_a_delayed_job_just_narrowed_is_started_though_slurm_reset_its_reason(monkeypatch):
    """Slurm reads a pending job's reason as None after a change (the plug-in's own
    `Features=` narrowing in the same tick) until its next scheduling pass; seen in the
    lab on a loaded host."""
    started, scontrol, notes = start(monkeypatch, pending("7"), record(reason="None"))
    assert started and notes == []
    assert scontrol.updates() == [["scontrol", "update", "JobId=7", "StartTime=now"]]


@pytest.mark.security
@pytest.mark.parametrize(
    "found",
    [
        pending("7", begins_after=PLACEMENT_DELAY_LIMIT + 1),  # its owner's plan
        pending("7", begins_after=86400),
        pending("7", reason="Resources"),  # not waiting for a begin time
        pending("7", reason="JobHeldUser"),  # held: only its owner releases it
        QueuedJob(
            "7",
            "alice",
            "RUNNING",
            0,
            1,
            0,
            reason="BeginTime",
            details=True,
            submit_time=SUBMIT,
            start_time=SUBMIT + 5,
        ),
        QueuedJob("7", "alice", "PENDING", 0, 1, 0, reason="BeginTime"),  # times not read
    ],
)
def test_the_agent_never_cuts_short_a_begin_time_that_is_no_placement_delay(monkeypatch, found):
    started, scontrol, notes = start(monkeypatch, found, record())
    assert not started and scontrol.calls == []
    assert notes == ["agent: job 7: start now refused: it waits for no placement delay"]
    started, scontrol, notes = start(monkeypatch, found, record(), job_id="8")
    assert not started and scontrol.calls == []  # nor a job it did not read


@pytest.mark.security
@pytest.mark.parametrize(
    ("shown", "why"),
    [
        # Requeued: Slurm's requeue delay (cred_expire) lets the old run's credential
        # expire; 21 s after its new submit time looked like a placement delay.
        (record(restarts=1, begins_after=21), "it was requeued"),
        (record(begins_after=PLACEMENT_DELAY_LIMIT + 1), "its begin time is its owner's"),
        (record(state="RUNNING", reason="None"), "it no longer waits for a begin time"),
        (record(reason="JobHeldUser"), "it no longer waits for a begin time"),
        (record(reason="Dependency"), "it no longer waits for a begin time"),
        (record(user="bob"), "its record is not its owner's as read"),
        ("", "its record is not its owner's as read"),
    ],
)
def test_the_agent_reads_the_job_again_and_starts_no_requeued_or_changed_one(
    monkeypatch, shown, why
):
    started, scontrol, notes = start(monkeypatch, pending("7", begins_after=21), shown)
    assert not started and scontrol.updates() == []
    assert notes[0].startswith(f"agent: job 7: start now refused: {why}"), notes


@pytest.mark.security
def test_the_details_read_times_as_epoch_seconds_whatever_the_callers_format(monkeypatch):
    """A root shell's SLURM_TIME_FORMAT ("%F %T": a space) shifted every field after it
    on the old read; local times misread across a DST change."""
    seen: list[dict | None] = []

    def squeue(argv, timeout, env=None):
        seen.append(env)
        start = argv[-1].split()[0]
        return f"{start} 9 alice 10:00  1795587794 1795587799 h100|l40s train\n"

    monkeypatch.setattr(queue_ticks.slurm.run, "output", squeue)
    jobs = [QueuedJob("9", "alice", "PENDING", 0, 1, 0)]
    queue_ticks.read_details(jobs, AgentConfig())
    assert seen == [{"SLURM_TIME_FORMAT": "%s"}]
    assert (jobs[0].submit_time, jobs[0].start_time, jobs[0].features) == (
        1795587794,
        1795587799,
        "h100|l40s",
    )


def test_slurm_times_read_as_epoch_seconds_and_none_as_zero():
    assert slurm_module.times.epoch_seconds("1795587794") == 1795587794.0
    texts = ("N/A", "Unknown", "", "x", "2026-11-25T06:00:00", "-5")
    assert [slurm_module.times.epoch_seconds(t) for t in texts] == [0.0] * len(texts)
    assert delayed_for_placement(pending("7", begins_after=PLACEMENT_DELAY_LIMIT))


def named(name: str, **fields) -> str:
    """record() of a job named `name` (Slurm allows any text in a name)."""
    return record(**fields).replace("JobName=train ", f"JobName={name} ")


@pytest.mark.security
@pytest.mark.parametrize(
    "name",
    [
        # scontrol prints the name before UserId, Restarts and the times: on the old read
        # (the first copy of a key won) these were the record.
        f"x Restarts=0 SubmitTime={SUBMIT:.0f} EligibleTime={SUBMIT + 5:.0f}",
        "x UserId=alice(1001) JobState=PENDING Reason=BeginTime",
        "x SubmitTime=\u00b2",  # "²".isdigit() is True, float("²") raised in the tick
    ],
)
def test_a_job_name_forges_no_field_of_the_record_read_again(monkeypatch, name):
    requeued = named(name, restarts=1, begins_after=21)
    started, scontrol, notes = start(monkeypatch, pending("7", begins_after=21), requeued)
    assert not started and scontrol.updates() == []
    refused = "agent: job 7: start now refused: its record is not its owner"
    assert notes[0].startswith(refused), notes


@pytest.mark.security
def test_a_job_name_with_a_line_break_is_no_record(monkeypatch):
    shown = named(f"x\nJobId=7 Restarts=0 SubmitTime={SUBMIT:.0f}", restarts=1, begins_after=21)
    started, scontrol, _ = start(monkeypatch, pending("7", begins_after=21), shown)
    assert not started and scontrol.updates() == []


def test_an_unforged_name_with_spaces_and_equals_signs_still_starts(monkeypatch):
    started, _, notes = start(monkeypatch, pending("7"), named("lr=0.1 run two"))
    assert started, notes
