"""Services (slurmd, munge), local disk space, memory against the node's configured
RealMemory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Collection

from tacc_agent.health.checks.base import ABSENT, FAIL, OK, Result, Sample, command
from tacc_agent.health.checks.tmpfiles import clean_departed
from tacc_agent.health.registry import Check, CheckContext, Family
from tacc_agent.procfs.system import memory_total_kib

DEFAULT_MIN_FREE_PERCENT = 5.0

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


def disk_limits(configured: dict | None, tmp_dirs: Collection[str]) -> dict[str, float]:
    """Watched path -> minimum free percent: "/" and the job tmp dirs at 5%, each unless
    ops name it (disk_min_free_percent), and every path ops name."""
    limits = dict.fromkeys(["/", *tmp_dirs], DEFAULT_MIN_FREE_PERCENT)
    return limits | {str(path): float(minimum) for path, minimum in (configured or {}).items()}


def free_percent(path: str) -> float:
    usage = shutil.disk_usage(path)
    return 100.0 * usage.free / usage.total if usage.total else 0.0


def same_filesystem(device: int, tmp_dirs: Collection[str]) -> list[str]:
    """The tmp dirs on this filesystem (st_dev)."""
    return [path for path in tmp_dirs if os.path.isdir(path) and os.stat(path).st_dev == device]


def check_disk(
    paths: dict[str, float],
    tmp_dirs: Collection[str] = (),
    proc_root: str = "/proc",
    timeout: float = 5.0,
) -> Result:
    """paths: local path -> minimum free percent. A job tmp dir that does not exist is
    skipped; any other missing path fails. A filesystem below its minimum that holds job
    tmp dirs first loses what departed users left in them (checks.tmpfiles)."""
    problems, samples, notes, swept = [], [], [], set()
    for path, minimum in paths.items():
        if not os.path.exists(path):
            if path not in tmp_dirs:
                problems.append(f"{path} does not exist")
            continue
        free, device = free_percent(path), os.stat(path).st_dev
        scratch = same_filesystem(device, tmp_dirs) if free < minimum else []
        if scratch and device not in swept:
            swept.add(device)
            notes.append(clean_departed(scratch, proc_root, timeout))
            free = free_percent(path)
        samples.append(Sample("disk_free_ratio", {"path": path}, round(free / 100, 4)))
        if free < minimum:
            problems.append(f"{path} {free:.1f}% free < {minimum:g}%")
    if problems:
        return Result("disk", FAIL, "; ".join(problems + notes), samples=samples)
    detail = f"{len(samples)} path(s) above their minimum"
    return Result("disk", OK, "; ".join([detail, *notes]), samples=samples)


def check_memory(proc_root: str, real_memory_mb: int) -> Result:
    total_mb = memory_total_kib(proc_root) // 1024
    samples = [Sample("memory_total_bytes", {}, total_mb * 2**20)]
    if real_memory_mb:
        samples.append(Sample("memory_configured_bytes", {}, real_memory_mb * 2**20))
    if real_memory_mb and total_mb < real_memory_mb:
        detail = f"{total_mb} MB, less than the configured RealMemory {real_memory_mb} MB"
        return Result("memory", FAIL, detail, samples=samples)
    return Result("memory", OK, f"{total_mb} MB", samples=samples)


def run_services(ctx: CheckContext) -> Result:
    return check_services(list(ctx.config.services), ctx.timeout)


def run_disk(ctx: CheckContext) -> Result:
    config = ctx.config
    limits = disk_limits(config.disk_min_free_percent, config.job_tmp_dirs)
    return check_disk(limits, config.job_tmp_dirs, config.proc_root, ctx.timeout)


def run_memory(ctx: CheckContext) -> Result:
    return check_memory(ctx.config.proc_root, ctx.config.real_memory_mb)


SERVICES = Check("services", run_services)
DISK = Check(
    "disk",
    run_disk,
    (Family("disk_free_ratio", "gauge", "Free space of each checked local path", ("path",)),),
)
MEMORY = Check(
    "memory",
    run_memory,
    (
        Family("memory_total_bytes", "gauge", "Memory the kernel reports (MemTotal)"),
        Family("memory_configured_bytes", "gauge", "The node's RealMemory in slurm.conf"),
    ),
)
