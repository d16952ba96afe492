#!/usr/bin/python
"""Ansible module: which of the driver's packages a node lacks or holds at another version
than the inventory's (what a driver roll would change there)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_driver_plan
short_description: Compare the node's NVIDIA packages with the inventory's
description:
  - Reads the installed versions of I(packages) with C(dpkg-query). A package that is not
    installed is to install; one of I(pinned) whose version is not I(version) followed by
    C(-) (the Debian revision) is to replace. With an empty I(version) only missing
    packages count.
  - Read-only; changes nothing (the rolling play decides from it whether a node needs a
    roll at all).
options:
  packages:
    description: Packages that must be installed (driver, headers, fabric manager, DCGM).
    type: list
    elements: str
    required: true
  pinned:
    description: The ones that must be at I(version) (the driver's and fabric manager's).
    type: list
    elements: str
    default: []
  version:
    description: The driver version the inventory holds (550.163.01); empty for any.
    type: str
    default: ""
author: TACC stack
"""

RETURN = r"""
changes: {description: One line per package to install or replace., type: list, returned: always}
installed: {description: Installed version per package found., type: dict, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

QUERY_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"


def parse_installed(text: str) -> dict[str, str]:
    """dpkg-query lines (package, version, status) -> {package: version} of installed ones."""
    installed = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[2].startswith("ii"):
            installed[fields[0]] = fields[1]
    return installed


def changes(
    installed: dict[str, str], packages: list[str], pinned: list[str], version: str
) -> list[str]:
    """What installing `packages` with `pinned` held at `version` would change."""
    found = []
    for name in packages:
        have = installed.get(name)
        if have is None:
            found.append(f"install {name}" + (f" {version}" if version and name in pinned else ""))
        elif version and name in pinned and not have.split(":")[-1].startswith(f"{version}-"):
            found.append(f"replace {name} {have} with {version}")
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
            "pinned": {"type": "list", "elements": "str", "default": []},
            "version": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    params = module.params
    # Exit status 1 when some package is unknown to dpkg: those are simply not installed.
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f", QUERY_FORMAT, *params["packages"]])
    if rc not in (0, 1):
        module.fail_json(msg=f"dpkg-query failed: {err.strip()}")
    installed = parse_installed(out)
    module.exit_json(
        changed=False,
        installed=installed,
        changes=changes(installed, params["packages"], params["pinned"], params["version"]),
    )


if __name__ == "__main__":
    main()
