"""GPUs through nvidia-smi (count against the expected number, its documented exit
codes), critical Xid events in the kernel log (/dev/kmsg or a log file), and ECC /
row-remap health with per-GPU figures when the GPUs report them."""

from __future__ import annotations

import os
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


def log_file_lines(kernel_log: str, xid_state: dict) -> list[str]:
    """Lines a kernel log file (kern.log) gained since the last run."""
    try:
        lines = Path(kernel_log).read_text(errors="replace").splitlines()
    except OSError:
        return []
    since = xid_state.get("line", 0)
    start = since if since <= len(lines) else 0  # the log was rotated
    xid_state["line"] = len(lines)
    return lines[start:]


def kmsg_lines(device: str, xid_state: dict) -> list[str]:
    """Messages the kernel ring buffer (/dev/kmsg, one "prio,seq,usec,flags;text" record
    per read) gained since the last run, by sequence number. Non-blocking: it stops at
    the end of the buffer. Needs no syslog daemon (Debian 12 logs to the journal only)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    last, found = xid_state.get("kmsg_seq", -1), []
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records overwritten while reading: go on
                continue
            if not chunk:
                break
            for record in chunk.decode(errors="replace").split("\n"):
                head, sep, text = record.partition(";")
                fields = head.split(",")
                if not sep or len(fields) < 3 or not fields[1].isdigit():
                    continue  # a continuation line (" KEY=value") or a partial record
                if int(fields[1]) > last:
                    found.append(text)
                    xid_state["kmsg_seq"] = int(fields[1])
    finally:
        os.close(fd)
    return found


def xids(lines: list[str]) -> list[tuple[str, int]]:
    """Critical Xid events (PCI address, code) in these kernel messages."""
    found = [(m.group(1), int(m.group(2))) for line in lines if (m := XID.search(line))]
    return [x for x in found if x[1] in CRITICAL_XIDS]


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
        xid_state.pop("kmsg_seq", None)  # sequence numbers restart with the kernel
    reader = kmsg_lines if kernel_log.startswith("/dev/") else log_file_lines
    events = xids(reader(kernel_log, xid_state))
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
