#!/usr/bin/env python3
"""Simulated scale (baseline for issue [7]): render the cluster-wide slurm.conf for a
generated inventory of N GPU nodes (default 4,096) with the slurm role's render_local
entry point, and time it. Only one host (the controller) is rendered: every host renders
the same bytes, so one is what a real run costs per host. Prints the time and file size.

Usage: .venv/bin/python -u bench/render_scale.py [--nodes 4096]
Needs no lab. The example inventory's group_vars supply everything but the host list.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import ROOT, sh


def inventory(root: Path, nodes: int) -> Path:
    """The example inventory's variables, with N GPU nodes 10.10.<rack>.<slot>."""
    shutil.copytree(ROOT / "inventory/example/group_vars", root / "group_vars")
    gpus = {f"gpu{i:04d}": {"ansible_host": f"10.10.{1 + (i - 1) // 250}.{1 + (i - 1) % 250}"}
            for i in range(1, nodes + 1)}  # fmt: skip
    members = dict.fromkeys(gpus)
    data = {"all": {
        "hosts": {"ctl1": {"ansible_host": "10.10.0.10"},
                  "login1": {"ansible_host": "10.10.0.11"}, **gpus},
        "children": {
            "slurm_controller": {"hosts": {"ctl1": None}},
            "slurm_dbd": {"hosts": {"ctl1": None}},
            "login": {"hosts": {"login1": None}},
            "slurm_compute": {"hosts": members},
            "gpu_nodes": {"hosts": members},
        },
    }}  # fmt: skip
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hosts = inventory(Path(tmp), args.nodes)
        out = Path(tmp) / "render"
        start = time.monotonic()
        sh([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(hosts),
            "playbooks/render-slurm-config.yml", "--limit", "ctl1",
            "-e", f"slurm_render_dir={out}", "-e", "vault_slurm_dbd_db_password=bench"],
           {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})  # fmt: skip
        seconds = time.monotonic() - start
        conf = out / "ctl1/slurm.conf"
        lines = conf.read_text().splitlines()
        node_lines = sum(line.startswith("NodeName=") for line in lines)
        print(f"{args.nodes} GPU nodes: slurm.conf rendered in {seconds:.1f} s "
              f"(ansible-playbook, one host), {conf.stat().st_size / 1024:.0f} KiB, "
              f"{len(lines)} lines, {node_lines} NodeName lines")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
