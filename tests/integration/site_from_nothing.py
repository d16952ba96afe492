"""The `hw` lab's install-from-nothing runs of playbooks/site.yml (labs.HW boots the bare
image), made once per pytest process for every module on that lab: test_hardware_roles.py
checks what each role changed in them, test_identity.py and test_directory_accounts.py
use the site they leave (slapd on n1, SSSD everywhere, Slurm with accounting).

- the first run is killed (SIGKILL) just after slurm.conf was written and before the
  restart it notified, with Ansible's default strategy (linear: ansible.cfg), what an
  operator's plain ansible-playbook runs;
- a second run finishes the job, then a re-run and a --check --diff run must change
  nothing: these three with make demo's mitogen_linear (the same modules and the same
  changed results; 121 CPU seconds for a re-run of the slurm shape instead of linear's
  324, on two cores shared with the other labs).
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.lab_helpers import changed_by_role, lab_cli, site, site_killed_at
from tests.integration.labs import HW, MITOGEN

# The task after the one that writes slurm.conf: its header means that one is done.
KILL_AT = "TASK [slurm : Set up accounting]"
# n2's FAKE hardware (tacc-lab fake-hw): 4 H100s, 2 NVSwitches, a ConnectX-6 Dx, RoCE.
FAKE_HW = ("n2", "--gpus", "4", "--nvswitches", "2", "--nics", "1", "--rdma", "1")


def converge_from_nothing(inventory: Path) -> dict:
    """site.yml's runs on the bare hw lab: their output, per-host and per-role changes."""
    fake = lab_cli(HW.name, "fake-hw", *FAKE_HW, "--link-layer", "Ethernet")
    assert fake.returncode == 0, fake.stderr
    killed = site_killed_at(inventory, KILL_AT)
    first, _ = site(inventory, strategy=MITOGEN)
    second, second_hosts = site(inventory, strategy=MITOGEN)
    check, check_hosts = site(inventory, "--check", "--diff", strategy=MITOGEN)
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
