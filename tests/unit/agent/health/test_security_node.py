"""Issue [10] points 16, 17 and 18 (second half): a researcher cannot drain a GPU node with
a forged Xid line (16), cannot dodge least-attained-service priority by spelling GPUs
differently, nor lose their own nice to it, and old service fades (17), and a job that
fills /tmp does not keep its node drained after it ends (18)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig, load_config
from tacc_agent.errors import AgentError
from tacc_agent.health import cycle as health
from tacc_agent.health.checks import system
from tacc_agent.health.checks.base import FAIL, OK
from tacc_agent.health.checks.gpu import check_gpus
from tacc_agent.tasks.schedule import queue_ticks
from tacc_contract.plugins import Queue, QueuedJob
from tacc_lab.fakehw import FakeHardware, device_state
from tacc_plugins import las

ROOT = Path(__file__).resolve().parents[4]


def tool(path: Path, script: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# ------------------------------------------------------------ 16: forged Xid lines
# The lab's FAKE nvidia-smi with two GPUs: it reports 00000000:17:00.0 and 00000000:27:00.0,
# which the kernel prints as 0000:17:00 and 0000:27:00.
XID_79 = "NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=python3, GPU has fallen off the bus."


def fake_smi(tmp_path: Path, gpus: int = 2) -> tuple[str, Path]:
    state = tmp_path / "hw.json"
    state.write_text(json.dumps(device_state(FakeHardware(gpus=gpus), "n2")))
    fake = ROOT / "packages/ops/tacc_lab/fakes/nvidia_smi.py"
    script = f'TACC_FAKE_HW_STATE={shlex.quote(str(state))} exec {sys.executable} {fake} "$@"\n'
    return tool(tmp_path / "bin/nvidia-smi", script), state


FORGED = {
    # root's `echo '<4>NVRM: ...' > /dev/kmsg`: userspace records get facility user (1)
    "user-facility-record": f"12,7,9000,-;{XID_79}",
    # a kernel message that starts with something else: a process name, a device
    "xid-mid-line": f"4,7,9000,-;python3[4242]: {XID_79}",
    # the driver's format on a PCI address that is no GPU of this node
    "unknown-bus": "4,7,9000,-;" + XID_79.replace("0000:17:00", "0000:99:00"),
    # kern.log: `logger -p kern.err -t kernel` writes this line from any account
    "syslog-file-line": f"Jan  1 00:00:00 n2 kernel: [  12.345678] {XID_79}",
}


@pytest.mark.security
@pytest.mark.parametrize("line", FORGED.values(), ids=FORGED.keys())
def test_p16_a_forged_xid_line_does_not_drain_the_node(tmp_path, line):
    smi, _ = fake_smi(tmp_path)
    log = tmp_path / "kmsg"
    log.write_text(f"6,1,0,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n{line}\n")
    state: dict = {}
    result = check_gpus(smi, 2, str(log), state, 10, "boot-1")
    assert result.status == OK, result.detail
    assert check_gpus(smi, 2, str(log), state, 10, "boot-1").status == OK


def journal_entry(message: str, transport: str, cursor: str, **more: str) -> str:
    return json.dumps(
        {
            "__CURSOR": cursor,
            "MESSAGE": message,
            "_TRANSPORT": transport,
            "SYSLOG_FACILITY": "0",
            **more,
        }
    )


@pytest.mark.security
def test_p16_only_the_kernels_own_xid_line_drains_from_the_journal_and_ring_buffer(
    tmp_path, monkeypatch
):
    smi, hw = fake_smi(tmp_path)
    entries = tmp_path / "journal.jsonl"
    entries.write_text(
        journal_entry(XID_79, "syslog", "c1", SYSLOG_IDENTIFIER="kernel")
        + "\n"
        + journal_entry(XID_79, "stdout", "c2")
        + "\n"
    )
    args = tmp_path / "journalctl.args"
    tool(tmp_path / "bin/journalctl", f'echo "$@" >> {args}\ncat {entries}\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    state: dict = {}
    assert check_gpus(smi, 2, "journal", state, 10, "boot-1").status == OK
    entries.write_text(journal_entry(XID_79, "kernel", "c3") + "\n")
    drained = check_gpus(smi, 2, "journal", state, 10, "boot-1")
    assert drained.status == FAIL and drained.detail == "Xid 79 on 0000:17:00"
    calls = args.read_text().splitlines()
    assert all("--dmesg" in call for call in calls)  # the kernel transport only
    assert "--after-cursor=c2" in calls[1]  # read on from where the last run stopped
    # /dev/kmsg: the kernel's record of a GPU that has since left nvidia-smi's listing
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,0,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    ring: dict = {}
    assert check_gpus(smi, 0, str(kmsg), ring, 10, "boot-1").status == OK
    hw.write_text(json.dumps(device_state(FakeHardware(gpus=1), "n2")))  # 0000:27 fell off
    kmsg.write_text(kmsg.read_text() + "4,2,9000,-;" + XID_79.replace(":17:", ":27:") + "\n")
    fallen = check_gpus(smi, 0, str(kmsg), ring, 10, "boot-1")
    assert fallen.status == FAIL and fallen.detail == "Xid 79 on 0000:27:00"


# ------------------------------------------------------------ 17: LAS
# What Slurm knows of each job, and a squeue that prints it in whatever format is asked
# (-o letters or -O names), so the test holds for any choice of fields.
SQUEUE_JOBS = [
    # sbatch --gpus=4 (tres-per-job), running
    {
        "JobArrayID": "21",
        "UserName": "alice",
        "State": "RUNNING",
        "Nice": "0",
        "NumNodes": "1",
        "NumTasks": "1",
        "tres-alloc": "cpu=4,mem=4G,node=1,billing=4,gres/gpu=4",
        "tres-per-job": "gres:gpu:4",
        "tres-per-node": "N/A",
        "tres-per-task": "N/A",
        "TimeUsed": "10:00",
    },
    # sbatch --gpus-per-task=2 --ntasks=3, running
    {
        "JobArrayID": "22",
        "UserName": "bob",
        "State": "RUNNING",
        "Nice": "0",
        "NumNodes": "1",
        "NumTasks": "3",
        "tres-alloc": "cpu=3,mem=3G,node=1,billing=3,gres/gpu=6",
        "tres-per-job": "N/A",
        "tres-per-node": "N/A",
        "tres-per-task": "gres:gpu:2",
        "TimeUsed": "10:00",
    },
    # sbatch --gres=gpu:a100:2 --nodes=2: typed GPUs are listed beside the total
    {
        "JobArrayID": "23",
        "UserName": "carol",
        "State": "RUNNING",
        "Nice": "0",
        "NumNodes": "2",
        "NumTasks": "2",
        "tres-alloc": "cpu=2,mem=2G,node=2,billing=2,gres/gpu=4,gres/gpu:a100=4",
        "tres-per-job": "N/A",
        "tres-per-node": "gres:gpu:a100:2",
        "tres-per-task": "N/A",
        "TimeUsed": "10:00",
    },
    # sbatch --gpus-per-task=1 --ntasks=5 on a cluster that does not account gres/gpu
    {
        "JobArrayID": "24_1",
        "UserName": "dave",
        "State": "PENDING",
        "Nice": "0",
        "NumNodes": "1",
        "NumTasks": "5",
        "tres-alloc": "cpu=5,node=1,billing=5",
        "tres-per-job": "N/A",
        "tres-per-node": "N/A",
        "tres-per-task": "gres/gpu:1",
        "TimeUsed": "0:00",
    },
]
LETTERS = {
    "i": "JobArrayID",
    "u": "UserName",
    "T": "State",
    "y": "Nice",
    "D": "NumNodes",
    "b": "tres-per-node",
    "M": "TimeUsed",
}


def fake_squeue(argv: list[str], timeout: float = 0) -> str:
    """One line per job: -o "%i|%u|..." (separators as given) or -O "Name:0|,..."."""
    lookup = {key.lower(): key for key in [*SQUEUE_JOBS[0], "Partition", "Reason"]}
    for arg in argv:
        if arg.startswith("--format="):
            columns = [(LETTERS[part[0]], part[1:]) for part in arg[9:].split("%")[1:]]
            break
        if arg.startswith("--Format="):
            specs = [spec.partition(":") for spec in arg[9:].split(",")]
            columns = [
                (lookup[name.lower()], rest.lstrip(".0123456789")) for name, _, rest in specs
            ]
            break
    else:
        raise AssertionError(f"no format in {argv}")
    lines = ("".join(job.get(key, "") + tail for key, tail in columns) for job in SQUEUE_JOBS)
    return "".join(line + "\n" for line in lines)


@pytest.mark.security
def test_p17_gpus_count_whichever_way_a_job_asked_for_them(monkeypatch):
    monkeypatch.setattr(slurm.run, "output", fake_squeue)
    jobs = queue_ticks.read_queue(AgentConfig())
    assert [(job.job_id, job.gpus) for job in jobs] == [
        ("21", 4),
        ("22", 6),
        ("23", 4),
        ("24_1", 5),
    ]
    # LAS accounts each running job's GPU-seconds (600 s each), not node-seconds
    queue = Queue(jobs, lambda job, nice: None, 0.0, None, AgentConfig())
    state = {"attained": {}, "counted": {}}
    las.account(state, queue)
    assert state["attained"] == {"alice": 2400.0, "bob": 3600.0, "carol": 2400.0}


def las_tick(tmp_path: Path, config: AgentConfig, now: float, jobs: list[QueuedJob]):
    changed: dict[str, int] = {}
    queue = Queue(jobs, changed.__setitem__, now, tmp_path, config)
    las.LeastAttainedService().tick(queue)
    return changed, queue.notes


def attained(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "las.json").read_text())["attained"]


@pytest.mark.security
def test_p17_attained_service_halves_every_configured_half_life(tmp_path):
    config = AgentConfig(las_thresholds=(1000.0,), las_nice_step=100, las_half_life_seconds=3600.0)
    las_tick(tmp_path, config, 0.0, [QueuedJob("1", "alice", "RUNNING", 0, 4, 0)])
    las_tick(tmp_path, config, 1000.0, [QueuedJob("1", "alice", "RUNNING", 0, 4, 1000)])
    assert attained(tmp_path) == {"alice": 4000.0}
    changed, _ = las_tick(
        tmp_path, config, 1000.0 + 3600, [QueuedJob("2", "alice", "PENDING", 0, 4, 0)]
    )
    assert attained(tmp_path)["alice"] == pytest.approx(2000.0) and changed == {}
    # Three half-lives on alice is below the threshold: her job is favoured again.
    changed, _ = las_tick(
        tmp_path, config, 1000.0 + 3 * 3600, [QueuedJob("2", "alice", "PENDING", 0, 4, 0)]
    )
    assert attained(tmp_path)["alice"] == pytest.approx(500.0) and changed == {"2": -100}
    # 0 keeps service forever
    keep = AgentConfig(las_thresholds=(1000.0,), las_nice_step=100, las_half_life_seconds=0)
    las_tick(tmp_path / "k", keep, 0.0, [QueuedJob("1", "bob", "RUNNING", 0, 1, 600)])
    las_tick(tmp_path / "k", keep, 10 * 86400.0, [])
    assert attained(tmp_path / "k") == {"bob": 600.0}


@pytest.mark.security
@pytest.mark.bad_input
def test_p17_a_negative_half_life_is_a_clear_config_error(tmp_path):
    config = AgentConfig(las_half_life_seconds=-5)
    expected = (
        "agent config: las_half_life_seconds: expected 0 (no decay) or a number of "
        "seconds above 0, got -5"
    )
    with pytest.raises(AgentError) as caught:
        las_tick(tmp_path, config, 0.0, [])
    assert str(caught.value) == expected


@pytest.mark.security
def test_p17_las_adds_to_the_users_own_nice_instead_of_replacing_it(tmp_path):
    config = AgentConfig(las_thresholds=(100.0,), las_nice_step=1000)
    las_tick(tmp_path, config, 0.0, [QueuedJob("1", "alice", "RUNNING", 0, 1, 500)])
    # bob (no service) submitted with --nice=300; alice (past the threshold) with --nice=50
    changed, notes = las_tick(
        tmp_path,
        config,
        0.0,
        [QueuedJob("2", "bob", "PENDING", 300, 1, 0), QueuedJob("3", "alice", "PENDING", 50, 1, 0)],
    )
    assert changed == {"2": -700}  # alice's own nice is left as she set it
    assert notes == ["las: job 2 of bob (0 GPU-s) nice 300 -> -700, its own nice 300 kept"]
    # The next tick sees the nice LAS set and changes nothing.
    changed, _ = las_tick(
        tmp_path,
        config,
        0.0,
        [
            QueuedJob("2", "bob", "PENDING", -700, 1, 0),
            QueuedJob("3", "alice", "PENDING", 50, 1, 0),
        ],
    )
    assert changed == {}
    # bob lowers his job further (scontrol update JobId=2 Nice=900): LAS builds on that.
    changed, _ = las_tick(tmp_path, config, 0.0, [QueuedJob("2", "bob", "PENDING", 900, 1, 0)])
    assert changed == {"2": -100}


# ------------------------------------------------------------ 18: a job that fills /tmp
class Usage(NamedTuple):
    total: int
    used: int
    free: int


def fake_disks(monkeypatch, low: dict[str, callable]) -> None:
    """shutil.disk_usage: 2% free where low[path]() says so, else 60%."""

    def usage(path) -> Usage:
        full = low.get(str(path), lambda: False)()
        return Usage(100, 98, 2) if full else Usage(100, 40, 60)

    monkeypatch.setattr(shutil, "disk_usage", usage)


def proc_tree(root: Path, uids: list[int]) -> str:
    (root / "self").mkdir(parents=True)
    (root / "meminfo").write_text("MemTotal:       16384000 kB\n")
    for pid, uid in enumerate(uids, start=100):
        (root / str(pid)).mkdir()
        (root / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return str(root)


@pytest.mark.security
def test_p18_a_full_tmp_is_watched_even_when_the_root_filesystem_has_room(tmp_path, monkeypatch):
    fake_disks(monkeypatch, {"/tmp": lambda: True})
    proc = tmp_path / "proc"  # no process readable: nothing may be removed from the real /tmp
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:       16384000 kB\n")
    config = AgentConfig(
        proc_root=str(proc),
        services=(),
        nvidia_smi=str(tmp_path / "none"),
        rdma_sysfs_root=str(tmp_path),
        state_dir=str(tmp_path / "state"),
    )
    disk = next(r for r in health.run_checks(config) if r.check == "disk")
    assert disk.status == FAIL
    assert disk.detail.startswith("/tmp 2.0% free < 5%")
    assert f"leftovers kept: no process readable under {proc}" in disk.detail


def leftovers(tmp_path: Path) -> tuple[Path, Path, dict[str, int]]:
    """A scratch dir as three users and root left it, and a directory outside it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own files as other users")
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    (scratch / "alice-run/ckpt").mkdir(parents=True)
    (scratch / "bob-run").mkdir()
    outside.mkdir()
    files = {
        "alice-big": 3001,
        "alice-run/ckpt/model.pt": 3001,
        "alice-run/log": 3001,
        "bob-run/out": 2001,
        "bob-run/alice-gift": 3001,
        "carol-data": 2002,
        "root-socket-dir-file": 0,
        "nobody-file": 65534,
    }
    for name, uid in files.items():
        (scratch / name).write_bytes(b"x" * 64)
        os.chown(scratch / name, uid, uid)
    for name, uid in {"alice-run": 3001, "alice-run/ckpt": 3001, "bob-run": 2001}.items():
        os.chown(scratch / name, uid, uid)
    (outside / "precious").write_text("not in a tmp dir")
    os.chown(outside / "precious", 3001, 3001)
    os.chown(outside, 3001, 3001)
    for link, target in {"alice-link": outside / "precious", "alice-dirlink": outside}.items():
        (scratch / link).symlink_to(target)
        os.lchown(scratch / link, 3001, 3001)
    return scratch, outside, files


@pytest.mark.security
def test_p18_what_departed_users_left_in_tmp_is_removed_and_the_node_recovers(
    tmp_path, monkeypatch
):
    scratch, outside, _ = leftovers(tmp_path)
    tool(tmp_path / "bin/squeue", "echo 2002\n")  # carol has a job here, but no process yet
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    fake_disks(monkeypatch, {str(scratch): (scratch / "alice-big").exists})
    proc = proc_tree(tmp_path / "proc", [0, 2001])  # root and bob run processes
    limits = system.disk_limits(None, [str(scratch)])
    result = system.check_disk(limits, [str(scratch)], proc, 5)
    assert result.status == OK, result.detail
    assert f"removed 8 leftover(s) of departed users from {scratch}" in result.detail
    left = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*"))
    assert left == ["bob-run", "bob-run/out", "carol-data", "nobody-file", "root-socket-dir-file"]
    assert (outside / "precious").read_text() == "not in a tmp dir"  # links were not followed


@pytest.mark.security
def test_p18_nothing_is_removed_when_slurm_does_not_say_whose_jobs_run_here(tmp_path, monkeypatch):
    scratch, _, files = leftovers(tmp_path)
    tool(tmp_path / "bin/squeue", "echo 'slurm_load_jobs error: Unable to contact' >&2; exit 1\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    fake_disks(monkeypatch, {str(scratch): (scratch / "alice-big").exists})
    proc = proc_tree(tmp_path / "proc", [0, 2001])
    result = system.check_disk({str(scratch): 5.0}, [str(scratch)], proc, 5)
    assert result.status == FAIL
    assert result.detail == (
        f"{scratch} 2.0% free < 5%; leftovers kept: squeue did not say whose jobs run here"
    )
    assert all((scratch / name).exists() for name in files)


@pytest.mark.security
@pytest.mark.bad_input
def test_p16_a_kernel_log_file_in_the_config_is_refused_not_silently_ignored(tmp_path):
    """kern.log was a valid kernel_log before; read as /dev/kmsg it would match no Xid,
    and GPUs that fell off the bus would never drain the node: refuse it clearly."""
    kern_log = tmp_path / "kern.log"
    kern_log.write_text("kernel: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus\n")
    config = tmp_path / "agent.yaml"
    config.write_text(f"kernel_log: {kern_log}\n")
    with pytest.raises(AgentError, match=r"kernel_log: expected /dev/kmsg .* or 'journal'"):
        load_config(config)
    config.write_text("kernel_log: journal\n")
    assert load_config(config).kernel_log == "journal"
