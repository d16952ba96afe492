#!/usr/bin/python
"""Ansible module: make the listed Slurm QoS exist with the given settings (sacctmgr)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_qos
short_description: Create or update Slurm QoS in the accounting database
description:
  - Reads the QoS table with C(sacctmgr show qos), then adds each listed QoS that is
    missing and modifies each whose priority, preemption list or wall-time limit differs.
  - QoS that are not listed are left alone. Supports check mode and diff mode.
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
author: TACC stack
"""

EXAMPLES = r"""
- name: QoS for urgent jobs
  slurm_qos:
    qos:
      - {name: urgent, priority: 100, preempt: [normal], max_wall: "12:00:00"}
"""

import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


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


def parse_table(stdout: str) -> dict[str, dict]:
    """`sacctmgr -n -P show qos format=Name,Priority,Preempt,MaxWall` to {name: settings}."""
    table = {}
    for line in stdout.splitlines():
        if not line.strip():
            continue
        name, priority, preempt, max_wall = [*line.split("|"), "", "", ""][:4]
        table[name] = {
            "priority": int(priority or 0),
            "preempt": sorted(p for p in preempt.split(",") if p),
            "max_wall": wall_minutes(max_wall),
        }
    return table


def desired(spec: dict) -> dict:
    return {
        "priority": spec["priority"],
        "preempt": sorted(spec["preempt"]),
        "max_wall": wall_minutes(spec["max_wall"]),
    }


def settings_to_apply(spec: dict, now: dict | None) -> list[str]:
    """sacctmgr `set` arguments for the settings that differ from `now` (None: new QoS,
    whose defaults are priority 0, no preemption, no wall-time limit)."""
    want = desired(spec)
    now = now or {"priority": 0, "preempt": [], "max_wall": None}
    settings = []
    if want["priority"] != now["priority"]:
        settings.append(f"Priority={want['priority']}")
    if want["preempt"] != now["preempt"]:
        settings.append(f"Preempt={','.join(want['preempt'])}")
    if want["max_wall"] != now["max_wall"]:
        settings.append(f"MaxWall={spec['max_wall'] if want['max_wall'] is not None else -1}")
    return settings


def plan(specs: list[dict], current: dict[str, dict]) -> list[list[str]]:
    """sacctmgr commands that make `current` match `specs`: every add first (a QoS may
    preempt one listed after it), then the modifications."""
    adds, modifies = [], []
    for spec in specs:
        name = spec["name"]
        if name not in current:
            adds.append(["sacctmgr", "--immediate", "add", "qos", name])
        settings = settings_to_apply(spec, current.get(name))
        if settings:
            where = ["sacctmgr", "--immediate", "modify", "qos", "where", f"name={name}", "set"]
            modifies.append(where + settings)
    return adds + modifies


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
                },
            }
        },
        supports_check_mode=True,
    )
    show = ["sacctmgr", "--noheader", "--parsable2", "show", "qos"]
    rc, out, err = module.run_command([*show, "format=Name,Priority,Preempt,MaxWall"])
    if rc != 0:
        module.fail_json(msg=f"sacctmgr show qos failed: {err.strip() or out.strip()}")
    try:
        current = parse_table(out)
        wanted = {spec["name"]: desired(spec) for spec in module.params["qos"]}
    except ValueError as exc:
        module.fail_json(msg=f"slurm_qos: {exc}")

    commands = plan(module.params["qos"], current)
    before = {name: current.get(name) for name in wanted}
    result = {
        "changed": bool(commands),
        "commands": [" ".join(c) for c in commands],
        "diff": {"before": before, "after": wanted},
    }
    if commands and not module.check_mode:
        for argv in commands:
            rc, out, err = module.run_command(argv)
            if rc != 0:
                module.fail_json(msg=f"{' '.join(argv)} failed: {err.strip() or out.strip()}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
