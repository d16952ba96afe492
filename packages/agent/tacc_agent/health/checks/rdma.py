"""RDMA ports from <sysfs_root>/class/infiniband/<dev>/ports/<n>/: state, phys_state,
rate, and error counters, whose growth since the last run is what matters."""

from __future__ import annotations

from pathlib import Path

from tacc_agent.health.checks.base import ABSENT, FAIL, OK, Result, Sample, read_state, write_state
from tacc_agent.health.registry import Check, CheckContext, Family
from tacc_agent.rdma_sysfs import ports

PORT = ("device", "port")
FAMILIES = (
    Family("rdma_ports_active", "gauge", "RDMA ports in state ACTIVE"),
    Family("rdma_port_active", "gauge", "1 when the RDMA port is ACTIVE", PORT),
    Family("rdma_port_rate_bytes_per_second", "gauge", "RDMA port link rate", PORT),
    Family(
        "rdma_port_errors_total",
        "counter",
        "RDMA port error counters (sysfs counters/)",
        (*PORT, "counter"),
    ),
)
COUNTERS_STATE = "rdma-counters.json"  # in the state dir: the counters of the last run


def check_rdma(
    sysfs_root: str, expected_ports: int, min_rate_gbps: float, state_file: str
) -> Result:
    found = ports(sysfs_root)
    if not found:
        if expected_ports:
            return Result("rdma", FAIL, f"no RDMA port, expected {expected_ports}")
        return Result("rdma", ABSENT, "no RDMA device")
    state = Path(state_file)
    before = read_state(state)
    write_state(state, {p["name"]: p["counters"] for p in found})
    problems = []
    active = [p for p in found if "ACTIVE" in p["state"]]
    for port in found:
        if "ACTIVE" not in port["state"]:
            problems.append(
                f"{port['name']} {port['state'] or 'no state'} ({port['phys_state'] or '?'})"
            )
        elif min_rate_gbps and port["rate_gbps"] < min_rate_gbps:
            problems.append(f"{port['name']} at {port['rate_gbps']:g} Gb/s < {min_rate_gbps:g}")
        grown = {
            name: value - before.get(port["name"], {}).get(name, value)
            for name, value in port["counters"].items()
        }
        grown = {name: delta for name, delta in grown.items() if delta > 0}
        if grown:
            problems.append(
                f"{port['name']} errors: "
                + ", ".join(f"{name} +{delta}" for name, delta in sorted(grown.items()))
            )
    if expected_ports and len(active) < expected_ports:
        problems.insert(0, f"{len(active)} of {expected_ports} expected ports active")
    samples = port_samples(found)
    if problems:
        return Result("rdma", FAIL, "; ".join(problems), samples=samples)
    return Result("rdma", OK, f"{len(active)} port(s) active", samples=samples)


def port_samples(found: list[dict]) -> list[Sample]:
    """Per port: active, link rate (bytes/s, like node_exporter), error counters."""
    samples = [Sample("rdma_ports_active", {}, sum("ACTIVE" in p["state"] for p in found))]
    for port in found:
        device, number = port["name"].split("/")
        labels = {"device": device, "port": number}
        samples.append(Sample("rdma_port_active", labels, int("ACTIVE" in port["state"])))
        samples.append(
            Sample("rdma_port_rate_bytes_per_second", labels, port["rate_gbps"] * 1e9 / 8)
        )
        samples += [
            Sample("rdma_port_errors_total", labels | {"counter": name}, value)
            for name, value in sorted(port["counters"].items())
        ]
    return samples


def run(ctx: CheckContext) -> Result:
    config = ctx.config
    return check_rdma(
        config.rdma_sysfs_root,
        config.expected_rdma_ports,
        config.min_rdma_rate_gbps,
        str(ctx.state_dir / COUNTERS_STATE),
    )


CHECK = Check("rdma", run, FAMILIES)
