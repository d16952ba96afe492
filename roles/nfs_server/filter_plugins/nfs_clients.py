"""Jinja filter: who may mount an export, from inventory alone (never from facts, so a
--limit run renders the same exports): the address of every host in the given groups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def tacc_nfs_group_addresses(
    group_names: Iterable[str], groups: Mapping[str, Iterable[str]], hostvars: Mapping
) -> list[str]:
    """Each host of `group_names` once, in inventory order: its ansible_host, else its
    inventory name (a name the server resolves). A group that does not exist adds none."""
    if isinstance(group_names, str):
        group_names = [group_names]
    addresses: list[str] = []
    for group in group_names:
        for host in groups.get(group, []):
            address = str(hostvars[host].get("ansible_host") or host)
            if address not in addresses:
                addresses.append(address)
    return addresses


class FilterModule:
    def filters(self) -> dict:
        return {"tacc_nfs_group_addresses": tacc_nfs_group_addresses}
