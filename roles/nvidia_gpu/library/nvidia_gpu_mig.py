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
    profiles, destroys them and creates the profiles, largest first, with a compute
    instance each (C(nvidia-smi mig -i N -cgi P,P -C)). A GPU listed with no profiles is
    emptied and turned back whole; a GPU not listed is left as it is. A GPU without MIG
    ([N/A]) named in the layout fails the module, and so does a GPU to change that runs
    processes (drain the node first: the rolling play).
  - A GPU whose MIG mode stays pending (it needs a GPU reset) is reported in
    C(reboot_needed).
  - Returns C(devices), each {gpu, type, gi, ci} from C(nvidia-smi mig -lci), and C(gres):
    the whole GPUs of I(gres_type) and the count of each MIG type, as slurm_node_gres
    declares them; C(minors_error) when /proc/driver/nvidia-caps/mig-minors (I(minors))
    numbers a device's capabilities otherwise than the slurm role writes them.
  - Returns C(create), GPU index -> the profiles as created (largest first), for the
    boot unit that makes them again (MIG instances do not outlive a reboot).
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

    def modes(self) -> dict[int, tuple[str, str]]:
        """Each GPU's MIG mode, (current, pending): Enabled, Disabled or [N/A]."""
        out = self.smi(
            "--query-gpu=index,mig.mode.current,mig.mode.pending", "--format=csv,noheader"
        )
        found = {}
        for line in out.splitlines():
            words = [word.strip() for word in line.split(",")]
            if len(words) == 3 and words[0].isdigit():
                found[int(words[0])] = (words[1], words[2])
        return found

    def instances(self, gpu: int | None = None) -> list[dict]:
        words = ["mig", *(["-i", str(gpu)] if gpu is not None else []), "-lci"]
        return parse_compute_instances(self.smi(*words, allow=(RC_NOT_FOUND,)))

    def refuse_busy(self, gpu: int) -> None:
        out = self.smi("-i", str(gpu), "--query-compute-apps=pid", "--format=csv,noheader")
        if out.strip():
            raise MigError(
                f"GPU {gpu} runs processes ({', '.join(out.split())}): its MIG layout changes "
                "only on a drained node (ansible-playbook playbooks/rolling.yml)"
            )

    def apply(self, gpu: int, wanted: list[str], mode: tuple[str, str]) -> bool:
        """Bring one GPU to `wanted` (no profiles: a whole GPU); True when its MIG mode
        waits for a GPU reset."""
        current, pending = mode
        if current == "[N/A]":
            if wanted:
                raise MigError(f"GPU {gpu} has no MIG (nvidia-smi says [N/A]): layout {wanted}")
            return False
        have = self.instances(gpu) if current == "Enabled" else []
        if not wanted:
            if current == "Enabled" and pending != "Disabled":
                self.refuse_busy(gpu)
                self.empty(gpu, current)
                self.change(f"GPU {gpu}: MIG off", "-i", str(gpu), "-mig", "0")
                if self.check_mode:
                    return False
                current = self.modes()[gpu][0]
            return current == "Enabled"  # turned off at the next GPU reset (a reboot)
        if current != "Enabled":
            if pending != "Enabled":
                self.refuse_busy(gpu)
                self.change(f"GPU {gpu}: MIG on", "-i", str(gpu), "-mig", "1")
            if self.check_mode or self.modes()[gpu][0] != "Enabled":
                return not self.check_mode  # enabled at the next GPU reset (a reboot)
        if Counter(d["type"] for d in have) != Counter(wanted):
            self.refuse_busy(gpu)
            self.empty(gpu, current)  # just turned on: nothing to remove
            ordered = largest_first(wanted)
            self.change(
                f"GPU {gpu}: MIG {','.join(ordered)}",
                *("mig", "-i", str(gpu), "-cgi", ",".join(ordered), "-C"),
            )
        return False

    def empty(self, gpu: int, current: str) -> None:
        """Every compute and GPU instance of the GPU gone (also GPU instances without a
        compute instance, which `-lci` does not list)."""
        if current != "Enabled":
            return
        for what, flag in (("compute", "-dci"), ("GPU", "-dgi")):
            self.changes.append(f"GPU {gpu}: {what} instances removed")
            if not self.check_mode:
                self.smi("mig", "-i", str(gpu), flag, allow=(RC_NOT_FOUND,))


def slices(profile: str) -> int:
    """A profile's compute slices (3 for 3g.40gb), 0 for a name without them."""
    head = profile.split("g.", 1)[0]
    return int(head) if head.isdigit() else 0


def largest_first(profiles: list[str]) -> list[str]:
    """The order the profiles are created in, here and by the boot unit: the largest
    first, so the placements fill best."""
    return sorted(profiles, key=slices, reverse=True)


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
        modes = mig.modes()
        pending = [gpu for gpu, wanted in layout.items() if mig.apply(gpu, wanted, modes[gpu])]
        enabled = any(current == "Enabled" for current, _ in mig.modes().values())
        devices = mig.instances() if enabled else []
        devices.sort(key=lambda d: (d["gpu"], d["gi"], d["ci"]))
    except (MigError, KeyError) as exc:
        module.fail_json(msg=str(exc), changes=mig.changes)
    minors = Path(params["minors"])
    problem = minors_error(devices, minors.read_text()) if devices and minors.exists() else ""
    module.exit_json(
        changed=bool(mig.changes),
        changes=mig.changes,
        # What the boot unit creates (MIG instances do not outlive a reboot).
        create={
            str(gpu): ",".join(largest_first(wanted))
            for gpu, wanted in sorted(layout.items())
            if wanted
        },
        devices=devices,
        gres=gres(devices, params["gpus"], params["gres_type"]),
        reboot_needed=bool(pending),
        minors_error=problem,
    )


if __name__ == "__main__":
    main()
