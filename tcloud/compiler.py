"""Layer 2, the compiler: a TaskSpec becomes a self-contained task instruction, the
manifest of its files + a generated Slurm batch script + its environment, with a digest
that is identical for identical inputs on any machine (no timestamps, no local paths).

The batch script runs in the job's own workdir, which the cluster side builds from its
content store ($TACC_WORKDIR, never shared with another job); $TACC_USERDIR is the
user's persistent directory.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

from tcloud.manifest import Entry, Hasher, build_manifest, sha256_file
from tcloud.schema import TaskSpec

FORMAT = "tcloud-instruction/1"
# --label prefixes every output line with the task's rank (one task per node), which
# `tcloud logs --node N` filters on.
SRUN = "srun --kill-on-bad-exit=1 --label"
TRANSPORT_ENV = {
    "auto": {},
    "rdma": {"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB"},
    "tcp": {"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"},
}


@dataclass(frozen=True)
class Instruction:
    manifest: dict[str, Entry]
    script: str
    environment: dict
    digest: str

    def manifest_json(self) -> dict:
        return manifest_json(self.manifest)


def manifest_json(manifest: dict[str, Entry]) -> dict:
    """path -> [sha256, size, mode]: what the digest covers and what the cluster stores."""
    return {path: [e.sha256, e.size, e.mode] for path, e in manifest.items()}


def env_digest(requirements: list[str]) -> str:
    """Names the cached venv: same requirements, same venv, on every node."""
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]


def sbatch_lines(task: TaskSpec) -> list[str]:
    res = task.resources
    options = {
        "job-name": task.name,
        "nodes": res["nodes"],
        "ntasks-per-node": 1,
        "cpus-per-task": res["cpus"],
        "mem": res["mem"],
        "time": res["time"],
        "output": "logs/%x-%j.out",
        # `tcloud halt` requeues the job on hold; Slurm requeues only requeueable jobs.
        "requeue": None,
    }
    if res["gpus_per_node"]:
        options["gpus-per-node"] = res["gpus_per_node"]
    for key in ("partition", "qos", "account"):
        if res.get(key):
            options[key] = res[key]
    if res.get("priority") is not None:
        options["nice"] = res["priority"]
    options.update(res.get("sbatch") or {})
    return [
        f"#SBATCH --{key}" if value is None else f"#SBATCH --{key}={value}"
        for key, value in options.items()
    ]


def launch(task: TaskSpec, line: str) -> str:
    """One run line, started on every node by the chosen launcher."""
    quoted = shlex.quote(line)
    launcher = task.runtime["launcher"]
    if launcher == "none":
        return f"bash -euo pipefail -c {quoted}"
    if launcher == "torchrun":
        gpus = max(task.resources["gpus_per_node"], 1)
        torch = (
            f"torchrun --nnodes=$SLURM_NNODES --nproc-per-node={gpus} "
            '--rdzv-backend=c10d --rdzv-endpoint="$TACC_MASTER_ADDR:29500"'
        )
        return f"{SRUN} bash -euo pipefail -c {shlex.quote(torch + ' ' + line)}"
    if launcher == "mpirun":
        return f"mpirun bash -euo pipefail -c {quoted}"
    return f"{SRUN} bash -euo pipefail -c {quoted}"


def render_script(task: TaskSpec) -> str:
    env = task.environment
    lines = ["#!/bin/bash", *sbatch_lines(task), "set -euo pipefail", ""]
    lines.append('cd "$TACC_WORKDIR/code"')
    lines.append('export TACC_DATASETS="$TACC_WORKDIR/datasets"')
    lines.append('TACC_MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)')
    lines.append("export TACC_MASTER_ADDR")
    variables = {**TRANSPORT_ENV[task.runtime["transport"]], **env["env"]}
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(variables.items())]
    lines += [f"module load {shlex.quote(module)}" for module in env["modules"]]
    for dataset in task.datasets:
        if dataset.cluster:
            target = shlex.quote(dataset.cluster)
            link = '"$TACC_WORKDIR"/' + shlex.quote(f"datasets/{dataset.name}")
            lines.append(f'mkdir -p "$TACC_WORKDIR/datasets" && ln -sfn {target} {link}')
    if env["requirements"]:
        venv = f'"$TACC_USERDIR/.tcloud/venvs/{env_digest(env["requirements"])}"'
        lines.append(f"tacc-env-ensure {venv} requirements.tcloud.txt")
        lines.append(f"source {venv}/bin/activate")
    if task.setup:
        lines += ["", "# setup (once, on the first node)"]
        lines += [f"bash -euo pipefail -c {shlex.quote(line)}" for line in task.setup]
    lines += ["", "# run (each line on every node)"]
    lines += [launch(task, line) for line in task.run]
    return "\n".join(lines) + "\n"


def digest_of(manifest: dict[str, Entry], script: str, environment: dict) -> str:
    canonical = json.dumps(
        {
            "format": FORMAT,
            "manifest": manifest_json(manifest),
            "script": script,
            "environment": environment,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def compile_task(task: TaskSpec, hasher: Hasher = sha256_file) -> Instruction:
    manifest = build_manifest(task, hasher)
    script = render_script(task)
    environment = {
        "requirements": list(task.environment["requirements"]),
        "outputs": list(task.outputs),
        "name": task.name,
    }
    return Instruction(manifest, script, environment, digest_of(manifest, script, environment))
