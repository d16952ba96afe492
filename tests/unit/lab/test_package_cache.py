"""The cluster package cache (roles/package_cache): its seeding script against a stand-in
for devpi-server's JSON API, the lab's choice of wheels to upload, and where the lab and
the example inventory put the cache.

The stand-in answers like devpi-server 6.20 did when this was written (checked against a
real one on 127.0.0.1): a login token in result.password, X-Devpi-Auth, index creation
by root only (--restrict-modify root), uploads only by the index's owner, a project's
JSON listing its bases' files too (under /root/pypi/+f/), 200 for an identical re-upload
and 409 for a different file of the same name on a non-volatile index.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import importlib.util
import ipaddress
import json
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import pytest
import yaml

from tacc_lab import nodes
from tacc_lab.config import NODE_PACKAGE_CACHE, LabConfig
from tacc_lab.inventory import HEAD_GROUPS, InventoryNode, NodeHardware, render_inventory
from tacc_lab.releases import BOOKWORM, TRIXIE
from tacc_lab.state import NodeRecord
from tacc_lab.wheels import find_links_dirs, node_compatible, node_wheels
from tests.conftest import ROOT

SEED = ROOT / "roles/package_cache/files/devpi_seed.py"
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
ROOT_PW, USER_PW = "root-secret-never-shown", "tacc-secret-never-shown"  # test values


def load_seed():
    spec = importlib.util.spec_from_file_location("devpi_seed", SEED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- a stand-in for devpi-server -----------------------------------------------------


class FakeDevpi:
    def __init__(self) -> None:
        self.users = {"root": ROOT_PW}
        self.indexes: dict[str, dict] = {
            "root/pypi": {"type": "mirror", "bases": [], "volatile": False}
        }
        self.files: dict[str, dict[str, tuple[str, str, bytes]]] = {}  # index -> name -> ...
        self.tokens: dict[str, str] = {}
        self.log: list[tuple[str, str]] = []
        self.writes = 0

    def who(self, headers) -> str | None:
        raw = headers.get("X-Devpi-Auth")
        if not raw:
            return None
        user, _, token = base64.b64decode(raw).decode().partition(":")
        return user if self.tokens.get(token) == user else None

    def handle(self, method: str, path: str, headers, body: bytes) -> tuple[int, dict]:
        self.log.append((method, path))
        parts = [p for p in path.split("/") if p]
        who = self.who(headers)
        if path == "/+api":
            return 200, {"result": {"login": "/+login"}}
        if path == "/+login" and method == "POST":
            data = json.loads(body)
            if self.users.get(data["user"]) != data["password"]:
                return 401, {"message": f"user {data['user']!r} could not be authenticated"}
            token = hashlib.sha256(body).hexdigest()
            self.tokens[token] = data["user"]
            return 200, {"result": {"password": token, "expiration": 36000}}
        if len(parts) == 1:
            user = parts[0]
            if method == "GET":
                return (200, {"result": {"username": user}}) if user in self.users else (404, {})
            if who != "root" and not (method == "PATCH" and who == user):
                return 403, {"message": "forbidden"}
            if method == "PUT" and user not in self.users:
                self.users[user] = json.loads(body)["password"]
                self.writes += 1
                return 201, {}
            if method == "PATCH" and user in self.users:
                self.users[user] = json.loads(body)["password"]
                self.writes += 1
                return 200, {}
            return 409, {"message": "conflict"}
        name = "/".join(parts[:2])
        if len(parts) == 2 and method == "GET":
            if name not in self.indexes:
                return 404, {"message": f"no index {name}"}
            projects = sorted({p for p, _, _ in self.files.get(name, {}).values()})
            return 200, {"result": {**self.indexes[name], "projects": projects}}
        if len(parts) == 2 and method in ("PUT", "PATCH"):
            if who != "root":
                return 403, {"message": "forbidden"}
            if (method == "PUT") == (name in self.indexes):
                return 409, {"message": "conflict"}
            self.indexes[name] = json.loads(body)
            self.writes += 1
            return 200, {"result": self.indexes[name]}
        if len(parts) == 2 and method == "POST":
            return self.upload(name, who, headers, body)
        if len(parts) == 3 and method == "GET":
            project = parts[2]
            links = [
                {"href": f"http://x/root/pypi/+f/abc/{TORCH}", "hashes": {"sha256": "0" * 64}}
            ]  # a base's file of the same name: not this index's
            for filename, (proj, digest, _) in self.files.get(name, {}).items():
                if proj == project:
                    href = f"http://x/{name}/+f/{digest[:3]}/{filename}"
                    links.append({"href": href, "hashes": {"sha256": digest}})
            return 200, {"result": {"2.13.0": {"+links": links}}}
        if len(parts) == 4 and parts[2] == "+simple":
            return 200, {}
        return 404, {"message": "unknown path"}

    def upload(self, name: str, who, headers, body: bytes) -> tuple[int, dict]:
        if who != name.split("/")[0]:
            return 403, {"message": "no permission to submit"}
        raw = f"Content-Type: {headers['Content-Type']}\r\n\r\n".encode() + body
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
        form = {
            part.get_param("name", header="content-disposition"): part
            for part in message.iter_parts()
        }
        assert form[":action"].get_content().strip() == "file_upload"
        filename = form["content"].get_filename()
        content = form["content"].get_payload(decode=True)
        assert int(headers["Content-Length"]) == len(body)
        digest = hashlib.sha256(content).hexdigest()
        held = self.files.setdefault(name, {})
        if filename in held:
            if held[filename][1] == digest:
                return 200, {"message": "Upload of identical file to non volatile index."}
            return 409, {"message": "file already exists in non-volatile index"}
        project = form["name"].get_content().strip().lower().replace("_", "-")
        held[filename] = (project, digest, content)
        self.writes += 1
        return 200, {}


@pytest.fixture
def devpi():
    fake = FakeDevpi()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            status, answer = fake.handle(self.command, self.path, self.headers, body)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield fake
    server.shutdown()
    server.server_close()


def make_wheel(path: Path, payload: str = "x = 1\n") -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pkg/__init__.py", payload)
    return path


@pytest.fixture
def creds(tmp_path) -> Path:
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"root": ROOT_PW, "user": USER_PW}))
    path.chmod(0o600)
    return path


def seed(devpi, creds: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable,
        str(SEED),
        "--url",
        devpi.url,
        "--credentials",
        str(creds),
        "--user",
        "tacc",
        "--index",
        "cluster",
        "--wait",
        "5",
        *extra,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


# --- the seeding script ---------------------------------------------------------------


def test_seeding_creates_user_index_and_uploads_once(devpi, creds, tmp_path):
    wheel = make_wheel(tmp_path / TORCH)
    first = seed(devpi, creds, str(wheel))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == "changed"
    assert devpi.users["tacc"] == USER_PW
    # Only its owner uploads, packages and tox results alike.
    assert devpi.indexes["tacc/cluster"] == {
        "type": "stage",
        "bases": ["root/pypi"],
        "volatile": False,
        "acl_upload": ["tacc"],
        "acl_toxresult_upload": ["tacc"],
    }
    project, _digest, content = devpi.files["tacc/cluster"][TORCH]
    assert project == "torch" and content == wheel.read_bytes()
    assert ("GET", "/tacc/cluster/+simple/pip/") in devpi.log  # the mirror's warm-up
    # The mirror asks upstream for each project's page, never first for PyPI's whole
    # project list (a cold cache whose list fetch timed out called numpy missing).
    assert devpi.indexes["root/pypi"]["mirror_no_project_list"] is True
    assert devpi.indexes["root/pypi"]["type"] == "mirror"
    writes = devpi.writes
    again = seed(devpi, creds, str(wheel))
    assert (again.returncode, again.stdout) == (0, ""), again.stderr
    assert devpi.writes == writes  # idempotent: nothing written the second time
    for proc in (first, again):  # passwords never in its output
        assert ROOT_PW not in proc.stdout + proc.stderr
        assert USER_PW not in proc.stdout + proc.stderr


def test_check_mode_says_changed_and_writes_nothing(devpi, creds, tmp_path):
    wheel = make_wheel(tmp_path / TORCH)
    proc = seed(devpi, creds, "--check", str(wheel))
    assert (proc.returncode, proc.stdout) == (0, "changed\n"), proc.stderr
    assert "create user tacc" in proc.stderr and f"upload {TORCH}" in proc.stderr
    assert "set root/pypi to mirror_no_project_list=True" in proc.stderr
    assert devpi.writes == 0 and "tacc" not in devpi.users
    # A host not set up yet (no credentials, no server): everything would change.
    missing = seed(devpi, tmp_path / "nothing.json", "--check", str(wheel))
    assert (missing.returncode, missing.stdout) == (0, "changed\n")


def test_a_new_wheel_and_a_reset_password_are_put_right(devpi, creds, tmp_path):
    old = make_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl")
    assert seed(devpi, creds, str(old)).returncode == 0
    devpi.users["tacc"] = "someone-changed-it"
    new = make_wheel(tmp_path / "demo_pkg-2.0-py3-none-any.whl")
    proc = seed(devpi, creds, str(old), str(new))
    assert proc.stdout == "changed\n", proc.stderr
    assert "set tacc's password" in proc.stderr
    assert "demo_pkg-1.0-py3-none-any.whl" not in proc.stderr  # already held
    assert devpi.users["tacc"] == USER_PW
    assert set(devpi.files["tacc/cluster"]) == {old.name, new.name}


def test_a_changed_index_config_is_patched(devpi, creds):
    assert seed(devpi, creds).returncode == 0
    devpi.indexes["tacc/cluster"]["volatile"] = True
    proc = seed(devpi, creds)
    assert proc.stdout == "changed\n", proc.stderr
    assert devpi.indexes["tacc/cluster"]["volatile"] is False


@pytest.mark.bad_input
def test_a_different_file_of_the_same_name_is_refused_clearly(devpi, creds, tmp_path):
    wheel = make_wheel(tmp_path / TORCH)
    assert seed(devpi, creds, str(wheel)).returncode == 0
    make_wheel(wheel, payload="x = 2\n")
    proc = seed(devpi, creds, str(wheel))
    assert proc.returncode == 1
    assert "already holds a different" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.bad_input
def test_a_wrong_root_password_is_one_clear_error(devpi, creds):
    devpi.users["root"] = "created-with-another"
    proc = seed(devpi, creds)
    assert proc.returncode == 1
    assert proc.stderr.startswith("devpi_seed: error: devpi refused root's password")
    assert ROOT_PW not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("content", "expected"),
    [('{"root": "x"}', "non-empty 'root' and 'user'"), ("not json", "Expecting value")],
)
def test_bad_credentials_files_are_one_clear_error(devpi, tmp_path, content, expected):
    path = tmp_path / "credentials.json"
    path.write_text(content)
    proc = seed(devpi, path)
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.bad_input
def test_a_server_that_never_answers_is_one_clear_error(creds):
    proc = subprocess.run(
        [
            sys.executable,
            str(SEED),
            "--url",
            "http://127.0.0.1:9",
            "--credentials",
            str(creds),
            "--user",
            "tacc",
            "--index",
            "cluster",
            "--wait",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert "did not answer within 1 s" in proc.stderr and "Traceback" not in proc.stderr


def test_wheel_names_give_project_and_version():
    module = load_seed()
    assert module.wheel_name_version(Path(TORCH)) == ("torch", "2.13.0+cpu")
    assert module.wheel_name_version(Path("a_b-1.0-1-py3-none-any.whl")) == ("a_b", "1.0")
    with pytest.raises(module.SeedError, match="not a wheel file name"):
        module.wheel_name_version(Path("torch.tar.gz"))


# --- which host wheels the lab uploads ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        (TORCH, True),
        ("six-1.17.0-py2.py3-none-any.whl", True),
        ("numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
        ("cryptography-44.0.0-cp39-abi3-manylinux_2_34_x86_64.whl", True),
        ("old-1.0-py310-none-any.whl", True),
        ("numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl", False),  # another Python
        ("x-1.0-cp311-cp311-manylinux_2_39_x86_64.whl", False),  # newer glibc than 2.36
        ("x-1.0-cp311-cp311-manylinux_2_17_aarch64.whl", False),  # another CPU
        ("x-1.0-cp311-cp311-macosx_11_0_arm64.whl", False),
        ("x-1.0-py2-none-any.whl", False),
        ("x-1.0.tar.gz", False),
    ],
)
def test_only_wheels_bookworm_nodes_can_install_are_chosen(name, ok):
    bookworm = {"python": BOOKWORM.python, "glibc": BOOKWORM.glibc}
    assert node_compatible(name, machine="x86_64", **bookworm) is ok


def test_a_trixie_node_takes_python_3_13_wheels_and_not_3_11_ones():
    trixie = {"machine": "x86_64", "python": TRIXIE.python, "glibc": TRIXIE.glibc}
    assert not node_compatible(TORCH, **trixie)
    assert node_compatible("torch-2.13.0+cpu-cp313-cp313-manylinux_2_28_x86_64.whl", **trixie)
    assert node_compatible("x-1.0-cp313-cp313-manylinux_2_39_x86_64.whl", **trixie)
    assert node_compatible("six-1.17.0-py2.py3-none-any.whl", **trixie)


def test_find_links_come_from_pip_config_and_the_environment():
    config = (
        "global.cert='/etc/ssl/certs/ca-certificates.crt'\n"
        "global.extra-index-url='file:///opt/pypi/simple'\n"
        "global.find-links='/opt/wheels file:///srv/more%20wheels https://example.org/w'\n"
        ":env:.find-links='/opt/wheels'\n"
    )
    dirs = find_links_dirs(config, {"PIP_FIND_LINKS": "/env/wheels /opt/wheels"})
    assert dirs == [Path("/opt/wheels"), Path("/srv/more wheels"), Path("/env/wheels")]
    assert find_links_dirs("", {}) == []


def test_node_wheels_lists_compatible_files_of_existing_dirs(tmp_path):
    for name in (TORCH, "six-1.17.0-py2.py3-none-any.whl", "x-1-cp312-cp312-linux_x86_64.whl"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub.whl").mkdir()  # a directory, not a wheel
    bookworm = {"python": BOOKWORM.python, "glibc": BOOKWORM.glibc}
    found = node_wheels([tmp_path, tmp_path / "missing"], machine="x86_64", **bookworm)
    assert found == [str(tmp_path / "six-1.17.0-py2.py3-none-any.whl"), str(tmp_path / TORCH)]


# --- where the cache lives ------------------------------------------------------------


def lab_vars_and_groups(wheels=None) -> dict:
    nodes_ = [InventoryNode(f"n{i}", f"10.77.0.{10 + i}", i) for i in (1, 2, 3)]
    text = render_inventory(
        nodes_,
        ssh_key=Path("/k"),
        known_hosts=Path("/kh"),
        proxy_url="http://10.77.0.1:3128",
        lab_name="lab",
        hardware=NodeHardware(cpus=2, memory_mb=4000),
        subnet="10.77.0.0/24",
        package_cache_wheels=wheels,
    )
    return yaml.safe_load(text)["all"]


def test_the_lab_runs_the_cache_on_its_head_node_with_the_host_wheels():
    lab = lab_vars_and_groups([f"/opt/wheels/{TORCH}"])
    assert "package_cache" in HEAD_GROUPS
    assert list(lab["children"]["package_cache"]["hosts"]) == ["n1"]
    assert lab["vars"]["package_cache_wheels"] == [f"/opt/wheels/{TORCH}"]
    assert lab["vars"]["package_cache_dir"] == NODE_PACKAGE_CACHE
    assert lab_vars_and_groups()["vars"]["package_cache_wheels"] == []


def test_the_example_inventory_and_site_playbook_have_the_cache():
    example = yaml.safe_load((ROOT / "inventory/example/hosts.yml").read_text())
    assert list(example["all"]["children"]["package_cache"]["hosts"]) == ["ctl1"]
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    names = [play["name"] for play in plays]
    cache = names.index("Cluster package cache")
    assert cache < names.index("Node agent")
    assert plays[cache]["hosts"] == "package_cache"
    assert plays[cache]["roles"] == [{"role": "package_cache"}]


def agent_index(groups: dict, **variables) -> str:
    """tacc_agent_package_index's default, rendered like Ansible renders it."""
    defaults = yaml.safe_load((ROOT / "roles/tacc_agent/defaults/main.yml").read_text())
    # Ansible renders variables without HTML escaping.
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701
    template = env.from_string(defaults["tacc_agent_package_index"])
    return template.render(groups=groups, **variables).strip()


def test_the_agent_builds_from_the_cache_when_the_inventory_has_one():
    assert agent_index({"package_cache": ["ctl1"]}) == "http://ctl1:3141/tacc/cluster/+simple/"
    assert agent_index({"package_cache": ["n1"]}, package_cache_port=8080) == (
        "http://n1:8080/tacc/cluster/+simple/"
    )
    assert agent_index({"all": ["n1"]}) == ""
    assert agent_index({"package_cache": []}) == ""


def test_the_cache_directory_is_per_lab_and_outside_the_state_directory(tmp_path):
    cfg = LabConfig.create(
        "pcache",
        "10.77.11.0/24",
        state_root=tmp_path / "state",
        package_cache_root=tmp_path / "cache",
    )
    assert cfg.package_cache_dir == tmp_path / "cache/pcache"
    assert not cfg.package_cache_dir.is_relative_to(cfg.state_dir)  # `down` removes that


def test_only_the_head_node_mounts_the_cache(tmp_path, monkeypatch):
    cfg = LabConfig(
        name="lab",
        subnet=ipaddress.IPv4Network("10.77.0.0/24"),
        state_root=tmp_path,
        package_cache_root=tmp_path / "cache",
    )
    started = []

    class Popen:
        def __init__(self, cmd, **kwargs):
            started.append(cmd)

    monkeypatch.setattr(nodes.subprocess, "Popen", Popen)
    for index in (1, 2):
        node = NodeRecord(name=f"n{index}", index=index, address=f"10.77.0.{10 + index}")
        paths = nodes.NodePaths(cfg, node.name)
        paths.base.mkdir(parents=True)
        nodes.start_node(cfg, node, paths)
    bind = f"--bind={tmp_path / 'cache/lab'}:{NODE_PACKAGE_CACHE}"
    assert bind in started[0] and not any(NODE_PACKAGE_CACHE in arg for arg in started[1])


def test_nodes_reach_their_peers_by_name_without_the_proxy(tmp_path):
    cfg = LabConfig(name="lab", subnet=ipaddress.IPv4Network("10.77.0.0/24"), state_root=tmp_path)
    cfg.ssh_dir.mkdir(parents=True)
    cfg.ssh_key.with_suffix(".pub").write_text("ssh-ed25519 AAAAlab lab\n")
    peers = [NodeRecord(name=f"n{i}", index=i, address=f"10.77.0.{10 + i}") for i in (1, 2)]
    paths = nodes.NodePaths(cfg, "n2")
    paths.base.mkdir(parents=True)
    paths.host_key.write_text("PRIVATE\n")
    paths.host_key.with_suffix(".pub").write_text("ssh-ed25519 AAAAn2 root@n2\n")
    nodes.configure_node(cfg, peers[1], paths, peers)
    environment = (paths.rootfs / "etc/environment").read_text()
    assert "no_proxy=localhost,127.0.0.1,10.77.0.0/24,n1,n2\n" in environment
