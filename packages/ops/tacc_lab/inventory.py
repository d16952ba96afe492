"""Render the Ansible inventory for a lab (pure, unit-tested).

Groups match `inventory/example/hosts.yml`, so every playbook runs unchanged on the lab,
in the production shape: n1 is the head node (controller, accounting, NFS server,
package cache), `login1` the separate login node (an NFS client, not a Slurm node),
every other node a compute node. With a container image (`--container-image`) n1 is
also the cluster's image registry. A lab without a login node (`--no-login-node`) has n1
as its login node too; a one-node lab puts everything on n1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tacc_lab import public_registry
from tacc_lab.addressing import LOGIN_INDEX
from tacc_lab.backup_controller import inventory_vars as backup_controller_vars
from tacc_lab.config import NODE_PACKAGE_CACHE
from tacc_lab.errors import LabError
from tacc_lab.fakehw import (
    DRIVER_VERSIONS,
    FAKE_HEADERS_PACKAGE,
    NODE_CPU_SYSFS,
    NODE_MIG_MINORS,
    NODE_RDMA_CONFIGFS,
    NODE_RDMA_SYSFS,
    NODE_REPO_URI,
)
from tacc_lab.researchers import ADMINS_GROUP, LOCAL_USERS, OPERATORS

# Ganesha export options for the lab's /shared (kernel exports(5) syntax; the role maps
# them to Access_Type/Squash).
# root_squash like the role's default: root on a client is nobody on /shared.
EXPORT_OPTIONS = ("rw", "sync", "no_subtree_check", "root_squash")

# The head node also serves the cluster's names (cluster_dns) and runs its monitoring.
HEAD_GROUPS = (
    "slurm_controller",
    "login",
    "slurm_dbd",
    "nfs_server",
    "package_cache",
    "cluster_dns",
    "monitoring",
)
LOGIN_GROUPS = ("login", "nfs_clients")
COMPUTE_GROUPS = ("slurm_compute", "nfs_clients", "gpu_nodes", "rdma_nodes", "smartnic_nodes")
# The head node also runs the cluster's image registry in a lab with a container image
# (`tacc-lab up --container-image`); other labs skip the registry and the runtime.
REGISTRY_GROUP = "image_registry"
# The head node also runs the lab's LDAP directory in a lab with one (`tacc-lab up
# --directory`: tacc_lab/directory.py); every node then reads users from it (SSSD).
DIRECTORY_GROUP = "directory_server"
ALL_GROUPS = tuple(
    dict.fromkeys((*HEAD_GROUPS, REGISTRY_GROUP, DIRECTORY_GROUP, *LOGIN_GROUPS, *COMPUTE_GROUPS))
)
REGISTRY_PORT = 5000
# Where the lab's alert test listens for Alertmanager's webhook, on the head node.
ALERT_WEBHOOK_PORT = 9099


@dataclass(frozen=True)
class ContainerImage:
    """The lab's container image: an OCI archive on this machine, seeded as `name`."""

    archive: Path
    name: str


@dataclass(frozen=True)
class InventoryNode:
    name: str
    address: str
    index: int


@dataclass(frozen=True)
class NodeHardware:
    """What every lab node sees: the host's CPUs and memory (nodes share the kernel)."""

    cpus: int
    memory_mb: int


def groups_for(
    index: int, node_count: int, *, login_node: bool = False, image_registry: bool = False
) -> tuple[str, ...]:
    """Groups of node `index` in a lab of `node_count` numbered nodes (n1..), plus the
    separate login node (index LOGIN_INDEX) when `login_node`; the head node runs the
    image registry when `image_registry`."""
    if index == LOGIN_INDEX:
        return LOGIN_GROUPS
    if index == 1:
        head = tuple(g for g in HEAD_GROUPS if not (login_node and g == "login"))
        head += (REGISTRY_GROUP,) if image_registry else ()
        return head + (COMPUTE_GROUPS if node_count == 1 else ())
    return COMPUTE_GROUPS


def container_vars(head: str, head_address: str, image: ContainerImage | None) -> dict:
    """Inventory variables of the container roles: without an image the lab skips the
    runtime (and has no registry), so labs that run no container stay as fast as before.
    With one, the site allows one public registry, nvcr.io, played by the lab's stand-in
    (tacc_lab/public_registry.py) and cached on the head node."""
    if image is None:
        return {"container_runtime_enabled": False}
    return {
        **public_registry.upstream_vars(head_address),
        # The lab's registry on the head node speaks plain HTTP on the lab's bridge:
        # tasks pin images by digest at submit, so integrity does not rest on TLS.
        "tacc_image_registry": f"{head}:{REGISTRY_PORT}",
        "tacc_image_registry_insecure": True,
        "image_registry_port": REGISTRY_PORT,
        "image_registry_seed": [{"archive": str(image.archive), "name": image.name}],
        "container_runtime_enabled": True,
        "container_runtime_name": "charliecloud",
    }


MONITORING_VARS = {
    # The lab's head node is also its login node (HEAD_GROUPS): a lab only, where users
    # reading each other's job figures in Prometheus is accepted (docs/lab.md).
    "monitoring_on_user_hosts": True,
    "monitoring_scrape_interval": "5s",
    "monitoring_scrape_timeout": "5s",
    "monitoring_evaluation_interval": "5s",
    "monitoring_alert_for": {
        "node_drained_by_check": "10s",
        "mount_stuck": "30s",
        "disk_nearly_full": "1m",
        "slurmctld_down": "30s",
        "slurmdbd_down": "30s",
        "gpus_allocated_idle": "2m",
        "target_down": "30s",
    },
    "monitoring_alertmanager_group_wait": "1s",
    "monitoring_alertmanager_group_interval": "10s",
    "monitoring_alert_webhook_url": f"http://127.0.0.1:{ALERT_WEBHOOK_PORT}/tacc-hook",
    # Collectors with nothing to read in an nspawn node.
    "node_exporter_disabled_collectors": ["rapl", "hwmon", "nvme", "infiniband", "mdadm"],
}


def accounting_vars(password: str | None, users: list[str]) -> dict:
    """Slurm accounting (slurmdbd on the head node: usage reports, `sacct`) when the lab
    has a database password for it. The researchers belong to one account, `research`:
    with PrivateData (the slurm role's default) slurmdbd shows a user's own jobs only to
    a user it knows, and jobs need an association (AccountingStorageEnforce)."""
    if password is None:
        return {}
    return {
        "slurm_accounting_enabled": True,
        "slurm_dbd_db_password": password,
        "slurm_accounts": [{"name": "research", "users": users}] if users else [],
    }


def head_node(nodes: list[InventoryNode]) -> InventoryNode:
    """The head node: the lowest-numbered node that is not the login node (n1)."""
    return min((n for n in nodes if n.index != LOGIN_INDEX), key=lambda n: n.index)


def numbered_count(indexes: list[int]) -> int:
    """How many of the lab's nodes are numbered (n1..): all but the login node."""
    return sum(1 for index in indexes if index != LOGIN_INDEX)


def cluster_users(researchers: dict[str, str]) -> list[dict]:
    """common_cluster_users entries, in LOCAL_USERS order, with fixed UIDs; operators
    are also in the admins group (cluster_groups)."""
    uids = dict(LOCAL_USERS)
    unknown = sorted(set(researchers) - set(uids))
    if unknown:
        raise LabError(f"not lab researchers: {', '.join(unknown)}")
    operators = dict(OPERATORS)
    return [
        {
            "name": name,
            "uid": uid,
            **({"groups": [ADMINS_GROUP[0]]} if name in operators else {}),
            "authorized_keys": [researchers[name].strip()],
        }
        for name, uid in LOCAL_USERS
        if name in researchers
    ]


def cluster_groups() -> list[dict]:
    """common_cluster_groups: the admins group, on every node whether or not an operator
    is declared, so its GID never goes to anything else."""
    name, gid = ADMINS_GROUP
    return [{"name": name, "gid": gid}]


def render_inventory(
    nodes: list[InventoryNode],
    *,
    ssh_key: Path,
    known_hosts: Path,
    proxy_url: str,
    lab_name: str,
    hardware: NodeHardware,
    subnet: str,
    researchers: dict[str, str] | None = None,
    package_cache_wheels: list[str] | None = None,
    container_image: ContainerImage | None = None,
    accounting_password: str | None = None,
    public_registry_password: str = "",
    directory: dict | None = None,
    backup_controller: str | None = None,
) -> str:
    """YAML text of the inventory for `nodes`, with host-key checking against the lab's file.

    `researchers` (name -> SSH public key) become `common_cluster_users` that log in
    with that key. `package_cache_wheels` (paths on this machine) are uploaded into the
    cluster package cache on the head node. `container_image` makes the head node the
    lab's image registry, seeded with it, and installs the container runtime.
    `directory` (tacc_lab.directory.directory_vars) makes the head node the lab's LDAP
    directory and every node read users from it. `backup_controller` (a node's name)
    is a second head: a backup slurmctld and a login host, no compute node
    (tacc_lab.backup_controller).
    """
    indexes = [node.index for node in nodes]
    count = numbered_count(indexes)
    login_node = LOGIN_INDEX in indexes
    head_record = head_node(nodes)
    head = head_record.name
    groups: dict[str, dict] = {group: {"hosts": {}} for group in ALL_GROUPS}
    hosts: dict[str, dict] = {}
    registry = container_image is not None
    for node in sorted(nodes, key=lambda n: n.index):
        hosts[node.name] = {"ansible_host": node.address}
        for group in groups_for(node.index, count, login_node=login_node, image_registry=registry):
            groups[group]["hosts"][node.name] = None
    if registry:
        # The cache's account at the stand-in, on the registry host alone.
        hosts[head].update(public_registry.account_vars(public_registry_password))
    if directory is not None:
        groups[DIRECTORY_GROUP]["hosts"][head] = None
    if backup_controller is not None:
        if backup_controller not in hosts:
            raise LabError(f"backup controller {backup_controller!r} is not a node of this lab")
        # A second head: no jobs run there (and researchers who log in to it are on no
        # compute node). It serves the cluster's names too (every node's resolv.conf
        # lists it after n1): with n1's power cut, jobs still find their nodes.
        for group in COMPUTE_GROUPS:
            groups[group]["hosts"].pop(backup_controller, None)
        for group in ("slurm_controller", "cluster_dns", *LOGIN_GROUPS):
            groups[group]["hosts"][backup_controller] = None
    ssh_args = (
        f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes "
        "-o ControlMaster=auto -o ControlPersist=60s"
    )
    users = cluster_users(researchers or {})
    data = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(ssh_key),
                "ansible_ssh_common_args": ssh_args,
                # Facts the roles read to adapt to the lab (see docs/lab.md).
                "tacc_lab_name": lab_name,
                "tacc_http_proxy": proxy_url,
                "tacc_shared_dir": "/shared",
                # Where the lab differs from production (docs/lab.md): the host owns the
                # clock, and nspawn mounts cgroup v1 controllers read-only.
                "common_time_sync": "none",
                "slurm_proctrack_type": "proctrack/linuxproc",
                "slurm_task_plugin": "task/none",
                "slurm_jobacct_gather_type": "jobacct_gather/linux",
                "slurm_node_cpus": hardware.cpus,
                # A requeued job (tcloud halt + resume) waits cred_expire before it runs
                # again (slurm.conf(5)); 120 s by default, 20 s is plenty for lab nodes.
                # A node that stops answering (power cut) is DOWN after SlurmdTimeout
                # (300 s by default) and its jobs requeued; 30 s keeps the lab's fault
                # tests short while a loaded host still answers every ping in time.
                # Nodes share the host's CPUs: a node given a FAKE CPU layout for its
                # FAKE GPUs (tacc-lab fake-hw --sockets) is declared with that layout,
                # which slurmd takes from slurm.conf (config_overrides) instead of
                # draining the node for the CPUs it sees.
                "slurm_extra_config": {
                    "AuthInfo": "cred_expire=20",
                    "SlurmdTimeout": 30,
                    "SlurmdParameters": "config_overrides",
                },
                "slurm_node_memory_mb": hardware.memory_mb,
                # No kernel NFS in nspawn nodes: n1 serves /shared (a host directory
                # bind-mounted on every node) with NFS-Ganesha; clients get enabled mount
                # units for it, and the lab's bind mount stands in for the mount itself.
                "nfs_server_implementation": "ganesha",
                "nfs_server_grace_period": 0,
                # nspawn nodes lack CAP_SYS_RESOURCE: Ganesha 5+ (Debian 13) must run
                # without PR_SET_IO_FLUSHER (older Ganesha has no such option).
                "nfs_server_ganesha_allow_io_flusher_fail": True,
                "nfs_server_exports": [
                    {"path": "/shared", "clients": subnet, "options": list(EXPORT_OPTIONS)}
                ],
                "nfs_client_mounts": [{"src": f"{head}:/shared", "path": "/shared"}],
                "nfs_client_mount_now": False,
                # FAKE hardware boundary (`tacc-lab fake-hw`): where the roles find the
                # RDMA sysfs tree and the fake NVIDIA driver repository. Nodes without
                # fakes have neither, exactly like nodes without the hardware.
                "rdma_sysfs_root": NODE_RDMA_SYSFS,
                "rdma_configfs_root": NODE_RDMA_CONFIGFS,
                "nvidia_gpu_cpu_sysfs": NODE_CPU_SYSFS,
                "nvidia_gpu_mig_minors": NODE_MIG_MINORS,
                "nvidia_gpu_repo_uri": NODE_REPO_URI,
                "nvidia_gpu_repo_suites": ["./"],
                "nvidia_gpu_repo_trusted": True,
                # Its packages are named as NVIDIA's CUDA repository names them
                # (cuda-drivers-550, nvidia-fabricmanager-550) and as Debian does
                # (nvidia-driver), in two versions: the lab holds the first; the second
                # is an upgrade whose module waits for a reboot. The kernel headers DKMS
                # needs are a FAKE package (the host's kernel has no Debian headers).
                "nvidia_gpu_driver_version": DRIVER_VERSIONS[0],
                "nvidia_gpu_kernel_headers_packages": [FAKE_HEADERS_PACKAGE],
                # The lab's researchers and operators (`tacc-lab user NAME` points tcloud
                # at them); the operators are in the admins group (the dashboard's ops view).
                "common_cluster_groups": cluster_groups(),
                "common_cluster_users": users,
                "tacc_agent_workspace": "/shared/tcloud",
                # Researchers' environments are isolated venvs built from the package
                # cache (roles/package_cache), so no OS Python packages are added for them.
                # The agent checks /shared is mounted and alive; in the lab it is the bind
                # mount standing in for NFS (above), so its type is the host's.
                "tacc_agent_mount_fstype": "",
                # The package cache's data is a host directory per lab name, kept across
                # labs and bind-mounted here on n1 (docs/lab.md); the wheels of this
                # machine's pip find-links directories are uploaded into it.
                "package_cache_dir": NODE_PACKAGE_CACHE,
                "package_cache_wheels": list(package_cache_wheels or []),
                # Containers (docs/containers.md): roles/image_registry, roles/container_runtime.
                **container_vars(head, head_record.address, container_image),
                **accounting_vars(accounting_password, [user["name"] for user in users]),
                # The lab's directory (roles/directory_server, roles/identity), if it has one.
                **(directory or {}),
                # A backup controller's shared state (tacc_lab.backup_controller).
                **(backup_controller_vars() if backup_controller else {}),
                # Monitoring (roles/monitoring on the head node): short intervals, so the
                # lab's alert test sees an alert within seconds; the webhook is a receiver
                # the test starts on the head node.
                **MONITORING_VARS,
                # Rolling reboots (playbooks/rolling.yml): lab nodes share the host's
                # kernel, so its boot id never changes; their init's start time does (the
                # lab's BMC, tacc_lab.bmc, boots a node that reboots itself again).
                "rolling_boot_time_command": "cut -d' ' -f22 /proc/1/stat",
            },
            "hosts": hosts,
            "children": {group: spec for group, spec in groups.items() if spec["hosts"]},
        }
    }
    header = f"# Written by `tacc-lab up` for lab {lab_name!r}. Do not edit: it is regenerated.\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
