"""The lab's user accounts (researchers and an operator): their SSH keys and the tcloud
config that logs in as them.

The local accounts themselves are created on every node by the common role, from the
`common_cluster_users` and `common_cluster_groups` the lab inventory declares
(tacc_lab/inventory.py).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.nodes import generate_ed25519_key

# (name, uid): the same UID on every node, like production's common_cluster_users.
RESEARCHERS = (("alice", 2001), ("bob", 2002))
# (name, uid): the lab's operators, local users like the researchers (a key, a tcloud
# config, a Slurm association) who are also in ADMINS_GROUP on every node: the group
# that admits to the dashboard's ops view.
OPERATORS = (("olga", 2003),)
# (name, gid): the operators' group, with a GID fixed across nodes (roles/common's
# common_cluster_groups), clear of the users' own groups (their UIDs).
ADMINS_GROUP = ("tacc_admins", 2100)
# Every local account of the lab (common_cluster_users), researchers first.
LOCAL_USERS = (*RESEARCHERS, *OPERATORS)
# (name, uid): researchers who exist only in the lab's LDAP directory (`tacc-lab up
# --directory`: tacc_lab/directory.py), in SSSD's ID range (roles/identity's
# identity_min_id..identity_max_id), clear of the inventory's.
DIRECTORY_RESEARCHERS = (("carol", 20001), ("dave", 20002))
# The tcloud cluster name in each researcher's config.
CLUSTER_NAME = "lab"


def researcher_names() -> list[str]:
    """Every lab user who gets a key and a tcloud config: local users, then the directory's."""
    return [name for name, _uid in (*LOCAL_USERS, *DIRECTORY_RESEARCHERS)]


def check_researcher(name: str) -> None:
    if name not in researcher_names():
        known = ", ".join(researcher_names())
        raise LabError(f"{name!r} is not a lab user; the users are: {known}")


def ensure_researcher_keys(cfg: LabConfig) -> dict[str, str]:
    """An ed25519 key pair per lab user (created once); name -> public key line."""
    public: dict[str, str] = {}
    for name in researcher_names():
        key = cfg.researcher_key(name)
        cfg.users_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        key.parent.mkdir(mode=0o700, exist_ok=True)
        if not key.exists():
            generate_ed25519_key(key, comment=f"{name}@tacc-lab-{cfg.name}")
        key.chmod(0o600)
        public[name] = key.with_suffix(".pub").read_text().strip()
    return public


def user_config_path(cfg: LabConfig, name: str) -> Path:
    return cfg.users_dir / name / "tcloud.yaml"


def user_cache_dir(cfg: LabConfig, name: str) -> Path:
    return cfg.users_dir / name / "cache"


def write_user_config(
    cfg: LabConfig, name: str, login_address: str, fallback_addresses: list[str] | None = None
) -> Path:
    """Write NAME's tcloud config (one cluster, "lab", current) and return its path;
    `fallback_addresses`: the other login hosts tcloud tries when the first is down.

    Same format as tcloud/config.py reads and writes, which only writes to the path in
    $TCLOUD_CONFIG. No `userdir`: the cluster decides it.
    """
    check_researcher(name)
    key = cfg.researcher_key(name)
    if not key.exists():
        raise LabError(f"{name} has no key yet ({key}); run `tacc-lab up` to create it")
    data = {
        "current": CLUSTER_NAME,
        "clusters": {
            CLUSTER_NAME: {
                "host": login_address,
                "user": name,
                "key": str(key),
                "known_hosts": str(cfg.known_hosts),
                **({"fallback_hosts": fallback_addresses} if fallback_addresses else {}),
            }
        },
    }
    path = user_config_path(cfg, name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=True))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
