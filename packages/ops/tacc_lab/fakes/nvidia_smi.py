"""FAKE (lab only): imitates NVIDIA's ``nvidia-smi`` for the GPUs listed in the fake state.

Supported::

    nvidia-smi                       the summary table (driver and CUDA version, one row per GPU)
    nvidia-smi -L | --list-gpus      GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
    nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]
    nvidia-smi --query-compute-apps=APP_FIELDS --format=csv[,noheader][,nounits]
    nvidia-smi topo -m | --matrix      the GPU topology matrix with each GPU's CPU and NUMA
                                     affinity (from the state's "cpu" layout and each
                                     GPU's "socket"), tab-separated as the real one

FIELDS is any subset, in any order, of index, name, uuid, memory.total, pci.bus_id,
driver_version, the figures temperature.gpu, utilization.gpu, memory.used, power.draw,
and the health fields ecc.errors.uncorrected.volatile.total, remapped_rows.failure (plus the
aliases gpu_name, gpu_uuid, gpu_bus_id, count). A GPU's state may set "ecc_uncorrected" and
"remap_failed" to stage trouble, "utilization_percent" (default 0) and "processes" (a list of
{"pid", "name", "used_mib"}) to stage use: memory.used is the sum of its processes' used_mib.

APP_FIELDS (one line per compute process on any GPU, in GPU order, as NVIDIA documents
`nvidia-smi --help-query-compute-apps`) is any subset of pid, process_name (alias name),
gpu_uuid, gpu_name, gpu_bus_id, used_gpu_memory (alias used_memory [MiB]); with no
processes the header (or, with noheader, nothing) is printed and it exits 0, as the real
tool does. GPUs are numbered in PCI bus order. With no GPUs it prints "No devices were
found" and exits 6, as the real tool does.

Installed by the FAKE driver package, the wrapper sets ``TACC_FAKE_NVML_VERSION`` to the
package's version (the user-space library's). Then, as the real tool: with no kernel module
loaded (the state's "driver_version" absent) it says it cannot communicate with the driver
and exits 9 (NVML_ERROR_DRIVER_NOT_LOADED); with another module version loaded (a driver
upgraded, not yet rebooted) it prints "Failed to initialize NVML: Driver/library version
mismatch" and exits 18 (NVML_ERROR_LIB_RM_VERSION_MISMATCH).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

try:
    from . import hwstate, nvidia_mig
except ImportError:  # run as a standalone file: hwstate.py sits next to this one
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hwstate
    import nvidia_mig

ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
FIELDS = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "pci.bus_id",
    "driver_version",
    "count",
    "temperature.gpu",
    "utilization.gpu",
    "memory.used",
    "power.draw",
    "ecc.errors.uncorrected.volatile.total",
    "remapped_rows.failure",
    "mig.mode.current",
    "mig.mode.pending",
)
UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "utilization.gpu": "%",
    "power.draw": "W",
    "used_gpu_memory": "MiB",
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "gpu_name", "gpu_bus_id", "used_gpu_memory")
RC_INVALID_ARGS, RC_NO_DEVICES, RC_NO_DRIVER, RC_MISMATCH = 2, 6, 9, 18
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


class UsageError(Exception):
    pass


def gpus(state: dict[str, Any]) -> list[dict[str, Any]]:
    """GPUs in PCI bus order, each with index, uuid and the nvidia-smi style bus id."""
    found = sorted(state["gpus"], key=lambda g: hwstate.normalize_pci(g["pci"]))
    for index, gpu in enumerate(found):
        gpu["index"] = index
        gpu.setdefault("uuid", f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, gpu['pci'])}")
        gpu["bus_id"] = "0000" + hwstate.normalize_pci(gpu["pci"]).upper()
    return found


def memory_used_mib(gpu: dict[str, Any]) -> int:
    return sum(int(proc.get("used_mib", 0)) for proc in gpu.get("processes", ()))


def field_value(gpu: dict[str, Any], state: dict[str, Any], field: str, units: bool) -> str:
    utilization, used = int(gpu.get("utilization_percent", 0)), memory_used_mib(gpu)
    values = {
        "index": str(gpu["index"]),
        "name": gpu["name"],
        "uuid": gpu["uuid"],
        "memory.total": f"{gpu['memory_mib']} MiB" if units else str(gpu["memory_mib"]),
        "pci.bus_id": gpu["bus_id"],
        "driver_version": state.get("driver_version", "N/A"),
        "count": str(len(state["gpus"])),
        "temperature.gpu": "30",  # an idle GPU, as the summary table shows it
        "utilization.gpu": f"{utilization} %" if units else str(utilization),
        "memory.used": f"{used} MiB" if units else str(used),
        "power.draw": "70.00 W" if units else "70.00",
        "ecc.errors.uncorrected.volatile.total": str(gpu.get("ecc_uncorrected", 0)),
        "remapped_rows.failure": "Yes" if gpu.get("remap_failed") else "No",
        "mig.mode.current": mig_mode(gpu),
        "mig.mode.pending": mig_mode(gpu),
    }
    return values[field]


def mig_mode(gpu: dict[str, Any]) -> str:
    if not nvidia_mig.capable(gpu):
        return "[N/A]"
    return "Enabled" if gpu.get("mig_mode") else "Disabled"


def format_options(format_arg: str) -> list[str]:
    options = [opt.strip() for opt in format_arg.split(",")]
    if options[0] != "csv" or not set(options[1:]) <= {"noheader", "nounits"}:
        raise UsageError(f'"{format_arg}" is not a valid format.')
    return options


def app_value(gpu: dict[str, Any], proc: dict[str, Any], field: str, units: bool) -> str:
    used = int(proc.get("used_mib", 0))
    values = {
        "pid": str(proc["pid"]),
        "process_name": str(proc.get("name", "python")),
        "gpu_uuid": gpu["uuid"],
        "gpu_name": gpu["name"],
        "gpu_bus_id": gpu["bus_id"],
        "used_gpu_memory": f"{used} MiB" if units else str(used),
    }
    return values[field]


def query_apps(
    state: dict[str, Any], fields_arg: str, format_arg: str, chosen: str | None = None
) -> list[str]:
    """--query-compute-apps: one line per compute process on any GPU (the one -i names)."""
    options = format_options(format_arg)
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for field in fields:
        if APP_ALIASES.get(field, field) not in APP_FIELDS:
            raise UsageError(f'Field "{field}" is not a valid field to query.')
    lines = []
    if "noheader" not in options:
        named = [APP_ALIASES.get(f, f) for f in fields]
        lines.append(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in named))
    units = "nounits" not in options
    for gpu in chosen_gpus(state, chosen):
        for proc in gpu.get("processes", ()):
            lines.append(
                ", ".join(app_value(gpu, proc, APP_ALIASES.get(f, f), units) for f in fields)
            )
    return lines


def query(
    state: dict[str, Any], fields_arg: str, format_arg: str, chosen: str | None = None
) -> list[str]:
    options = format_options(format_arg)
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    for field in fields:
        if ALIASES.get(field, field) not in FIELDS:
            raise UsageError(f'Field "{field}" is not a valid field to query.')
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(f"{f} [{UNITS[f]}]" if f in UNITS else f for f in fields))
    units = "nounits" not in options
    for gpu in chosen_gpus(state, chosen):
        lines.append(", ".join(field_value(gpu, state, ALIASES.get(f, f), units) for f in fields))
    return lines


def row(left: str, middle: str, right: str) -> str:
    """One line of the summary table's three-column GPU section."""
    return f"|{left:<41}|{middle:<24}|{right:<22}|"


def driver_series(state: dict[str, Any]) -> int:
    """The driver's major version (550 for "550.54.15"), 0 when the state has none."""
    major = str(state.get("driver_version", "")).split(".")[0]
    return int(major) if major.isdigit() else 0


def table(state: dict[str, Any]) -> list[str]:
    """The default summary table in the layout of the state's driver series: the 550
    series, or the 580 series as the real 580.159.04 prints it (`make gpu-check` on an
    H200, 2026-12-04): a "+" rule under the version line, an empty line between the GPU
    and process tables and a wider PID column."""
    new_layout = driver_series(state) >= 580
    rule = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    wide_rule = "+" + "-" * 89 + "+"
    driver, cuda = state.get("driver_version", "N/A"), state.get("cuda_version", "N/A")
    lines = [
        time.asctime(),  # the day padded with a space, as the real one: "Dec  4"
        wide_rule,
        f"| NVIDIA-SMI {driver:<23}Driver Version: {driver:<15}CUDA Version: {cuda:<9}|",
        rule if new_layout else "|" + rule[1:],
        row(
            " GPU  Name                 Persistence-M",
            " Bus-Id          Disp.A",
            " Volatile Uncorr. ECC",
        ),
        row(
            " Fan  Temp   Perf          Pwr:Usage/Cap",
            "           Memory-Usage",
            " GPU-Util  Compute M.",
        ),
        row("", "", f"{'MIG M.':>21}"),
        "|" + rule[1:-1].replace("-", "=") + "|",
    ]
    for gpu in gpus(state):
        memory = f"{gpu['memory_mib']}MiB"
        lines += [
            row(
                f" {gpu['index']:>3}  {gpu['name'][:29]:<29}  On",
                f"   {gpu['bus_id']} Off",
                f"{0:>21}",
            ),
            row(
                " N/A   30C    P0             70W /  700W",
                f"{'0MiB':>11} / {memory:>9}",
                f"{'0%':>8}{'Default':>13}",
            ),
            row("", "", f"{'Disabled':>21}"),
            rule,
        ]
    processes = (
        " GPU   GI   CI              PID   Type   Process name"
        if new_layout
        else " GPU   GI   CI        PID   Type   Process name"
    )
    lines += [
        "" if new_layout else " " * 89,
        wide_rule,
        f"| {'Processes:':<88}|",
        f"| {processes:<77}GPU Memory |",
        f"| {'       ID   ID':<77}Usage      |",
        "|" + "=" * 89 + "|",
        f"| {' No running processes found':<88}|",
        wide_rule,
    ]
    return lines


TOPO_LEGEND = (
    "",
    "Legend:",
    "",
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes"
    " (e.g., QPI/UPI)",
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges"
    " within a NUMA node",
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host"
    " Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


def socket_cpus(layout: dict[str, Any], socket: int) -> str:
    """The CPU list of one socket as nvidia-smi prints it ("0-7", or "0-7,16-23" with two
    threads per core): CPUs numbered socket by socket, then the second threads."""
    sockets, cores = int(layout["sockets"]), int(layout["cores_per_socket"])
    ranges = []
    for thread in range(int(layout.get("threads_per_core", 1))):
        first = thread * sockets * cores + socket * cores
        ranges.append(f"{first}-{first + cores - 1}" if cores > 1 else str(first))
    return ",".join(ranges)


def topo_matrix(state: dict[str, Any]) -> list[str]:
    """`nvidia-smi topo -m`: GPU-to-GPU links (NV18 through NVSwitches, else NODE within a
    socket and SYS across), then each GPU's CPU Affinity, NUMA Affinity and GPU NUMA ID."""
    found = gpus(state)
    layout = state.get("cpu") or {"sockets": 1, "cores_per_socket": os.cpu_count() or 1}
    nvlink = bool(state.get("nvswitches"))
    header = ["", *(f"GPU{g['index']}" for g in found), "CPU Affinity", "NUMA Affinity"]
    lines = ["\t".join([*header, "GPU NUMA ID"])]
    for gpu in found:
        socket = int(gpu.get("socket", 0))
        links = [
            " X "
            if other is gpu
            else "NV18"
            if nvlink
            else "NODE"
            if int(other.get("socket", 0)) == socket
            else "SYS"
            for other in found
        ]
        cells = [f"GPU{gpu['index']}", *links, socket_cpus(layout, socket), str(socket), "", "N/A"]
        lines.append("\t".join(cells))
    return [*lines, *TOPO_LEGEND]


def parse(argv: list[str]) -> dict[str, str]:
    if argv[:1] == ["mig"]:
        return {"mig": "1"}
    if argv[:1] == ["-mig"]:
        if argv[1:] not in (["0"], ["1"]):
            raise UsageError(BAD_ARGS)
        return {"mig-mode": argv[1]}
    if argv[:1] == ["topo"]:
        if argv[1:] not in (["-m"], ["--matrix"]):
            raise UsageError(BAD_ARGS)
        return {"topo": "1"}
    opts: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if arg in ("-L", "--list-gpus"):
            opts["list"] = "1"
        elif name in ("--query-gpu", "--query-compute-apps", "--format"):
            value = value if eq else next(args, "")
            if not value:
                raise UsageError(f'"{name}=" switch is missing a value.')
            opts[name[2:]] = value
        else:
            raise UsageError(BAD_ARGS)
    queries = sum(key in opts for key in ("list", "query-gpu", "query-compute-apps"))
    asks_query = "query-gpu" in opts or "query-compute-apps" in opts
    if asks_query != ("format" in opts) or queries > 1:
        raise UsageError(BAD_ARGS)
    return opts


def gpu_option(argv: list[str]) -> tuple[str | None, list[str]]:
    """The GPU `-i N` / `--id=N` names (None: all) and the other words."""
    rest, chosen = [], None
    words = iter(argv)
    for word in words:
        if word in ("-i", "--id"):
            chosen = next(words, "")
        elif word.startswith("--id="):
            chosen = word.split("=", 1)[1]
        else:
            rest.append(word)
    return chosen, rest


def chosen_gpus(state: dict[str, Any], chosen: str | None) -> list[dict[str, Any]]:
    found = gpus(state)
    if chosen is None:
        return found
    picked = [g for g in found if chosen in (str(g["index"]), g["uuid"], g["bus_id"])]
    if not picked:
        raise UsageError(f"No GPU with ID {chosen} found.")
    return picked


def mig_change(opts: dict[str, str], words: list[str], chosen: str | None) -> list[str]:
    """-mig 0|1 and `mig ...`: they change the state (kept under its lock)."""
    with hwstate.update() as state:
        found = chosen_gpus(state, chosen)
        if "mig" in opts:
            return nvidia_mig.mig_command(found, words[1:])
        return [line for gpu in found for line in nvidia_mig.set_mode(gpu, opts["mig-mode"] == "1")]


def main(argv: list[str] | None = None) -> int:
    try:
        chosen, words = gpu_option(sys.argv[1:] if argv is None else argv)
        opts = parse(words)
        state = hwstate.load()
        library = os.environ.get("TACC_FAKE_NVML_VERSION", "")
        if library and not state.get("driver_version"):
            print(NO_DRIVER)
            return RC_NO_DRIVER
        if library and state["driver_version"] != library:
            short = ".".join(library.split(".")[:2])
            print("Failed to initialize NVML: Driver/library version mismatch")
            print(f"NVML library version: {short}")
            return RC_MISMATCH
        if not state["gpus"]:
            print("No devices were found")
            return RC_NO_DEVICES
        if "mig" in opts or "mig-mode" in opts:
            lines = mig_change(opts, words, chosen)
        elif "list" in opts:
            lines = [
                line
                for g in chosen_gpus(state, chosen)
                for line in (
                    f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})",
                    *nvidia_mig.list_lines(g),
                )
            ]
        elif "query-gpu" in opts:
            lines = query(state, opts["query-gpu"], opts["format"], chosen)
        elif "topo" in opts:
            lines = topo_matrix(state)
        elif "query-compute-apps" in opts:
            lines = query_apps(state, opts["query-compute-apps"], opts["format"], chosen)
        else:
            lines = table(state)
    except UsageError as err:
        print(err, file=sys.stderr)
        return RC_INVALID_ARGS
    except nvidia_mig.MigError as err:
        print(err)
        return err.rc
    if lines:  # csv,noheader with no processes prints nothing at all
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
