"""FAKE (lab only): imitates ``lspci`` (pciutils) for the GPUs, NVSwitches and NICs in the state.

Supported: ``lspci [-D] [-n|-nn] [-d [VENDOR]:[DEVICE][:CLASS]] [-s [[DOMAIN:]BUS:]DEV.FN]``
(short flags may be combined, e.g. ``-Dnn``). Output lines follow lspci's formats::

    -D -n:  0000:17:00.0 0302: 10de:2330 (rev a1)
    -D -nn: 0000:17:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] \
            [10de:2330] (rev a1)                                           (one line)
    plain:  17:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)

No matching device prints nothing and exits 0; a bad option exits 2 like the real tool.
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

NVIDIA, MELLANOX = "10de", "15b3"
VENDORS = {NVIDIA: "NVIDIA Corporation", MELLANOX: "Mellanox Technologies"}
CLASSES = {
    "0302": "3D controller",
    "0680": "Bridge",
    "0200": "Ethernet controller",
    "0207": "Infiniband controller",
}
# Names as in pci.ids; an unknown id prints as "Device XXXX", as lspci does.
DEVICES = {
    "20b0": "GA100 [A100 SXM4 40GB]",
    "20b2": "GA100 [A100 SXM4 80GB]",
    "20b5": "GA100 [A100 PCIe 80GB]",
    "2330": "GH100 [H100 SXM5 80GB]",
    "2331": "GH100 [H100 PCIe]",
    "2335": "GH100 [H200 SXM 141GB]",
    "1af1": "GA100 [A100 NVSwitch]",
    "22a3": "GH100 [H100 NVSwitch]",
    "1017": "MT27800 Family [ConnectX-5]",
    "1019": "MT28800 Family [ConnectX-5 Ex]",
    "101b": "MT28908 Family [ConnectX-6]",
    "101d": "MT2892 Family [ConnectX-6 Dx]",
    "101f": "MT2894 Family [ConnectX-6 Lx]",
    "1021": "MT2910 Family [ConnectX-7]",
    "a2d6": "MT42822 BlueField-2 integrated ConnectX-6 Dx network controller",
    "a2dc": "MT43244 BlueField-3 integrated ConnectX-7 network controller",
}
NIC_IDS = {
    "ConnectX5": "1017",
    "ConnectX6": "101b",
    "ConnectX6DX": "101d",
    "ConnectX6LX": "101f",
    "ConnectX7": "1021",
    "BlueField2": "a2d6",
    "BlueField3": "a2dc",
}

Device = dict[str, str]


class UsageError(Exception):
    pass


def devices(state: dict[str, Any]) -> list[Device]:
    """Every fake PCI function as {pci, vendor, device, class, rev}, sorted by address."""
    found = [
        {"pci": g["pci"], "vendor": NVIDIA, "device": g["device_id"], "class": "0302", "rev": "a1"}
        for g in state["gpus"]
    ]
    found += [
        {"pci": s["pci"], "vendor": NVIDIA, "device": s["device_id"], "class": "0680", "rev": "a1"}
        for s in state["nvswitches"]
    ]
    for nic in state["nics"]:
        infiniband = nic["config"].get("LINK_TYPE_P1", "").startswith("IB")
        device_id = nic.get("device_id") or NIC_IDS.get(nic.get("device_type", ""), "1017")
        found.append(
            {
                "pci": nic["pci"],
                "vendor": MELLANOX,
                "device": device_id,
                "class": "0207" if infiniband else "0200",
                "rev": nic.get("rev", ""),
            }
        )
    for dev in found:
        dev["pci"] = hwstate.normalize_pci(dev["pci"])
        dev["device"] = dev["device"].lower()
    return sorted(found, key=lambda dev: dev["pci"])


def parse_filter(spec: str) -> Device:
    """``-d [vendor]:[device][:class]`` -> the fields to match (empty ones match anything)."""
    parts = spec.lower().split(":")
    if len(parts) not in (2, 3) or not all(re.fullmatch(r"[0-9a-f]{0,4}", p) for p in parts):
        raise UsageError("-d: Invalid vendor ID")
    fields = zip(("vendor", "device", "class"), parts, strict=False)
    return {key: value for key, value in fields if value}


def selected(dev: Device, filters: list[Device], slots: list[str]) -> bool:
    """Matches every ``-d`` filter and every ``-s`` address (given with or without domain)."""
    return all(all(dev[k] == v for k, v in f.items()) for f in filters) and all(
        dev["pci"] == hwstate.normalize_pci(slot) for slot in slots
    )


def render(dev: Device, numeric: int, domain: bool) -> str:
    address = dev["pci"] if domain or not dev["pci"].startswith("0000:") else dev["pci"][5:]
    rev = f" (rev {dev['rev']})" if dev["rev"] else ""
    ids = f"{dev['vendor']}:{dev['device']}"
    if numeric == 1:
        return f"{address} {dev['class']}: {ids}{rev}"
    cls = CLASSES[dev["class"]]
    name = f"{VENDORS[dev['vendor']]} {DEVICES.get(dev['device'], 'Device ' + dev['device'])}"
    if numeric >= 2:
        return f"{address} {cls} [{dev['class']}]: {name} [{ids}]{rev}"
    return f"{address} {cls}: {name}{rev}"


def parse(argv: list[str]) -> tuple[int, bool, list[Device], list[str]]:
    numeric, domain = 0, False
    filters: list[Device] = []
    slots: list[str] = []
    args = iter(argv)
    for arg in args:
        if not arg.startswith("-") or arg == "-":
            raise UsageError(f"Unexpected argument: {arg}")
        flags = arg[1:]
        while flags:
            flag, flags = flags[0], flags[1:]
            if flag == "n":
                numeric += 1
            elif flag == "D":
                domain = True
            elif flag in "ds":
                value = flags or next(args, None)
                if value is None:
                    raise UsageError(f"option requires an argument -- '{flag}'")
                if flag == "d":
                    filters.append(parse_filter(value))
                else:
                    slots.append(value)
                flags = ""
            else:
                raise UsageError(f"invalid option -- '{flag}'")
    return numeric, domain, filters, slots


def main(argv: list[str] | None = None) -> int:
    try:
        numeric, domain, filters, slots = parse(sys.argv[1:] if argv is None else argv)
        for dev in devices(hwstate.load()):
            if selected(dev, filters, slots):
                print(render(dev, numeric, domain))
    except UsageError as err:
        print(f"lspci: {err}\nFor more information, try `lspci --help'.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
