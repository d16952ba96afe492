"""`python -m tacc_lab.demo TASK_DIR`: what `make demo` ends with. As the lab researcher
alice (`eval "$(tacc-lab user alice)"`), submit a task with tcloud, follow its logs from
every node until it ends, and show its final status.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def researcher_env(lab: str, user: str) -> dict[str, str]:
    """The environment `eval "$(tacc-lab user USER)"` would give."""
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, "user", user],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    env = dict(os.environ)
    for line in proc.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    return env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    task = Path(args[0] if args else ROOT / "examples/hello")
    lab = os.environ.get("TACC_LAB_NAME", "lab")
    env = researcher_env(lab, "alice")
    tcloud = str(BIN / "tcloud")
    proc = subprocess.run(
        [tcloud, "submit", "--json", str(task)], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr, end="")
        return proc.returncode
    job = json.loads(proc.stdout)
    print(f"$ tcloud submit {task}  (as alice)")
    print(f"submitted job {job['job_id']}: sent {job['blobs_sent']} file(s) to {job['workdir']}")
    print(f"$ tcloud logs -f {job['job_id']}")
    sys.stdout.flush()
    subprocess.run([tcloud, "logs", "-f", job["job_id"]], env=env, check=False, timeout=300)
    print(f"$ tcloud status {job['job_id']}")
    sys.stdout.flush()
    status = subprocess.run([tcloud, "status", job["job_id"]], env=env, check=False)
    return status.returncode


if __name__ == "__main__":
    sys.exit(main())
