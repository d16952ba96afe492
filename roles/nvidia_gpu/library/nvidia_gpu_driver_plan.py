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
  held:
    description:
      - Name patterns (fnmatch) of the driver's packages the version hold covers. Every
        installed package matching one, at a driver-numbered version (like 550.54.15-1)
        other than I(version), is to replace too (C(others)): a downgrade of the meta
        package alone would leave the libraries where they were.
    type: list
    elements: str
    default: []
author: TACC stack
"""

RETURN = r"""
changes: {description: One line per package to install or replace., type: list, returned: always}
installed: {description: Installed version per package found., type: dict, returned: always}
others: {description: Held packages at another driver version., type: list, returned: always}
obsolete: {description: Another branch's own packages, to remove., type: list, returned: always}
replaces: {description: A driver package is at another version., type: bool, returned: always}
"""

import fnmatch  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

QUERY_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"
# How both sources number the driver's packages: 550.163.01-1, 535.247.01-1~deb12u1.
DRIVER_NUMBERED = re.compile(r"^[0-9]{3}\.[0-9]+(\.[0-9]+)?-")
OTHER_BRANCH = re.compile(r"-[0-9]{3}$")  # cuda-drivers-550, nvidia-fabricmanager-550


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


def held_others(installed: dict[str, str], held: list[str], version: str) -> list[str]:
    """The installed driver's packages the hold covers, when that driver is another
    version: the held packages at the driver version most of them share (the installed
    driver's; packages of other sources that lag it, like Debian's nvidia-persistenced
    or nvidia-settings, keep theirs and stay out)."""
    numbered = {
        name: have.split(":")[-1].split("-")[0]
        for name, have in installed.items()
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in held)
        and DRIVER_NUMBERED.match(have.split(":")[-1])
    }
    if not numbered:
        return []
    counts = Counter(numbered.values())
    driver = max(sorted(counts), key=lambda v: counts[v])
    if driver == version:
        return []
    return sorted(name for name, have in numbered.items() if have == driver)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "required": True},
            "pinned": {"type": "list", "elements": "str", "default": []},
            "version": {"type": "str", "default": ""},
            "held": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f", QUERY_FORMAT])
    if rc != 0:
        module.fail_json(msg=f"dpkg-query failed: {err.strip()}")
    installed = parse_installed(out)
    version = params["version"]
    found_others = held_others(installed, params["held"], version) if version else []
    # Another branch's own packages (cuda-drivers-550 when 570 is held) have no such
    # version: they go, the new branch's come with the driver.
    branch = version.split(".")[0]
    obsolete = [n for n in found_others if OTHER_BRANCH.search(n) and not n.endswith(f"-{branch}")]
    others = [n for n in found_others if n not in obsolete]
    found = changes(installed, params["packages"], params["pinned"], version)
    found += [
        f"replace {name} {installed[name]} with {version}"
        for name in others
        if name not in params["packages"]
    ]
    found += [f"remove {name} {installed[name]}" for name in obsolete]
    module.exit_json(
        changed=False,
        installed={name: installed[name] for name in params["packages"] if name in installed},
        others=others,
        obsolete=obsolete,
        changes=found,
        # A driver that is there (its packages at another version, whatever their
        # names: a branch or source change pins names not installed yet) would be
        # swapped under running jobs; a first install has none.
        replaces=any(line.startswith(("replace ", "remove ")) for line in found),
    )


if __name__ == "__main__":
    main()
