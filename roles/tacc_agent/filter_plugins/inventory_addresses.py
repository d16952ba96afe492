"""Jinja filter: the inventory address of each of some hosts (ansible_host, else the
host's inventory name), as roles/monitoring scrapes them: the agent's allowed scrapers
(tacc_agent_metrics_job_scrapers) are the monitoring hosts' addresses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def tacc_inventory_addresses(hosts: Iterable[str], hostvars: Mapping) -> list[str]:
    """[ansible_host or the name] of each host, in order, each once."""
    found: list[str] = []
    for host in hosts:
        address = str(hostvars[host].get("ansible_host") or host)
        if address not in found:
            found.append(address)
    return found


class FilterModule:
    def filters(self) -> dict:
        return {"tacc_inventory_addresses": tacc_inventory_addresses}
