"""The queue tick's requeue (tacc_agent/tasks/schedule/preempt.py): the owner's opt-in read as root
with care, and the owner's own halt then resume."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_agent import cli, slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_REJECTED, AgentError, Rejected
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs import verbs as jobs
from tacc_agent.tasks.schedule import preempt
from tacc_agent.tasks.store import workspace
from tests.unit.fake_slurm import oneliner

OTHER_UID = 4321  # the job's owner when the tests run as root (files chowned to it)
OPTED_IN = {"plugin_data": {"tiresias": {"opt_in": ["preemptible"]}, "elastic": {}}}


def owner_uid() -> int:
    return OTHER_UID if os.getuid() == 0 else os.getuid()


def chown_tree(path: Path, uid: int) -> None:
    if os.getuid() != 0:
        return
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), uid, -1)
    os.lchown(path, uid, -1)


@pytest.fixture
def job_dir(tmp_path) -> Path:
    """alice's job: <user dir>/jobs/<dir>, its submit.json opting in to preemption."""
    directory = tmp_path / "alice" / "jobs" / "abc-1"
    (directory / "status").mkdir(parents=True)
    (directory / "status" / "submit.json").write_text(json.dumps(OPTED_IN))
    chown_tree(tmp_path / "alice", owner_uid())
    return directory


def record(job_dir: Path, state: str = "RUNNING", uid: int | None = None) -> preempt.JobRecord:
    return preempt.JobRecord(
        "41", owner_uid() if uid is None else uid, "alice", state, job_dir, False
    )


def write_submit(job_dir: Path, data: bytes) -> None:
    path = job_dir / "status" / "submit.json"
    path.unlink()
    path.write_bytes(data)
    chown_tree(job_dir, owner_uid())


def test_the_known_opt_in_words_of_every_plugin_are_read(job_dir):
    write_submit(
        job_dir,
        json.dumps(
            {
                "plugin_data": {
                    "tiresias": {"opt_in": ["preemptible", "root", 3]},
                    "elastic": {"opt_in": ["resize"], "min": 1},
                    "sweep": [],
                    "x": {"opt_in": "resize"},
                }
            }
        ).encode(),
    )
    assert preempt.opted_in_job(record(job_dir)) == {"preemptible", "resize"}


def test_slurms_record_gives_owner_state_and_directory(monkeypatch):
    info = {
        "JobId": "41",
        "UserId": "alice(1001)",
        "JobState": "RUNNING",
        "WorkDir": "/shared/tcloud/alice/jobs/abc-1",
        "Comment": "tacc:abc-1:00",
    }
    trial = {**info, "JobId": "52", "ArrayJobId": "50", "ArrayTaskId": "2"}
    lines = {"41": oneliner(info), "52": oneliner(trial)}
    monkeypatch.setattr(
        slurm.oneliner,
        "show_lines",
        lambda kind, name="", timeout=0, env=None: [lines[name]] if name else [*lines.values()],
    )
    assert preempt.job_record("41", AgentConfig()) == preempt.JobRecord(
        "41", 1001, "alice", "RUNNING", Path("/shared/tcloud/alice/jobs/abc-1"), False
    )
    assert set(preempt.job_records(AgentConfig())) == {"41", "50_2"}
    assert preempt.job_records(AgentConfig())["50_2"].array is True


@pytest.mark.security
def test_a_symlinked_submit_record_is_not_followed(job_dir, tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(OPTED_IN))
    chown_tree(real, owner_uid())
    (job_dir / "status" / "submit.json").unlink()
    (job_dir / "status" / "submit.json").symlink_to(real)
    assert preempt.opted_in_job(record(job_dir)) == frozenset()


@pytest.mark.security
def test_a_symlinked_status_or_job_directory_is_not_followed(job_dir, tmp_path):
    linked = tmp_path / "alice" / "jobs" / "link-1"
    linked.symlink_to(job_dir)
    assert preempt.opted_in_job(record(linked)) == frozenset()
    other = tmp_path / "alice" / "jobs" / "abc-2"
    other.mkdir()
    (other / "status").symlink_to(job_dir / "status")
    chown_tree(other, owner_uid())
    assert preempt.opted_in_job(record(other)) == frozenset()
    assert preempt.opted_in_job(record(job_dir)) == {"preemptible"}


@pytest.mark.security
def test_a_directory_of_someone_else_does_not_opt_the_job_in(job_dir):
    """Slurm says the job is uid X's: a job directory (and file) of another uid is not
    X's word, whatever it says."""
    assert preempt.opted_in_job(record(job_dir, uid=owner_uid() + 1)) == frozenset()
    # root's jobs are never read
    assert preempt.opted_in_job(record(job_dir, uid=0)) == frozenset()


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another uid")
def test_a_submit_record_of_another_uid_in_the_owners_directory_is_ignored(job_dir):
    os.lchown(job_dir / "status" / "submit.json", OTHER_UID + 1, -1)
    assert preempt.opted_in_job(record(job_dir)) == frozenset()


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        json.dumps({"plugin_data": ["preemptible"]}).encode(),
        json.dumps({"plugin_data": {"tiresias": {"opt_in": "preemptible"}}}).encode(),
        b'{"plugin_data": {"tiresias": {"opt_in": ["preemptible"]}}, "pad": "'
        + b"x" * preempt.MAX_RECORD_BYTES
        + b'"}',
    ],
    ids=["garbage", "not-utf8", "a-list", "plugin-data-a-list", "opt-in-a-string", "huge"],
)
def test_a_bad_or_huge_submit_record_opts_in_to_nothing(job_dir, data):
    write_submit(job_dir, data)
    assert preempt.opted_in_job(record(job_dir)) == frozenset()


@pytest.mark.security
def test_a_fifo_in_place_of_the_record_neither_blocks_nor_counts(job_dir):
    (job_dir / "status" / "submit.json").unlink()
    os.mkfifo(job_dir / "status" / "submit.json")
    chown_tree(job_dir, owner_uid())
    assert preempt.opted_in_job(record(job_dir)) == frozenset()


def test_a_sweep_trial_is_never_opted_in(job_dir):
    trial = preempt.JobRecord("50_2", owner_uid(), "alice", "RUNNING", job_dir, True)
    assert preempt.opted_in_job(trial) == frozenset()


# ---------------------------------------------------------------- requeue
class Runner:
    def __init__(self, codes: list[int], output: str = "{}") -> None:
        self.codes, self.output = codes, output
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.calls.append((argv, timeout))
        return self.codes[len(self.calls) - 1], self.output


def no_accounting(argv: list[str], timeout: float = 0, check: bool = True, env=None) -> str:
    """Slurm without accounting limits: a resize's grow reads only the partition's."""
    if argv[:3] == ["scontrol", "show", "config"]:
        return "AccountingStorageEnforce = none\n"
    raise AgentError(f"{argv[0]}: not in this test")


def halted(run: Runner, info: dict[str, str], slurm_max: int) -> Runner:
    """`run`, where the owner's halt leaves the job held, its range showing as Slurm
    shows a pending job's (NumNodes=SIZE-MAX)."""

    def halting(argv: list[str], timeout: float) -> tuple[int, str]:
        if "halt" in argv:
            info.update(JobState="PENDING", NumNodes=f"{info['NumNodes']}-{slurm_max}")
        return run(argv, timeout)

    halting.calls = run.calls
    return halting


@pytest.fixture
def slurm_job(job_dir, monkeypatch):
    """Slurm's job 41: alice's, running in job_dir; the system knows alice by that uid."""
    info = {
        "JobId": "41",
        "UserId": f"alice({owner_uid()})",
        "JobState": "RUNNING",
        "WorkDir": str(job_dir),
        "NumNodes": "1",
        "Partition": "batch",
        "TRES": "cpu=8,mem=1G,node=1,billing=8",  # as Slurm 22.05 prints a running job's
    }
    partition = {"PartitionName": "batch", "MaxNodes": "UNLIMITED", "QoS": "N/A"}
    monkeypatch.setattr(
        slurm.oneliner,
        "show_lines",
        lambda kind, name="", timeout=0, env=None: [
            oneliner(partition if kind == "partition" else info)
        ],
    )
    monkeypatch.setattr(slurm.run, "output", no_accounting)

    class Entry:
        pw_name = "alice"

    monkeypatch.setattr(preempt.pwd, "getpwuid", lambda uid: Entry)
    return info


def test_a_requeue_runs_the_owners_halt_then_resume(job_dir, slurm_job):
    run, notes = Runner([0, 0]), []
    config = AgentConfig(halt_grace_seconds=10, slurm_timeout_seconds=15)
    reason = "preempted by tiresias: queue 2 -> job 42 in queue 0"
    assert preempt.requeue("41", reason, config, notes.append, run) is True
    agent = [sys.executable, "-I", "-m", "tacc_agent", f"--userdir={job_dir.parent.parent}"]
    assert run.calls == [
        (
            [
                "runuser",
                "-u",
                "alice",
                "--",
                *agent,
                "job",
                "halt",
                "41",
                "--grace",
                "10",
                "--reason",
                reason,
            ],
            10 + 60 + 30,
        ),
        (
            ["runuser", "-u", "alice", "--", *agent, "job", "resume", "41", "--reason", reason],
            60 + 30,
        ),
    ]
    assert notes == [f"agent: job 41 of alice checkpointed and requeued ({reason})"]


@pytest.mark.security
@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"JobState": "PENDING"}, "it is PENDING, not RUNNING"),
        ({"UserId": "bob(4999)"}, "its task did not opt in"),  # alice's files, bob's job
        ({"WorkDir": "/nonexistent/jobs/x"}, "its task did not opt in"),
        ({"ArrayJobId": "40", "ArrayTaskId": "1"}, "Slurm has no single job by that id"),
    ],
)
def test_a_requeue_of_a_job_that_may_not_be_requeued_runs_nothing(slurm_job, change, why):
    slurm_job.update(change)
    run, notes = Runner([0, 0]), []
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert run.calls == [] and why in notes[0]


@pytest.mark.security
def test_a_job_not_opted_in_is_not_requeued(job_dir, slurm_job):
    write_submit(job_dir, json.dumps({"plugin_data": {"elastic": {"opt_in": ["resize"]}}}).encode())
    run, notes = Runner([0, 0]), []
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert run.calls == [] and "did not opt in (preemptible)" in notes[0]


@pytest.mark.security
def test_an_owner_name_the_system_does_not_give_that_uid_is_refused(slurm_job, monkeypatch):
    class Entry:
        pw_name = "mallory"

    monkeypatch.setattr(preempt.pwd, "getpwuid", lambda uid: Entry)
    run, notes = Runner([0, 0]), []
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert run.calls == [] and "not a tacc user's" in notes[0]


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("job_id", "reason"),
    [
        ("41", "two\nlines"),
        ("41", "x" * 121),
        ("41", ""),
        ("41", "--userdir=/tmp"),
        ("41", None),
        ("41_1", "preempted"),
        ("41 42", "preempted"),
    ],
)
def test_a_bad_reason_or_job_id_is_refused_before_anything_runs(slurm_job, job_id, reason):
    run, notes = Runner([0, 0]), []
    assert preempt.requeue(job_id, reason, AgentConfig(), notes.append, run) is False
    assert run.calls == [] and "not requeued" in notes[0]


@pytest.mark.fault
def test_a_failing_halt_is_a_note_and_no_resume(slurm_job):
    failed = json.dumps({"error": "job 41 ended (COMPLETED) during its checkpoint grace period"})
    run, notes = Runner([3], failed), []
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert len(run.calls) == 1 and run.calls[0][0][-6:-4] == ["halt", "41"]
    assert notes == [
        "agent: job 41 not requeued: its halt failed: job 41 ended (COMPLETED) "
        "during its checkpoint grace period"
    ]


@pytest.mark.fault
def test_a_failing_resume_says_the_job_is_left_held(slurm_job):
    run, notes = Runner([0, 1], "scontrol failed: Access/permission denied"), []
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert "halted but left held: its resume failed: scontrol failed" in notes[0]


@pytest.mark.fault
def test_anything_raised_is_a_note_never_the_ticks_end(slurm_job, monkeypatch):
    def broken(kind, name="", timeout=0, env=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(slurm.oneliner, "show_lines", broken)
    notes: list[str] = []
    assert preempt.requeue("41", "preempted", AgentConfig(), notes.append, Runner([])) is False
    assert notes == ["agent: job 41 not requeued: RuntimeError: boom"]


def test_the_runner_is_argv_only_from_root_with_a_plain_environment(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(kwargs, argv=argv)
        raise FileNotFoundError

    monkeypatch.setattr(slurm.run.subprocess, "run", fake_run)
    monkeypatch.setenv("TACC_AGENT_CONFIG", "/root/tiresias.yaml")
    assert preempt.run_command(["runuser", "-u", "alice"], 5) == (127, "runuser not found")
    assert seen["cwd"] == "/" and "TACC_AGENT_CONFIG" not in seen["env"]
    assert "shell" not in seen and seen["timeout"] == 5


# ---------------------------------------------------------- halt/resume --reason
@pytest.fixture
def running_job(tmp_path, monkeypatch):
    user_dir = tmp_path / "me"
    job = user_dir / "jobs" / "j-1"
    (job / "status").mkdir(parents=True)
    for state in ("QUEUED", "PROVISIONING", "RUNNING"):
        records.add_event(job, state)
    workspace.register(user_dir, "41", job)
    info = {"JobState": "RUNNING", "UserId": f"me({os.getuid()})", "WorkDir": str(job)}
    monkeypatch.setattr(jobs, "slurm_info", lambda job_id, config: info)
    monkeypatch.setattr(jobs.slurm.run, "output", lambda argv, timeout, **kw: "")
    return user_dir, job, info


def test_halt_and_resume_record_the_reason_they_were_given(running_job):
    user_dir, job, info = running_job
    records.write_rank(job, 0, host="n2", state="EXITED", exit_code=0)
    jobs.halt(user_dir, "41", AgentConfig(), 1, "preempted by tiresias: queue 1")
    info.update(JobState="PENDING", Reason="job_requeued_in_held_state")
    jobs.resume(user_dir, "41", AgentConfig(), "preempted by tiresias: queue 1")
    reasons = [e.get("reason") for e in records.history(job)][-2:]
    assert reasons == [
        "halted: preempted by tiresias: queue 1",
        "resumed: preempted by tiresias: queue 1",
    ]


@pytest.mark.bad_input
@pytest.mark.parametrize("reason", ["two\nlines", "x" * 121, " ", "bell\a"])
def test_a_bad_reason_is_refused_before_anything_is_done(running_job, reason):
    user_dir, job, _ = running_job
    with pytest.raises(Rejected, match=r"--reason: expected one line of printable text"):
        jobs.halt(user_dir, "41", AgentConfig(), 1, reason)
    with pytest.raises(Rejected, match=r"--reason: expected one line"):
        jobs.resume(user_dir, "41", AgentConfig(), reason)
    assert records.last_state(job) == "RUNNING"


@pytest.mark.bad_input
def test_the_command_line_answers_a_bad_reason_with_a_clear_error(
    running_job, monkeypatch, capsys, tmp_path
):
    user_dir, _, _ = running_job
    monkeypatch.setenv("TACC_AGENT_CONFIG", str(tmp_path / "none.yaml"))
    umask = os.umask(0o022)  # main sets the agent's 077: given back for the next tests
    try:
        rc = cli.main(["--userdir", str(user_dir), "job", "halt", "41", "--reason", "a\nb"])
    finally:
        os.umask(umask)
    answer = json.loads(capsys.readouterr().out)
    assert rc == AGENT_REJECTED and answer["field"] == "reason"
    assert answer["error"].startswith("--reason: expected one line of printable text")


def test_the_tasks_own_opt_in_counts_whichever_plug_ins_were_on_at_submit():
    """resources.preemptible is recorded by the agent at submit (submit.json opt_in), so
    a policy turned on later (or only in the tick's settings) still finds it."""
    assert preempt.opt_ins_of({"opt_in": ["preemptible", "rm -rf"]}) == {"preemptible"}
    assert preempt.opt_ins_of({"opt_in": "preemptible"}) == frozenset()


@pytest.mark.security
@pytest.mark.parametrize("where", ["status/submit.json", "status"])
def test_a_record_others_could_write_does_not_count(job_dir, where):
    """A group member who could write the owner's record could make the owner's job
    preemptible: such a record is not read."""
    assert preempt.opted_in_job(record(job_dir)) == {"preemptible"}
    (job_dir / where).chmod(0o664 if where.endswith(".json") else 0o775)
    assert preempt.opted_in_job(record(job_dir)) == frozenset()


RESIZABLE = {"plugin_data": {"elastic": {"opt_in": ["resize"], "range": [1, 3]}}}


def test_a_resize_halts_sets_the_held_jobs_size_as_root_then_resumes(job_dir, slurm_job, tmp_path):
    """Its tasks with its nodes: a job of 2 tasks per node (sbatch --ntasks-per-node=2)
    asked 2 x its old size in tasks, which Slurm would hold it to (seen in the lab)."""
    write_submit(job_dir, json.dumps(RESIZABLE).encode())
    slurm_job.update({"NtasksPerN:B:S:C": "2:0:*:*", "CPUs/Task": "4"})
    run, notes = halted(Runner([0, 0, 0]), slurm_job, 3), []
    config = AgentConfig(halt_grace_seconds=10, slurm_timeout_seconds=15, state_dir=str(tmp_path))
    reason = "resized by elastic: grow 1 -> 3 nodes (2 idle for 30 s)"
    assert preempt.requeue("41", reason, config, notes.append, run, nodes=3) is True
    assert [argv[:3] for argv, _ in run.calls] == [
        ["runuser", "-u", "alice"],
        ["scontrol", "update", "JobId=41"],
        ["runuser", "-u", "alice"],
    ]
    assert run.calls[1] == (
        ["scontrol", "update", "JobId=41", "NumNodes=3-3", "NumTasks=6", "NumCPUs=24"],
        15,
    )
    assert notes == [f"agent: job 41 of alice checkpointed and requeued at 3 node(s) ({reason})"]


@pytest.mark.security
@pytest.mark.parametrize(
    ("record", "nodes", "why"),
    [
        (OPTED_IN, 2, "did not opt in (resize)"),  # preemptible is not resizable
        (RESIZABLE, 4, "4 node(s) is outside its task's range (1-3)"),
        (RESIZABLE, 0, "0 node(s) is outside its task's range (1-3)"),
        (
            {"plugin_data": {"elastic": {"opt_in": ["resize"], "range": [1, True]}}},
            1,
            "outside its task's range (none)",
        ),
        ({"plugin_data": {"elastic": {"opt_in": ["resize"]}}}, 1, "range (none)"),
    ],
)
def test_a_resize_the_task_did_not_allow_runs_nothing(job_dir, slurm_job, record, nodes, why):
    write_submit(job_dir, json.dumps(record).encode())
    run, notes = Runner([0, 0, 0]), []
    assert (
        preempt.requeue("41", "resized by test", AgentConfig(), notes.append, run, nodes=nodes)
        is False
    )
    assert run.calls == [] and why in notes[0], notes


def test_a_size_slurm_refuses_leaves_the_job_requeued_at_its_old_size(job_dir, slurm_job, tmp_path):
    write_submit(job_dir, json.dumps(RESIZABLE).encode())
    refused = "scontrol: error: Requested node configuration is not available"
    run, notes = halted(Runner([0, 1, 0], refused), slurm_job, 3), []
    config = AgentConfig(state_dir=str(tmp_path))
    assert preempt.requeue("41", "resized by test", config, notes.append, run, nodes=2) is False
    assert len(run.calls) == 3  # resumed all the same: never left held
    assert "its size not changed: scontrol: error: Requested node" in notes[0], notes
    assert notes[1] == "agent: job 41 of alice checkpointed and requeued (resized by test)"


# ---------------------------------------------------------------- root_squash
def squashed(monkeypatch) -> None:
    """Root may not read the users' directories (NFS root_squash): the kernel says EACCES."""

    def refused(name, uid, flags, dir_fd=None):
        raise PermissionError(errno.EACCES, "Permission denied", name)

    monkeypatch.setattr(preempt, "open_owned", refused)
    monkeypatch.setattr(preempt, "owner_name", lambda job: "alice")


def test_where_root_may_not_read_the_record_is_read_as_its_owner(job_dir, monkeypatch):
    squashed(monkeypatch)
    run = Runner([0], json.dumps(RESIZABLE))
    assert preempt.read_submit_record(record(job_dir), run) == RESIZABLE
    argv, _ = run.calls[0]
    assert argv[:5] == ["runuser", "-u", "alice", "--", sys.executable]
    assert argv[-2:] == [str(job_dir / "status" / "submit.json"), str(preempt.MAX_RECORD_BYTES + 1)]


@pytest.mark.security
@pytest.mark.parametrize(
    ("code", "output"), [(1, "Traceback"), (0, "x" * (2 << 20)), (0, "[1]"), (0, "not json")]
)
def test_an_owners_read_that_fails_or_is_not_a_record_opts_in_to_nothing(
    job_dir, monkeypatch, code, output
):
    squashed(monkeypatch)
    assert preempt.read_submit_record(record(job_dir), Runner([code], output)) == {}


@pytest.mark.security
def test_a_record_that_is_not_the_owners_is_never_read_as_the_owner(job_dir):
    """open_owned's own refusals (another uid's file, group-writable) are no squash."""
    os.chmod(job_dir / "status" / "submit.json", 0o666)  # noqa: S103  (the case itself)
    run = Runner([0], json.dumps(RESIZABLE))
    assert preempt.read_submit_record(record(job_dir), run) == {} and run.calls == []


@pytest.mark.security
def test_the_owners_read_takes_a_regular_file_only_and_follows_no_link(tmp_path):
    record_file = tmp_path / "submit.json"
    record_file.write_text('{"opt_in": ["resize"]}')
    (tmp_path / "link.json").symlink_to(record_file)
    os.mkfifo(tmp_path / "fifo.json")

    def read(path: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-I", "-c", preempt.OWNER_READ, str(path), "100"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )

    assert read(record_file).stdout == '{"opt_in": ["resize"]}'
    assert read(tmp_path / "link.json").returncode != 0  # ELOOP
    fifo = read(tmp_path / "fifo.json")  # does not block; writes nothing
    assert fifo.returncode == 0 and fifo.stdout == ""


def test_a_resize_back_of_a_pending_job_sets_its_size_alone(job_dir, slurm_job, tmp_path):
    """A resized job that never got its nodes goes back to its old size while it waits:
    no halt, no resume (it is not running)."""
    write_submit(job_dir, json.dumps(RESIZABLE).encode())
    slurm_job.update(JobState="PENDING", NumNodes="3")  # root's NumNodes=3-3
    run, notes = Runner([0]), []
    why = "resized by elastic: back to 1 nodes (3 not free in 181 s)"
    config = AgentConfig(slurm_timeout_seconds=15, state_dir=str(tmp_path))
    assert preempt.requeue("41", why, config, notes.append, run, nodes=1) is True
    assert run.calls == [(["scontrol", "update", "JobId=41", "NumNodes=1-1"], 15)]
    assert notes == [f"agent: job 41 of alice now asks for 1 node(s) ({why})"]
    # A pending job is never requeued (preempted): only a resize may touch it.
    assert preempt.requeue("41", "preempted by test", AgentConfig(), notes.append, run) is False
    assert "it is PENDING, not RUNNING" in notes[-1]
