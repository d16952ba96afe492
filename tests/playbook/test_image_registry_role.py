"""roles/image_registry rendered and checked by Ansible itself, without a lab: the serving
instance is read-only (mode seeded) on the host's cluster address, the seeding instance
writable on the loopback only, TLS when given, and the seed list's names are checked
(format, unique) naming the list index. Both roles know Debian and RedHat (UNTESTED)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

ROLE = ROOT / "roles/image_registry"


def playbook(tmp_path: Path, play: list[dict], *extra_vars: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    argv = [str(BIN / "ansible-playbook"), "-i", "n1,", str(path)]
    argv += [
        "-e",
        json.dumps(
            {
                "ansible_connection": "local",
                "ansible_host": "10.77.31.11",
                "ansible_python_interpreter": sys.executable,
            }
        ),
    ]
    for extra in extra_vars:
        argv += ["-e", json.dumps(extra)]
    env = ansible_env()
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
    )


def render(tmp_path: Path, **settings: object) -> tuple[dict, dict]:
    """config.yml and seed.yml as the role writes them, from its defaults and vars."""
    tasks = [
        {
            "name": f"render {name}",
            "ansible.builtin.template": {
                "src": str(ROLE / "templates" / name),
                "dest": str(tmp_path / name),
                "mode": "0600",
            },
        }
        for name in ("config.yml.j2", "seed.yml.j2")
    ]
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars_files": [
                str(ROLE / "defaults/main.yml"),
                str(ROLE / "vars/main.yml"),
                str(ROLE / "vars/Debian.yml"),
            ],
            "tasks": tasks,
        }
    ]
    proc = playbook(tmp_path, play, settings)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return tuple(
        yaml.safe_load((tmp_path / n).read_text()) for n in ("config.yml.j2", "seed.yml.j2")
    )


@pytest.mark.security
def test_the_serving_registry_is_read_only_on_the_cluster_address(tmp_path: Path) -> None:
    """Anyone on the cluster network can reach it: they must not be able to push (a
    pushed image would be pinned by everyone's next submit and run as them)."""
    serving, seeding = render(tmp_path)
    assert serving["storage"]["maintenance"]["readonly"] == {"enabled": True}
    assert serving["http"]["addr"] == "10.77.31.11:5000"  # the cluster address, not 0.0.0.0
    assert serving["storage"]["delete"] == {"enabled": False}
    assert "tls" not in serving["http"]
    # The seeding instance writes the same storage, on the loopback only.
    assert seeding["http"]["addr"] == "127.0.0.1:5001"
    assert "maintenance" not in seeding["storage"]
    assert seeding["storage"]["filesystem"] == serving["storage"]["filesystem"]


def test_an_ipv6_listen_address_is_bracketed_and_tls_is_rendered(tmp_path: Path) -> None:
    serving, _ = render(
        tmp_path,
        image_registry_listen_address="fd00::11",
        image_registry_tls_certificate="/ctl/registry.crt",
        image_registry_tls_key="/ctl/registry.key",
    )
    assert serving["http"]["addr"] == "[fd00::11]:5000"
    assert serving["http"]["tls"] == {
        "certificate": "/etc/docker/registry/tls/registry.crt",
        "key": "/etc/docker/registry/tls/registry.key",
    }


def test_a_pull_through_cache_is_not_made_read_only(tmp_path: Path) -> None:
    """Distribution refuses pushes in proxy mode itself, and must write what it caches."""
    serving, _ = render(
        tmp_path,
        image_registry_mode="pull_through",
        image_registry_proxy_url="https://registry-1.docker.io",
    )
    assert "maintenance" not in serving["storage"]
    assert serving["proxy"] == {"remoteurl": "https://registry-1.docker.io"}


def validate(tmp_path: Path, **settings: object) -> subprocess.CompletedProcess:
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "validate",
                    "ansible.builtin.include_role": {
                        "name": "image_registry",
                        "tasks_from": "validate",
                    },
                }
            ],
        }
    ]
    return playbook(tmp_path, play, settings)


def seed_list(*names: str) -> dict:
    return {
        "image_registry_seed": [
            {"archive": f"/a/{i}.oci.tar", "name": n} for i, n in enumerate(names)
        ]
    }


def test_good_seed_names_pass(tmp_path: Path) -> None:
    proc = validate(tmp_path, **seed_list("tacc/base:bookworm", "tacc/base:trixie", "a.b/c-d_e"))
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["tacc/Base:bookworm", "tacc/base:", "/tacc/base", "a:b:c"])
def test_a_seed_name_that_is_not_a_repository_and_tag_is_refused_naming_its_index(
    tmp_path: Path, name: str
) -> None:
    proc = validate(tmp_path, **seed_list("tacc/base:bookworm", name))
    assert proc.returncode != 0
    assert (
        f"image_registry_seed[1].name={json.dumps(name)}: expected repository[:tag]" in proc.stdout
    )


@pytest.mark.bad_input
def test_a_seed_name_used_twice_is_refused_naming_the_later_index(tmp_path: Path) -> None:
    proc = validate(tmp_path, **seed_list("tacc/base:bookworm", "x/y", "tacc/base:bookworm"))
    assert proc.returncode != 0
    assert 'image_registry_seed[2].name="tacc/base:bookworm": an earlier entry' in proc.stdout


@pytest.mark.bad_input
def test_a_tls_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    proc = validate(tmp_path, image_registry_tls_certificate="/ctl/registry.crt")
    assert proc.returncode != 0
    assert "image_registry_tls_certificate and image_registry_tls_key go together" in proc.stdout


def test_archives_are_named_from_the_seed_name_not_the_archive_file() -> None:
    """Two seeds whose archives share a base name must not overwrite each other, and an
    archive named with ':' must not break skopeo's oci-archive:PATH."""
    tasks = (ROLE / "tasks/main.yml").read_text()
    assert "item.archive | basename" not in tasks
    assert tasks.count("hash('sha256')") + tasks.count("map('hash', 'sha256')") == 3


@pytest.mark.parametrize("role", ["image_registry", "container_runtime"])
def test_both_roles_name_redhat_packages_like_debian(role: str) -> None:
    """A RedHat site gets names (UNTESTED) instead of a failed include before the
    role's own 'other families' tasks; other families fail naming the family."""
    debian = yaml.safe_load((ROOT / f"roles/{role}/vars/Debian.yml").read_text())
    redhat_file = ROOT / f"roles/{role}/vars/RedHat.yml"
    assert redhat_file.is_file()
    assert "UNTESTED" in redhat_file.read_text()
    redhat = yaml.safe_load(redhat_file.read_text())
    assert sorted(redhat) == sorted(debian)
    task_files = sorted((ROOT / f"roles/{role}/tasks").glob("*.yml"))
    tasks = "".join(path.read_text() for path in task_files)
    assert "Refuse an OS family the role has no names for" in tasks


def test_redhat_names_docker_distribution_and_charliecloud() -> None:
    registry = yaml.safe_load((ROLE / "vars/RedHat.yml").read_text())
    assert registry["image_registry_packages"][0] == "docker-distribution"
    assert registry["image_registry_service"] == "docker-distribution"
    runtime = yaml.safe_load((ROOT / "roles/container_runtime/vars/RedHat.yml").read_text())
    assert runtime["container_runtime_os_packages"]["charliecloud"] == ["charliecloud"]
