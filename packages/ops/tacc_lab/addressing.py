"""Pure address and name allocation for lab nodes (no I/O, unit-tested)."""

from __future__ import annotations

import ipaddress

from tacc_lab.errors import LabError

# Host addresses below this offset are left for the bridge (.1) and future services.
FIRST_NODE_OFFSET = 11


def bridge_address(subnet: ipaddress.IPv4Network) -> ipaddress.IPv4Address:
    return subnet.network_address + 1


# The separate login node (`tacc-lab up --login-node`, the default from two nodes on):
# index 0, named like a production login node and addressed just below n1 (.10).
LOGIN_INDEX = 0
LOGIN_NAME = "login1"


def node_name(index: int) -> str:
    if index == LOGIN_INDEX:
        return LOGIN_NAME
    if index < 1:
        raise ValueError(f"node index starts at 1 (0 is the login node), got {index}")
    return f"n{index}"


def node_address(subnet: ipaddress.IPv4Network, index: int) -> ipaddress.IPv4Address:
    """Address of node `index`: the login node (0) .10, n1 .11, n2 .12, ... in the subnet."""
    if index < LOGIN_INDEX:
        raise ValueError(f"node index starts at 0 (the login node), got {index}")
    offset = FIRST_NODE_OFFSET + index - 1
    if offset >= subnet.num_addresses - 1:
        raise LabError(
            f"subnet {subnet} has no address for node {index}: "
            f"at most {max_nodes(subnet)} nodes fit; use a larger --subnet"
        )
    return subnet.network_address + offset


def max_nodes(subnet: ipaddress.IPv4Network) -> int:
    return max(0, subnet.num_addresses - 1 - FIRST_NODE_OFFSET)


def overlapping(
    subnet: ipaddress.IPv4Network,
    in_use: list[tuple[str, ipaddress.IPv4Network]],
    own_interface: str,
) -> list[tuple[str, ipaddress.IPv4Network]]:
    """Networks on other interfaces that overlap `subnet` (ours on `own_interface` are fine)."""
    return [(dev, net) for dev, net in in_use if dev != own_interface and net.overlaps(subnet)]
