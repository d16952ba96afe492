"""Bad inventory variables stop every role at its argument validation (meta/
argument_specs.yml), before any of its tasks runs, with the variable's name and what is
expected; and every inventory this repository ships passes that validation.

The cases run in one real ansible-playbook run on this machine (connection: local, no
facts): each case is a host of its own, with the bad variables as host variables and the
role (entry point) to include; a host that fails stops there while the others go on.
As a guard for this machine the run is in check mode and selects a tag no role task has:
only the roles' validation tasks (tagged `always`) and the play's post task run. That
post task writes a marker file per host, so a value that slipped through validation
shows up as a marker (and a failed case), never as a role changing this host.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_lab.inventory import InventoryNode, NodeHardware, render_inventory
from tests.conftest import ROOT
from tests.playbook.argument_spec_runs import LOCAL, ansible_playbook, failed_tasks

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta").is_dir())


def run_entries(role: str) -> list[str]:
    """The entry points a role runs by: main, else (a role of several entry points and no
    main, slurm_upgrade) each of them."""
    specs = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())
    entries = specs["argument_specs"]
    return ["main"] if "main" in entries else sorted(entries)


ENTRIES = {role: run_entries(role) for role in ROLES}
MAIN_ROLES = [role for role in ROLES if ENTRIES[role] == ["main"]]  # `roles:` can list them
GROUPS = (
    "slurm_controller",
    "slurm_compute",
    "login",
    "slurm_dbd",
    "nfs_server",
    "nfs_clients",
    "gpu_nodes",
    "rdma_nodes",
    "smartnic_nodes",
)
SECRET = "s3cret-db-password-never-shown"  # noqa: S105 (a test value)


def recap(stdout: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP counts per host."""
    found = {
        host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
        for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.M)
    }
    assert found, stdout[-2000:]
    return found


# (role, variables, expected fragments of the error, entry point or None for main)
CASES = [
    (
        "common",
        {"common_time_sync": "ntpd"},
        ["common_time_sync must be one of: chrony, none, got: ntpd"],
        None,
    ),
    ("common", {"common_manage_hosts": "maybe"}, ["common_manage_hosts", "bool"], None),
    (
        "common",
        {"common_cluster_users": [{"name": "alice"}]},
        ["missing required arguments: uid found in common_cluster_users"],
        None,
    ),
    (
        "common",
        {"common_cluster_users": [{"name": "alice", "uid": "twenty"}]},
        ["'uid'", "common_cluster_users", "int"],
        None,
    ),
    (
        "common",
        {"common_cluster_groups": [{"name": "tacc_admins"}]},
        ["missing required arguments: gid found in common_cluster_groups"],
        None,
    ),
    (
        "common",
        {"common_service_accounts": [{"name": "x", "uid": 1, "gid": 1, "shel": "/bin/sh"}]},
        ["common_service_accounts.shel", "Supported parameters include"],
        None,
    ),
    (
        "common",
        {"common_limits": [{"domain": "*", "type": "-", "item": "memlock"}]},
        ["missing required arguments: value found in common_limits"],
        None,
    ),
    (
        "common",
        {"common_limits": [{"domain": "*", "type": "both", "item": "nofile", "value": 1}]},
        ["type must be one of: soft, hard, -, got: both", "common_limits"],
        None,
    ),
    ("common", {"common_ntp_servers": {"pool": "x"}}, ["common_ntp_servers", "list"], None),
    (
        "directory_server",
        {"directory_server_bind_password": SECRET, "directory_server_users": {"carol": 20001}},
        ["directory_server_users", "list"],
        None,
    ),
    (
        "identity",
        {"identity_ldap_bind_password": SECRET, "identity_min_id": "low"},
        ["identity_min_id", "int"],
        None,
    ),
    (
        "cluster_dns",
        {"cluster_dns_upstream_servers": {"site": "9.9.9.9"}},
        ["cluster_dns_upstream_servers", "list"],
        None,
    ),
    ("cluster_dns", {"cluster_dns_agent_port": "http"}, ["cluster_dns_agent_port", "int"], None),
    (
        "monitoring",
        {"monitoring_prometheus_port": "http"},
        ["monitoring_prometheus_port", "int"],
        None,
    ),
    (
        "monitoring",
        {"monitoring_prometheus_listen_on_host": "sometimes"},
        ["monitoring_prometheus_listen_on_host", "bool"],
        None,
    ),
    ("node_exporter", {"node_exporter_port": "metrics"}, ["node_exporter_port", "int"], None),
    (
        "node_exporter",
        {"node_exporter_disabled_collectors": {"rapl": True}},
        ["node_exporter_disabled_collectors", "list"],
        None,
    ),
    ("acceptance", {"acceptance_thresholds": "fast"}, ["acceptance_thresholds", "dict"], None),
    (
        "rolling",
        {"rolling_action": "reimage"},
        ["rolling_action", "reboot, upgrade, upgrade_reboot"],
        None,
    ),
    (
        "rolling",
        {"rolling_checkpoint_grace": "a minute"},
        ["rolling_checkpoint_grace", "int"],
        None,
    ),
    (
        "slurm_upgrade",
        {"slurm_upgrade_jobs_timeout": "a day"},
        ["slurm_upgrade_jobs_timeout", "int"],
        "export",
    ),
    (
        "slurm_upgrade",
        {"slurm_upgrade_allow_unarchived": "maybe"},
        ["slurm_upgrade_allow_unarchived", "bool"],
        "import",
    ),
    ("munge", {"munge_key": "{{ vault_munge_key }}"}, ["'vault_munge_key' is undefined"], None),
    ("backup", {"backup_keep_days": "two weeks"}, ["backup_keep_days", "int"], None),
    (
        "backup",
        {"backup_restore_slurm_state": "maybe"},
        ["backup_restore_slurm_state", "bool"],
        None,
    ),
    (
        "nfs_client",
        {"nfs_client_mounts": [{"src": "ctl1:/srv/shared"}]},
        ["missing required arguments: path found in nfs_client_mounts"],
        None,
    ),
    ("nfs_client", {"nfs_client_automount": "sometimes"}, ["nfs_client_automount", "bool"], None),
    (
        "nfs_client",
        {"nfs_client_automount_idle_seconds": "an hour"},
        ["nfs_client_automount_idle_seconds", "int"],
        None,
    ),
    (
        "nfs_server",
        {"nfs_server_implementation": "nfsd"},
        ["nfs_server_implementation must be one of: kernel, ganesha, got: nfsd"],
        None,
    ),
    (
        "nfs_server",
        {"nfs_server_exports": [{"clients": "*"}]},
        ["missing required arguments: path found in nfs_server_exports"],
        None,
    ),
    ("nfs_server", {"nfs_server_grace_period": "ninety"}, ["nfs_server_grace_period", "int"], None),
    (
        "nvidia_gpu",
        {"nvidia_gpu_gres_mismatch": "ignore"},
        ["nvidia_gpu_gres_mismatch must be one of: fail, warn, got: ignore"],
        None,
    ),
    (
        "nvidia_gpu",
        {"nvidia_gpu_driver_packages": {"cuda-drivers": "latest"}},
        ["nvidia_gpu_driver_packages", "list"],
        None,
    ),
    ("nvidia_gpu", {"nvidia_gpu_dcgm": "perhaps"}, ["nvidia_gpu_dcgm", "bool"], None),
    ("mpi", {"mpi_tcp_networks": {"include": "ib0"}}, ["mpi_tcp_networks", "list"], None),
    ("mpi", {"mpi_mca_params": ["pml=ucx"]}, ["mpi_mca_params", "dict"], None),
    ("mpi", {"mpi_slurm_pmix": "perhaps"}, ["mpi_slurm_pmix", "bool"], None),
    ("package_cache", {"package_cache_port": "http"}, ["package_cache_port", "int"], None),
    (
        "package_cache",
        {"package_cache_offline": "sometimes"},
        ["package_cache_offline", "bool"],
        None,
    ),
    (
        "package_cache",
        {"package_cache_wheels": {"torch": "/opt/wheels/torch.whl"}},
        ["package_cache_wheels", "list"],
        None,
    ),
    (
        "package_cache",
        {"package_cache_root_password": SECRET, "package_cache_service_uid": "pkg"},
        ["package_cache_service_uid", "int"],
        None,
    ),
    (
        "rdma",
        {"rdma_ipoib_interfaces": [{"name": "ib0", "address": "10.20.0.1/16", "mode": "bonded"}]},
        ["mode must be one of: datagram, connected, got: bonded", "rdma_ipoib_interfaces"],
        None,
    ),
    (
        "rdma",
        {"rdma_ipoib_interfaces": [{"name": "ib0"}]},
        ["missing required arguments: address found in rdma_ipoib_interfaces"],
        None,
    ),
    (
        "rdma",
        {"rdma_roce_mode": "RoCE v3"},
        ["rdma_roce_mode must be one of: RoCE v2, IB/RoCE v1, got: RoCE v3"],
        None,
    ),
    ("rdma", {"rdma_roce_tos": "high"}, ["rdma_roce_tos", "int"], None),
    (
        "slurm",
        {"slurm_partitions": [{"name": "batch", "defualt": True}]},
        ["slurm_partitions.defualt", "Supported parameters include"],
        None,
    ),
    (
        "slurm",
        {"slurm_partitions": [{"nodes": "ALL"}]},
        ["missing required arguments: name found in slurm_partitions"],
        None,
    ),
    (
        "slurm",
        {"slurm_qos": [{"name": "urgent", "priority": "high"}]},
        ["'priority'", "slurm_qos", "int"],
        None,
    ),
    (
        "slurm",
        {"slurm_gres_autodetect": "nvidia"},
        ["slurm_gres_autodetect must be one of: off, nvml, got: nvidia"],
        None,
    ),
    (
        "slurm",
        {"slurm_proctrack_type": "proctrack/cgrup"},
        ["slurm_proctrack_type must be one of", "got: proctrack/cgrup"],
        None,
    ),
    (
        "slurm",
        {"slurm_preempt_type": "preempt/partition-prio"},
        ["slurm_preempt_type must be one of", "got: preempt/partition-prio"],
        None,
    ),
    (
        "slurm",
        {"slurm_priority_type": "priority/fairshare"},
        ["slurm_priority_type must be one of", "got: priority/fairshare"],
        None,
    ),
    (
        "slurm",
        {"slurm_jobacct_gather_type": "jobacct_gather/cgroups"},
        ["slurm_jobacct_gather_type must be one of", "got: jobacct_gather/cgroups"],
        None,
    ),
    ("slurm", {"slurm_node_cpus": 8.5}, ["slurm_node_cpus", "int"], None),
    (
        "slurm",
        {"slurm_memory_safety_factor": "most"},
        ["slurm_memory_safety_factor", "float"],
        None,
    ),
    (
        "slurm",
        {"slurm_dbd_db_password": SECRET, "slurm_gres_autodetect": "yes-please"},
        ["slurm_gres_autodetect must be one of"],
        None,
    ),
    (
        "slurm",
        {"slurm_render_os_family": "Windows"},
        [
            "missing required arguments: slurm_render_dir",
            "slurm_render_os_family must be one of: Debian, RedHat, got: Windows",
        ],
        "render_local",
    ),
    (
        "slurm_pam_adopt",
        {"slurm_pam_adopt_options": {"action_generic_failure": "pass"}},
        ["action_generic_failure must be one of: deny, allow, ignore, got: pass"],
        None,
    ),
    (
        "smartnic_firmware",
        {"smartnic_firmware_mlxconfig_tool": "mft"},
        ["smartnic_firmware_mlxconfig_tool must be one of: mlxconfig, mstconfig, got: mft"],
        None,
    ),
    (
        "smartnic_firmware",
        {"smartnic_firmware_burn": "yes please"},
        ["smartnic_firmware_burn", "bool"],
        None,
    ),
    (
        "smartnic_firmware",
        {"smartnic_firmware_reboot_timeout": "soon"},
        ["smartnic_firmware_reboot_timeout", "int"],
        None,
    ),
    (
        "container_runtime",
        {"container_runtime_name": "docker"},
        ["container_runtime_name must be one of: charliecloud, apptainer, enroot, got: docker"],
        None,
    ),
    (
        "container_runtime",
        {"container_runtime_registries": [{"insecure": True}]},
        ["missing required arguments: location found in container_runtime_registries"],
        None,
    ),
    (
        "container_runtime",
        {"container_runtime_enabled": "sometimes"},
        ["container_runtime_enabled", "bool"],
        None,
    ),
    (
        "image_registry",
        {"image_registry_upstreams": [{"registry": "nvcr.io", "url": "https://nvcr.io"}]},
        ["missing required arguments: port found in image_registry_upstreams"],
        None,
    ),
    (
        "image_registry",
        {"image_registry_seed": [{"archive": "/srv/images/base.oci.tar"}]},
        ["missing required arguments: name found in image_registry_seed"],
        None,
    ),
    (
        "image_registry",
        {
            "image_registry_upstream_credentials": {"nvcr.io": {"password": SECRET}},
            "image_registry_port": "http",
        },
        ["image_registry_port", "int"],
        None,
    ),
    (
        "tacc_agent",
        {"tacc_agent_workspace_users": [{"uid": 20001}]},
        ["missing required arguments: name found in tacc_agent_workspace_users"],
        None,
    ),
    (
        "tacc_agent",
        {"tacc_agent_mounts": [{"fstype": "nfs4"}]},
        ["missing required arguments: path found in tacc_agent_mounts"],
        None,
    ),
    (
        "tacc_agent",
        {"tacc_agent_settings": {"chek_interval_seconds": 5}},
        ["tacc_agent_settings.chek_interval_seconds", "check_interval_seconds"],
        None,
    ),
    (
        "tacc_agent",
        {"tacc_agent_settings": {"drain": "maybe"}},
        ["drain", "tacc_agent_settings", "bool"],
        None,
    ),
    ("tacc_agent", {"tacc_agent_metrics_port": "http"}, ["tacc_agent_metrics_port", "int"], None),
]


def case_id(case: tuple) -> str:
    role, variables, _, entry = case
    return f"{role}{'.' + entry if entry else ''}-{'+'.join(variables)}"


@dataclass(frozen=True)
class Batch:
    proc: subprocess.CompletedProcess
    results: Path  # the tree callback's last result per host
    markers: Path

    def result(self, host: str) -> dict:
        return json.loads((self.results / host).read_text())


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Batch:
    """One ansible-playbook run: a host per case, and one per role with no variables."""
    tmp = tmp_path_factory.mktemp("argspecs")
    hosts, entries = {}, {}
    for index, (role, variables, _, entry) in enumerate(CASES):
        hosts[f"case{index:02d}"] = {**LOCAL, "bad_input_role": role, **variables}
        entries.setdefault(entry or "main", {})[f"case{index:02d}"] = None
    for role in ROLES:
        hosts[f"defaults_{role}"] = {**LOCAL, "bad_input_role": role}
        # In each of its entry points' plays (a play whose every host fails ends the run).
        for entry in ENTRIES[role]:
            entries.setdefault(entry, {})[f"defaults_{role}"] = None
    everyone = dict.fromkeys(hosts)
    children = {group: {"hosts": everyone} for group in GROUPS}
    children |= {f"entry_{entry}": {"hosts": members} for entry, members in entries.items()}
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts, "children": children}}))
    markers = tmp / "markers"
    markers.mkdir()
    # One play per role entry point (tasks_from picks the entry point's argument spec).
    play = [
        {
            "name": f"Apply each host's role ({entry}) with its variables",
            "hosts": f"entry_{entry}",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Include the role",
                    "ansible.builtin.include_role": {
                        "name": "{{ bad_input_role }}",
                        "tasks_from": entry,
                    },
                    "tags": ["always"],  # so its validation task runs under --tags
                }
            ],
            "post_tasks": [
                {
                    "name": "Mark that the play went on after the role",
                    "ansible.builtin.copy": {
                        "dest": f"{markers}/{{{{ inventory_hostname }}}}",
                        "content": "ran\n",
                        "mode": "0600",
                    },
                    "check_mode": False,
                    "tags": ["always"],
                }
            ],
        }
        for entry in sorted(entries)
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    results = tmp / "results"
    env = {
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(results),
    }
    proc = ansible_playbook(tmp / "hosts.yml", tmp / "play.yml", tmp, env=env)
    return Batch(proc, results, markers)


@pytest.mark.bad_input
@pytest.mark.parametrize("index", range(len(CASES)), ids=[case_id(c) for c in CASES])
def test_bad_variables_stop_the_role_at_argument_validation(batch, index):
    role, _, expected, entry = CASES[index]
    host = f"case{index:02d}"
    output = batch.proc.stdout + batch.proc.stderr
    assert batch.proc.returncode != 0, output[-3000:]
    # The task that failed is the role's argument validation, and it names the variable.
    task = failed_tasks(batch.proc.stdout).get(host, "(none: the host did not fail)")
    assert task.startswith(f"{role} : Validating arguments against arg spec '{entry or 'main'}'"), (
        task
    )
    result = batch.result(host)  # the host's last result: the failed validation
    assert result["changed"] is False, result
    context = result.get("validate_args_context")  # absent when templating failed first
    assert context is None or (context["name"], context["argument_spec_name"]) == (
        role,
        entry or "main",
    )
    for fragment in expected:
        assert fragment in result["msg"], (fragment, result["msg"])
    # Nothing ran after it: the host failed there, changed nothing, skipped the post task.
    counts = recap(batch.proc.stdout)[host]
    assert (counts["changed"], counts["failed"], counts["skipped"]) == (0, 1, 0), counts
    assert not (batch.markers / host).exists()
    assert "Traceback" not in output
    assert SECRET not in output  # a no_log value is never printed, even in a failure


def test_every_role_has_bad_variable_cases():
    assert sorted({role for role, *_ in CASES}) == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_the_roles_defaults_pass_validation(batch, role):
    """The guard of the cases above: without bad variables the same play goes on."""
    counts = recap(batch.proc.stdout)[f"defaults_{role}"]
    assert counts["failed"] == 0, batch.result(f"defaults_{role}")
    assert (batch.markers / f"defaults_{role}").exists()


def validate_all_roles(inventory: Path, tmp: Path, *extra: str) -> None:
    """Every role's argument validation for every host of an inventory (no connection:
    the validation action runs on this machine)."""
    play = [
        {
            "name": "Validate every role's variables",
            "hosts": "all",
            "gather_facts": False,
            "roles": [{"role": role} for role in MAIN_ROLES],
        }
    ]
    path = tmp / "validate.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    proc = ansible_playbook(inventory, path, tmp, *extra)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    for host, counts in recap(proc.stdout).items():  # one validation per role passed
        assert counts["ok"] == len(MAIN_ROLES) and counts["failed"] == 0, (host, counts)


def test_example_inventory_is_valid(tmp_path):
    validate_all_roles(
        ROOT / "inventory/example", tmp_path, "-e", "vault_slurm_dbd_db_password=unit-test"
    )


def lab_inventory(tmp: Path, group_vars: dict | None = None) -> Path:
    nodes = [InventoryNode(f"n{i}", f"10.77.0.{10 + i}", i) for i in (1, 2, 3)]
    text = render_inventory(
        nodes,
        ssh_key=tmp / "id_ed25519",
        known_hosts=tmp / "known_hosts",
        proxy_url="http://10.77.0.1:3128",
        lab_name="specs",
        hardware=NodeHardware(cpus=2, memory_mb=4000),
        subnet="10.77.0.0/24",
        researchers={"alice": "ssh-ed25519 AAAAalice alice@lab"},
    )
    directory = tmp / "inventory"
    (directory / "group_vars").mkdir(parents=True)
    (directory / "hosts.yml").write_text(text)
    if group_vars:
        (directory / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    return directory


def test_lab_inventory_is_valid(tmp_path):
    validate_all_roles(lab_inventory(tmp_path), tmp_path)


SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_molecule_inventories_are_valid(scenario, tmp_path):
    config = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())
    group_vars = config["provisioner"].get("inventory", {}).get("group_vars", {}).get("all")
    validate_all_roles(lab_inventory(tmp_path, group_vars), tmp_path)


def test_every_agent_setting_is_in_the_tacc_agent_roles_spec():
    """tacc_agent_settings takes every key the agent's config knows (none is refused by
    the role that the agent would read), and nothing else."""
    spec = yaml.safe_load((ROOT / "roles/tacc_agent/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]["tacc_agent_settings"]["options"]
    assert set(options) == {f.name for f in fields(AgentConfig)}
