"""GPUs through nvidia-smi (count against the expected number, its documented exit
codes), critical Xid events in the kernel log, and ECC / row-remap health when the
GPUs report them."""

from __future__ import annotations

import re
from pathlib import Path

from tacc_agent.checks.base import ABSENT, FAIL, OK, Result, Sample, command

# nvidia-smi(1), RETURN VALUE.
EXIT_CODES = {
    2: "invalid argument", 3: "operation not available", 4: "no permission",
    6: "no GPU found", 8: "external power cables not attached", 9: "driver not loaded",
    10: "kernel detected an interrupt issue", 12: "NVML library not found",
    13: "a function is not implemented by NVML", 14: "infoROM corrupted",
    15: "GPU has fallen off the bus", 255: "other error",
}  # fmt: skip
# Xids that mean the GPU needs attention (NVIDIA's Xid catalogue): double-bit ECC,
# row remapping failures, NVLink errors, fallen off the bus, contained/uncontained ECC.
CRITICAL_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
# One optional query for figures and health; a driver that lacks a field rejects the whole
# query (exit 2), which then only costs the figures, never the check.
FIGURE_FIELDS = ("index,temperature.gpu,utilization.gpu,memory.used,memory.total,power.draw,"
                 "ecc.errors.uncorrected.volatile.total,remapped_rows.failure")  # fmt: skip
FIGURES = (  # field position -> metric name, scale to base units
    (1, "gpu_temperature_celsius", 1.0), (2, "gpu_utilization_ratio", 0.01),
    (3, "gpu_memory_used_bytes", 2.0**20), (4, "gpu_memory_total_bytes", 2.0**20),
    (5, "gpu_power_watts", 1.0), (6, "gpu_ecc_uncorrected_errors", 1.0),
)  # fmt: skip


def xids(kernel_log: str, since_line: int) -> tuple[list[tuple[str, int]], int]:
    """Critical Xid events after line `since_line`, and the new line count."""
    try:
        lines = Path(kernel_log).read_text(errors="replace").splitlines()
    except OSError:
        return [], since_line
    start = since_line if since_line <= len(lines) else 0  # the log was rotated
    found = [(m.group(1), int(m.group(2))) for line in lines[start:] if (m := XID.search(line))]
    return [x for x in found if x[1] in CRITICAL_XIDS], len(lines)


def number(text: str) -> float | None:
    """A figure, or None for nvidia-smi's "[N/A]" / "[Not Supported]"."""
    try:
        return float(text)
    except ValueError:
        return None


def figures(nvidia_smi: str, timeout: float) -> tuple[list[str], list[Sample]]:
    """ECC and row-remap trouble, and per-GPU figures; nothing when not reported."""
    out = command([nvidia_smi, f"--query-gpu={FIGURE_FIELDS}", "--format=csv,noheader,nounits"],
                  timeout)  # fmt: skip
    if out.code != 0:
        return [], []
    problems, samples = [], []
    for line in out.stdout.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) < 8:
            continue
        index = values[0]
        for position, name, scale in FIGURES:
            value = number(values[position])
            if value is not None:
                samples.append(Sample(name, {"gpu": index}, value * scale))
        ecc = number(values[6])
        if ecc:
            problems.append(f"GPU {index}: {ecc:g} uncorrected ECC errors")
        if values[7].lower() == "yes":
            problems.append(f"GPU {index}: row remapping failed")
    return problems, samples


def critical_xids(kernel_log: str, xid_state: dict, boot_id: str) -> list[str]:
    """Critical Xids since the last run, plus the ones already seen since boot: they hold
    until the node reboots (a GPU reset), so the next run cannot resume the node."""
    if xid_state.get("boot_id") != boot_id:
        xid_state.update(boot_id=boot_id, events=[])
    events, xid_state["line"] = xids(kernel_log, xid_state.get("line", 0))
    seen = xid_state.setdefault("events", [])
    seen += [f"Xid {code} on {bus}" for bus, code in events if f"Xid {code} on {bus}" not in seen]
    return list(seen)


def check_gpus(nvidia_smi: str, expected: int, kernel_log: str, xid_state: dict,
               timeout: float, boot_id: str = "") -> Result:  # fmt: skip
    out = command([nvidia_smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout)
    if out.code is None and "not found" in out.problem:
        if expected:
            return Result("gpu", FAIL, f"nvidia-smi not found, expected {expected} GPU(s)")
        return Result("gpu", ABSENT, "no nvidia-smi")
    if out.code is None:
        return Result("gpu", FAIL, out.problem)
    if out.code == 6 and not expected:
        return Result("gpu", ABSENT, "no GPU")
    if out.code != 0:
        why = EXIT_CODES.get(out.code, "unknown error")
        return Result("gpu", FAIL, f"nvidia-smi exited {out.code} ({why})")
    count = len([line for line in out.stdout.splitlines() if line.strip()])
    problems = []
    if expected and count != expected:
        problems.append(f"{count} GPU(s), expected {expected}")
    seen = critical_xids(kernel_log, xid_state, boot_id)
    problems += seen
    trouble, samples = figures(nvidia_smi, timeout)
    problems += trouble
    samples = [Sample("gpus", {}, count), Sample("gpu_critical_xids", {}, len(seen)), *samples]
    if problems:
        return Result("gpu", FAIL, "; ".join(problems), samples=samples)
    return Result("gpu", OK, f"{count} GPU(s)", samples=samples)
