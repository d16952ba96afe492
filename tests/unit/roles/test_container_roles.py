"""roles/image_registry and roles/container_runtime without a lab: the seeding script
pushes an archive only while the registry lacks its digest (and never in check mode),
through a writable loopback instance it starts only for the push and stops after, the
registries file is valid TOML naming the cluster registry, insecure only when asked."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from tests.conftest import ROOT

SEED = ROOT / "roles/image_registry/files/image_seed.py"
MANIFEST = b'{"schemaVersion":2,"layers":[]}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()

# A stand-in for skopeo: `inspect --raw oci-archive:...` prints the archive's manifest,
# `inspect --raw docker://...` prints what the fake registry holds (a file) or says
# "manifest unknown", `copy` stores the archive's manifest there; every call is logged.
FAKE_SKOPEO = """#!/bin/sh
echo "$*" >> "$FAKE_DIR/calls"
last=""; for a in "$@"; do last="$a"; done
case "$1" in
inspect)
  case "$last" in
  oci-archive:*) cat "${last#oci-archive:}";;
  docker://*) if [ -f "$FAKE_DIR/served" ]; then cat "$FAKE_DIR/served";
              else echo "manifest unknown: manifest unknown" >&2; exit 1; fi;;
  esac;;
copy)
  if [ -n "$FAKE_HANG" ]; then sleep 60; fi
  for a in "$@"; do
    case "$a" in oci-archive:*) cp "${a#oci-archive:}" "$FAKE_DIR/served";; esac
  done;;
esac
"""


class V2(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    """Something answering /v2/ on the loopback (the script waits for it)."""
    server = HTTPServer(("127.0.0.1", 0), V2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


# A stand-in for `docker-registry serve CONFIG`: answers /v2/ on the config's http.addr
# until it is terminated, logging "serve CONFIG" and "stopped" to the calls.
FAKE_REGISTRY = f"""#!{sys.executable}
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class V2(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a): pass
calls = os.path.join(os.environ["FAKE_DIR"], "calls")
with open(calls, "a") as f: f.write(" ".join(sys.argv[1:]) + "\\n")
host, port = json.load(open(sys.argv[2]))["addr"].rsplit(":", 1)
server = HTTPServer((host, int(port)), V2)
def stop(*_):
    with open(calls, "a") as f: f.write("stopped\\n")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
server.serve_forever()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("skopeo", FAKE_SKOPEO), ("docker-registry", FAKE_REGISTRY)):
        tool = bin_dir / name
        tool.write_text(text)
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "base.oci.tar").write_bytes(MANIFEST)
    (tmp_path / "seed.yml").write_text(json.dumps({"addr": f"127.0.0.1:{free_port()}"}))
    return tmp_path


def seed_address(fake: Path) -> str:
    return json.loads((fake / "seed.yml").read_text())["addr"]


def seed(fake: Path, registry: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{fake / 'bin'}:{os.environ['PATH']}", "FAKE_DIR": str(fake)}
    return subprocess.run(
        [
            sys.executable,
            str(SEED),
            "--registry",
            registry,
            "--wait",
            "5",
            "--seed-registry",
            seed_address(fake),
            "--seed-command",
            str(fake / "bin/docker-registry"),
            "--seed-config",
            str(fake / "seed.yml"),
            *extra,
            "--",
            str(fake / "base.oci.tar"),
            "tacc/base:bookworm",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0


def calls(fake: Path) -> list[str]:
    path = fake / "calls"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.security
def test_an_absent_image_is_pushed_once_through_the_loopback_instance_then_left_alone(
    fake: Path, registry: str
) -> None:
    """The serving registry is read-only: the push goes to the writable instance on the
    loopback, started for it and stopped after (no writable listener stays up)."""
    first = seed(fake, registry)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"pushed tacc/base:bookworm {DIGEST}", "changed"]
    seeding = seed_address(fake)
    pushes = [c for c in calls(fake) if c.startswith("copy")]
    assert pushes == [
        "copy --quiet --preserve-digests --dest-tls-verify=false "
        f"oci-archive:{fake}/base.oci.tar docker://{seeding}/tacc/base:bookworm"
    ]
    assert [c for c in calls(fake) if c.startswith(("serve", "stopped"))] == [
        f"serve {fake}/seed.yml",
        "stopped",
    ]
    assert not listening(seeding)
    again = seed(fake, registry)
    assert again.stdout.splitlines() == [f"present tacc/base:bookworm {DIGEST}", "ok"]
    assert len([c for c in calls(fake) if c.startswith("copy")]) == 1
    assert len([c for c in calls(fake) if c.startswith("serve")]) == 1  # not started again


@pytest.mark.security
@pytest.mark.fault
def test_a_killed_seeding_leaves_no_writable_listener(fake: Path, registry: str) -> None:
    """SIGKILL while it pushes (an Ansible timeout, an operator's ^C): the loopback
    instance stops with it instead of staying up writable."""
    env = {
        **os.environ,
        "PATH": f"{fake / 'bin'}:{os.environ['PATH']}",
        "FAKE_DIR": str(fake),
        "FAKE_HANG": "1",
    }
    seeding = seed_address(fake)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SEED),
            "--registry",
            registry,
            "--wait",
            "5",
            "--seed-registry",
            seeding,
            "--seed-command",
            str(fake / "bin/docker-registry"),
            "--seed-config",
            str(fake / "seed.yml"),
            "--",
            str(fake / "base.oci.tar"),
            "tacc/base:bookworm",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not [c for c in calls(fake) if c.startswith("copy")]:
            assert time.monotonic() < deadline, "the push never started"
            time.sleep(0.1)
        assert listening(seeding)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while listening(seeding):
            assert time.monotonic() < deadline, "the seeding instance outlived the script"
            time.sleep(0.1)
        assert calls(fake)[-1] == "stopped"
    finally:
        proc.kill()


@pytest.mark.bad_input
def test_a_seeding_instance_off_the_loopback_is_refused(fake: Path, registry: str) -> None:
    env = {**os.environ, "PATH": f"{fake / 'bin'}:{os.environ['PATH']}", "FAKE_DIR": str(fake)}
    proc = subprocess.run(
        [
            sys.executable,
            str(SEED),
            "--registry",
            registry,
            "--seed-registry",
            "10.0.0.1:5001",
            "--",
            str(fake / "base.oci.tar"),
            "tacc/base:bookworm",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--seed-registry must be on the loopback" in proc.stderr
    assert not calls(fake)


def test_check_mode_says_what_it_would_push_and_pushes_nothing(fake: Path, registry: str) -> None:
    proc = seed(fake, registry, "--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "changed"
    assert "would push tacc/base:bookworm" in proc.stdout
    assert not [c for c in calls(fake) if c.startswith(("copy", "serve"))]
    assert not (fake / "served").exists()


def test_a_different_digest_under_the_name_is_replaced(fake: Path, registry: str) -> None:
    (fake / "served").write_bytes(b'{"old": true}')
    proc = seed(fake, registry)
    assert proc.stdout.splitlines()[-1] == "changed"
    assert (fake / "served").read_bytes() == MANIFEST


@pytest.mark.bad_input
def test_an_unreachable_registry_is_one_clear_line(fake: Path) -> None:
    proc = seed(fake, "127.0.0.1:9", "--wait", "1")
    assert proc.returncode == 1
    assert proc.stderr.startswith("image_seed: the registry at 127.0.0.1:9 did not answer")
    assert "Traceback" not in proc.stderr


def render_registries(
    registries: list[dict], upstreams: list[dict] | None = None, registry: str = "n1:5000"
) -> dict:
    env = Environment(  # noqa: S701 (TOML, not HTML; as Ansible renders it)
        loader=FileSystemLoader(ROOT / "roles/container_runtime/templates"),
        undefined=StrictUndefined,
        trim_blocks=True,  # as Ansible's template module
    )
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    env.filters["regex_replace"] = lambda text, pattern, by: re.sub(pattern, by, text)
    text = env.get_template("registries.conf.j2").render(
        container_runtime_registries=registries,
        container_runtime_upstreams=upstreams or [],
        container_runtime_registry=registry,
        container_runtime_registry_insecure=True,
        ansible_managed="managed",
    )
    return tomllib.loads(text)


@pytest.mark.security
def test_each_public_registrys_names_go_to_its_cache_and_never_out() -> None:
    """Issue [24] point 1: nvcr.io/... and docker.io/... are remapped to their caches on
    the registry host (location, not a mirror: no fallback to the upstream)."""
    upstreams = [
        {"registry": "nvcr.io", "url": "https://nvcr.io", "port": 5010},
        {"registry": "docker.io", "url": "https://registry-1.docker.io", "port": 5011},
    ]
    parsed = render_registries([{"location": "n1:5000", "insecure": True}], upstreams)
    assert parsed["registry"][1:] == [
        {"prefix": "nvcr.io", "location": "n1:5010", "insecure": True, "blocked": False},
        {"prefix": "docker.io", "location": "n1:5011", "insecure": True, "blocked": False},
    ]
    assert all("mirror" not in entry for entry in parsed["registry"])
    bracketed = render_registries([], upstreams[:1], registry="[fd00::11]:5000")
    assert bracketed["registry"][0]["location"] == "[fd00::11]:5010"


def test_the_registries_file_names_the_cluster_registry() -> None:
    parsed = render_registries([{"location": "n1:5000", "insecure": True}])
    assert parsed == {"registry": [{"location": "n1:5000", "insecure": True, "blocked": False}]}
    secure = render_registries([{"location": "ctl1:5000", "insecure": False}])
    assert secure["registry"][0]["insecure"] is False


def test_an_air_gapped_mirror_entry_renders() -> None:
    parsed = render_registries(
        [
            {
                "prefix": "docker.io",
                "location": "docker.io",
                "mirrors": [{"location": "reg1:5000/docker.io", "insecure": True}],
            }
        ]
    )
    entry = parsed["registry"][0]
    assert entry["prefix"] == "docker.io"
    assert entry["mirror"] == [{"location": "reg1:5000/docker.io", "insecure": True}]


def test_apptainer_and_enroot_have_no_debian_12_package_so_choosing_them_fails() -> None:
    names = yaml.safe_load((ROOT / "roles/container_runtime/vars/Debian.yml").read_text())
    assert names["container_runtime_os_packages"] == {
        "charliecloud": ["charliecloud-runtime"],
        "apptainer": [],
        "enroot": [],
    }
    task_files = sorted((ROOT / "roles/container_runtime/tasks").glob("*.yml"))
    tasks = "".join(path.read_text() for path in task_files)
    assert "Refuse a runtime this OS has no packages for" in tasks
