"""roles/image_registry and roles/container_runtime without a lab: the seeding script
pushes an archive only while the registry lacks its digest (and never in check mode), the
registries file is valid TOML naming the cluster registry, insecure only when asked."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
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


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    skopeo = bin_dir / "skopeo"
    skopeo.write_text(FAKE_SKOPEO)
    skopeo.chmod(skopeo.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "base.oci.tar").write_bytes(MANIFEST)
    return tmp_path


def seed(fake: Path, registry: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{fake / 'bin'}:{os.environ['PATH']}", "FAKE_DIR": str(fake)}
    return subprocess.run(
        [sys.executable, str(SEED), "--registry", registry, "--wait", "5", *extra, "--",
         str(fake / "base.oci.tar"), "tacc/base:bookworm"],
        capture_output=True, text=True, env=env, check=False, timeout=60,
    )  # fmt: skip


def calls(fake: Path) -> list[str]:
    path = fake / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_an_absent_image_is_pushed_once_then_left_alone(fake: Path, registry: str) -> None:
    first = seed(fake, registry)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"pushed tacc/base:bookworm {DIGEST}", "changed"]
    pushes = [c for c in calls(fake) if c.startswith("copy")]
    assert pushes == [
        "copy --quiet --preserve-digests --dest-tls-verify=false "
        f"oci-archive:{fake}/base.oci.tar docker://{registry}/tacc/base:bookworm"
    ]
    again = seed(fake, registry)
    assert again.stdout.splitlines() == [f"present tacc/base:bookworm {DIGEST}", "ok"]
    assert len([c for c in calls(fake) if c.startswith("copy")]) == 1


def test_check_mode_says_what_it_would_push_and_pushes_nothing(fake: Path, registry: str) -> None:
    proc = seed(fake, registry, "--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "changed"
    assert "would push tacc/base:bookworm" in proc.stdout
    assert not [c for c in calls(fake) if c.startswith("copy")]
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


def render_registries(registries: list[dict]) -> dict:
    env = Environment(  # noqa: S701 (TOML, not HTML; as Ansible renders it)
        loader=FileSystemLoader(ROOT / "roles/container_runtime/templates"),
        undefined=StrictUndefined,
        trim_blocks=True,  # as Ansible's template module
    )
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    text = env.get_template("registries.conf.j2").render(
        container_runtime_registries=registries, ansible_managed="managed"
    )
    return tomllib.loads(text)


def test_the_registries_file_names_the_cluster_registry() -> None:
    parsed = render_registries([{"location": "n1:5000", "insecure": True}])
    assert parsed == {"registry": [{"location": "n1:5000", "insecure": True, "blocked": False}]}
    secure = render_registries([{"location": "ctl1:5000", "insecure": False}])
    assert secure["registry"][0]["insecure"] is False


def test_an_air_gapped_mirror_entry_renders() -> None:
    parsed = render_registries(
        [{"prefix": "docker.io", "location": "docker.io",
          "mirrors": [{"location": "reg1:5000/docker.io", "insecure": True}]}]
    )  # fmt: skip
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
    tasks = (ROOT / "roles/container_runtime/tasks/main.yml").read_text()
    assert "Refuse a runtime this OS has no packages for" in tasks
