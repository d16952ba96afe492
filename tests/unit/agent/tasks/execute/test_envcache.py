"""Environments built with uv from a package index: once under a lock, locked, keyed by
the interpreter and platform, and rebuilt from a past lock (tcloud rerun). The index is
a PEP 503 directory of tiny wheels made here (file://), so nothing leaves the machine."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute import envcache, package_index
from tacc_agent.tasks.jobs import records, rerun
from tacc_agent.tasks.store import workspace
from tacc_contract.instruction import code_digest
from tacc_contract.schema import pinned_requirement
from tests.unit.agent_jobs import make_job

SEED_PACKAGES = ("pip", "setuptools", "wheel")


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
    # What `uv venv --seed` installs, from the same index (stand-ins: nothing leaves the
    # machine).
    wheels += [wheel(files, name, "99.0") for name in SEED_PACKAGES]
    return simple_index(tmp_path / "index", wheels), files


def builder(url: str, tmp_path: Path) -> envcache.Builder:
    return envcache.Builder(
        python=sys.executable, uv=envcache.uv_binary(""), index=url, cache_dir=tmp_path / "uv-cache"
    )


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
    out = subprocess.run(
        [python, "-c", "import tacc_probe; print(tacc_probe.VERSION)"],
        capture_output=True,
        text=True,
        check=True,
    )
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
        "import sys; from pathlib import Path; from tacc_agent.tasks.execute import envcache; "
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
    again = envcache.ensure(
        user_dir, ["tacc-probe"], builder(url, tmp_path), "3", print, 60, lock=first["lock"]
    )
    assert again["lock"] == first["lock"] == ["tacc-dep==2.0", "tacc-probe==1.0"]
    assert again["digest"] != first["digest"]  # locked: its own environment


def test_a_failed_build_leaves_nothing_that_looks_ready(index, tmp_path):
    url, _ = index
    lines: list[str] = []
    with pytest.raises(AgentError, match="building the environment failed"):
        envcache.ensure(
            tmp_path, ["surely-not-a-package-xyz"], builder(url, tmp_path), "1", lines.append, 60
        )
    assert envcache.listing(tmp_path) == []
    assert [p.name for p in (tmp_path / "envs").iterdir() if p.is_dir()] == []


def test_a_rerun_keeps_the_files_and_pins_the_locked_versions(tmp_path):
    task = {
        "name": "t",
        "run": ["python -c 'import tacc_probe'"],
        "environment": {"requirements": ["tacc-probe"]},
    }
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


# --- a package cache that cannot reach upstream (devpi-server's answers) ---------------


class ColdCache:
    """devpi's answers for the index tacc/cluster (base root/pypi) served from the
    `index` fixture's directory. A project in `cold` is one the mirror has not fetched
    yet: the cluster index says it does not exist and the mirror answers 502, until the
    mirror has been asked `cold_for` times (its background fetch is then done)."""

    def __init__(self, root: Path, cold: set[str], cold_for: int) -> None:
        self.root, self.cold, self.cold_for = root, set(cold), cold_for
        self.asked: Counter[str] = Counter()

    def answer(self, path: str) -> tuple[int, bytes]:
        self.asked[path] += 1
        if path == "/tacc/cluster":
            return 200, json.dumps({"result": {"type": "stage", "bases": ["root/pypi"]}}).encode()
        if "/files/" in path:
            return 200, (self.root / "files" / path.rsplit("/", 1)[-1]).read_bytes()
        index, _, project = path.strip("/").partition("/+simple/")
        page = self.root / "simple" / project / "index.html"
        if project in self.cold or not page.exists():
            if index == "root/pypi" and project in self.cold:
                if sum(n for p, n in self.asked.items() if p.startswith("/root/")) >= self.cold_for:
                    self.cold.discard(project)  # fetched upstream in the background
                return 502, f"timeout after 20 seconds while getting data for {project!r}".encode()
            return 404, f"The project {project} does not exist.".encode()
        return 200, page.read_text().replace("../../files/", "/tacc/cluster/files/").encode()


@pytest.fixture
def cold_cache(index, tmp_path, monkeypatch):
    monkeypatch.setattr(envcache, "RETRY_DELAYS", (0.0, 0.0, 0.0))
    cache = ColdCache(tmp_path / "index", set(), 0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = cache.answer(self.path)
            self.send_response(status)
            kind = "application/octet-stream" if "/files/" in self.path else "text/html"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache.url = f"http://127.0.0.1:{server.server_address[1]}/tacc/cluster/+simple/"
    yield cache
    server.shutdown()
    server.server_close()


@pytest.mark.fault
def test_a_cache_that_could_not_reach_upstream_is_asked_again_not_called_missing(
    cold_cache, tmp_path
):
    # The first submit after make demo: devpi's mirror had not fetched tacc-dep from
    # upstream yet, so its cluster index said "does not exist" (the old code failed the
    # job there: `uv pip compile exited 1`).
    cold_cache.cold, cold_cache.cold_for = {"tacc-dep"}, 2
    lines: list[str] = []
    env = envcache.ensure(
        tmp_path, ["tacc-probe"], builder(cold_cache.url, tmp_path), "1", lines.append, 60
    )
    assert env["lock"] == ["tacc-dep==2.0", "tacc-probe==1.0"], lines
    retries = [line for line in lines if "trying again" in line]
    assert len(retries) == 2, lines
    assert "tacc-dep said missing, then" in retries[0] and "HTTP 502" in retries[0], retries
    assert cold_cache.asked["/root/pypi/+simple/tacc-dep/"] == 2
    # The venv's seed packages come from the cache too, not from PyPI behind its back.
    assert cold_cache.asked["/tacc/cluster/+simple/pip/"] >= 1


@pytest.mark.fault
def test_a_cache_that_stays_unreachable_fails_naming_it_and_saying_try_again(cold_cache, tmp_path):
    cold_cache.cold, cold_cache.cold_for = {"tacc-dep"}, 1000
    lines: list[str] = []
    with pytest.raises(AgentError) as failed:
        envcache.ensure(
            tmp_path, ["tacc-probe"], builder(cold_cache.url, tmp_path), "1", lines.append, 60
        )
    message = str(failed.value)
    assert f"the package cache {cold_cache.url} could not get" in message, message
    assert "upstream unreachable, try again" in message and "after 4 tries" in message
    assert "has no project" not in message
    assert envcache.listing(tmp_path) == []


def test_a_project_missing_everywhere_fails_at_once(cold_cache, tmp_path):
    with pytest.raises(AgentError) as failed:
        envcache.ensure(
            tmp_path,
            ["surely-not-a-package-xyz"],
            builder(cold_cache.url, tmp_path),
            "1",
            print,
            60,
        )
    message = str(failed.value)
    assert f"the package cache {cold_cache.url} has no project surely-not-a-package-xyz" in message
    assert cold_cache.asked["/root/pypi/+simple/surely-not-a-package-xyz/"] == 1  # no retry


def test_uv_output_is_read_for_missing_projects_and_unreachable_caches():
    resolve = (
        "error: No solution found when resolving dependencies\n  cause: Because numpy was "
        "not found in the package registry and you require numpy, we can conclude that ..."
    )
    assert package_index.missing_projects(resolve) == ["numpy"]
    assert package_index.missing_projects("The project Foo_Bar does not exist.") == ["foo-bar"]
    fetch = (
        "error: Request failed after 3 retries in 7.0s\n"
        "  cause: Failed to fetch: http://n1:3141/tacc/cluster/+simple/torch/\n"
        "  cause: HTTP status server error (502 Bad Gateway) for url (http://n1:3141/...)"
    )
    assert package_index.missing_projects(fetch) == []
    found = package_index.diagnose("http://n1:3141/tacc/cluster/+simple/", fetch)
    assert found is not None and found.transient and "502 Bad Gateway" in found.detail
    conflict = "Because you require a==1 and a==2, we can conclude that ... unsatisfiable."
    assert package_index.diagnose("http://n1:3141/tacc/cluster/+simple/", conflict) is None


def test_a_probe_asks_the_index_then_its_bases():
    answers = {
        "http://c:3141/tacc/cluster/+simple/numpy/": (404, "The project numpy does not exist."),
        "http://c:3141/tacc/cluster": (200, json.dumps({"result": {"bases": ["root/pypi"]}})),
        "http://c:3141/root/pypi/+simple/numpy/": (None, "timed out"),
    }
    asked: list[str] = []

    def get(url: str, accept: str):
        asked.append(url)
        return answers[url]

    verdict, detail = package_index.probe("http://c:3141/tacc/cluster/+simple/", "NumPy", get)
    assert verdict is package_index.Verdict.UNREACHABLE and "no answer timed out" in detail
    assert asked == list(answers)
    # devpi's error page, on one line.
    page = (
        "<html>\n <head>\n  <title>502 Bad Gateway</title>\n </head>\n <body>\n  <h1>502 "
        "Bad Gateway</h1>\n  -1 status on GET URL(&#x27;https://pypi.org/simple/six/&#x27;)"
        "<br/><br/>\n </body>\n</html>"
    )
    answers["http://c:3141/root/pypi/+simple/numpy/"] = (502, page)
    _, detail = package_index.probe("http://c:3141/tacc/cluster/+simple/", "numpy", get)
    assert detail == (
        "http://c:3141/root/pypi/+simple/numpy/: HTTP 502 502 Bad Gateway "
        "-1 status on GET URL('https://pypi.org/simple/six/')"
    )
    # Not a devpi index: its own 404 is the answer.
    answers["https://pypi.org/simple/numpy/"] = (404, "Not Found")
    verdict, _ = package_index.probe("https://pypi.org/simple/", "numpy", get)
    assert verdict is package_index.Verdict.MISSING
