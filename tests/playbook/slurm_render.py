"""playbooks/render-slurm-config.yml run for real (ansible-playbook on this machine, no
lab): test_slurm_conf_render.py, test_mpi_example.py, test_slurm_extra_config_guard.py and
test_slurm_scheduler_parameters.py render slurm.conf with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

# --tags slurm: the Slurm files only (render-cluster-files.yml), a third of a whole render's
# time, for the tests that read slurm.conf, gres.conf or cgroup.conf alone.
SLURM_ONLY = ("--tags", "slurm")


def render(out: Path, *extra: str, inventory: Path = ROOT / "inventory/example") -> None:
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            "playbooks/render-slurm-config.yml",
            "-e",
            f"slurm_render_dir={out}",
            "-e",
            "vault_slurm_dbd_db_password=unit-test",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=ansible_env(),
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
