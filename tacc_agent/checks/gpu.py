"""GPUs through nvidia-smi (count against the expected number, its documented exit
codes), critical Xid events in the kernel log, and ECC / row-remap health when the
GPUs report them."""

from __future__ import annotations

import re
from pathlib import Path

from tacc_agent.checks.base import ABSENT, FAIL, OK, Result, command

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
HEALTH_FIELDS = "index,ecc.errors.uncorrected.volatile.total,remapped_rows.failure"


def xids(kernel_log: str, since_line: int) -> tuple[list[tuple[str, int]], int]:
    """Critical Xid events after line `since_line`, and the new line count."""
    try:
        lines = Path(kernel_log).read_text(errors="replace").splitlines()
    except OSError:
        return [], since_line
    start = since_line if since_line <= len(lines) else 0  # the log was rotated
    found = [(m.group(1), int(m.group(2))) for line in lines[start:] if (m := XID.search(line))]
    return [x for x in found if x[1] in CRITICAL_XIDS], len(lines)


def health_problems(nvidia_smi: str, timeout: float) -> list[str]:
    """ECC and row-remap trouble; [] when the GPUs do not report these fields."""
    out = command([nvidia_smi, f"--query-gpu={HEALTH_FIELDS}", "--format=csv,noheader,nounits"],
                  timeout)  # fmt: skip
    if out.code != 0:
        return []
    problems = []
    for line in out.stdout.splitlines():
        index, ecc, remap = [v.strip() for v in line.split(",")][:3]
        if ecc.isdigit() and int(ecc) > 0:
            problems.append(f"GPU {index}: {ecc} uncorrected ECC errors")
        if remap.lower() == "yes":
            problems.append(f"GPU {index}: row remapping failed")
    return problems


def check_gpus(nvidia_smi: str, expected: int, kernel_log: str, xid_state: dict,
               timeout: float) -> Result:  # fmt: skip
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
    events, xid_state["line"] = xids(kernel_log, xid_state.get("line", 0))
    problems += [f"Xid {code} on {bus}" for bus, code in events]
    problems += health_problems(nvidia_smi, timeout)
    metrics = {"gpus": count}
    if problems:
        return Result("gpu", FAIL, "; ".join(problems), metrics=metrics)
    return Result("gpu", OK, f"{count} GPU(s)", metrics=metrics)
