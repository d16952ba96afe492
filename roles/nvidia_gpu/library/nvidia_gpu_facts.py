#!/usr/bin/python
"""Ansible module: find NVIDIA GPUs and NVSwitches (lspci, nvidia-smi) and work out the
node's Slurm Gres string."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_facts
short_description: Detect NVIDIA GPUs and NVSwitches and derive the Slurm Gres
description:
  - Lists PCI functions of vendor 10de with C(lspci -D -n). Display/3D controllers
    (classes 0300, 0302) are GPUs, class 0680 functions are NVSwitches.
  - When C(nvidia-smi) is installed, reads each GPU's name, UUID, memory and the driver
    version, and derives the Gres type from the model name (H100 -> h100).
  - With the driver loaded, reads C(nvidia-smi topo -m) for the CPUs near each GPU and
    turns them into Slurm's logical core indexes (gres.conf C(Cores=): core 0 is the
    first core of the first socket) with the CPU topology under O(cpu_sysfs). C(cores)
    is the list per GPU, empty when every GPU is near every core (nothing to bind);
    C(cores_error) says why they could not be read (then C(cores) is empty).
  - C(reboot_needed) is true on a node with GPUs whose C(nvidia-smi) cannot reach the
    driver (exit 9: no module loaded, e.g. a first install beside nouveau) or reports a
    driver/library version mismatch (exit 18: the driver was upgraded, the old module
    still runs), or where nouveau is loaded; C(driver_error) is what nvidia-smi said.
  - Read-only; returns facts under C(nvidia_gpu).
options:
  gres_type:
    description: Gres type to use instead of the one derived from the model name.
    type: str
    default: ""
  cpu_sysfs:
    description: The CPU topology in sysfs (cpuN/topology/physical_package_id, core_id).
    type: str
    default: /sys/devices/system/cpu
  module_sysfs:
    description: Where loaded kernel modules are listed (nouveau loaded is a reboot to do).
    type: str
    default: /sys/module
  modules_root:
    description:
      - Where kernel modules are installed per kernel release. No module loaded (exit 9)
        is a reboot to do only where an nvidia module was built for the running kernel
        (DKMS needs its headers): else a reboot would not help, and C(driver_error) says so.
    type: str
    default: /lib/modules
author: TACC stack
"""

import os  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

GPU_CLASSES = ("0300", "0302")
NVSWITCH_CLASS = "0680"
_LSPCI = re.compile(r"^(\S+) ([0-9a-f]{4}): 10de:([0-9a-f]{4})", re.I)
_PREFIXES = ("nvidia", "tesla", "geforce", "quadro")
SMI_FIELDS = "index,name,uuid,memory.total,pci.bus_id,driver_version"
# nvidia-smi's exit codes (NVML's return codes) that a reboot cures: no kernel module
# loaded (NVML_ERROR_DRIVER_NOT_LOADED) and a module older than the library
# (NVML_ERROR_LIB_RM_VERSION_MISMATCH).
REBOOT_CODES = {9: "driver not loaded", 18: "driver/library version mismatch"}


def parse_lspci(text: str) -> tuple[list[dict], list[dict]]:
    """`lspci -D -n -d 10de:` lines to (gpus, nvswitches), each [{pci, class, device_id}]."""
    gpus, switches = [], []
    for line in text.splitlines():
        match = _LSPCI.match(line.strip())
        if not match:
            continue
        pci, pci_class, device_id = match.groups()
        entry = {"pci": pci, "class": pci_class, "device_id": device_id.lower()}
        if pci_class in GPU_CLASSES:
            gpus.append(entry)
        elif pci_class == NVSWITCH_CLASS:
            switches.append(entry)
    return gpus, switches


def parse_smi(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits` rows."""
    rows = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6:
            continue
        index, name, uuid, memory, bus_id, driver = fields
        rows.append(
            {
                "index": int(index),
                "name": name,
                "uuid": uuid,
                "memory_mib": int(memory),
                "pci": bus_id.lower()[-12:],
                "driver_version": driver,
            }
        )
    return rows


def parse_cpu_list(text: str) -> list[int]:
    """ "0-7,16-23" -> [0, ..., 7, 16, ..., 23]; "N/A" -> []."""
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def compress_ids(ids: list[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> "0-3,8-9", as gres.conf's Cores= takes them."""
    ranges: list[str] = []
    ordered = sorted(set(ids))
    start = 0
    for i, value in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != value + 1:
            first = ordered[start]
            ranges.append(str(first) if first == value else f"{first}-{value}")
            start = i + 1
    return ",".join(ranges)


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo(text: str) -> list[list[int]]:
    """`nvidia-smi topo -m`: each GPU's "CPU Affinity" as OS CPU numbers, in GPU order
    ([] for a GPU without one: "N/A"). The matrix is tab-separated; its header names the
    columns (underlined with terminal codes on a terminal)."""
    lines = [ANSI.sub("", line).split("\t") for line in text.splitlines() if "\t" in line]
    if not lines:
        return []
    header = [cell.strip() for cell in lines[0]]
    if "CPU Affinity" not in header:
        return []
    column = header.index("CPU Affinity")
    return [
        parse_cpu_list(cells[column]) if len(cells) > column else []
        for cells in lines[1:]
        if re.fullmatch(r"GPU\d+", cells[0].strip())
    ]


def logical_cores(cpu_sysfs: Path) -> dict[int, int]:
    """OS CPU number -> Slurm's logical core index: the node's (socket, core) pairs in
    order, so core 0 is the first core of the first socket and a core's threads share
    its index."""
    found: dict[int, tuple[int, int]] = {}
    for topology in cpu_sysfs.glob("cpu[0-9]*/topology"):
        cpu = int(topology.parent.name[3:])
        package = int((topology / "physical_package_id").read_text().strip())
        core = int((topology / "core_id").read_text().strip())
        found[cpu] = (package, core)
    index = {pair: i for i, pair in enumerate(sorted(set(found.values())))}
    return {cpu: index[pair] for cpu, pair in found.items()}


def gpu_cores(affinity: list[list[int]], cores_of: dict[int, int]) -> list[str]:
    """Cores= of each GPU, or [] when every GPU is near every core (nothing to bind); a
    GPU the driver gives no affinity is near every core. A CPU the topology does not
    list raises ValueError."""
    every = compress_ids(list(cores_of.values()))
    result = []
    for index, cpus in enumerate(affinity):
        missing = [cpu for cpu in cpus if cpu not in cores_of]
        if missing:
            raise ValueError(
                f"GPU{index} is near CPUs {compress_ids(missing)}, not in the CPU topology"
            )
        result.append(compress_ids([cores_of[cpu] for cpu in cpus]) or every)
    return [] if all(cores == every for cores in result) else result


def gres_type(model: str) -> str:
    """A Slurm Gres type from a model name: "NVIDIA H100 80GB HBM3" -> "h100",
    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 3090" -> "rtx3090"."""
    tokens = [t for t in re.split(r"[\s-]+", model.strip().lower()) if t]
    while tokens and tokens[0] in _PREFIXES:
        tokens.pop(0)
    if not tokens:
        return "gpu"
    if tokens[0] == "rtx" and len(tokens) > 1:
        return "rtx" + tokens[1]
    return re.sub(r"[^a-z0-9]", "", tokens[0]) or "gpu"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gres_type": {"type": "str", "default": ""},
            "cpu_sysfs": {"type": "str", "default": "/sys/devices/system/cpu"},
            "module_sysfs": {"type": "str", "default": "/sys/module"},
            "modules_root": {"type": "str", "default": "/lib/modules"},
        },
        supports_check_mode=True,
    )
    lspci = module.get_bin_path("lspci")
    if lspci is None:
        module.fail_json(msg="lspci not found: install pciutils")
    rc, out, err = module.run_command([lspci, "-D", "-n", "-d", "10de:"])
    if rc != 0:
        module.fail_json(msg=f"lspci failed: {err.strip()}")
    gpus, switches = parse_lspci(out)
    smi_rows: list[dict] = []
    driver = driver_error = ""
    reboot_for = ""
    smi = module.get_bin_path("nvidia-smi")
    if smi and gpus:
        query = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
        rc, out, err = module.run_command(query)
        if rc == 0:
            smi_rows = parse_smi(out)
            driver = smi_rows[0]["driver_version"] if smi_rows else ""
        else:
            driver_error = " ".join((out.strip() or err.strip()).splitlines()[:2])
            reboot_for = REBOOT_CODES.get(rc, "")
            release = os.uname().release
            built = Path(module.params["modules_root"], release)
            if rc == 9 and not any(built.rglob("nvidia.ko*")):
                reboot_for = ""
                driver_error += (
                    f"; no nvidia kernel module built for kernel {release} under {built} "
                    "(DKMS needs that kernel's headers)"
                )
    if gpus and Path(module.params["module_sysfs"], "nouveau").exists():
        reboot_for = reboot_for or "nouveau is loaded"
    cores: list[str] = []
    cores_error = ""
    if smi_rows:
        rc, out, err = module.run_command([smi, "topo", "-m"])
        affinity = parse_topo(out) if rc == 0 else []
        try:
            if rc != 0:
                raise ValueError(f"nvidia-smi topo -m failed: {(err or out).strip()}")
            if len(affinity) != len(smi_rows):
                raise ValueError(
                    f"nvidia-smi topo -m lists {len(affinity)} GPUs, not {len(smi_rows)}"
                )
            cores = gpu_cores(affinity, logical_cores(Path(module.params["cpu_sysfs"])))
        except (OSError, ValueError) as exc:
            cores_error = f"cannot tell the GPUs' cores: {exc}"
    models = sorted({row["name"] for row in smi_rows})
    kind = module.params["gres_type"] or (gres_type(models[0]) if models else "")
    count = len(gpus)
    gres = (f"gpu:{kind}:{count}" if kind else f"gpu:{count}") if count else ""
    module.exit_json(
        changed=False,
        ansible_facts={
            "nvidia_gpu": {
                "count": count,
                "pci": [g["pci"] for g in gpus],
                "nvswitch_count": len(switches),
                "driver_loaded": bool(smi_rows),
                "driver_version": driver,
                "models": models,
                "devices": smi_rows,
                "gres_type": kind,
                "gres": gres,
                "mixed_models": len(models) > 1,
                "cores": cores,
                "cores_error": cores_error,
                "driver_error": driver_error,
                "reboot_needed": bool(reboot_for),
                "reboot_reason": reboot_for,
            }
        },
    )


if __name__ == "__main__":
    main()
