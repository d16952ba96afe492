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

from tacc_lab.releases import RELEASES, release_named
from tacc_lab.wheels import host_has_torch_for

ROOT = Path(__file__).resolve().parents[3]  # the repository: packages/ops/tacc_lab/demo.py
BIN = Path(sys.executable).parent


def researcher_env(lab: str, user: str) -> dict[str, str]:
    """The environment `eval "$(tacc-lab user USER)"` would give."""
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, "user", user],
        capture_output=True,
        text=True,
        check=True,
    )
    env = dict(os.environ)
    for line in proc.stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    return env


# The daemons each node group runs once site.yml has provisioned it.
SERVICES_BY_GROUP = {
    "slurm_controller": ["slurmctld"],
    "slurm_compute": ["slurmd"],
    "nfs_server": ["nfs-ganesha"],
}
EVERY_NODE = ["sshd", "munge", "tacc-agent"]


def lab_json(lab: str, *argv: str) -> dict:
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, *argv], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def services_on(lab: str, node: str, services: list[str]) -> str:
    proc = subprocess.run(
        [str(BIN / "tacc-lab"), "--name", lab, "ssh", node, "systemctl", "is-active", *services],
        capture_output=True,
        text=True,
        check=False,
    )
    states = proc.stdout.split()
    return " ".join(
        name if state == "active" else f"{name}({state})"
        for name, state in zip(services, states + ["?"] * len(services), strict=False)
    )


def summary(lab: str, info: dict) -> str:
    """What ran where: every node's role groups and daemons, and the job's ranks."""
    ranks: dict[str, list[str]] = {}
    for rank in info.get("nodes", []):
        code = "" if rank.get("exit_code") is None else f" exit {rank['exit_code']}"
        ranks.setdefault(rank["host"], []).append(f"rank {rank['rank']} {rank['state']}{code}")
    lines = [f"== summary: what ran where (lab {lab!r}) =="]
    for node in lab_json(lab, "status", "--json")["nodes"]:
        wanted = EVERY_NODE + [s for g in node["groups"] for s in SERVICES_BY_GROUP.get(g, [])]
        lines.append(f"{node['name']}  {node['address']}  {','.join(node['groups'])}")
        lines.append(f"    daemons: {services_on(lab, node['name'], wanted)}")
        if node["name"] in ranks:
            lines.append(f"    job {info['job_id']}: {'; '.join(ranks[node['name']])}")
    lines.append(
        f"job {info['job_id']} {info['name']} (alice): {info['state']}, "
        f"files in {info['workdir']} on /shared"
    )
    return "\n".join(lines)


NEXT_EXAMPLE = "examples/pytorch-ddp"
# Without a CPU torch wheel for the nodes' Python (a Debian 12 host's is for 3.11 only, and
# PyPI has only the CUDA build), the next example is one that needs no torch.
NO_TORCH_EXAMPLE = "examples/mpi-allreduce"


def next_steps(lab: str, root: Path, cwd: Path, torch_for: str = "") -> str:
    """The demo's last lines: the lab stays up, and how to submit the next example as
    alice from a shell of the user's own (the venv's tcloud, alice's tcloud config).
    `torch_for`: why the nodes get no CPU torch ("" when they do)."""
    default = lab == "lab"
    down = "make lab-down" if default else f"make lab-down LAB_NAME={shlex.quote(lab)}"
    user = "tacc-lab user alice" if default else f"tacc-lab --name {shlex.quote(lab)} user alice"
    here = "" if cwd.resolve() == root.resolve() else f"cd {shlex.quote(str(root))}; "
    example = NO_TORCH_EXAMPLE if torch_for else NEXT_EXAMPLE
    lines = [
        f"demo done: the lab stays up ({down} removes it)",
        f'next, as alice: {here}source .venv/bin/activate; eval "$({user})"',
        f"  then: tcloud submit {example}   (then tcloud logs -f JOB, JOB the id it prints)",
    ]
    if torch_for:
        lines.insert(2, f"  ({NEXT_EXAMPLE} needs {torch_for})")
    return "\n".join(lines)


def missing_torch(lab: str) -> str:
    """Why the lab's nodes get no CPU torch wheel from this machine; "" when they do."""
    release = release_named(lab_json(lab, "status", "--json")["os"])
    if host_has_torch_for(release):
        return ""
    others = [other.codename for other in RELEASES.values() if host_has_torch_for(other)]
    python = ".".join(map(str, release.python))
    hint = (
        f"; `make lab-down` then `TACC_LAB_OS={others[0]} make demo` boots nodes it fits"
        if others
        else ""
    )
    return (
        f"a CPU torch wheel for {release.codename}'s Python {python} in this machine's pip "
        f"find-links, which has none{hint}"
    )


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
    if status.returncode != 0:
        return status.returncode
    info = subprocess.run(
        [tcloud, "status", "--json", job["job_id"]],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    completed = info.returncode == 0 and json.loads(info.stdout)["state"] == "COMPLETED"
    if info.returncode == 0:
        print(summary(lab, json.loads(info.stdout)))
    if completed:
        print(next_steps(lab, ROOT, Path.cwd(), missing_torch(lab)))
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
