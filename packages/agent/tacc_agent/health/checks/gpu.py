"""GPUs through nvidia-smi (count against the expected number, its documented exit
codes), critical Xid events in the kernel's own messages (/dev/kmsg or the journal's
kernel transport), and ECC / row-remap health with per-GPU figures when the GPUs report
them.

An Xid drains the node until it reboots, so only the kernel can raise one (issue [10],
point 16): a record counts when the kernel wrote it (facility 0 in /dev/kmsg, which
userspace cannot write with; `_TRANSPORT=kernel` in the journal, which journald sets
itself), its message starts with the driver's `NVRM: Xid (PCI:<bus>): <code>, ` and the
bus is a GPU nvidia-smi reported since boot. A syslog file such as kern.log is not read:
`logger -p kern.err -t kernel` writes the same line into it from any account."""

from __future__ import annotations

import json
import os
import re

from tacc_agent.health.checks.base import (
    ABSENT,
    FAIL,
    OK,
    Result,
    Sample,
    command,
    read_state,
    write_state,
)
from tacc_agent.health.registry import Check, CheckContext, Family

# nvidia-smi(1), RETURN VALUE.
EXIT_CODES = {
    2: "invalid argument",
    3: "operation not available",
    4: "no permission",
    6: "no GPU found",
    8: "external power cables not attached",
    9: "driver not loaded",
    10: "kernel detected an interrupt issue",
    12: "NVML library not found",
    13: "a function is not implemented by NVML",
    14: "infoROM corrupted",
    15: "GPU has fallen off the bus",
    255: "other error",
}
# Xids that mean the GPU needs attention (NVIDIA's Xid catalogue): double-bit ECC,
# row remapping failures, NVLink errors, fallen off the bus, contained/uncontained ECC.
CRITICAL_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
# The driver's line, from the start of the kernel's message: bus as the kernel prints it
# (domain:bus:device, sometimes with .function), the Xid code, then its details.
XID = re.compile(
    r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
    r"(?:\.[0-7])?)\): (?P<code>\d+), "
)
PCI_ADDRESS = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?")
KERNEL_FACILITY = 0  # syslog facility "kern": /dev/kmsg gives userspace writers LOG_USER
JOURNAL = "journal"  # kernel_log value: the journal's kernel transport (journalctl -k)
# One optional query for figures and health; a driver that lacks a field rejects the whole
# query (exit 2), which then only costs the figures, never the check.
FIGURE_FIELDS = (
    "index,temperature.gpu,utilization.gpu,memory.used,memory.total,power.draw,"
    "ecc.errors.uncorrected.volatile.total,remapped_rows.failure"
)
FIGURES = (  # field position -> metric name, scale to base units
    (1, "gpu_temperature_celsius", 1.0),
    (2, "gpu_utilization_ratio", 0.01),
    (3, "gpu_memory_used_bytes", 2.0**20),
    (4, "gpu_memory_total_bytes", 2.0**20),
    (5, "gpu_power_watts", 1.0),
    (6, "gpu_ecc_uncorrected_errors", 1.0),
)
FAMILIES = (
    Family("gpus", "gauge", "GPUs nvidia-smi reports"),
    Family("gpu_critical_xids", "gauge", "Critical Xid events seen since boot (they hold a drain)"),
    Family("gpu_temperature_celsius", "gauge", "GPU core temperature", ("gpu",)),
    Family(
        "gpu_utilization_ratio", "gauge", "GPU utilization over the last sample period", ("gpu",)
    ),
    Family("gpu_memory_used_bytes", "gauge", "GPU memory in use", ("gpu",)),
    Family("gpu_memory_total_bytes", "gauge", "GPU memory installed", ("gpu",)),
    Family("gpu_power_watts", "gauge", "GPU power draw", ("gpu",)),
    Family(
        "gpu_ecc_uncorrected_errors",
        "gauge",
        "Uncorrected ECC errors since the driver loaded",
        ("gpu",),
    ),
)
XID_STATE = "xid.json"  # in the state dir: Xids seen this boot, where the kernel log was read


def kmsg_lines(device: str, xid_state: dict) -> list[str]:
    """Messages the kernel itself wrote to its ring buffer (/dev/kmsg, one
    "prio,seq,usec,flags;text" record per read) since the last run, by sequence number.
    Records of another facility came from userspace (root writing to /dev/kmsg) and are
    skipped. Non-blocking: it stops at the end of the buffer. Needs no syslog daemon
    (Debian 12 logs to the journal only)."""
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
                if not sep or len(fields) < 3 or not all(f.isdigit() for f in fields[:2]):
                    continue  # a continuation line (" KEY=value") or a partial record
                if int(fields[1]) > last:
                    xid_state["kmsg_seq"] = int(fields[1])
                    if int(fields[0]) >> 3 == KERNEL_FACILITY:
                        found.append(text)
    finally:
        os.close(fd)
    return found


def journal_lines(xid_state: dict, timeout: float) -> list[str]:
    """Kernel messages of this boot the journal gained since the last run (its cursor):
    `journalctl -k` matches _TRANSPORT=kernel, a field journald sets itself, and each
    entry is checked for it again. Persistent, so nothing scrolls out between two runs."""
    argv = ["journalctl", "--dmesg", "--output=json", "--no-pager", "--quiet"]
    if xid_state.get("journal_cursor"):
        argv.append(f"--after-cursor={xid_state['journal_cursor']}")
    out = command(argv, timeout)
    if out.code != 0:
        return []
    found = []
    for line in out.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("__CURSOR"), str):
            xid_state["journal_cursor"] = entry["__CURSOR"]
        message = entry.get("MESSAGE")
        if entry.get("_TRANSPORT") == "kernel" and isinstance(message, str):
            found.append(message)
    return found


def pci_address(text: str) -> str | None:
    """A PCI address in one spelling for nvidia-smi's "00000000:3B:00.0" and the kernel's
    "0000:3b:00": domain:bus:device in lower case, without the function."""
    match = PCI_ADDRESS.fullmatch(text.strip())
    if not match:
        return None
    domain, bus, device = (int(part, 16) for part in match.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def smi_buses(stdout: str) -> set[str]:
    """The GPUs' PCI addresses in `--query-gpu=index,pci.bus_id` output."""
    found = (pci_address(line.partition(",")[2]) for line in stdout.splitlines())
    return {bus for bus in found if bus}


def xids(lines: list[str], buses: set[str]) -> list[tuple[str, int]]:
    """Critical Xid events (PCI address as printed, code) in these kernel messages: the
    driver's line from the start of a message, on one of these GPUs."""
    found = [(m["bus"], int(m["code"])) for line in lines if (m := XID.match(line))]
    return [x for x in found if x[1] in CRITICAL_XIDS and pci_address(x[0]) in buses]


def number(text: str) -> float | None:
    """A figure, or None for nvidia-smi's "[N/A]" / "[Not Supported]"."""
    try:
        return float(text)
    except ValueError:
        return None


def figures(nvidia_smi: str, timeout: float) -> tuple[list[str], list[Sample]]:
    """ECC and row-remap trouble, and per-GPU figures; nothing when not reported."""
    out = command(
        [nvidia_smi, f"--query-gpu={FIGURE_FIELDS}", "--format=csv,noheader,nounits"], timeout
    )
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


def critical_xids(
    kernel_log: str, xid_state: dict, boot_id: str, buses: set[str], timeout: float = 5.0
) -> list[str]:
    """Critical Xids since the last run, plus the ones already seen since boot: they hold
    until the node reboots (a GPU reset), so the next run cannot resume the node. `buses`:
    the GPUs nvidia-smi reports now; one it reported earlier in this boot still counts (a
    GPU that fell off the bus leaves its listing)."""
    if xid_state.get("boot_id") != boot_id:
        xid_state.update(boot_id=boot_id, events=[], gpu_buses=[])
        xid_state.pop("kmsg_seq", None)  # sequence numbers restart with the kernel
        xid_state.pop("journal_cursor", None)
    known = sorted(set(xid_state.get("gpu_buses", [])) | buses)
    xid_state["gpu_buses"] = known
    if kernel_log == JOURNAL:
        lines = journal_lines(xid_state, timeout)
    else:
        lines = kmsg_lines(kernel_log, xid_state)
    events = xids(lines, set(known))
    seen = xid_state.setdefault("events", [])
    seen += [f"Xid {code} on {bus}" for bus, code in events if f"Xid {code} on {bus}" not in seen]
    return list(seen)


def check_gpus(
    nvidia_smi: str,
    expected: int,
    kernel_log: str,
    xid_state: dict,
    timeout: float,
    boot_id: str = "",
) -> Result:
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
    seen = critical_xids(kernel_log, xid_state, boot_id, smi_buses(out.stdout), timeout)
    problems += seen
    trouble, samples = figures(nvidia_smi, timeout)
    problems += trouble
    samples = [Sample("gpus", {}, count), Sample("gpu_critical_xids", {}, len(seen)), *samples]
    if problems:
        return Result("gpu", FAIL, "; ".join(problems), samples=samples)
    return Result("gpu", OK, f"{count} GPU(s)", samples=samples)


def run(ctx: CheckContext) -> Result:
    """The registered check: the node's settings, and the Xid state kept across runs (also
    when the check crashes half-way, so an Xid read from the kernel log is never lost)."""
    config, state_file = ctx.config, ctx.state_dir / XID_STATE
    xid_state = read_state(state_file)
    try:
        return check_gpus(
            config.nvidia_smi,
            config.expected_gpus,
            config.kernel_log,
            xid_state,
            ctx.timeout,
            ctx.boot_id,
        )
    finally:
        write_state(state_file, xid_state)


CHECK = Check("gpu", run, FAMILIES)
