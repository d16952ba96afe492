"""`python -m tacc_lab.demo TASK_DIR`: submit a task to the lab with tcloud, wait for
it, and print its log (what `make demo` ends with).

tcloud gets its own config (.cache/tcloud/config.yaml): cluster "lab" is the login
node n1 as root, with the lab's key and known_hosts (host keys verified), and the
user directory on the lab's shared storage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tacc_lab.lab import find_node, resolve_config

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    task = Path(args[0] if args else ROOT / "examples/hello")
    lab = os.environ.get("TACC_LAB_NAME", "lab")
    cfg = resolve_config(lab, None, "10.77.0.0/24")
    login = find_node(cfg, "n1")
    env = {**os.environ, "TCLOUD_CONFIG": str(ROOT / ".cache/tcloud/config.yaml")}
    tcloud = str(BIN / "tcloud")
    subprocess.run(
        [
            tcloud,
            "config",
            "add",
            "lab",
            "--host",
            login.address,
            "--user",
            "root",
            "--key",
            str(cfg.ssh_key),
            "--known-hosts",
            str(cfg.known_hosts),
            "--userdir",
            "/shared/tcloud/root",
        ],
        env=env,
        check=True,
    )
    proc = subprocess.run(
        [tcloud, "submit", "--json", str(task)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr, end="")
        return proc.returncode
    job = json.loads(proc.stdout)
    print(f"submitted job {job['job']}: sent {job['blobs_sent']} file(s), workdir {job['workdir']}")
    ssh = [str(BIN / "tacc-lab"), "--name", lab, "ssh", "n1"]
    deadline = time.monotonic() + 120
    while subprocess.run(
        [*ssh, "squeue", "-h", "-j", job["job"]], capture_output=True, text=True
    ).stdout.strip():
        if time.monotonic() > deadline:
            print("job still queued or running after 120 s", file=sys.stderr)
            return 1
        time.sleep(1)
    log = f"{job['workdir']}/logs/{job['name']}-{job['job']}.out"
    print(f"--- {log}")
    return subprocess.run([*ssh, "cat", log]).returncode


if __name__ == "__main__":
    sys.exit(main())
