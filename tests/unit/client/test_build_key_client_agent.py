"""The build key is the same on both sides for the same content (review of issue 19,
finding 2): tcloud computes it at submit from its manifest (sha256 and mode of each
file), the agent again from the job's files and the manifest in instruction.json; a
copied file's executable bit is part of it on both sides (the agent copies the file 0755
or 0644), so `chmod +x` gives another image instead of reusing the old one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.tasks.images import build as agent_build
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task

REFERENCE = "n1:5000/tacc/base:bookworm"
PINNED = REFERENCE + "@sha256:" + "a" * 64
CONTAINERFILE = (
    f"FROM {REFERENCE}\n"
    "ARG V=1\n"
    "ENV A=$X B=\\$X C='${X:-d}' D=$V\n"
    "WORKDIR /opt/$X\n"
    "COPY tool.sh data/ ./\n"
    'RUN ["sh", "-c", "./tool.sh"]\n'
)


def project(root: Path) -> Path:
    (root / "env" / "data").mkdir(parents=True)
    (root / "tcloud.yaml").write_text("name: t\nrun: [./env/tool.sh]\nimage:\n  build: env\n")
    (root / "env" / "Containerfile").write_text(CONTAINERFILE)
    (root / "env" / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "env" / "data" / "x.txt").write_text("x\n")
    (root / "notes.md").write_text("not copied\n")
    return root


def submitted(task_dir: Path) -> dict:
    """The instruction document tcloud writes, the base pinned as the cluster would."""
    task = load_task(task_dir / "tcloud.yaml")
    return compile_task(task, plugins=[], resolve_image=lambda _ref: PINNED).document


def agent_checks(tmp_path: Path, task_dir: Path, document: dict) -> None:
    """What the agent does before building: re-parse the job's build file and recompute
    the key from the job's files and manifest; AgentError on a mismatch."""
    job_dir = tmp_path / "job"
    shutil.rmtree(job_dir, ignore_errors=True)
    shutil.copytree(task_dir, job_dir / "code")
    (job_dir / "instruction.json").write_text(json.dumps(document))
    entry = document["task"]["image_build"]
    build = agent_build.read_build_file(job_dir, entry)
    agent_build.check_key(build, entry, agent_build.job_context(job_dir, entry))


@pytest.mark.security
def test_client_and_agent_compute_the_same_key_from_the_same_files(tmp_path):
    task_dir = project(tmp_path / "p")
    document = submitted(task_dir)
    entry = document["task"]["image_build"]
    assert entry["file"] == "env/Containerfile" and entry["context"] == "env"
    agent_checks(tmp_path, task_dir, document)  # no mismatch
    (task_dir / "env" / "tool.sh").chmod(0o755)
    executable = submitted(task_dir)
    assert executable["task"]["image_build"]["key"] != entry["key"]
    agent_checks(tmp_path, task_dir, executable)


@pytest.mark.security
def test_the_agent_keys_the_mode_it_applies(tmp_path):
    """A manifest whose mode of a copied file differs from what tcloud keyed: refused."""
    task_dir = project(tmp_path / "p")
    document = submitted(task_dir)
    document["manifest"]["code/env/tool.sh"][2] = 0o755
    with pytest.raises(AgentError, match="does not match its key"):
        agent_checks(tmp_path, task_dir, document)
    # The mode of a file the build does not copy: no matter.
    document = submitted(task_dir)
    document["manifest"]["code/notes.md"][2] = 0o755
    agent_checks(tmp_path, task_dir, document)
