"""Security [10], submitting: concurrent submits of one user (point 9), a submit cut off
after sbatch (10), extra sbatch options that would override the agent's (13), and Slurm
job ids that name another job than the index's (14). Slurm is tests/unit/fake_slurm.py
on PATH; uploads run the real client against the real store, in this process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs import verbs as jobs
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.store import delta as store
from tacc_agent.tasks.store import receive as store_receive
from tacc_agent.tasks.store import workspace
from tacc_contract import sbatch
from tacc_contract.instruction import InvalidInstruction, digest_of
from tacc_contract.protocol import blob_name
from tacc_plugins import duration
from tcloud.compile.compiler import Instruction, compile_task
from tcloud.compile.legacy import general_to_resources
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError, TcloudError
from tcloud.transfer import upload as upload_module
from tcloud.transfer import upload_stream
from tests.conftest import run_cli
from tests.unit.agent_jobs import agent_env, make_job
from tests.unit.fake_slurm import FakeSlurmOnPath

CONCURRENT = 20
BIG = 3 * upload_module.CHUNK + 12345  # several SFTP chunks: appends would interleave
TASK = {"name": "t", "run": ["python3 train.py"]}

# --- point 9: concurrent submits of one user --------------------------------------------


class LocalSFTP:
    """SFTP onto this machine's files (the user's directory is a local path here)."""

    class Handle:
        def __init__(self, path: str, mode: str) -> None:
            self.file = open(path, mode)  # noqa: SIM115 - closed by __exit__

        def set_pipelined(self, _on: bool) -> None:
            pass

        def write(self, data: bytes) -> None:
            self.file.write(data)
            self.file.flush()
            time.sleep(0.02)  # a network write takes a while: concurrent uploads overlap

        def __enter__(self):
            return self

        def __exit__(self, *_exc) -> None:
            self.file.close()

    def open(self, path: str, mode: str) -> Handle:
        return self.Handle(path, mode)

    def remove(self, path: str) -> None:
        os.remove(path)

    def close(self) -> None:
        pass


class LocalClient:
    def open_sftp(self) -> LocalSFTP:
        return LocalSFTP()


def local_stream(_client, userdir: str, produce) -> dict:
    """`store receive` in this process: produce writes into a pipe that the agent's
    receive reads in another thread (a refused or cut stream is drained, as the agent's
    session ends and the channel closes)."""
    read_end, write_end = os.pipe()
    answer: dict = {}
    with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as writer:

        def agent_side() -> None:
            try:
                answer.update(store_receive.receive(Path(userdir), reader))
            except Rejected as exc:
                answer["error"] = str(exc)
                reader.read()

        def write(data: bytes) -> None:
            writer.write(data)
            writer.flush()
            time.sleep(0.02)  # a network write takes a while: concurrent uploads overlap

        thread = threading.Thread(target=agent_side)
        thread.start()
        try:
            produce(write)
        finally:
            writer.close()
            thread.join()
    if "error" in answer:
        raise TcloudError(answer["error"])
    return answer


@pytest.fixture(params=["stream", "sftp"])
def transport(request) -> str:
    """How the blobs go: one framed stream (`store receive`), or by SFTP one file at a
    time (an agent whose store does not offer to receive a stream)."""
    return request.param


@pytest.fixture
def local_store(tmp_path, monkeypatch, transport) -> tuple[Path, Instruction]:
    """(the user's directory, an instruction with a new big file): tcloud's upload talks
    to the agent's store in this process, as `tacc-agent store` would answer."""
    user_dir = tmp_path / "workspace" / "user"
    user_dir.mkdir(parents=True, mode=0o700)

    def remote(_client, request: dict, userdir: str) -> dict:
        answer = store.handle(Path(userdir), json.loads(json.dumps(request)))
        if transport == "sftp":
            answer.pop("receive", None)
        return json.loads(json.dumps(answer))

    monkeypatch.setattr(upload_module, "remote", remote)
    monkeypatch.setattr(upload_module, "stream_blobs", local_stream)
    project = tmp_path / "project"
    project.mkdir()
    (project / "tcloud.yaml").write_text(yaml.safe_dump(TASK))
    (project / "train.py").write_text("print('hi')\n")
    (project / "data.bin").write_bytes(os.urandom(BIG))
    return user_dir, compile_task(load_task(project / "tcloud.yaml"))


def upload_at_once(user_dir: Path, instruction: Instruction) -> list:
    """CONCURRENT uploads of the same instruction, started together: each one's result,
    or the exception it raised."""
    start = threading.Barrier(CONCURRENT)

    def one(_: int):
        start.wait()
        try:
            return upload_module.upload(LocalClient(), instruction, str(user_dir))
        except Exception as exc:  # reported by the test, every one
            return exc

    with ThreadPoolExecutor(CONCURRENT) as pool:
        return list(pool.map(one, range(CONCURRENT)))


def assert_all_committed(user_dir: Path, instruction: Instruction, results: list) -> None:
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, f"{len(failed)} of {CONCURRENT} uploads failed: {failed[0]}"
    workdirs = {r.workdir for r in results}
    assert len(workdirs) == CONCURRENT
    data = instruction.manifest["code/data.bin"].source.read_bytes()
    for workdir in workdirs:
        assert (Path(workdir) / "code" / "data.bin").read_bytes() == data
    assert not list((user_dir / "store" / ".partial").iterdir())


@pytest.mark.security
def test_p9_concurrent_uploads_of_the_same_new_file_all_succeed(local_store):
    """Point 9: two (here 20) submits of one new file at once never share a partial
    file: all succeed, and the stored blob is the file."""
    user_dir, instruction = local_store
    assert_all_committed(user_dir, instruction, upload_at_once(user_dir, instruction))


@pytest.mark.security
def test_p9_concurrent_uploads_resume_a_cut_one_without_mixing(local_store, monkeypatch, transport):
    """Point 9: what a cut upload left is resumed by each of 20 concurrent uploads from
    its own copy: each sends only the rest, all succeed."""
    user_dir, instruction = local_store
    data = instruction.manifest["code/data.bin"].source
    real_send, real_frames = upload_module.send, upload_stream.blob_frames

    def cut_after_first_chunk(sftp, local, remote_path, offset, progress):
        if local == data:
            with local.open("rb") as source, sftp.open(remote_path, "ab") as target:
                target.write(source.read(upload_module.CHUNK))
            raise OSError("connection reset (simulated)")
        return real_send(sftp, local, remote_path, offset, progress)

    def stream_cut_after_first_chunk(blob, write, progress):
        if blob.source == data:
            write(blob.header())
            with data.open("rb") as source:
                write(source.read(upload_module.CHUNK))
            raise OSError("connection reset (simulated)")
        return real_frames(blob, write, progress)

    if transport == "sftp":
        monkeypatch.setattr(upload_module, "send", cut_after_first_chunk)
    else:
        monkeypatch.setattr(upload_stream, "blob_frames", stream_cut_after_first_chunk)
    with pytest.raises(TcloudError, match="the upload stopped"):
        upload_module.upload(LocalClient(), instruction, str(user_dir))
    monkeypatch.setattr(upload_module, "send", real_send)
    monkeypatch.setattr(upload_stream, "blob_frames", real_frames)
    results = upload_at_once(user_dir, instruction)
    assert_all_committed(user_dir, instruction, results)
    # The other files may have come after the cut: they are sent whole.
    others = sum(e.size for path, e in instruction.manifest.items() if path != "code/data.bin")
    rest = BIG - upload_module.CHUNK + others
    assert all(r.bytes_sent <= rest for r in results), [r.bytes_sent for r in results]


@pytest.mark.security
def test_p9_duration_prediction_skips_job_dirs_that_vanish_while_it_scans(tmp_path):
    """Point 9: 20 concurrent scans of jobs/ (each submit's duration prediction) while
    other submits rename their .building-* trees into place and old jobs are removed."""
    user_dir, _ = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    instruction = compile_task(load_task(tmp_path / "project" / "tcloud.yaml"))
    stop, errors = threading.Event(), []

    def churn() -> None:
        while not stop.is_set():
            workdir = Path(store.commit_local(user_dir, instruction)["workdir"])
            shutil.rmtree(workdir, ignore_errors=True)  # a job its owner removes

    def scan(_: int) -> None:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                records.past_jobs(user_dir, duration.RECENT_JOBS)
            except OSError as exc:
                errors.append(exc)
                return

    churners = [threading.Thread(target=churn) for _ in range(3)]
    for thread in churners:
        thread.start()
    try:
        with ThreadPoolExecutor(CONCURRENT) as pool:
            list(pool.map(scan, range(CONCURRENT)))
    finally:
        stop.set()
        for thread in churners:
            thread.join()
    assert not errors, f"{len(errors)} of {CONCURRENT} scans failed: {errors[0]!r}"


# --- point 10: a submit cut off after sbatch ---------------------------------------------


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurmOnPath:
    fake = FakeSlurmOnPath(tmp_path)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    return fake


def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(workspace=str(tmp_path / "workspace"), slurm_timeout_seconds=10)


def submit_in_agent(tmp_path: Path, slurm: FakeSlurmOnPath, job_dir: Path, sbatch: str, **kwargs):
    """`tacc-agent job submit` as its own process (it may be killed), sbatch answering as
    `sbatch` says."""
    # 8 s: the hanging sbatch must still hang while the test looks at ps on a loaded host.
    env = agent_env(tmp_path, slurm_timeout_seconds=8) | slurm.env(sbatch)
    user_dir = job_dir.parent.parent
    argv = [
        sys.executable,
        "-m",
        "tacc_agent",
        "--userdir",
        str(user_dir),
        "job",
        "submit",
        str(job_dir),
    ]
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def rows(user_dir: Path, tmp_path: Path) -> list[tuple[str, str]]:
    return [(r["job"], r["state"]) for r in jobs.ps(user_dir, config(tmp_path))]


@pytest.mark.security
@pytest.mark.fault
def test_p10_a_submit_killed_after_sbatch_is_found_by_ps_status_and_cancel(tmp_path, slurm):
    """Point 10: the agent dies right after sbatch took the job (no id was indexed):
    ps, status and cancel still find the job, by its tag, and cancel it."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    killed = submit_in_agent(tmp_path, slurm, job_dir, "kill")
    killed.communicate(timeout=60)
    assert killed.returncode == -9 and list(slurm.jobs()) == ["100"]
    assert rows(user_dir, tmp_path) == [("100", "QUEUED")]
    assert jobs.status(user_dir, "100", config(tmp_path))["workdir"] == str(job_dir)
    done = jobs.cancel(user_dir, ["100"], config(tmp_path))
    assert done == [{"job_id": "100", "state": "CANCELLED", "cancelled": True}]
    assert slurm.jobs()["100"]["state"] == "CANCELLED"


@pytest.mark.security
@pytest.mark.fault
def test_p10_a_job_whose_sbatch_timed_out_is_submitting_then_found(tmp_path, slurm):
    """Point 10: while sbatch has not answered, ps shows the job as SUBMITTING (its
    submitter still holds it); once the submit timed out, ps finds its id in Slurm."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    hanging = submit_in_agent(tmp_path, slurm, job_dir, "hang")
    deadline = time.monotonic() + 30
    while not slurm.jobs():
        assert time.monotonic() < deadline and hanging.poll() is None, hanging.communicate()
        time.sleep(0.05)
    assert rows(user_dir, tmp_path) == [("-", "SUBMITTING")]
    out, err = hanging.communicate(timeout=60)
    assert hanging.returncode == 3 and "sbatch did not answer" in out, out + err
    assert "`tcloud ps` finds it" in out
    assert rows(user_dir, tmp_path) == [("100", "QUEUED")]


@pytest.mark.security
@pytest.mark.fault
def test_p10_a_submission_slurm_never_got_is_recorded_as_failed(tmp_path, slurm):
    """Point 10: the agent died before Slurm took the job: once Slurm has had time to
    show it and does not, the job is FAILED (never submitted) and leaves ps."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    lost = submit_in_agent(tmp_path, slurm, job_dir, "lost")
    lost.communicate(timeout=60)
    assert lost.returncode == -9 and slurm.jobs() == {}
    assert rows(user_dir, tmp_path) == [("-", "SUBMITTING")]  # Slurm may still show it
    record = records.read_json(job_dir / "status" / "submit.json")
    records.write_json(job_dir / "status" / "submit.json", {**record, "since": 0})  # long ago
    assert rows(user_dir, tmp_path) == []
    last = records.current(records.history(job_dir))
    assert last["state"] == "FAILED" and "Slurm has no such job" in last["reason"]
    with pytest.raises(Rejected, match="no job 100 of yours"):
        jobs.status(user_dir, "100", config(tmp_path))


@pytest.mark.security
def test_p10_every_job_is_tagged_with_its_directory(tmp_path, slurm):
    """Point 10: sbatch gets --comment=tacc:<job dir>:<random>, kept in the record."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    answer = schedule.submit(user_dir, job_dir, config(tmp_path))
    tag = slurm.jobs()[answer["job_id"]]["comment"]
    assert tag.startswith(f"tacc:{job_dir.name}:") and len(tag) > len(job_dir.name) + 10
    record = records.read_json(job_dir / "status" / "submit.json")
    assert record["tag"] == tag and record["job_id"] == answer["job_id"]
    assert rows(user_dir, tmp_path) == [(answer["job_id"], "QUEUED")]


# --- point 13: extra sbatch options -------------------------------------------------------

# Options the agent sets, or must own, in spellings sbatch reads: names and abbreviations.
OVERRIDES = [
    "nodes",
    "nod",
    "no",
    "n",
    "ntasks",
    "tasks-per-node",
    "ntasks-per-core",
    "gres",
    "gr",
    "gpus",
    "gpus-per-node",
    "gpus-per-task",
    "gpus-per-socket",
    "cpus-per-gpu",
    "mem-per-cpu",
    "mem-per-gpu",
    "time",
    "t",
    "ti",
    "time-min",
    "export",
    "export-file",
    "exp",
    "chdir",
    "ch",
    "output",
    "o",
    "error",
    "uid",
    "gid",
    "comment",
    "wrap",
    "array",
    "partition",
    "par",
    "qos",
    "account",
    "nice",
    "priority",
    "job-name",
    "signal",
    "parsable",
    "test-only",
    "wait",
    "version",
    "help",
    "usage",
    "clusters",
    "requeue",
    "open-mode",
    "get-user-env",
]


def instruction_text(sbatch: dict[str, str]) -> str:
    task = {"name": "t", "run": ["true"], "resources": {"sbatch": sbatch}}
    return json.dumps({"format": "tacc-instruction/1", "task": task}, indent=1)


@pytest.mark.security
@pytest.mark.bad_input
@pytest.mark.parametrize("name", OVERRIDES)
def test_p13_an_extra_sbatch_option_the_agent_sets_is_refused_on_both_sides(tmp_path, name):
    """Point 13: tcloud refuses it naming file, line and field; the agent refuses it
    again in the instruction (the client is not trusted) and before sbatch."""
    task = tmp_path / "tcloud.yaml"
    task.write_text(f"name: t\nrun: [x]\nresources:\n  sbatch:\n    {name}: '2'\n")
    with pytest.raises(TaskFileError) as caught:
        load_task(task)
    assert f"tcloud.yaml:5:5: resources.sbatch.{name}: expected" in str(caught.value)
    assert f"sbatch option {name!r} cannot be set by a task" in str(caught.value)
    with pytest.raises(InvalidInstruction, match=f"task.resources.sbatch.{name}: expected"):
        parse(instruction_text({name: "2"}), "instruction.json")
    with pytest.raises(Rejected, match=f"sbatch option {name!r} cannot be set by a task"):
        sbatch.extra_options({name: "2"})


@pytest.mark.security
@pytest.mark.bad_input
def test_p13_legacy_spellings_never_reach_sbatch_and_validate_names_the_line(tmp_path):
    """Point 13: a tuxiv.conf's general lines in sbatch's other spellings (-N2, -N 2,
    --nodes 2, --nod=2, -G1, -t 5) are refused, never passed on as extras."""
    lines = [
        "-N2",
        "-N 2",
        "--nodes 2",
        "--nod=2",
        "-G1",
        "-t 5",
        "--gpus=1",
        "-D=/tmp",
        "--gres=nic:1",
        "-o=x.log",
    ]
    resources, problems = general_to_resources(lines)
    assert resources["sbatch"] == {} and len(problems) == len(lines), problems
    task = tmp_path / "tcloud.yaml"
    task.write_text("name: t\nrun: [x]\nresources:\n  sbatch: {exclusive: '', nodes: '2'}\n")
    proc = run_cli("tcloud", "validate", str(task))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{task}:4:27: resources.sbatch.nodes: expected" in proc.stderr, proc.stderr
    assert "set resources.nodes instead" in proc.stderr


@pytest.mark.security
def test_p13_extras_come_before_the_agents_options(tmp_path):
    """Point 13: sbatch takes the last of an option given twice, so the task's extras
    go first: even a spelling the check does not know cannot override the agent's."""
    task = parse(instruction_text({"exclusive": "", "mail-type": "END"}), "instruction.json")
    argv = schedule.sbatch_argv(task, tmp_path, AgentConfig())
    assert argv[:3] == ["sbatch", "--exclusive=", "--mail-type=END"]
    assert argv.index("--parsable") > 2 and argv.index("--nodes=1") > 2


# --- point 14: a Slurm id that names another job ------------------------------------------


def queued_job(tmp_path: Path, job_id: str) -> tuple[Path, Path]:
    """A job of the caller's, submitted (tagged) and indexed as job_id."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    records.add_event(job_dir, "QUEUED")
    tag = f"tacc:{job_dir.name}:0123456789abcdef"
    records.write_json(job_dir / "status" / "submit.json", {"job_id": job_id, "tag": tag})
    workspace.register(user_dir, job_id, job_dir)
    return user_dir, job_dir


@pytest.mark.security
def test_p14_a_reused_slurm_id_never_replaces_an_index_entry(tmp_path, slurm):
    """Point 14: two of the caller's jobs with the same Slurm id (the controller lost
    its state and counts again): both stay indexed, and the newer answers to the id."""
    user_dir, old = queued_job(tmp_path, "42")
    (tmp_path / "project").rename(tmp_path / "old-project")
    _, new = make_job(tmp_path, {**TASK, "name": "u"}, {"train.py": "print('new')\n"})
    time.sleep(0.01)
    workspace.register(user_dir, "42", new)
    found = [(e.job_id, e.job_dir) for e in workspace.entries(user_dir)]
    assert found == [("42", old), ("42", new)]
    assert workspace.job_dir(user_dir, "42") == new
    slurm.add_job("42", uid=os.getuid(), user="alice", workdir=str(new), state="PENDING")
    assert sorted(rows(user_dir, tmp_path)) == [("42", "FAILED"), ("42", "QUEUED")]


@pytest.mark.security
def test_p14_status_never_takes_another_users_slurm_job_for_the_callers(tmp_path, slurm):
    """Point 14: Slurm's job 42 is bob's now, with a copy of the caller's tag: the
    caller's job 42 is not shown as bob's running job."""
    user_dir, job_dir = queued_job(tmp_path, "42")
    tag = records.read_json(job_dir / "status" / "submit.json")["tag"]
    slurm.add_job("42", comment=tag, workdir=str(job_dir))
    info = jobs.status(user_dir, "42", config(tmp_path))
    assert info["slurm_state"] is None and info["nodes"] == []
    assert info["state"] == "FAILED" and "left Slurm" in info["reason"]


@pytest.mark.security
def test_p14_cancel_halt_resume_of_another_users_slurm_job_are_refused(tmp_path, slurm):
    """Point 14: the caller's job 42 is indexed, Slurm's job 42 is bob's: nothing is
    sent to Slurm for it, and the refusal says why."""
    user_dir, job_dir = queued_job(tmp_path, "42")
    slurm.add_job("42")
    cfg = config(tmp_path)
    for act in (
        lambda: jobs.cancel(user_dir, ["42"], cfg),
        lambda: jobs.halt(user_dir, "42", cfg),
        lambda: jobs.resume(user_dir, "42", cfg),
    ):
        with pytest.raises(
            Rejected, match=r"Slurm's job 42 is not this job of yours \(it is bob's"
        ):
            act()
    assert slurm.calls("scancel") == [] and slurm.jobs()["42"]["state"] == "RUNNING"
    assert records.last_state(job_dir) == "QUEUED"


def test_p9_an_upload_from_a_tcloud_before_per_upload_files_still_commits(tmp_path):
    """An older tcloud appends to store/.partial/<blob> and names no upload in its
    commit: the agent takes that file (mixed versions during an upgrade)."""
    user = tmp_path / "user"
    user.mkdir()
    data = b"print('hi')\n"
    blob = hashlib.sha256(data).hexdigest() + "-644"
    assert store.handle(user, {"op": "missing", "blobs": [blob]})["missing"] == [blob]
    (user / "store" / ".partial" / blob).write_bytes(data)
    doc = {
        "format": "tacc-instruction/1",
        "task": {"name": "t", "run": ["python x.py"]},
        "manifest": {},
    }
    answer = store.handle(
        user,
        {
            "op": "commit",
            "blobs": [blob],
            "manifest": {"code/x.py": blob},
            "digest": digest_of(doc),
            "files": {"instruction.json": json.dumps(doc)},
        },
    )
    assert answer["bad"] == [] and answer["workdir"], answer
    assert (Path(answer["workdir"]) / "code/x.py").read_bytes() == data


@pytest.mark.security
def test_p9_cut_uploads_do_not_pile_copies_up(tmp_path):
    """Each cut upload of a blob left a copy of what had arrived; the next upload takes
    over an idle one (renamed) and the other idle ones go: one partial file remains."""
    user = tmp_path / "user"
    user.mkdir()
    data = b"x" * (4 << 20)
    blob = hashlib.sha256(data).hexdigest() + "-644"
    partial = user / "store" / ".partial"
    for _attempt in range(4):
        upload = store.handle(user, {"op": "missing", "blobs": [blob]})["uploads"][blob]
        part = partial / upload
        with part.open("ab") as out:  # 1 MiB more arrives, then the link drops
            out.write(data[part.stat().st_size if part.exists() else 0 :][: 1 << 20])
        for path in partial.iterdir():  # minutes go by before the next attempt
            os.utime(path, (time.time() - 3600, time.time() - 3600))
    answer = store.handle(user, {"op": "missing", "blobs": [blob]})
    left = sorted(partial.iterdir())
    assert [p.name for p in left] == [answer["uploads"][blob]]
    assert answer["partial"][blob] == 4 << 20  # all four MiB kept, in one file


@pytest.mark.security
def test_p14_a_comment_cannot_forge_the_owner_or_workdir_scontrol_shows():
    """A user's own free text (Comment, printed after UserId and WorkDir) that holds
    `UserId=...` or `WorkDir=...` words does not replace the real fields."""
    line = (
        "JobId=7 JobName=x UserId=bob(2002) GroupId=bob(2002) JobState=RUNNING "
        "WorkDir=/shared/tcloud/bob Comment=hi UserId=alice(2001) "
        "WorkDir=/shared/tcloud/alice/jobs/a-1 StdOut=/dev/null"
    )
    fields = parse_oneliner(line)
    assert fields["UserId"] == "bob(2002)"
    assert fields["WorkDir"] == "/shared/tcloud/bob"
    assert fields["Comment"].startswith("hi UserId=alice(2001)")


@pytest.mark.security
@pytest.mark.fault
def test_p10_a_job_that_ran_and_left_the_queue_is_found_without_accounting(tmp_path, slurm):
    """The submit crashed after sbatch; the job ran and finished before anyone looked,
    and the cluster keeps no accounting: its own PROVISIONING record names its id, so
    ps keeps it instead of calling it never submitted."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    lost = submit_in_agent(tmp_path, slurm, job_dir, "lost")
    lost.communicate(timeout=60)
    records.add_event(job_dir, "PROVISIONING", restart=0, slurm_job_id="100")
    records.add_event(job_dir, "COMPLETED", exit_code=0)
    record = records.read_json(job_dir / "status" / "submit.json")
    records.write_json(job_dir / "status" / "submit.json", {**record, "since": 0})  # long ago
    assert [job for job, _ in rows(user_dir, tmp_path)] == ["100"]
    assert records.current(records.history(job_dir))["state"] == "COMPLETED"


@pytest.mark.fault
def test_a_partial_file_longer_than_its_blob_is_sent_afresh_by_either_transport(local_store):
    """What a broken earlier upload left beyond the blob's size is neither appended to
    (SFTP) nor refused as an offset (stream): the blob is sent from its first byte."""
    user_dir, instruction = local_store
    data = instruction.manifest["code/data.bin"]
    name = blob_name(data.sha256, data.mode)
    store.ensure_dirs(user_dir)
    (user_dir / "store" / ".partial" / name).write_bytes(os.urandom(BIG + 50))
    result = upload_module.upload(LocalClient(), instruction, str(user_dir))
    assert result.bytes_sent >= BIG
    assert (Path(result.workdir) / "code" / "data.bin").read_bytes() == data.source.read_bytes()
