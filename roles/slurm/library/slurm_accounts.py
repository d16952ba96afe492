#!/usr/bin/python
"""Ansible module: make the listed Slurm accounts and user associations exist (sacctmgr)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_accounts
short_description: Create or update Slurm accounts and their users' associations
description:
  - Reads the associations of one cluster with C(sacctmgr show assoc), adds each listed
    account that is missing (under root) and each listed user missing from its account,
    and modifies the fair-share shares of an account, and the QoS and default QoS of an
    account and of its listed users, where they differ.
  - Accounts, users and settings that are not listed are left alone (an empty O(accounts[].qos)
    or O(accounts[].default_qos) keeps what the database has). Nothing is ever removed.
  - The QoS named must exist (see slurm_qos). A cluster the database does not know yet
    is added first (C(sacctmgr add cluster)), as Slurm's setup does before slurmctld
    first starts. Supports check mode and diff mode.
options:
  cluster:
    description: Cluster the associations belong to (slurm.conf ClusterName).
    type: str
    required: true
  accounts:
    description: Accounts to manage.
    type: list
    elements: dict
    required: true
    suboptions:
      name: {description: Account name., type: str, required: true}
      description:
        description: Description, set when the account is created.
        type: str
        default: ""
      fairshare: {description: Fair-share shares of the account., type: int, default: 1}
      users:
        description: Users associated with the account.
        type: list
        elements: str
        default: []
      default_qos: {description: Default QoS of the account and its users., type: str, default: ""}
      qos:
        description: QoS the account and its users may use.
        type: list
        elements: str
        default: []
author: TACC stack
"""

EXAMPLES = r"""
- name: Two research groups sharing the cluster 2:1
  slurm_accounts:
    cluster: tacc
    accounts:
      - name: vision
        fairshare: 200
        users: [alice]
        qos: [normal, scavenger]
        default_qos: normal
      - {name: nlp, fairshare: 100, users: [bob]}
"""

RETURN = r"""
commands:
  description: The sacctmgr commands run (or, in check mode, that would run).
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.tacc_sacctmgr import run_planned, show  # noqa: E402

FORMAT = "Account,User,Partition,Fairshare,DefaultQOS,QOS"
SACCTMGR = ["sacctmgr", "--immediate"]


def fairshare(text: str) -> int | str:
    """Shares as sacctmgr prints them: a number, or "parent" (the parent's shares)."""
    text = text.strip()
    return int(text) if text.lstrip("-").isdigit() else text.lower()


def parse_assocs(stdout: str) -> dict[tuple[str, str], dict]:
    """`sacctmgr -n -P show assoc format=<FORMAT>` to {(account, user): settings}; user
    "" is the account's own association. Per-partition associations are skipped."""
    table = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        account, user, partition, shares, default_qos, qos = [*line.split("|"), *[""] * 5][:6]
        if partition:
            continue
        table[(account, user)] = {
            "fairshare": fairshare(shares),
            "default_qos": default_qos,
            "qos": sorted(q for q in qos.split(",") if q),
        }
    return table


def _qos_settings(spec: dict, now: dict | None) -> list[str]:
    """QOS= and DefaultQOS= where the spec names them and they differ from `now`."""
    settings = []
    if spec["qos"] and (now is None or sorted(spec["qos"]) != now["qos"]):
        settings.append(f"QOS={','.join(sorted(spec['qos']))}")
    if spec["default_qos"] and (now is None or spec["default_qos"] != now["default_qos"]):
        settings.append(f"DefaultQOS={spec['default_qos']}")
    return settings


def account_commands(spec: dict, current: dict, cluster: str) -> list[list[str]]:
    name = spec["name"]
    now = current.get((name, ""))
    if now is None:
        add = [*SACCTMGR, "add", "account", name, f"Cluster={cluster}"]
        if spec["description"]:
            add.append(f"Description={spec['description']}")
        return [[*add, f"Fairshare={spec['fairshare']}", *_qos_settings(spec, None)]]
    settings = [] if now["fairshare"] == spec["fairshare"] else [f"Fairshare={spec['fairshare']}"]
    settings += _qos_settings(spec, now)
    if not settings:
        return []
    where = ["modify", "account", "where", f"Name={name}", f"Cluster={cluster}", "set"]
    return [[*SACCTMGR, *where, *settings]]


def user_commands(spec: dict, user: str, current: dict, cluster: str) -> list[list[str]]:
    account = spec["name"]
    now = current.get((account, user))
    if now is None:
        add = ["add", "user", user, f"Account={account}", f"Cluster={cluster}"]
        return [[*SACCTMGR, *add, *_qos_settings(spec, None)]]
    settings = _qos_settings(spec, now)
    if not settings:
        return []
    where = ["modify", "user", "where", f"Name={user}", f"Account={account}", f"Cluster={cluster}"]
    return [[*SACCTMGR, *where, "set", *settings]]


def parse_clusters(stdout: str) -> set[str]:
    """`sacctmgr -n -P show cluster format=Cluster` to the set of cluster names."""
    return {line.strip() for line in stdout.splitlines() if line.strip()}


def plan(
    specs: list[dict], current: dict, cluster: str, cluster_known: bool = True
) -> list[list[str]]:
    """sacctmgr commands that make `current` hold `specs`: the cluster if the database
    does not know it, then accounts (a user's association needs its account), then users."""
    accounts = [] if cluster_known or not specs else [[*SACCTMGR, "add", "cluster", cluster]]
    accounts += [c for spec in specs for c in account_commands(spec, current, cluster)]
    users = [
        c
        for spec in specs
        for user in dict.fromkeys(spec["users"])
        for c in user_commands(spec, user, current, cluster)
    ]
    return accounts + users


def wanted_state(specs: list[dict]) -> dict[str, dict]:
    """For the diff: what each listed association should hold, keyed "account" or
    "account/user"."""
    state = {}
    for spec in specs:
        settings = {"qos": sorted(spec["qos"]) or None, "default_qos": spec["default_qos"] or None}
        state[spec["name"]] = {"fairshare": spec["fairshare"], **settings}
        for user in spec["users"]:
            state[f"{spec['name']}/{user}"] = dict(settings)
    return state


def current_state(specs: list[dict], current: dict) -> dict[str, dict | None]:
    state = {}
    for spec in specs:
        state[spec["name"]] = current.get((spec["name"], ""))
        for user in spec["users"]:
            state[f"{spec['name']}/{user}"] = current.get((spec["name"], user))
    return state


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "accounts": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "name": {"type": "str", "required": True},
                    "description": {"type": "str", "default": ""},
                    "fairshare": {"type": "int", "default": 1},
                    "users": {"type": "list", "elements": "str", "default": []},
                    "default_qos": {"type": "str", "default": ""},
                    "qos": {"type": "list", "elements": "str", "default": []},
                },
            },
        },
        supports_check_mode=True,
    )
    cluster, specs = module.params["cluster"], module.params["accounts"]
    known = cluster in parse_clusters(show(module, "cluster", "format=Cluster"))
    shown = show(module, "assoc", "where", f"cluster={cluster}", f"format={FORMAT}")
    current = parse_assocs(shown)
    commands = plan(specs, current, cluster, known)
    result = {
        "changed": bool(commands),
        "commands": [" ".join(c) for c in commands],
        "diff": {"before": current_state(specs, current), "after": wanted_state(specs)},
    }
    run_planned(module, commands)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
