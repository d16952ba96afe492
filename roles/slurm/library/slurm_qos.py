#!/usr/bin/python
"""Ansible module: make the listed Slurm QoS exist with the given settings (sacctmgr)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_qos
short_description: Create or update Slurm QoS in the accounting database
description:
  - Reads the QoS table with C(sacctmgr show qos), then adds each listed QoS that is
    missing and modifies each whose priority, preemption list, wall-time limit, per-user
    GPU or job limit, preemption mode or usage factor differs.
  - QoS that are not listed are left alone. Supports check mode and diff mode.
  - A per-user GPU limit is a limit on the TRES gres/gpu, which exists in the database only
    once slurmctld has started with it in AccountingStorageTRES. With
    O(missing_tres=defer), such limits are left for a later call and the QoS are returned
    in RV(deferred); with O(missing_tres=fail) the module fails (not in check mode).
options:
  qos:
    description: QoS to manage.
    type: list
    elements: dict
    required: true
    suboptions:
      name: {description: QoS name., type: str, required: true}
      priority: {description: Priority factor., type: int, default: 0}
      preempt: {description: QoS this one may preempt., type: list, elements: str, default: []}
      max_wall:
        description: Per-job wall-time limit in Slurm time format; empty for none.
        type: str
        default: ""
      max_gpus_per_user:
        description: GPUs one user may hold at once (MaxTRESPerUser=gres/gpu=N); unset for no limit.
        type: int
      max_jobs_per_user:
        description: Jobs one user may run at once (MaxJobsPerUser); unset for no limit.
        type: int
      preempt_mode:
        description: How its jobs are preempted (requeue, cancel, ...); empty for the cluster's.
        type: str
        default: ""
      usage_factor:
        description: Multiplies its jobs' usage for fair share (0.0 is free).
        type: float
        default: 1.0
  missing_tres:
    description: What to do with a GPU limit while gres/gpu is not yet a TRES of the cluster.
    type: str
    choices: [defer, fail]
    default: fail
author: TACC stack
"""

EXAMPLES = r"""
- name: QoS for urgent jobs and a free, preemptible scavenger QoS
  slurm_qos:
    qos:
      - {name: urgent, priority: 100, preempt: [normal], max_wall: "12:00:00"}
      - {name: normal, preempt: [scavenger], max_gpus_per_user: 16}
      - {name: scavenger, usage_factor: 0.0, preempt_mode: requeue}
"""

RETURN = r"""
commands:
  description: The sacctmgr commands run (or, in check mode, that would run).
  type: list
  elements: str
  returned: always
deferred:
  description: QoS whose GPU limit was left out because gres/gpu is not a TRES yet.
  type: list
  elements: str
  returned: always
"""

import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.tacc_sacctmgr import run_planned, show  # noqa: E402

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
GPU_TRES = "gres/gpu"
FORMAT = "Name,Priority,Preempt,MaxWall,MaxTRESPU,MaxJobsPU,PreemptMode,UsageFactor"
# What a QoS that `sacctmgr add qos NAME` just created has.
NEW_QOS = {
    "priority": 0,
    "preempt": [],
    "max_wall": None,
    "max_gpus_per_user": None,
    "max_jobs_per_user": None,
    "preempt_mode": "cluster",
    "usage_factor": 1.0,
}


def wall_minutes(text: str) -> int | None:
    """Slurm time ("MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS") in
    minutes; None for no limit."""
    text = text.strip()
    if text in ("", "UNLIMITED", "INFINITE", "-1"):
        return None
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"not a Slurm time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        return int(days) * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if third is not None:
        return int(first) * 60 + int(second) + (1 if int(third) else 0)
    return int(first) + (1 if second and int(second) else 0)


def tres_limit(text: str, tres: str = GPU_TRES) -> int | None:
    """The limit on `tres` in a TRES string ("cpu=8,gres/gpu=2" -> 2); None for none."""
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip().lower() == tres and value.strip():
            return int(value)
    return None


def preempt_mode(text: str | None) -> str:
    """sacctmgr's spelling: lower case, "cluster" for none (OFF is shown as cluster)."""
    mode = (text or "").strip().lower()
    return "cluster" if mode in ("", "off", "cluster") else mode


def parse_table(stdout: str) -> dict[str, dict]:
    """`sacctmgr -n -P show qos format=<FORMAT>` to {name: settings}. Shorter lines (the
    first four columns only) read the rest as unset."""
    table = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        name, priority, preempt, max_wall, max_tres, max_jobs, mode, factor = [
            *line.split("|"),
            *[""] * 7,
        ][:8]
        table[name] = {
            "priority": int(priority or 0),
            "preempt": sorted(p for p in preempt.split(",") if p),
            "max_wall": wall_minutes(max_wall),
            "max_gpus_per_user": tres_limit(max_tres),
            "max_jobs_per_user": int(max_jobs) if max_jobs.strip() else None,
            "preempt_mode": preempt_mode(mode),
            "usage_factor": float(factor) if factor.strip() else 1.0,
        }
    return table


def desired(spec: dict) -> dict:
    return {
        "priority": spec["priority"],
        "preempt": sorted(spec["preempt"]),
        "max_wall": wall_minutes(spec["max_wall"]),
        "max_gpus_per_user": spec.get("max_gpus_per_user"),
        "max_jobs_per_user": spec.get("max_jobs_per_user"),
        "preempt_mode": preempt_mode(spec.get("preempt_mode")),
        "usage_factor": float(spec.get("usage_factor", 1.0)),
    }


def _limit(value: int | None) -> str:
    return "-1" if value is None else str(value)


def settings_to_apply(spec: dict, now: dict | None, gpu_tres: bool = True) -> list[str]:
    """sacctmgr `set` arguments for the settings that differ from `now` (None: a new QoS,
    see NEW_QOS). Without gpu_tres the GPU limit is left out."""
    want = desired(spec)
    now = {**NEW_QOS, **(now or {})}
    settings = []
    if want["priority"] != now["priority"]:
        settings.append(f"Priority={want['priority']}")
    if want["preempt"] != now["preempt"]:
        settings.append(f"Preempt={','.join(want['preempt'])}")
    if want["max_wall"] != now["max_wall"]:
        settings.append(f"MaxWall={spec['max_wall'] if want['max_wall'] is not None else -1}")
    if gpu_tres and want["max_gpus_per_user"] != now["max_gpus_per_user"]:
        settings.append(f"MaxTRESPerUser={GPU_TRES}={_limit(want['max_gpus_per_user'])}")
    if want["max_jobs_per_user"] != now["max_jobs_per_user"]:
        settings.append(f"MaxJobsPerUser={_limit(want['max_jobs_per_user'])}")
    if want["preempt_mode"] != now["preempt_mode"]:
        settings.append(f"PreemptMode={want['preempt_mode']}")
    if abs(want["usage_factor"] - now["usage_factor"]) > 1e-6:
        settings.append(f"UsageFactor={want['usage_factor']:g}")
    return settings


def plan(specs: list[dict], current: dict[str, dict], gpu_tres: bool = True) -> list[list[str]]:
    """sacctmgr commands that make `current` match `specs`: every add first (a QoS may
    preempt one listed after it), then the modifications."""
    adds, modifies = [], []
    for spec in specs:
        name = spec["name"]
        if name not in current:
            adds.append(["sacctmgr", "--immediate", "add", "qos", name])
        settings = settings_to_apply(spec, current.get(name), gpu_tres)
        if settings:
            where = ["sacctmgr", "--immediate", "modify", "qos", "where", f"name={name}", "set"]
            modifies.append(where + settings)
    return adds + modifies


def deferred_gpu_limits(specs: list[dict], current: dict[str, dict]) -> list[str]:
    """QoS whose GPU limit differs from the database's (what waits for gres/gpu)."""
    return [
        spec["name"]
        for spec in specs
        if desired(spec)["max_gpus_per_user"]
        != {**NEW_QOS, **current.get(spec["name"], {})}["max_gpus_per_user"]
    ]


def parse_tres(stdout: str) -> set[str]:
    """`sacctmgr -n -P show tres format=Type,Name` ("gres|gpu", "cpu|") to {"gres/gpu", "cpu"}."""
    names = set()
    for line in stdout.splitlines():
        kind, _, name = line.strip().partition("|")
        if kind:
            names.add(f"{kind}/{name}".lower() if name else kind.lower())
    return names


def gpu_tres_known(module: AnsibleModule, specs: list[dict]) -> bool:
    """Whether gres/gpu is a TRES of the cluster (only asked when a QoS has a GPU limit)."""
    if all(spec.get("max_gpus_per_user") is None for spec in specs):
        return True
    return GPU_TRES in parse_tres(show(module, "tres", "format=Type,Name"))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "qos": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "name": {"type": "str", "required": True},
                    "priority": {"type": "int", "default": 0},
                    "preempt": {"type": "list", "elements": "str", "default": []},
                    "max_wall": {"type": "str", "default": ""},
                    "max_gpus_per_user": {"type": "int"},
                    "max_jobs_per_user": {"type": "int"},
                    "preempt_mode": {"type": "str", "default": ""},
                    "usage_factor": {"type": "float", "default": 1.0},
                },
            },
            "missing_tres": {"type": "str", "choices": ["defer", "fail"], "default": "fail"},
        },
        supports_check_mode=True,
    )
    specs = module.params["qos"]
    try:
        current = parse_table(show(module, "qos", f"format={FORMAT}"))
        wanted = {spec["name"]: desired(spec) for spec in specs}
    except ValueError as exc:
        module.fail_json(msg=f"slurm_qos: {exc}")

    gpu_tres = gpu_tres_known(module, specs)
    deferred = [] if gpu_tres else deferred_gpu_limits(specs, current)
    if deferred and module.params["missing_tres"] == "fail" and not module.check_mode:
        module.fail_json(
            msg=f"slurm_qos: {GPU_TRES} is not a TRES of this cluster yet, so the GPU limits "
            f"of {', '.join(deferred)} cannot be set: slurmctld registers it when it starts "
            f"with {GPU_TRES} in AccountingStorageTRES"
        )
    commands = plan(specs, current, gpu_tres)
    result = {
        "changed": bool(commands or deferred),
        "commands": [" ".join(c) for c in commands],
        "deferred": deferred,
        "diff": {"before": {name: current.get(name) for name in wanted}, "after": wanted},
    }
    run_planned(module, commands)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
