"""FAKE (lab only): imitates NVIDIA/Mellanox ``mlxfwmanager`` firmware queries for the fake NICs.

Supported::

    mlxfwmanager [--query]              every NIC in the state
    mlxfwmanager -d <pci> [--query]     one NIC

Each device block shows Device Type, Part Number, Description, PSID, PCI Device Name, Base
GUID/MAC and the Versions table; the FW line is the version on flash and, after a burn and before
``hwstate reboot``, a "FW (Running)" line shows the version still running. No images are ever
available, so the Status is always "No matching image found". Errors go to stderr and exit 1.
"""

from __future__ import annotations

import os
import sys
from typing import Any

try:
    from . import hwstate
except ImportError:  # run as a standalone file: hwstate.py sits next to this one
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hwstate

HwError = hwstate.HwError
NO_DEVICES = (
    "-E- No devices found or specified, mst might be stopped, run 'mst start' to load MST modules"
)


def device_lines(index: int, nic: dict[str, Any], shown_as: str) -> list[str]:
    fields = [
        ("Device Type:", nic.get("device_type", "N/A")),
        ("Part Number:", nic.get("part_number", "N/A")),
        ("Description:", nic.get("description", "N/A")),
        ("PSID:", nic["psid"]),
        ("PCI Device Name:", shown_as),
        ("Base GUID:", nic.get("base_guid", "N/A")),
        ("Base MAC:", nic.get("base_mac", "N/A")),
        ("Versions:", f"{'Current':<15}Available"),
    ]
    versions = [("FW", hwstate.flash_fw(nic))]
    if nic["pending_fw"]:
        versions.append(("FW (Running)", nic["fw_version"]))
    versions += list(nic.get("rom_versions", {}).items())  # e.g. {"PXE": "3.6.0805"}
    return [
        f"Device #{index}:",
        "----------",
        "",
        *(f"  {label:<18}{value}" for label, value in fields),
        *(f"     {name:<15}{version:<15}N/A" for name, version in versions),
        "",
        f"  {'Status:':<18}No matching image found",
        "",
    ]


def parse(argv: list[str]) -> str | None:
    device = None
    args = iter(argv)
    for arg in args:
        if arg in ("-d", "--dev"):
            device = next(args, None)
            if device is None:
                raise HwError("-E- Option -d needs a device")
        elif arg != "--query":
            raise HwError(f"-E- Unsupported option in the lab fake: {arg} (only -d and --query)")
    return device


def main(argv: list[str] | None = None) -> int:
    try:
        device = parse(sys.argv[1:] if argv is None else argv)
        state = hwstate.load()
        if device is None:
            targets = [(nic, nic["pci"]) for nic in state["nics"]]
        else:
            nic = hwstate.find_nic(state, device)
            targets = [(nic, device)] if nic else []
        print("Querying Mellanox devices firmware ...\n")
        if not targets:
            raise HwError(NO_DEVICES)
    except HwError as err:
        sys.stdout.flush()
        print(err, file=sys.stderr)
        return err.rc
    for index, (nic, shown_as) in enumerate(targets, start=1):
        print("\n".join(device_lines(index, nic, shown_as)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
