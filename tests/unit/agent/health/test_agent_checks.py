"""Node health checks on fixture trees and fake tools (issue [6], first part)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tacc_agent.health import cycle as health
from tacc_agent.health.checks import mounts
from tacc_agent.health.checks.base import ABSENT, FAIL, OK, STUCK, Result
from tacc_agent.health.checks.gpu import check_gpus
from tacc_agent.health.checks.gpu import kmsg_lines as xid_lines
from tacc_agent.health.checks.rdma import check_rdma
from tacc_agent.health.checks.system import check_memory, check_services
from tests.unit.agent_fixtures import rdma_tree, tool
from tests.unit.blocking_fuse import FSTYPE, blocking_fuse
from tests.unit.fake_slurm import FakeSlurm


def test_rdma_healthy_degraded_counters_and_absent(tmp_path):
    healthy = rdma_tree(
        tmp_path / "ok",
        {
            "mlx5_0/1": ("4: ACTIVE", "200 Gb/sec (4X HDR)", 0),
            "mlx5_1/1": ("4: ACTIVE", "200 Gb/sec (4X HDR)", 0),
        },
    )
    state = str(tmp_path / "counters.json")
    assert check_rdma(healthy, 2, 100, state).status == OK
    degraded = rdma_tree(
        tmp_path / "bad",
        {"mlx5_0/1": ("4: ACTIVE", "200 Gb/sec", 0), "mlx5_1/1": ("1: DOWN", "10 Gb/sec", 0)},
    )
    result = check_rdma(degraded, 2, 100, str(tmp_path / "c2.json"))
    assert result.status == FAIL
    assert result.detail == "1 of 2 expected ports active; mlx5_1/1 1: DOWN (3: Disabled)"
    counter = Path(healthy, "class/infiniband/mlx5_0/ports/1/counters/symbol_error")
    counter.write_text("7\n")
    grown = check_rdma(healthy, 2, 100, state)
    assert grown.status == FAIL and "mlx5_0/1 errors: symbol_error +7" in grown.detail
    assert check_rdma(healthy, 2, 100, state).status == OK  # no new errors since
    assert check_rdma(str(tmp_path / "none"), 0, 0, state).status == ABSENT
    assert check_rdma(str(tmp_path / "none"), 2, 0, state).status == FAIL


def test_gpu_count_exit_codes_xids_and_absence(tmp_path):
    log = tmp_path / "kmsg"  # /dev/kmsg's record format (prio,seq,usec,flags;text)
    log.write_text("6,1,0,-;boot\n")
    two = tool(
        tmp_path / "smi2",
        'case "$1" in --query-gpu=index,pci.bus_id) '
        'printf "0, 00000000:3B:00.0\\n1, 00000000:5E:00.0\\n";; *) exit 2;; esac\n',
    )
    state: dict = {}
    assert check_gpus(two, 2, str(log), state, 5).status == OK
    missing = check_gpus(two, 4, str(log), state, 5)
    assert missing.status == FAIL and missing.detail == "2 GPU(s), expected 4"
    xid_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    log.write_text(f"6,1,0,-;boot\n4,2,9,-;{xid_79}\n")
    xid = check_gpus(two, 2, str(log), state, 5, "boot-1")
    assert xid.status == FAIL and xid.detail == "Xid 79 on 0000:3b:00"
    again = check_gpus(two, 2, str(log), state, 5, "boot-1")  # it holds until a reboot
    assert again.status == FAIL and again.detail == "Xid 79 on 0000:3b:00"
    log.write_text("6,1,0,-;boot\n")  # a reboot: a new ring buffer
    assert check_gpus(two, 2, str(log), state, 5, "boot-2").status == OK  # the Xid is gone
    fallen = tool(tmp_path / "smi15", "exit 15\n")
    assert check_gpus(fallen, 2, str(log), state, 5).detail == (
        "nvidia-smi exited 15 (GPU has fallen off the bus)"
    )
    none = tool(tmp_path / "smi6", "echo 'No devices were found'; exit 6\n")
    assert check_gpus(none, 0, str(log), state, 5).status == ABSENT
    assert check_gpus(str(tmp_path / "nope"), 0, str(log), state, 5).status == ABSENT
    assert check_gpus(str(tmp_path / "nope"), 8, str(log), state, 5).status == FAIL
    hang = tool(tmp_path / "hang", "sleep 30\n")
    slow = check_gpus(hang, 8, str(log), state, 0.3)
    assert slow.status == FAIL and "did not answer within 0.3 s" in slow.detail


def test_services_from_systemctl(tmp_path, monkeypatch):
    tool(
        tmp_path / "systemctl",
        "printf 'Id=munge.service\\nLoadState=loaded\\nActiveState=active"
        "\\n\\nId=slurmd.service\\nLoadState=loaded\\nActiveState=failed\\n'\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    result = check_services(["munge", "slurmd"], 5)
    assert result.status == FAIL and result.detail == "slurmd.service failed"


def test_memory_against_real_memory(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")
    assert check_memory(str(tmp_path), 15000).status == OK
    low = check_memory(str(tmp_path), 32000)
    assert low.status == FAIL and "less than the configured RealMemory 32000 MB" in low.detail


MOUNTINFO = (
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:40 / {shared} rw,nosuid,relatime shared:2 - nfs4 n1:/shared rw,vers=4.2\n"
    "41 22 0:41 / /with\\040space rw - tmpfs tmpfs rw\n"
)


def test_mountinfo_types_options_and_liveness(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (tmp_path / "self").mkdir()
    (tmp_path / "self/mountinfo").write_text(MOUNTINFO.format(shared=shared))
    good = [{"path": str(shared), "fstype": "nfs4", "options": ["rw", "vers=4.2"]}]
    assert mounts.check_mounts(good, str(tmp_path), str(tmp_path / "st"), 2).status == OK
    bad = [
        {"path": str(shared), "fstype": "nfs", "options": ["ro"]},
        {"path": "/scratch", "fstype": "xfs"},
    ]
    result = mounts.check_mounts(bad, str(tmp_path), str(tmp_path / "st"), 2)
    assert result.status == FAIL
    assert result.detail == (
        f"{shared} is nfs4, expected nfs; {shared} lacks options ro; /scratch not mounted"
    )


def test_a_fuse_mount_whose_statfs_blocks_is_stuck_not_reprobed_then_failed(tmp_path, monkeypatch):
    point = tmp_path / "hung"
    point.mkdir()
    state = str(tmp_path / "st")
    want = [{"path": str(point), "fstype": FSTYPE}]
    with blocking_fuse(point) as fuse:
        # The probe blocks until the abort below; the check comes back without it.
        first = mounts.check_mounts(want, "/proc", state, 0.3)
        assert first.status == STUCK and "did not answer within 0.3 s" in first.detail
        marker = next(Path(state).glob("stuck-*.json"))
        fuse["stuck_pids"].append(json.loads(marker.read_text())["pid"])
        forks = []
        monkeypatch.setattr(os, "fork", lambda: forks.append(1) or 0)
        second = mounts.check_mounts(want, "/proc", state, 0.3)
        assert second.status == STUCK and "statfs blocked since" in second.detail and not forks
        monkeypatch.undo()
        fuse["abort"]()  # the server died: the blocked probe ends, the mount stays
        dead = mounts.check_mounts(want, "/proc", state, 2)
        assert dead.status == FAIL and dead.detail == f"{point}: statfs failed"


FAILED = [Result("gpu", FAIL, "1 GPU(s), expected 2"), Result("rdma", OK)]
HEALTHY = [Result("gpu", OK), Result("rdma", ABSENT)]


@pytest.mark.parametrize(
    ("state", "reason", "results", "calls", "said"),
    [
        (
            "IDLE",
            "none",
            FAILED,
            [
                [
                    "scontrol",
                    "update",
                    "NodeName=n2",
                    "State=DRAIN",
                    "Reason=tacc: gpu: 1 GPU(s), expected 2",
                ]
            ],
            "drained n2",
        ),
        ("IDLE+DRAIN", "tacc: gpu: 1 GPU(s), expected 2", FAILED, [], "already drained"),
        (
            "IDLE+DRAIN",
            "tacc: gpu: 1 GPU(s), expected 2 [root@2026-11-22T20:10:00]",
            FAILED,
            [],
            "already drained",
        ),
        ("IDLE+DRAIN", "disk swap [admin@2026]", FAILED, [], "drained by an admin"),
        (
            "IDLE+DRAIN",
            "tacc: gpu: old",
            HEALTHY,
            [["scontrol", "update", "NodeName=n2", "State=RESUME"]],
            "resumed n2",
        ),
        ("IDLE+DRAIN", "disk swap [admin@2026]", HEALTHY, [], "nothing to do"),
        # The acceptance gate's and rolling maintenance's drains: a passing run never
        # resumes them (a new node would take jobs before its acceptance).
        ("IDLE+DRAIN", "tacc: acceptance pending", HEALTHY, [], "nothing to do"),
        (
            "IDLE+DRAIN",
            "tacc: acceptance failed: mpi allreduce within node 8 MB/s < 100 MB/s",
            HEALTHY,
            [],
            "nothing to do",
        ),
        (
            "MIXED+DRAIN",
            "tacc: rolling reboot [root@2026-11-24T20:00:00]",
            HEALTHY,
            [],
            "nothing to do",
        ),
        ("IDLE+DRAIN", "tacc: rolling reboot", FAILED, [], "drained by an admin"),
    ],
)
def test_drain_and_resume_only_what_the_agent_drained(
    monkeypatch, state, reason, results, calls, said
):
    fake = FakeSlurm().install(monkeypatch)
    fake.add_node("n2", state, reason)
    outcome = health.apply_to_slurm(results, "n2", 5)
    assert said in outcome.said and fake.updates() == calls
    # The drain gauge's input: the node is held by this agent's failing check.
    assert outcome.drained_by_agent == (said in ("drained n2", "already drained"))


def one_gpu_smi(path: Path, figures: str) -> str:
    """nvidia-smi for one GPU that answers the figures query with this CSV line."""
    script = (
        'case "$1" in --query-gpu=index,pci.bus_id) echo "0, 00000000:3B:00.0";;\n'
        f' --query-gpu=index,temperature*) echo "{figures}";; *) exit 2;; esac\n'
    )
    return tool(path, script)


def test_gpu_figures_and_ecc_from_one_optional_query(tmp_path):
    smi = one_gpu_smi(tmp_path / "smi", "0, 41, 87, 1024, 81559, 312.50, 2, No")
    result = check_gpus(smi, 1, str(tmp_path / "none.log"), {}, 5)
    assert result.status == FAIL and result.detail == "GPU 0: 2 uncorrected ECC errors"
    figures = {s.name: s.value for s in result.samples}
    assert figures["gpu_utilization_ratio"] == 0.87
    assert figures["gpu_memory_used_bytes"] == 1024 * 2**20
    assert figures["gpu_power_watts"] == 312.5 and figures["gpus"] == 1
    old_driver = one_gpu_smi(
        tmp_path / "old", "0, 41, [N/A], 10, 20, [Not Supported], [N/A], [N/A]"
    )
    plain = check_gpus(old_driver, 1, str(tmp_path / "none.log"), {}, 5)
    assert plain.status == OK
    assert "gpu_power_watts" not in {s.name for s in plain.samples}


def test_xids_from_kmsg_records_by_sequence_number(tmp_path):
    """/dev/kmsg's record format (Documentation/ABI/testing/dev-kmsg), read from a file."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,101,5000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"
        "4,102,6000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        "4,103,7000,-;NVRM: Xid (PCI:0000:5e:00): 13, pid=9, Graphics Exception\n"
    )
    state: dict = {}
    assert xid_lines(str(kmsg), state) == [
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:5e:00): 13, pid=9, Graphics Exception",
    ]
    assert state["kmsg_seq"] == 103 and xid_lines(str(kmsg), state) == []  # seen already
    two = tool(tmp_path / "smi", 'printf "0, 00000000:3B:00.0\\n1, 00000000:5E:00.0\\n"\n')
    result = check_gpus(two, 2, str(kmsg), {}, 5, "boot-1")
    assert result.status == FAIL and result.detail == "Xid 79 on 0000:3b:00"  # 13 is not critical
