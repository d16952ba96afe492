from pathlib import Path

import pytest
import yaml

from tacc_lab.errors import LabError
from tacc_lab.inventory import (
    COMPUTE_GROUPS,
    HEAD_GROUPS,
    InventoryNode,
    NodeHardware,
    groups_for,
    render_inventory,
)

KEYS = {
    "olga": "ssh-ed25519 AAAAolga olga@tacc-lab-lab",
    "bob": "ssh-ed25519 AAAAbob bob@tacc-lab-lab\n",
    "alice": "ssh-ed25519 AAAAalice alice@tacc-lab-lab",
}


def render_lab(
    count: int,
    researchers: dict[str, str] | None = None,
    *,
    login_node: bool = False,
    accounting_password: str | None = None,
    directory: dict | None = None,
    backup_controller: str | None = None,
) -> dict:
    nodes = [InventoryNode(f"n{i}", f"10.77.0.{10 + i}", i) for i in range(count, 0, -1)]
    if login_node:
        nodes.append(InventoryNode("login1", "10.77.0.10", 0))
    text = render_inventory(
        nodes,
        ssh_key=Path("/var/lib/tacc-lab/lab/ssh/id_ed25519"),
        known_hosts=Path("/var/lib/tacc-lab/lab/ssh/known_hosts"),
        proxy_url="http://10.77.0.1:3128",
        lab_name="lab",
        hardware=NodeHardware(cpus=2, memory_mb=24000),
        subnet="10.77.0.0/24",
        researchers=KEYS if researchers is None else researchers,
        accounting_password=accounting_password,
        directory=directory,
        backup_controller=backup_controller,
    )
    assert text.startswith("# Written by `tacc-lab up`")
    return yaml.safe_load(text)


def test_head_node_and_compute_nodes_get_their_groups():
    data = render_lab(3)["all"]
    assert list(data["hosts"]) == ["n1", "n2", "n3"]  # sorted by index
    assert data["hosts"]["n2"]["ansible_host"] == "10.77.0.12"
    children = data["children"]
    assert list(children["slurm_controller"]["hosts"]) == ["n1"]
    assert list(children["login"]["hosts"]) == ["n1"]
    assert list(children["slurm_compute"]["hosts"]) == ["n2", "n3"]
    assert list(children["gpu_nodes"]["hosts"]) == ["n2", "n3"]


def test_a_backup_controller_is_a_second_controller_and_login_host_with_shared_state():
    data = render_lab(4, backup_controller="n4")["all"]
    children = data["children"]
    assert list(children["slurm_controller"]["hosts"]) == ["n1", "n4"]  # the primary first
    assert list(children["login"]["hosts"]) == ["n1", "n4"]
    assert list(children["cluster_dns"]["hosts"]) == ["n1", "n4"]  # names outlive n1
    assert list(children["nfs_clients"]["hosts"]) == ["n2", "n3", "n4"]
    # A second head, not a compute node: no jobs there, no researcher beside them.
    assert list(children["slurm_compute"]["hosts"]) == ["n2", "n3"]
    assert "n4" not in children["gpu_nodes"]["hosts"]
    assert data["vars"]["slurm_state_save_location"] == "/srv/tacc-controllers/slurm-state"
    assert data["vars"]["tacc_agent_cluster_state_dir"] == "/srv/tacc-controllers/tacc-agent"
    assert "slurm_state_save_location" not in render_lab(3)["all"]["vars"]


def test_the_production_shape_has_a_separate_login_node_that_mounts_shared():
    data = render_lab(3, login_node=True)["all"]
    assert list(data["hosts"]) == ["login1", "n1", "n2", "n3"]
    children = data["children"]
    assert list(children["login"]["hosts"]) == ["login1"]
    assert list(children["nfs_clients"]["hosts"]) == ["login1", "n2", "n3"]
    assert list(children["slurm_controller"]["hosts"]) == ["n1"]
    assert list(children["nfs_server"]["hosts"]) == ["n1"]
    assert list(children["slurm_compute"]["hosts"]) == ["n2", "n3"]
    assert "login1" not in children["slurm_compute"]["hosts"]
    assert data["vars"]["nfs_client_mounts"][0]["src"] == "n1:/shared"


def test_single_node_lab_is_head_and_compute():
    assert set(groups_for(1, 1)) == set(HEAD_GROUPS) | set(COMPUTE_GROUPS)
    children = render_lab(1)["all"]["children"]
    assert list(children["slurm_compute"]["hosts"]) == ["n1"]


def test_inventory_verifies_host_keys_against_lab_known_hosts():
    lab_vars = render_lab(2)["all"]["vars"]
    args = lab_vars["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in args
    assert "UserKnownHostsFile=/var/lib/tacc-lab/lab/ssh/known_hosts" in args
    assert lab_vars["ansible_user"] == "root"
    assert lab_vars["tacc_http_proxy"] == "http://10.77.0.1:3128"


def test_groups_match_the_example_inventory(project_root):
    example = yaml.safe_load((project_root / "inventory/example/hosts.yml").read_text())
    example_groups = set(example["all"]["children"])
    assert set(HEAD_GROUPS) | set(COMPUTE_GROUPS) <= example_groups


def test_lab_sets_the_plugins_nspawn_supports():
    lab_vars = render_lab(2)["all"]["vars"]
    assert lab_vars["slurm_proctrack_type"] == "proctrack/linuxproc"
    assert lab_vars["slurm_task_plugin"] == "task/none"
    assert (lab_vars["slurm_node_cpus"], lab_vars["slurm_node_memory_mb"]) == (2, 24000)


def test_lab_serves_shared_with_ganesha_and_points_roles_at_fake_hardware():
    lab_vars = render_lab(3)["all"]["vars"]
    assert lab_vars["nfs_server_implementation"] == "ganesha"
    assert lab_vars["nfs_server_exports"][0]["path"] == "/shared"
    assert lab_vars["nfs_server_exports"][0]["clients"] == "10.77.0.0/24"
    assert lab_vars["nfs_client_mounts"] == [{"src": "n1:/shared", "path": "/shared"}]
    assert lab_vars["nfs_client_mount_now"] is False
    assert lab_vars["rdma_sysfs_root"] == "/opt/tacc-fake-hw/sys/class/infiniband"
    assert lab_vars["nvidia_gpu_repo_uri"] == "file:/opt/tacc-fake-hw/repo"


def test_lab_researchers_become_cluster_users_with_their_keys():
    lab_vars = render_lab(2)["all"]["vars"]
    assert lab_vars["common_cluster_users"] == [
        {
            "name": "alice",
            "uid": 2001,
            "authorized_keys": ["ssh-ed25519 AAAAalice alice@tacc-lab-lab"],
        },
        {"name": "bob", "uid": 2002, "authorized_keys": ["ssh-ed25519 AAAAbob bob@tacc-lab-lab"]},
        {
            "name": "olga",
            "uid": 2003,
            "groups": ["tacc_admins"],
            "authorized_keys": ["ssh-ed25519 AAAAolga olga@tacc-lab-lab"],
        },
    ]
    assert lab_vars["tacc_agent_workspace"] == "/shared/tcloud"
    assert "tacc_agent_extra_packages" not in lab_vars  # environments come from the cache


def test_the_operator_is_in_the_admins_group_on_every_node():
    lab_vars = render_lab(3, login_node=True)["all"]["vars"]  # all: every node gets it
    assert lab_vars["common_cluster_groups"] == [{"name": "tacc_admins", "gid": 2100}]
    admins = [
        u["name"] for u in lab_vars["common_cluster_users"] if "tacc_admins" in u.get("groups", [])
    ]
    assert admins == ["olga"]
    uids = {user["uid"] for user in lab_vars["common_cluster_users"]}
    assert 2100 not in uids  # no user's own group (gid = uid) takes the admins' GID


def test_every_local_user_gets_a_slurm_association():
    lab_vars = render_lab(2, accounting_password="pw")["all"]["vars"]  # noqa: S106 (a test value)
    assert lab_vars["slurm_accounts"] == [{"name": "research", "users": ["alice", "bob", "olga"]}]


def test_no_researchers_means_no_cluster_users():
    lab_vars = render_lab(1, researchers={})["all"]["vars"]
    assert lab_vars["common_cluster_users"] == []
    assert lab_vars["common_cluster_groups"] == [{"name": "tacc_admins", "gid": 2100}]


def test_unknown_researcher_is_refused():
    with pytest.raises(LabError, match="not lab researchers: mallory"):
        render_lab(1, researchers={"mallory": "ssh-ed25519 AAAA"})
