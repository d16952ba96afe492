"""FAKE (lab only): imitates NVIDIA/Mellanox ``mstflint`` (flint) for the NICs in the fake state.

Supported::

    mstflint -d <pci> q|query                 query the device flash
    mstflint -i <image> q|query               query a fake image file (see mkimage.py)
    mstflint -d <pci> -i <image> -y [--allow_psid_change] b|burn

Burning checks the image's embedded checksum and that its PSID matches the device's, and needs
``-y`` (the lab is non-interactive). A burn writes the flash only: ``q`` shows the new version
at once (and the old one as "FW Version(Running)") until ``hwstate reboot``. Each burn is logged.
Errors go to stderr with ``-E-`` prefixes and exit 1.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

try:
    from . import hwstate, mkimage
except ImportError:  # run as a standalone file: the helpers sit next to this one
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hwstate
    import mkimage

HwError = hwstate.HwError


def query_lines(info: dict[str, Any]) -> list[str]:
    """flint's FS4 query layout; ``info`` has fw, psid and optional running/guid/mac/date."""
    rows = [("Image type:", "FS4"), ("FW Version:", info["fw"])]
    if info.get("running") and info["running"] != info["fw"]:
        rows.append(("FW Version(Running):", info["running"]))
    rows += [
        ("FW Release Date:", info.get("date") or "N/A"),
        ("Product Version:", info["fw"]),
        ("Description:", f"{'UID':<19}GuidsNumber"),
        ("Base GUID:", f"{info.get('guid') or 'N/A':<24}4"),
        ("Base MAC:", f"{info.get('mac') or 'N/A':<24}4"),
        ("Image VSD:", "N/A"),
        ("Device VSD:", "N/A"),
        ("PSID:", info["psid"]),
        ("Security Attributes:", "N/A"),
    ]
    return [f"{label:<23}{value}" for label, value in rows]


def open_device(state: hwstate.State, device: str) -> dict[str, Any]:
    nic = hwstate.find_nic(state, device)
    if nic is None:
        raise HwError(f"-E- Cannot open Device: {device}. No such file or directory. MFE_CR_ERROR")
    return nic


def open_image(path: str) -> dict[str, Any]:
    try:
        return mkimage.parse(Path(path).read_bytes())
    except OSError as err:
        raise HwError(f"-E- Cannot open {path}: {err.strerror}") from None
    except ValueError as err:
        raise HwError(f"-E- Cannot open {path}: {err}") from None


def query(opts: dict[str, Any]) -> list[str]:
    if opts["device"] and opts["image"]:
        raise HwError("-E- Query: give either a device (-d) or an image (-i), not both")
    if opts["image"]:
        image = open_image(opts["image"])
        return query_lines({"fw": image["version"], "psid": image["psid"]})
    nic = open_device(hwstate.load(), opts["device"])
    return query_lines(
        {
            "fw": hwstate.flash_fw(nic),
            "running": nic["fw_version"],
            "psid": nic["psid"],
            "guid": nic.get("base_guid"),
            "mac": nic.get("base_mac"),
            "date": nic.get("fw_release_date"),
        }
    )


def burn(opts: dict[str, Any]) -> list[str]:
    if not opts["device"] or not opts["image"]:
        raise HwError("-E- Burn needs both a device (-d) and an image file (-i)")
    with hwstate.update() as state:
        nic = open_device(state, opts["device"])
        image = open_image(opts["image"])
        if not image["checksum_ok"]:
            raise HwError("-E- Burning FS4 image failed: Bad CRC: the image payload is corrupted")
        old, new = hwstate.flash_fw(nic), image["version"]
        print(
            f"\n    Current FW version on flash:  {old}\n    New FW version:               {new}\n"
        )
        if image["psid"] != nic["psid"]:
            if not opts["allow_psid_change"]:
                raise HwError(
                    f"-E- PSID mismatch. The PSID on flash ({nic['psid']}) differs from the PSID"
                    f" in the given image ({image['psid']})."
                )
            print(
                f'    You are about to replace current PSID on flash - "{nic["psid"]}" with a'
                f' different PSID - "{image["psid"]}".\n'
            )
        if not opts["yes"]:
            raise HwError("-E- Burn needs confirmation: use -y for non-interactive burn")
        nic["psid"] = image["psid"]
        nic["pending_fw"] = new if new != nic["fw_version"] else None
        path = os.path.abspath(opts["image"])
        event = f"burn from={old} to={new} image={path} sha256={image['sha256']}"
        hwstate.log_event("mstflint", nic["pci"], event)
    return [
        "Burning FW image without signatures - OK",
        "Restoring signature                     - OK",
        "-I- To load new FW run mstfwreset or reboot machine.",
    ]


def parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"device": None, "image": None, "yes": False, "allow_psid_change": False}
    commands = []
    args = iter(argv)
    for arg in args:
        if arg in ("-d", "--device", "-i", "--image"):
            opts["device" if arg in ("-d", "--device") else "image"] = next(args, None)
        elif arg in ("-y", "--yes"):
            opts["yes"] = True
        elif arg in ("--allow_psid_change", "-allow_psid_change"):
            opts["allow_psid_change"] = True
        elif arg.startswith("-"):
            raise HwError(f'-E- Unknown flag "{arg}"')
        else:
            commands.append(arg)
    if not commands or commands[0] not in ("q", "query", "b", "burn"):
        raise HwError("-E- No command given. Supported here: q|query, b|burn")
    if commands[0] in ("q", "query") and not (opts["device"] or opts["image"]):
        raise HwError("-E- Missing device or image file (-d or -i)")
    opts["command"] = "burn" if commands[0] in ("b", "burn") else "query"
    return opts


def run(argv: list[str]) -> list[str]:
    opts = parse(argv)
    return burn(opts) if opts["command"] == "burn" else query(opts)


def main(argv: list[str] | None = None) -> int:
    return hwstate.run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
