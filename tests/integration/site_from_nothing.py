"""The `hw` lab's install-from-nothing runs of playbooks/site.yml (labs.HW boots the bare
image), made once per pytest process for every module on that lab: test_hardware_roles.py
checks what each role changed in them, test_identity.py and test_directory_accounts.py
use the site they leave (slapd on n1, SSSD everywhere, Slurm with accounting).

- the first run is killed (SIGKILL) just after slurm.conf was written and before the
  restart it notified;
- a second run finishes the job, then a re-run and a --check --diff run must change
  nothing.

All four with make demo's mitogen_linear (the same modules and the same changed results;
121 CPU seconds for a re-run of the slurm shape instead of linear's 324, on two cores
shared with the other labs): the killed run was linear until the hw chain became the
suite's longest (its 490 s of 1262 s of setup); Ansible's default strategy still runs
the rolling, firmware and upgrade playbooks in the suite.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.integration.lab_helpers import changed_by_role, lab_cli, site, site_killed_at
from tests.integration.labs import HW, MITOGEN

T = TypeVar("T")
# The task after the one that writes slurm.conf: its header means that one is done.
KILL_AT = "TASK [slurm : Set up accounting]"
# n2's FAKE hardware (tacc-lab fake-hw): 8 H100s over 2 sockets of 8 cores, 2 NVSwitches,
# a ConnectX-6 Dx, RoCE.
FAKE_HW = ("n2", "--gpus", "8", "--sockets", "2", "--cores-per-socket", "8")
FAKE_HW += ("--nvswitches", "2", "--nics", "1", "--rdma", "1")


class Phases:
    """Runs each phase and keeps its wall time, for pytest -s (what the fixture costs
    is in its setup duration; this says where it goes)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, name: str, step: Callable[..., T], *args, **kwargs) -> T:
        start = time.monotonic()
        try:
            return step(*args, **kwargs)
        finally:
            self.seconds[name] = time.monotonic() - start

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.seconds.items())


def converge_from_nothing(inventory: Path) -> dict:
    """site.yml's runs on the bare hw lab: their output, per-host and per-role changes."""
    fake = lab_cli(HW.name, "fake-hw", *FAKE_HW, "--link-layer", "Ethernet")
    assert fake.returncode == 0, fake.stderr
    phases = Phases()
    killed = phases("the killed run", site_killed_at, inventory, KILL_AT, strategy=MITOGEN)
    first, _ = phases("the run that finishes it", site, inventory, strategy=MITOGEN)
    second, second_hosts = phases("the re-run", site, inventory, strategy=MITOGEN)
    check, check_hosts = phases(
        "--check --diff", site, inventory, "--check", "--diff", strategy=MITOGEN
    )
    print(f"site from nothing: {phases}", file=sys.stderr, flush=True)
    return {
        "inventory": inventory,
        "killed": killed,
        "rerun": first.stdout,
        "first": killed + first.stdout,
        "second": second_hosts,
        "check": check_hosts,
        "first_roles": changed_by_role(killed + first.stdout),
        "second_roles": changed_by_role(second.stdout),
        "check_roles": changed_by_role(check.stdout),
    }
