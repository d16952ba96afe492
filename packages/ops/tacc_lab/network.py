"""The lab's bridge: create, check the subnet is free, remove; nodes' stale veths."""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

from tacc_lab.addressing import bridge_address, overlapping
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.runner import run


def host_networks() -> list[tuple[str, ipaddress.IPv4Network]]:
    """(interface, network) for every IPv4 address and route on the host."""
    found: list[tuple[str, ipaddress.IPv4Network]] = []
    for entry in json.loads(run(["ip", "-j", "-4", "addr", "show"]) or "[]"):
        for info in entry.get("addr_info", []):
            net = ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False)
            found.append((entry["ifname"], net))
    for route in json.loads(run(["ip", "-j", "-4", "route", "show"]) or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            found.append((route.get("dev", "?"), ipaddress.IPv4Network(dst, strict=False)))
    return found


def bridge_exists(name: str) -> bool:
    return bool(run(["ip", "-j", "link", "show", name], check=False).strip())


def ensure_bridge(cfg: LabConfig) -> None:
    clashes = overlapping(cfg.subnet, host_networks(), cfg.bridge)
    if clashes:
        where = ", ".join(f"{dev} ({net})" for dev, net in clashes)
        raise LabError(
            f"subnet {cfg.subnet} is already in use on this host by {where}; "
            "choose another with --subnet (e.g. 10.78.0.0/24)"
        )
    if not bridge_exists(cfg.bridge):
        run(["ip", "link", "add", cfg.bridge, "type", "bridge"])
    address = f"{bridge_address(cfg.subnet)}/{cfg.subnet.prefixlen}"
    current = run(["ip", "-j", "-4", "addr", "show", "dev", cfg.bridge])
    if address.split("/")[0] not in current:
        run(["ip", "addr", "add", address, "dev", cfg.bridge])
    run(["ip", "link", "set", cfg.bridge, "up"])


def remove_bridge(cfg: LabConfig) -> None:
    if bridge_exists(cfg.bridge):
        run(["ip", "link", "delete", cfg.bridge])


def host_veth(machine: str) -> str:
    """The host end of a node's veth pair, as systemd-nspawn names it (IFNAMSIZ - 1)."""
    return f"vb-{machine}"[:15]


def clear_stale_veth(machine: str, timeout: float = 15.0) -> None:
    """The kernel tears a dead node's network namespace down asynchronously, so its veth
    can outlive the node for a moment; a new node of the same name would then fail with
    "Failed to add new veth interfaces ... File exists". Wait for it, then remove it."""
    name = host_veth(machine)
    deadline = time.monotonic() + timeout
    while Path("/sys/class/net", name).exists():
        if time.monotonic() > deadline:
            run(["ip", "link", "delete", name], check=False)
            return
        time.sleep(0.2)
