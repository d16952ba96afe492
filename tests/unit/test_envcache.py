"""Environments built with uv from a package index: once under a lock, locked, keyed by
the interpreter and platform, and rebuilt from a past lock (tcloud rerun). The index is
a PEP 503 directory of tiny wheels made here (file://), so nothing leaves the machine."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks import envcache, records, rerun, workspace
from tacc_contract.instruction import code_digest
from tacc_contract.schema import pinned_requirement
from tests.unit.agent_jobs import make_job


def wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel: one module `<name>.py` holding its version."""
    module = name.replace("-", "_")
    path = directory / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{module}.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as archive:
        for arcname, text in files.items():
            archive.writestr(arcname, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{arcname},sha256={digest.decode()},{len(text.encode())}")
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index of `wheels` under root/simple; its file:// URL."""
    for path in wheels:
        project = path.name.split("-")[0].replace("_", "-")
        page = root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        links = page.read_text() if page.exists() else ""
        page.write_text(links + f'<a href="../../files/{path.name}">{path.name}</a>\n')
    return (root / "simple").as_uri() + "/"


@pytest.fixture
def index(tmp_path) -> tuple[str, Path]:
    files = tmp_path / "index" / "files"
    files.mkdir(parents=True)
    wheels = [wheel(files, "tacc-probe", "1.0", ("tacc-dep",)), wheel(files, "tacc-dep", "2.0")]
    return simple_index(tmp_path / "index", wheels), files


def builder(url: str, tmp_path: Path) -> envcache.Builder:
    return envcache.Builder(python=sys.executable, uv=envcache.uv_binary(""), index=url,
                            cache_dir=tmp_path / "uv-cache")  # fmt: skip


def test_an_environment_is_locked_keyed_by_interpreter_and_recorded(index, tmp_path):
    url, _ = index
    lines: list[str] = []
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    env = envcache.ensure(user_dir, ["tacc-probe"], builder(url, tmp_path), "7", lines.append, 60)
    assert env["lock"] == ["tacc-dep==2.0", "tacc-probe==1.0"], lines
    assert env["requirements"] == ["tacc-probe"] and env["installer"].startswith("uv ")
    here = envcache.interpreter(sys.executable)
    assert (env["python"], env["platform"]) == (here.version, here.platform)
    assert env["digest"] == envcache.env_digest(["tacc-probe"], [], here)
    python = Path(env["path"]) / "bin" / "python"
    out = subprocess.run([python, "-c", "import tacc_probe; print(tacc_probe.VERSION)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "1.0"
    assert (Path(env["path"]) / envcache.LOCK_FILE).read_text().split() == env["lock"]
    # Another interpreter (or platform) is another environment.
    other = envcache.Interpreter(here.implementation, "3.12.1", here.platform)
    assert envcache.env_digest(["tacc-probe"], [], other) != env["digest"]


def test_an_environment_is_built_once_under_a_lock_and_then_reused(index, tmp_path):
    url, _ = index
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    script = (
        "import sys; from pathlib import Path; from tacc_agent.tasks import envcache; "
        f"b = envcache.Builder(sys.executable, envcache.uv_binary(''), {url!r}); "
        "envcache.ensure(Path(sys.argv[1]), ['tacc-probe'], b, sys.argv[2], print, 300)"
    )
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(user_dir), job], stdout=subprocess.PIPE, text=True
        )
        for job in ("101", "102")
    ]
    outputs = [racer.communicate(timeout=300)[0] for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), outputs
    text = "".join(outputs)
    assert text.count(": built in ") == 1 and text.count(": reused (built by job ") == 1
    (entry,) = envcache.listing(user_dir)
    assert entry["requirements"] == ["tacc-probe"] and entry["built_by_job"] in ("101", "102")


def test_a_lock_builds_exactly_its_versions_even_when_newer_ones_exist(index, tmp_path):
    url, files = index
    user_dir = tmp_path / "user"
    user_dir.mkdir()
    first = envcache.ensure(user_dir, ["tacc-probe"], builder(url, tmp_path), "1", print, 60)
    simple_index(tmp_path / "index", [wheel(files, "tacc-probe", "1.1", ("tacc-dep",))])
    fresh = envcache.ensure(user_dir, ["tacc-probe==1.1"], builder(url, tmp_path), "2", print, 60)
    assert "tacc-probe==1.1" in fresh["lock"]
    again = envcache.ensure(user_dir, ["tacc-probe"], builder(url, tmp_path), "3", print, 60,
                            lock=first["lock"])  # fmt: skip
    assert again["lock"] == first["lock"] == ["tacc-dep==2.0", "tacc-probe==1.0"]
    assert again["digest"] != first["digest"]  # locked: its own environment


def test_a_failed_build_leaves_nothing_that_looks_ready(index, tmp_path):
    url, _ = index
    lines: list[str] = []
    with pytest.raises(AgentError, match="building the environment failed"):
        envcache.ensure(tmp_path, ["surely-not-a-package-xyz"], builder(url, tmp_path), "1",
                        lines.append, 60)  # fmt: skip
    assert envcache.listing(tmp_path) == []
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_a_rerun_keeps_the_files_and_pins_the_locked_versions(tmp_path):
    task = {"name": "t", "run": ["python -c 'import tacc_probe'"],
            "environment": {"requirements": ["tacc-probe"]}}  # fmt: skip
    _, job_dir = make_job(tmp_path, task, {"train.py": "print(1)\n"})
    with pytest.raises(Rejected, match="never built its environment"):
        rerun.rerun_document("5", job_dir)
    envcache.record_for_job(job_dir, {"digest": "d", "lock": ["tacc-probe==1.0"]})
    document = rerun.rerun_document("5", job_dir)
    past = records.read_json(job_dir / "instruction.json")
    assert document["task"]["environment"]["lock"] == ["tacc-probe==1.0"]
    assert document["rerun_of"] == "5" and document["manifest"] == past["manifest"]
    assert code_digest(document) == code_digest(past)
    assert json.loads(json.dumps(document))["task"]["run"] == task["run"]


def test_a_lock_may_pin_direct_references_but_not_options():
    assert pinned_requirement("torch==2.13.0+cpu") is None
    assert pinned_requirement("pkg @ https://example.org/pkg-1.0-py3-none-any.whl") is None
    for bad in ("--index-url http://evil/simple", "-r /etc/passwd", "torch>=2", "torch"):
        assert pinned_requirement(bad), bad


@pytest.mark.security
@pytest.mark.parametrize("path", ["code/../../escape", "../x", "/etc/passwd", "outputs/x"])
def test_a_rerun_refuses_a_manifest_path_outside_the_job(tmp_path, path):
    # The user may edit their past job's instruction.json: a rerun commits its manifest
    # through the same path checks as an upload (the old code linked it unchecked).
    task = {"name": "t", "run": ["true"]}
    user_dir, job_dir = make_job(tmp_path, task, {"train.py": "print(1)\n"})
    document = records.read_json(job_dir / "instruction.json")
    entry = next(iter(document["manifest"].values()))
    document["manifest"] = {path: entry}
    (job_dir / "instruction.json").write_text(json.dumps(document))
    workspace.register(user_dir, "5", job_dir)
    with pytest.raises(Rejected, match="must be a relative path under code or datasets"):
        rerun.rerun(user_dir, "5", AgentConfig())
    assert not (tmp_path / "escape").exists()
