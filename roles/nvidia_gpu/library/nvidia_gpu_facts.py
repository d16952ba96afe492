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
  - Read-only; returns facts under C(nvidia_gpu).
options:
  gres_type:
    description: Gres type to use instead of the one derived from the model name.
    type: str
    default: ""
author: TACC stack
"""

import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

GPU_CLASSES = ("0300", "0302")
NVSWITCH_CLASS = "0680"
_LSPCI = re.compile(r"^(\S+) ([0-9a-f]{4}): 10de:([0-9a-f]{4})", re.I)
_PREFIXES = ("nvidia", "tesla", "geforce", "quadro")
SMI_FIELDS = "index,name,uuid,memory.total,pci.bus_id,driver_version"


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
        argument_spec={"gres_type": {"type": "str", "default": ""}},
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
    driver = ""
    smi = module.get_bin_path("nvidia-smi")
    if smi and gpus:
        query = [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"]
        rc, out, err = module.run_command(query)
        if rc == 0:
            smi_rows = parse_smi(out)
            driver = smi_rows[0]["driver_version"] if smi_rows else ""
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
            }
        },
    )


if __name__ == "__main__":
    main()
