"""Issue [21] point 3, what inventory makes of a backup controller: the example inventory
with login1 also in slurm_controller (after ctl1, the primary) and the controllers'
shared state folders set. Rendered for real (render-slurm-config.yml); the role's
validate step refuses a backup without shared state and a run that leaves a controller
out."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env
from tests.playbook.slurm_render import render

# The example inventory's GPU nodes: two sockets of 32 cores.
TOPOLOGY = "Sockets=2 CoresPerSocket=32 ThreadsPerCore=1"

STATE = "/srv/ha/slurm-state"
AGENT_STATE = "/srv/ha/tacc-agent"


def two_controllers(inventory: Path) -> None:
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["children"]["slurm_controller"]["hosts"] = {"ctl1": None, "login1": None}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    (inventory / "group_vars/all/controllers.yml").write_text(
        yaml.safe_dump(
            {"slurm_state_save_location": STATE, "tacc_agent_cluster_state_dir": AGENT_STATE}
        )
    )
    # gpu01 offers its GPUs as shards too: both controllers must describe them alike.
    with (inventory / "host_vars/gpu01.yml").open("a") as host_vars:
        host_vars.write("slurm_gpu_sharing: shard\n")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    inventory = tmp_path_factory.mktemp("inventory")
    shutil.copytree(ROOT / "inventory/example", inventory, dirs_exist_ok=True)
    two_controllers(inventory)
    out = tmp_path_factory.mktemp("ha")
    render(out, "--limit", "ctl1,login1,gpu01", inventory=inventory)
    return out


def test_both_controllers_are_in_slurm_conf_the_primary_first(rendered):
    conf = (rendered / "ctl1/slurm.conf").read_text().splitlines()
    assert [line for line in conf if line.startswith("SlurmctldHost=")] == [
        "SlurmctldHost=ctl1(10.10.0.10)",
        "SlurmctldHost=login1(10.10.0.11)",
    ]
    assert f"StateSaveLocation={STATE}" in conf
    assert "SlurmctldTimeout=120" in conf
    # A backup that handed control back restarts as a fresh standby (Slurm 24.11 forgets
    # its ClusterID in control and would not take over again with slurmdbd away).
    assert "SlurmctldPrimaryOffProg=/usr/local/sbin/tacc-slurmctld-standby" in conf
    # Each controller keeps the same files (it reads its own when it takes over, and
    # configless slurmds fetch theirs from whichever is in control).
    for name in ("slurm.conf", "gres.conf"):
        assert (rendered / "login1" / name).read_bytes() == (rendered / "ctl1" / name).read_bytes()


def test_shards_are_typed_like_their_gpus_for_a_controller_that_takes_over(rendered):
    """slurmd reports shards with their GPU's type; a backup that takes over from the
    saved state drained a node whose shards slurm.conf listed untyped (Slurm 24.11)."""
    conf = (rendered / "login1/slurm.conf").read_text()
    assert f"NodeName=gpu01 NodeAddr=10.10.1.1 CPUs=64 {TOPOLOGY} RealMemory=489250 " in conf
    assert "Gres=gpu:a100:8,shard:a100:32 " in conf
    gres = (rendered / "login1/gres.conf").read_text().splitlines()
    assert "NodeName=gpu01 Name=shard Type=a100 Count=32" in gres


def test_slurmd_asks_both_controllers_for_its_configuration(rendered):
    options = (rendered / "gpu01/root/etc/default/slurmd").read_text()
    assert 'SLURMD_OPTIONS="--conf-server 10.10.0.10:6817,10.10.0.11:6817"' in options


def test_only_the_controllers_keep_the_shared_queue_records(rendered):
    for host in ("ctl1", "login1"):
        agent = yaml.safe_load((rendered / f"{host}/tacc-agent.yaml").read_text())
        assert agent["cluster_state_dir"] == AGENT_STATE
        assert "slurmctld" in agent["services"]
    assert "cluster_state_dir" not in yaml.safe_load(
        (rendered / "gpu01/tacc-agent.yaml").read_text()
    )


def test_one_controller_keeps_its_state_on_its_own_disk(tmp_path):
    render(tmp_path, "--limit", "ctl1", "--tags", "slurm")
    conf = (tmp_path / "ctl1/slurm.conf").read_text().splitlines()
    assert "StateSaveLocation=/var/lib/slurm/slurmctld" in conf
    assert not [line for line in conf if line.startswith(("SlurmctldTimeout=", "SlurmctldPrim"))]


# The role's validate step for real (connection local, as test_slurm_extra_config_guard.py).
def validate(
    tmp: Path, controllers: list[str], limit: str, state: str
) -> subprocess.CompletedProcess:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "hosts": {name: dict(local) for name in ("ctl1", "ctl2", "gpu01")},
            "vars": {"slurm_state_save_location": state},
            "children": {
                "slurm_controller": {"hosts": dict.fromkeys(controllers)},
                "slurm_compute": {"hosts": {"gpu01": None}},
            },
        }
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))
    play = [
        {
            "name": "Run the slurm role's validate step",
            "hosts": "all",
            "gather_facts": True,
            "gather_subset": ["!all", "min"],
            "tasks": [
                {
                    "name": "Validate",
                    "ansible.builtin.include_role": {"name": "slurm", "tasks_from": "validate"},
                }
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = ansible_env()
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(tmp / "hosts.yml"),
            str(tmp / "play.yml"),
            "--limit",
            limit,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


@pytest.mark.bad_input
@pytest.mark.parametrize("state", ["", "/var/lib/slurm/slurmctld", "relative/path"])
def test_a_backup_controller_without_shared_state_is_refused(tmp_path, state):
    proc = validate(tmp_path, ["ctl1", "ctl2"], "all", state)
    assert proc.returncode != 0
    assert "slurm_controller_hosts names 2 controllers (ctl1, ctl2)" in proc.stdout, proc.stdout
    assert "set it to an absolute path on storage every controller mounts" in proc.stdout


@pytest.mark.bad_input
def test_a_run_that_leaves_a_controller_out_is_refused(tmp_path):
    proc = validate(tmp_path, ["ctl1", "ctl2"], "ctl1,gpu01", "/srv/ha/slurm-state")
    assert proc.returncode != 0
    assert "but not the controller(s) ctl2" in proc.stdout, proc.stdout
    assert "--limit slurm_controller" in proc.stdout


def test_a_run_with_both_controllers_or_none_passes(tmp_path):
    both = validate(tmp_path, ["ctl1", "ctl2"], "all", "/srv/ha/slurm-state")
    assert both.returncode == 0, both.stdout[-3000:]
    compute_only = validate(tmp_path, ["ctl1", "ctl2"], "gpu01", "/srv/ha/slurm-state")
    assert compute_only.returncode == 0, compute_only.stdout[-3000:]
