#!/usr/bin/python
"""Ansible module: apply mlxconfig settings to NVIDIA/Mellanox NICs, only those that differ."""

from __future__ import annotations

DOCUMENTATION = r"""
module: smartnic_config
short_description: Idempotent mlxconfig settings (LINK_TYPE_P1, SRIOV_EN, NUM_OF_VFS, ...)
description:
  - Reads each device's next-boot configuration with C(mlxconfig -d DEV q KEYS) and sets
    only the keys whose value differs, in one C(mlxconfig -d DEV -y set) call.
  - Values compare by name or number, so C(ETH), C(2) and C(ETH(2)) are the same, and
    C(True)/C(1) likewise. New values take effect after a reboot or firmware reset.
  - Check mode reports the keys it would set.
options:
  devices: {description: PCI addresses., type: list, elements: str, required: true}
  settings: {description: mlxconfig key -> value., type: dict, required: true}
  tool:
    description: C(mlxconfig) (NVIDIA MFT) or C(mstconfig) (mstflint package).
    type: str
    default: mlxconfig
author: TACC stack
"""

import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_ROW = re.compile(r"^\s+([A-Z0-9_]+)\s+(\S+)\s*$")
_NAMED = re.compile(r"^(.*)\((-?\d+)\)$")


def parse_next_boot(text: str) -> dict[str, str]:
    """`mlxconfig -d DEV q` rows below "Configurations:" to {KEY: value}."""
    values, in_table = {}, False
    for line in text.splitlines():
        if line.startswith("Configurations:"):
            in_table = True
            continue
        match = _ROW.match(line) if in_table else None
        if match:
            values[match.group(1)] = match.group(2)
    return values


def same_value(current: str, wanted: str) -> bool:
    """mlxconfig shows enums as NAME(N); accept the name, the number or both."""
    wanted = str(wanted).strip()
    if current.lower() == wanted.lower():
        return True
    match = _NAMED.match(current)
    if match:
        name, number = match.groups()
        return wanted.lower() in (name.lower(), number)
    return False


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "devices": {"type": "list", "elements": "str", "required": True},
            "settings": {"type": "dict", "required": True},
            "tool": {"type": "str", "default": "mlxconfig"},
        },
        supports_check_mode=True,
    )
    mlxconfig = module.get_bin_path(module.params["tool"], required=True)
    settings = {key: str(value) for key, value in module.params["settings"].items()}
    changes: dict[str, dict[str, str]] = {}
    before_lines, after_lines = [], []
    for pci in module.params["devices"]:
        rc, out, err = module.run_command([mlxconfig, "-d", pci, "q", *settings])
        if rc != 0:
            module.fail_json(msg=f"mlxconfig -d {pci} q failed: {err.strip() or out.strip()}")
        current = parse_next_boot(out)
        missing = sorted(set(settings) - set(current))
        if missing:
            module.fail_json(msg=f"{pci}: mlxconfig does not report {', '.join(missing)}")
        differ = {k: v for k, v in settings.items() if not same_value(current[k], v)}
        before_lines += [f"{pci} {k}={current[k]}\n" for k in sorted(settings)]
        after_lines += [f"{pci} {k}={differ.get(k, current[k])}\n" for k in sorted(settings)]
        if not differ:
            continue
        changes[pci] = differ
        if not module.check_mode:
            argv = [mlxconfig, "-d", pci, "-y", "set", *(f"{k}={v}" for k, v in differ.items())]
            rc, out, err = module.run_command(argv)
            if rc != 0:
                module.fail_json(msg=f"mlxconfig -d {pci} set failed: {err.strip() or out.strip()}")
    module.exit_json(
        changed=bool(changes),
        set=changes,
        diff={"before": "".join(before_lines), "after": "".join(after_lines)},
    )


if __name__ == "__main__":
    main()
