"""FAKE (lab only): the MIG side of the fake ``nvidia-smi`` (see nvidia_smi.py).

Imitates, on the GPUs of the fake state::

    nvidia-smi -i N -mig 1|0             MIG mode on or off ("Enabled MIG Mode for GPU ...")
    nvidia-smi mig -i N -cgi P[,P...] -C  GPU instances of profiles P (names like 3g.40gb)
                                          with a compute instance each
    nvidia-smi mig -i N -dci | -dgi       destroy the GPU's compute / GPU instances
    nvidia-smi mig [-i N] -lci            the compute instances table

and the MIG lines of ``nvidia-smi -L``. A GPU's state holds "mig_mode" (bool) and
"mig" (a list of {"gi", "ci", "profile"}); a GPU model without MIG (L40S) refuses. GPU
instance IDs are given as the driver gives them on an empty GPU of the A100/H100 family:
the lowest free ID of the profile's placements (7g: 0; 4g: 1; 3g: 1-2; 2g: 3-5; 1g: 7-13),
within the GPU's seven compute slices. Each new instance gets its two capability device
files (/dev/nvidia-caps/nvidia-capN, empty placeholders as for /dev/nvidiaN, numbered as
NVIDIA's /proc/driver/nvidia-caps/mig-minors numbers them: see mig_minors()).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# profile size (compute slices) -> the GPU instance IDs the driver places it at
PLACEMENTS = {7: (0,), 4: (1,), 3: (1, 2), 2: (3, 4, 5), 1: tuple(range(7, 14))}
PROFILE_IDS = {7: 0, 4: 5, 3: 9, 2: 14, 1: 19}
MIG_MODELS = ("A100", "H100", "H200")
FIRST_MINOR, PER_GPU, PER_GI = 3, 135, 9
RC_NOT_FOUND, RC_INVALID = 6, 2


class MigError(Exception):
    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


def capable(gpu: dict[str, Any]) -> bool:
    return any(model in gpu["name"] for model in MIG_MODELS)


def slices(profile: str) -> int:
    """3 for "3g.40gb"; MigError for a name that is no profile."""
    head = profile.split("g.", 1)[0]
    if not head.isdigit() or int(head) not in PLACEMENTS or "g." not in profile:
        raise MigError(f"Unable to find profile {profile!r}", RC_INVALID)
    return int(head)


def mig_minors(gpus: int) -> str:
    """/proc/driver/nvidia-caps/mig-minors for `gpus` GPUs, as the driver writes it."""
    lines = ["config 1", "monitor 2"]
    for gpu in range(gpus):
        for gi in range(15):
            base = FIRST_MINOR + PER_GPU * gpu + PER_GI * gi
            lines.append(f"gpu{gpu}/gi{gi}/access {base}")
            lines.extend(f"gpu{gpu}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(8))
    return "\n".join(lines) + "\n"


def cap_files(index: int, gi: int, ci: int) -> list[Path]:
    base = FIRST_MINOR + PER_GPU * index + PER_GI * gi
    caps = Path(os.environ.get("TACC_FAKE_DEV", "/dev"), "nvidia-caps")
    return [caps / f"nvidia-cap{base}", caps / f"nvidia-cap{base + 1 + ci}"]


def set_mode(gpu: dict[str, Any], enable: bool) -> list[str]:
    bus = gpu["bus_id"]
    if not capable(gpu):
        raise MigError(f"Unable to enable MIG Mode for GPU {bus}: Not Supported", 3)
    if not enable and gpu.get("mig"):
        raise MigError(f"Unable to disable MIG Mode for GPU {bus}: In use by another client")
    gpu["mig_mode"] = enable
    return [f"{'Enabled' if enable else 'Disabled'} MIG Mode for GPU {bus}", "All done."]


def create(gpu: dict[str, Any], profiles: list[str]) -> list[str]:
    if not gpu.get("mig_mode"):
        raise MigError(f"Unable to create a GPU instance on GPU {gpu['index']}: Not Supported", 3)
    lines = []
    for profile in profiles:
        size = slices(profile)
        taken = {inst["gi"] for inst in gpu.setdefault("mig", [])}
        used = sum(slices(inst["profile"]) for inst in gpu["mig"])
        free = [gi for gi in PLACEMENTS[size] if gi not in taken]
        if not free or used + size > 7:
            raise MigError(
                f"Unable to create a GPU instance on GPU {gpu['index']} using profile "
                f"{profile}: Insufficient Resources"
            )
        gpu["mig"].append({"gi": free[0], "ci": 0, "profile": profile})
        for path in cap_files(gpu["index"], free[0], 0):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(mode=0o444)
        index, gi, pid = gpu["index"], free[0], PROFILE_IDS[size]
        lines.append(
            f"Successfully created GPU instance ID {gi:2d} on GPU {index:2d} using profile "
            f"MIG {profile} (ID {pid:2d})"
        )
        lines.append(
            f"Successfully created compute instance ID  0 on GPU {index:2d} GPU instance ID "
            f"{gi:2d} using profile MIG {profile} (ID {pid:2d})"
        )
    return lines


def destroy(gpu: dict[str, Any], what: str) -> list[str]:
    instances = gpu.get("mig", [])
    if not instances:
        raise MigError(f"No {'compute' if what == 'ci' else 'GPU'} instances found", RC_NOT_FOUND)
    index = gpu["index"]
    if what == "ci":
        return [
            f"Successfully destroyed compute instance ID  {inst['ci']} from GPU {index:2d} "
            f"GPU instance ID {inst['gi']:2d}"
            for inst in instances
        ]
    gpu["mig"] = []
    return [
        f"Successfully destroyed GPU instance ID {inst['gi']:2d} from GPU {index:2d}"
        for inst in instances
    ]


def sorted_instances(gpu: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(gpu.get("mig", []), key=lambda inst: inst["gi"])


def compute_row(gpu: dict[str, Any], inst: dict[str, Any]) -> str:
    size = slices(inst["profile"])
    return (
        f"| {gpu['index']:>3}  {inst['gi']:>6}       MIG {inst['profile']:<12}"
        f"{PROFILE_IDS[size]:>4}  {inst['ci']:>8}          0:{size}     |"
    )


def list_compute(found: list[dict[str, Any]]) -> list[str]:
    rows = [compute_row(gpu, inst) for gpu in found for inst in sorted_instances(gpu)]
    if not rows:
        raise MigError("No compute instances found: Not Found", RC_NOT_FOUND)
    rule = "+" + "-" * 68 + "+"
    return [
        rule,
        "| Compute instances:" + " " * 49 + "|",
        "| GPU     GPU       Name             Profile   Instance   Placement  |",
        "|       Instance                       ID        ID       Start:Size |",
        "|         ID                                                         |",
        "|" + "=" * 68 + "|",
        *rows,
        rule,
    ]


def list_lines(gpu: dict[str, Any]) -> list[str]:
    """The MIG devices under a GPU's `nvidia-smi -L` line."""
    uuid = gpu["uuid"][4:-4]
    return [
        f"  MIG {inst['profile']:<11} Device {n:2d}: (UUID: MIG-{uuid}{inst['gi']:04x})"
        for n, inst in enumerate(sorted_instances(gpu))
    ]


def mig_command(found: list[dict[str, Any]], argv: list[str]) -> list[str]:
    """`nvidia-smi mig ...` on the GPUs `found` (all, or the one -i names)."""
    if "-lci" in argv:
        return list_compute(found)
    if len(found) != 1:
        raise MigError("Please specify the GPU with -i", RC_INVALID)
    gpu = found[0]
    if "-cgi" in argv:
        at = argv.index("-cgi") + 1
        if at >= len(argv) or "-C" not in argv:
            raise MigError("-cgi needs profiles, and -C (a compute instance each)", RC_INVALID)
        return create(gpu, argv[at].split(","))
    if "-dci" in argv:
        return destroy(gpu, "ci")
    if "-dgi" in argv:
        return destroy(gpu, "gi")
    raise MigError("Invalid combination of input arguments.", RC_INVALID)
