#!/usr/bin/python
"""Ansible module: split the node's GPUs into MIG devices as the inventory says, and read
back the devices the driver made (for the slurm role's gres.conf)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: nvidia_gpu_mig
short_description: Apply a MIG layout with nvidia-smi and report the MIG devices
description:
  - For each GPU index in I(layout) (a list of MIG profile names, e.g. 3g.40gb), turns MIG
    mode on (C(nvidia-smi -i N -mig 1)) and, when the GPU's instances are not those
    profiles, destroys them and creates the profiles with a compute instance each
    (C(nvidia-smi mig -i N -cgi P,P -C)). A GPU not in I(layout) whose MIG mode is on is
    emptied and turned back to a whole GPU. A GPU without MIG ([N/A]) named in the layout
    fails the module.
  - A GPU whose MIG mode stays pending (it needs a GPU reset) is reported in
    C(reboot_needed).
  - Returns C(devices), each {gpu, type, gi, ci} from C(nvidia-smi mig -lci), and C(gres):
    the whole GPUs of I(gres_type) and the count of each MIG type, as slurm_node_gres
    declares them; C(minors_error) when /proc/driver/nvidia-caps/mig-minors (I(minors))
    numbers a device's capabilities otherwise than the slurm role writes them.
  - Check mode reports what would change without changing it.
options:
  layout: {description: "GPU index -> MIG profiles.", type: dict, default: {}}
  gpus: {description: The node's GPU count., type: int, required: true}
  gres_type: {description: The whole GPUs' Gres type (h100)., type: str, default: ""}
  minors:
    description: NVIDIA's mig-minors file.
    type: path
    default: /proc/driver/nvidia-caps/mig-minors
author: TACC stack
"""

import re  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

Run = Callable[[list[str]], tuple[int, str, str]]
# A row of `nvidia-smi mig -lci`: GPU, GPU instance, "MIG <profile>", profile ID, compute
# instance, placement.
_COMPUTE_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+\d+\s+(\d+)\s+\d+:\d+\s*\|$")
RC_NOT_FOUND = 6
FIRST_MINOR, PER_GPU, PER_GI = 3, 135, 9  # as roles/slurm/filter_plugins/hostlist.py


class MigError(Exception):
    pass


def parse_compute_instances(text: str) -> list[dict]:
    """`nvidia-smi mig -lci` -> [{gpu, type, gi, ci}] in the table's order."""
    found = []
    for line in text.splitlines():
        match = _COMPUTE_ROW.match(line.strip())
        if match:
            gpu, gi, profile, ci = match.groups()
            found.append({"gpu": int(gpu), "type": profile, "gi": int(gi), "ci": int(ci)})
    return found


def expected_minors(device: dict) -> dict[str, int]:
    base = FIRST_MINOR + PER_GPU * device["gpu"] + PER_GI * device["gi"]
    prefix = f"gpu{device['gpu']}/gi{device['gi']}"
    return {f"{prefix}/access": base, f"{prefix}/ci{device['ci']}/access": base + 1 + device["ci"]}


def minors_error(devices: list[dict], text: str) -> str:
    """Where the driver's mig-minors differ from the numbering gres.conf is written with."""
    table = {}
    for line in text.splitlines():
        name, _, number = line.rpartition(" ")
        if number.isdigit():
            table[name] = int(number)
    for device in devices:
        for name, minor in expected_minors(device).items():
            if table.get(name) != minor:
                return f"mig-minors gives {name} {table.get(name)}, not {minor}"
    return ""


class Mig:
    """nvidia-smi's MIG commands through `run` (argv -> rc, stdout, stderr)."""

    def __init__(self, run: Run, check_mode: bool = False) -> None:
        self.run = run
        self.check_mode = check_mode
        self.changes: list[str] = []

    def smi(self, *words: str, allow: tuple[int, ...] = ()) -> str:
        rc, out, err = self.run(["nvidia-smi", *words])
        if rc != 0 and rc not in allow:
            raise MigError(f"nvidia-smi {' '.join(words)}: exit {rc}: {(out or err).strip()}")
        return out

    def change(self, what: str, *words: str) -> None:
        self.changes.append(what)
        if not self.check_mode:
            self.smi(*words)

    def mode(self, gpu: int) -> tuple[str, str]:
        out = self.smi(
            "-i", str(gpu), "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader"
        )
        current, _, pending = out.strip().partition(",")
        return current.strip(), pending.strip()

    def instances(self, gpu: int | None = None) -> list[dict]:
        words = ["mig", *(["-i", str(gpu)] if gpu is not None else []), "-lci"]
        return parse_compute_instances(self.smi(*words, allow=(RC_NOT_FOUND,)))

    def apply(self, gpu: int, wanted: list[str]) -> bool:
        """Bring one GPU to `wanted` (no profiles: a whole GPU); True when its MIG mode
        waits for a GPU reset."""
        current, pending = self.mode(gpu)
        if current == "[N/A]":
            if wanted:
                raise MigError(f"GPU {gpu} has no MIG (nvidia-smi says [N/A]): layout {wanted}")
            return False
        have = self.instances(gpu) if current == "Enabled" else []
        if not wanted:
            if current == "Enabled" or pending == "Enabled":
                self.empty(gpu, have)
                self.change(f"GPU {gpu}: MIG off", "-i", str(gpu), "-mig", "0")
            return False
        if current != "Enabled":
            self.change(f"GPU {gpu}: MIG on", "-i", str(gpu), "-mig", "1")
            if not self.check_mode and self.mode(gpu)[0] != "Enabled":
                return True  # enabled at the next GPU reset (reboot): nothing to split yet
        if Counter(d["type"] for d in have) != Counter(wanted):
            self.empty(gpu, have)
            self.change(
                f"GPU {gpu}: MIG {','.join(wanted)}",
                *("mig", "-i", str(gpu), "-cgi", ",".join(wanted), "-C"),
            )
        return False

    def empty(self, gpu: int, have: list[dict]) -> None:
        if have:
            self.change(f"GPU {gpu}: compute instances removed", "mig", "-i", str(gpu), "-dci")
            self.change(f"GPU {gpu}: GPU instances removed", "mig", "-i", str(gpu), "-dgi")


def layout_of(raw: dict, gpus: int) -> dict[int, list[str]]:
    layout = {}
    for key, profiles in raw.items():
        if not str(key).isdigit() or int(key) >= gpus:
            raise MigError(
                f"nvidia_gpu_mig: {key!r} is not a GPU index of this node (0-{gpus - 1})"
            )
        if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
            raise MigError(
                f"nvidia_gpu_mig: GPU {key}: expected a list of MIG profiles like 3g.40gb"
            )
        layout[int(key)] = profiles
    return layout


def gres(devices: list[dict], gpus: int, gres_type: str) -> list[str]:
    """slurm_node_gres for the node: its whole GPUs, then each MIG type's count."""
    whole = gpus - len({d["gpu"] for d in devices})
    kind = f"gpu:{gres_type}:" if gres_type else "gpu:"
    counts = Counter(d["type"] for d in devices)
    return ([f"{kind}{whole}"] if whole else []) + [f"gpu:{t}:{n}" for t, n in counts.items()]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "layout": {"type": "dict", "default": {}},
            "gpus": {"type": "int", "required": True},
            "gres_type": {"type": "str", "default": ""},
            "minors": {"type": "path", "default": "/proc/driver/nvidia-caps/mig-minors"},
        },
        supports_check_mode=True,
    )
    params = module.params
    mig = Mig(lambda argv: module.run_command(argv), module.check_mode)
    try:
        layout = layout_of(params["layout"], params["gpus"])
        pending = [gpu for gpu in range(params["gpus"]) if mig.apply(gpu, layout.get(gpu, []))]
        devices = sorted(mig.instances(), key=lambda d: (d["gpu"], d["gi"], d["ci"]))
    except MigError as exc:
        module.fail_json(msg=str(exc), changes=mig.changes)
    minors = Path(params["minors"])
    problem = minors_error(devices, minors.read_text()) if devices and minors.exists() else ""
    module.exit_json(
        changed=bool(mig.changes),
        changes=mig.changes,
        devices=devices,
        gres=gres(devices, params["gpus"], params["gres_type"]),
        reboot_needed=bool(pending),
        minors_error=problem,
    )


if __name__ == "__main__":
    main()
