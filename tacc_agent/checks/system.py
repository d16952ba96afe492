"""Services (slurmd, munge), local disk space, memory against the node's configured
RealMemory."""

from __future__ import annotations

import shutil
from pathlib import Path

from tacc_agent.checks.base import ABSENT, FAIL, OK, Result, Sample, command

# A restart (a configuration roll-out) passes through "activating" for a moment: that is no
# reason to drain a node. "failed", "inactive" and a stuck "deactivating" are.
TRANSITIONAL_OK = ("active", "activating", "reloading")


def check_services(names: list[str], timeout: float) -> Result:
    if not names:
        return Result("services", OK, "no services configured")
    out = command(["systemctl", "show", "--property=Id,LoadState,ActiveState", *names], timeout)
    if out.code is None or "not been booted with systemd" in out.problem:
        absent = "not found" in out.problem or "systemd" in out.problem
        return Result("services", ABSENT if absent else FAIL, out.problem.splitlines()[0])
    if out.code != 0:
        return Result("services", FAIL, f"systemctl exited {out.code}: {out.problem}")
    units, current = [], {}
    for line in [*out.stdout.splitlines(), ""]:
        if not line.strip():
            if current:
                units.append(current)
            current = {}
            continue
        key, _, value = line.partition("=")
        current[key] = value
    if len(units) != len(names):
        return Result("services", FAIL, f"systemctl described {len(units)} of {len(names)} units")
    problems = []
    for name, unit in zip(names, units, strict=True):
        if unit.get("ActiveState") in TRANSITIONAL_OK:
            continue
        state = unit.get("ActiveState", "?")
        if unit.get("LoadState") == "not-found":
            state = "not installed"
        problems.append(f"{unit.get('Id', name)} {state}")
    if problems:
        return Result("services", FAIL, "; ".join(problems))
    return Result("services", OK, ", ".join(names) + " active")


def check_disk(paths: dict[str, float]) -> Result:
    """paths: local path -> minimum free percent."""
    problems, samples = [], []
    for path, minimum in paths.items():
        usage = shutil.disk_usage(path)
        free = 100.0 * usage.free / usage.total if usage.total else 0.0
        samples.append(Sample("disk_free_ratio", {"path": path}, round(free / 100, 4)))
        if free < minimum:
            problems.append(f"{path} {free:.1f}% free < {minimum:g}%")
    if problems:
        return Result("disk", FAIL, "; ".join(problems), samples=samples)
    return Result("disk", OK, f"{len(paths)} path(s) above their minimum", samples=samples)


def check_memory(proc_root: str, real_memory_mb: int) -> Result:
    meminfo = Path(proc_root, "meminfo").read_text().split()
    total_mb = int(meminfo[meminfo.index("MemTotal:") + 1]) // 1024
    samples = [Sample("memory_total_bytes", {}, total_mb * 2**20)]
    if real_memory_mb:
        samples.append(Sample("memory_configured_bytes", {}, real_memory_mb * 2**20))
    if real_memory_mb and total_mb < real_memory_mb:
        detail = f"{total_mb} MB, less than the configured RealMemory {real_memory_mb} MB"
        return Result("memory", FAIL, detail, samples=samples)
    return Result("memory", OK, f"{total_mb} MB", samples=samples)
