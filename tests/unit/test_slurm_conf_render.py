"""slurm.conf comes from inventory variables only: rendered from the example inventory
(1 controller + login + 8 GPU nodes) it is the same on every host and in a --limit run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT


def render(out: Path, *extra: str) -> None:
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            "inventory/example",
            "playbooks/render-slurm-config.yml",
            "-e",
            f"slurm_render_dir={out}",
            "-e",
            "vault_slurm_dbd_db_password=unit-test",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, Path]:
    full = tmp_path_factory.mktemp("full")
    limited = tmp_path_factory.mktemp("limited")
    render(full)
    render(limited, "--limit", "gpu03")
    return full, limited


def test_every_host_renders_the_same_slurm_conf(rendered):
    full, _ = rendered
    confs = {p.parent.name: p.read_bytes() for p in full.glob("*/slurm.conf")}
    assert sorted(confs) == sorted(["ctl1", "login1"] + [f"gpu0{i}" for i in range(1, 9)])
    assert len(set(confs.values())) == 1


def test_limit_run_renders_the_same_bytes(rendered):
    full, limited = rendered
    assert [p.name for p in limited.iterdir()] == ["gpu03"]
    assert (limited / "gpu03/slurm.conf").read_bytes() == (full / "ctl1/slurm.conf").read_bytes()
    assert (limited / "gpu03/gres.conf").read_bytes() == (full / "gpu03/gres.conf").read_bytes()


def test_nodes_partitions_and_policy_come_from_group_vars(rendered):
    conf = (rendered[0] / "ctl1/slurm.conf").read_text()
    # 515000 MB declared, 0.95 safety factor.
    assert "NodeName=gpu05 NodeAddr=10.10.1.5 CPUs=64 RealMemory=489250 Gres=gpu:a100:8" in conf
    assert "SlurmctldHost=ctl1(10.10.0.10)" in conf
    assert "PartitionName=urgent Nodes=ALL Default=NO MaxTime=12:00:00" in conf
    assert "PriorityTier=10 QOS=urgent" in conf
    for line in (
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "GresTypes=gpu",
        "PriorityWeightFairshare=10000",
        "HealthCheckProgram=/usr/local/sbin/tacc-agent-healthcheck",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY",
    ):
        assert line in conf.splitlines()
    assert "NodeName=login1" not in conf and "NodeName=ctl1" not in conf


def test_gres_conf_names_each_gpu_device(rendered):
    gres = (rendered[0] / "gpu01/gres.conf").read_text()
    assert "NodeName=gpu01 Name=gpu Type=a100 File=/dev/nvidia[0-7]" in gres


def test_agent_settings_come_from_inventory(rendered):
    """Per node: its Slurm daemons, its GPUs (Gres), its RealMemory, its NFS mounts."""
    gpu = yaml.safe_load((rendered[0] / "gpu05/tacc-agent.yaml").read_text())
    assert gpu["services"] == ["munge", "slurmd"] and gpu["drain"] is True
    assert gpu["expected_gpus"] == 8 and gpu["real_memory_mb"] == 489250
    assert gpu["mounts"] == [{"path": "/shared", "fstype": "nfs4"}]
    controller = yaml.safe_load((rendered[0] / "ctl1/tacc-agent.yaml").read_text())
    assert controller["services"] == ["munge", "slurmctld", "slurmdbd"]
    assert controller["drain"] is False and controller["expected_gpus"] == 0
    assert controller["real_memory_mb"] == 0
    limited = yaml.safe_load((rendered[1] / "gpu03/tacc-agent.yaml").read_text())
    assert limited == yaml.safe_load((rendered[0] / "gpu03/tacc-agent.yaml").read_text())
