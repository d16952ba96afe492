"""FAKE (lab only): imitates NVIDIA/Mellanox ``mlxconfig`` (NV configuration) for the fake NICs.

Supported::

    mlxconfig [-d <pci>] [-e] q|query [KEY ...]     no -d: every NIC; -e: Default/Current/Next Boot
    mlxconfig -d <pci> -y s|set KEY=VAL [KEY=VAL ...]

Values may be given as names or numbers and are stored normalized: LINK_TYPE_P<n> as IB(1),
ETH(2) or VPI(3); booleans (a current value of True(1)/False(0), or a key ending in _EN) as
False(0)/True(1); numeric keys (NUM_OF_VFS) as plain integers. ``set`` writes "next boot" values
that ``hwstate reboot`` makes current, and is logged. Errors go to stderr and exit 1.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

try:
    from . import hwstate
except ImportError:  # run as a standalone file: hwstate.py sits next to this one
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hwstate

HwError = hwstate.HwError
LINK_TYPES = {"IB": 1, "ETH": 2, "VPI": 3}
BOOLEANS = {"False": 0, "True": 1}
STAR_NOTE = "The '*' shows parameters with next value different from default/current value."


def normalize(key: str, value: str, current: str) -> str:
    """The stored form of ``value`` for ``key``, judged by the key's name and current value."""
    name = re.sub(r"\(\d+\)$", "", value.strip())
    if re.fullmatch(r"LINK_TYPE_P\d+", key):
        table = LINK_TYPES
    elif current in ("False(0)", "True(1)") or key.endswith("_EN"):
        table = BOOLEANS
    elif re.fullmatch(r"\d+", current):
        if not re.fullmatch(r"\d+", name):
            raise HwError(f"-E- Failed to set configuration: bad value {value!r} for {key}")
        return str(int(name))
    else:
        return value.strip()
    for label, number in table.items():
        if name.upper() == label.upper() or name == str(number):
            return f"{label}({number})"
    raise HwError(f"-E- Failed to set configuration: bad value {value!r} for {key}")


def device_block(index: int, nic: dict[str, Any], shown_as: str) -> list[str]:
    return [
        "",
        f"Device #{index}:",
        "----------",
        "",
        f"{'Device type:':<16}{nic.get('device_type', 'N/A')}",
        f"{'Name:':<16}{nic.get('part_number', 'N/A')}",
        f"{'Description:':<16}{nic.get('description', 'N/A')}",
        f"{'Device:':<16}{shown_as}",
        "",
    ]


def next_value(nic: dict[str, Any], key: str) -> str:
    return str(nic["next_boot"].get(key, nic["config"][key]))


def check_keys(nic: dict[str, Any], keys: list[str]) -> list[str]:
    for key in keys:
        if key not in nic["config"]:
            raise HwError(f"-E- The Device doesn't support {key} parameter")
    return keys or list(nic["config"])


def query_lines(nic: dict[str, Any], keys: list[str], verbose: bool) -> list[str]:
    if not verbose:
        lines = [f"{'Configurations:':<52}Next Boot"]
        return lines + [f"        {key:<44}{next_value(nic, key)}" for key in keys]
    lines = [f"{'Configurations:':<52}{'Default':<16}{'Current':<16}Next Boot"]
    starred = False
    for key in keys:
        current = nic["config"][key]
        default = nic["defaults"].get(key, current)
        upcoming = next_value(nic, key)
        star = upcoming != default or upcoming != current
        starred |= star
        lines.append(f"{'*' if star else ' '}       {key:<44}{default:<16}{current:<16}{upcoming}")
    return [*lines, STAR_NOTE] if starred else lines


def query(opts: dict[str, Any]) -> list[str]:
    state = hwstate.load()
    if opts["device"]:
        nic = hwstate.find_nic(state, opts["device"])
        if nic is None:
            raise HwError(f"-E- Failed to open device: {opts['device']}. No such file or directory")
        targets = [(nic, opts["device"])]
    else:
        targets = [(nic, nic["pci"]) for nic in state["nics"]]
    if not targets:
        raise HwError("-E- No devices found.")
    lines = []
    for index, (nic, shown_as) in enumerate(targets, start=1):
        keys = check_keys(nic, [key.upper() for key in opts["params"]])
        lines += device_block(index, nic, shown_as) + query_lines(nic, keys, opts["verbose"])
    return lines


def set_config(opts: dict[str, Any]) -> list[str]:
    if not opts["device"] or not opts["params"]:
        raise HwError("-E- set needs a device (-d) and at least one KEY=VAL")
    with hwstate.update() as state:
        nic = hwstate.find_nic(state, opts["device"])
        if nic is None:
            raise HwError(f"-E- Failed to open device: {opts['device']}. No such file or directory")
        changes = {}
        for param in opts["params"]:
            key, eq, value = param.partition("=")
            if not eq or not value:
                raise HwError(f"-E- Bad parameter: {param} (expected KEY=VAL)")
            key = check_keys(nic, [key.upper()])[0]
            changes[key] = normalize(key, value, nic["config"][key])
        header = f"{'Configurations:':<52}Next Boot       New"
        lines = [*device_block(1, nic, opts["device"]), header]
        for key, new in changes.items():
            lines.append(f"        {key:<44}{next_value(nic, key):<16}{new}")
        if not opts["yes"]:
            print("\n".join([*lines, "", " Apply new Configuration? (y/n) [n] : "]))
            raise HwError("-E- Aborted: no terminal to answer; use -y for non-interactive set")
        for key, new in changes.items():
            if new == nic["config"][key]:
                nic["next_boot"].pop(key, None)  # back to the current value: nothing pending
            else:
                nic["next_boot"][key] = new
        event = " ".join(f"{key}={new}" for key, new in changes.items())
        hwstate.log_event("mlxconfig", nic["pci"], f"set {event}")
    return [
        *lines,
        "",
        " Apply new Configuration? (y/n) [n] : y",
        "Applying... Done!",
        "-I- Please reboot machine to load new configurations.",
    ]


def parse(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"device": None, "yes": False, "verbose": False, "params": []}
    words = []
    args = iter(argv)
    for arg in args:
        if arg in ("-d", "--dev"):
            opts["device"] = next(args, None)
        elif arg in ("-y", "--yes"):
            opts["yes"] = True
        elif arg in ("-e", "--enable_verbosity"):
            opts["verbose"] = True
        elif arg.startswith("-"):
            raise HwError(f"-E- Unknown option: {arg}")
        else:
            words.append(arg)
    if not words or words[0] not in ("q", "query", "s", "set"):
        raise HwError("-E- No command given. Supported here: q|query, s|set")
    opts["command"] = "set" if words[0] in ("s", "set") else "query"
    opts["params"] = words[1:]
    return opts


def run(argv: list[str]) -> list[str]:
    opts = parse(argv)
    return set_config(opts) if opts["command"] == "set" else query(opts)


def main(argv: list[str] | None = None) -> int:
    return hwstate.run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())
