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


def with_role_vars(tasks: list[dict]) -> list[dict]:
    """A play of `tasks` that sees the role's defaults and vars (Debian's names)."""
    files = [str(ROLE / name) for name in ("defaults/main.yml", "vars/main.yml", "vars/Debian.yml")]
    return [{"hosts": "all", "gather_facts": False, "vars_files": files, "tasks": tasks}]


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
    play = with_role_vars(tasks)
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


UPSTREAMS = [
    {"registry": "nvcr.io", "url": "https://nvcr.io", "port": 5010},
    {"registry": "docker.io", "url": "https://registry-1.docker.io", "port": 5011},
]
ACCOUNT = {"username": "$oauthtoken", "password": "nvapi-s3cret-never-shown"}


def render_caches(tmp_path: Path, **settings: object) -> dict[str, dict]:
    """Each cache's configuration as the role writes it, by registry."""
    upstreams = settings.get("image_registry_upstreams", UPSTREAMS)
    tasks = [
        {
            "name": "render caches",
            "ansible.builtin.template": {
                "src": str(ROLE / "templates/cache.yml.j2"),
                "dest": str(tmp_path / "cache-{{ image_registry_cache.port }}.yml"),
                "mode": "0600",
            },
            "loop": "{{ image_registry_upstreams }}",
            "loop_control": {"loop_var": "image_registry_cache"},
        }
    ]
    play = with_role_vars(tasks)
    proc = playbook(tmp_path, play, {"image_registry_upstreams": upstreams, **settings})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return {
        u["registry"]: yaml.safe_load((tmp_path / f"cache-{u['port']}.yml").read_text())
        for u in upstreams
    }


def test_each_public_registry_gets_its_own_cache_beside_the_seeded_registry(tmp_path) -> None:
    """Issue [24] point 1: one proxy instance per upstream (Distribution 2.8 proxies one),
    on its own port of the cluster address, with its own storage; the account only for
    the registry it is for."""
    caches = render_caches(tmp_path, image_registry_upstream_credentials={"nvcr.io": ACCOUNT})
    nvcr, hub = caches["nvcr.io"], caches["docker.io"]
    assert nvcr["http"]["addr"] == "10.77.31.11:5010" and hub["http"]["addr"] == "10.77.31.11:5011"
    assert nvcr["proxy"] == {"remoteurl": "https://nvcr.io", **ACCOUNT}
    assert hub["proxy"] == {"remoteurl": "https://registry-1.docker.io"}  # anonymous
    assert (
        nvcr["storage"]["filesystem"]["rootdirectory"] == "/var/lib/docker-registry-cache/nvcr.io"
    )
    # What a cache fetched stays (a job's pinned image for its rerun); Distribution
    # refuses pushes to a cache itself.
    assert nvcr["storage"]["delete"] == {"enabled": False}
    serving, _ = render(tmp_path)
    assert serving["http"]["addr"] == "10.77.31.11:5000" and "proxy" not in serving


@pytest.mark.security
def test_an_upstream_account_is_never_shown_by_the_role() -> None:
    """The cache's configuration (it holds the account) is written without diff or
    log, the validation loops over registry names only, and the file is the registry
    user's to read, no one else's."""
    tasks = yaml.safe_load((ROLE / "tasks/caches.yml").read_text())
    written = next(t for t in tasks if t["name"] == "Write each cache's configuration")
    assert written["no_log"].startswith("{{ image_registry_upstream_credentials | length > 0")
    assert written["diff"].startswith("{{ image_registry_upstream_credentials | length == 0")
    assert written["ansible.builtin.template"]["mode"] == "0640"
    checks = yaml.safe_load((ROLE / "tasks/validate.yml").read_text())
    account = next(t for t in checks if t["name"].startswith("Refuse an account"))
    assert account["loop"] == "{{ image_registry_upstream_credentials.keys() | list }}"
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert options["image_registry_upstream_credentials"]["no_log"] is True


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


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"registry": "https://nvcr.io", "url": "https://nvcr.io", "port": 5010}, "registry"),
        ({"registry": "nvcr", "url": "https://nvcr.io", "port": 5010}, "no dot"),
        ({"registry": "nvcr.io", "url": "nvcr.io", "port": 5010}, "url without scheme"),
        ({"registry": "nvcr.io", "url": "https://nvcr.io/v2/x", "port": 5010}, "url path"),
        ({"registry": "nvcr.io", "url": "https://nvcr.io", "port": 5000}, "serving port"),
        ({"registry": "nvcr.io", "url": "https://nvcr.io", "port": 5001}, "seeding port"),
        ({"registry": "nvcr.io", "url": "https://nvcr.io", "port": 70000}, "port range"),
        ({"registry": "nvcr.io", "url": "https://u:key@nvcr.io", "port": 5010}, "account"),
        ({"registry": "nvcr.io", "url": "http://nvcr.io", "port": 5010}, "plain http"),
        ({"registry": "NVCR.io", "url": "https://nvcr.io", "port": 5010}, "upper case"),
        ({"registry": "ctl1:5000", "url": "https://x.org", "port": 5010}, "cluster's"),
    ],
)
def test_a_bad_public_registry_entry_is_refused_naming_its_index(tmp_path, entry, why) -> None:
    proc = validate(
        tmp_path, image_registry_upstreams=[UPSTREAMS[1], entry], tacc_image_registry="ctl1:5000"
    )
    assert proc.returncode != 0, why
    said = " ".join(proc.stdout.split())
    assert "tacc_image_upstreams[1] (registry " in said, proc.stdout[-2000:]
    assert "expected {registry: the name tasks write" in said
    assert "key@" not in said  # an account in the URL is never repeated


@pytest.mark.bad_input
def test_a_registry_or_port_listed_twice_is_refused(tmp_path) -> None:
    twice = [UPSTREAMS[0], {**UPSTREAMS[1], "port": 5010}]
    proc = validate(tmp_path, image_registry_upstreams=twice)
    assert proc.returncode != 0
    assert "tacc_image_upstreams[1]: an earlier entry has the registry" in proc.stdout


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "credentials",
    [
        {"quay.io": ACCOUNT},
        {"nvcr.io": {"username": "$oauthtoken"}},
        {"nvcr.io": {"username": "", "password": "x"}},
    ],
)
def test_an_account_for_an_unlisted_registry_or_half_an_account_is_refused(
    tmp_path, credentials
) -> None:
    proc = validate(
        tmp_path,
        image_registry_upstreams=UPSTREAMS,
        image_registry_upstream_credentials=credentials,
    )
    assert proc.returncode != 0
    name = next(iter(credentials))
    said = " ".join(proc.stdout.split())
    assert f'image_registry_upstream_credentials["{name}"]: expected {{username, password}}' in said
    assert "lists (nvcr.io, docker.io)" in said
    assert "s3cret" not in proc.stdout and "$oauthtoken" not in proc.stdout


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "old",
    [
        {"image_registry_mode": "pull_through"},
        {"image_registry_proxy_url": "https://registry-1.docker.io"},
    ],
)
def test_the_single_upstream_settings_of_before_are_refused_with_what_replaces_them(
    tmp_path, old
) -> None:
    proc = validate(tmp_path, **old)
    assert proc.returncode != 0
    said = " ".join(proc.stdout.split())
    assert "image_registry_mode: pull_through and image_registry_proxy_url are gone" in said
    assert "tacc_image_upstreams" in said


def test_good_public_registries_and_accounts_pass(tmp_path) -> None:
    inside = {"registry": "reg.site.org", "url": "http://reg.site.org", "insecure": True}
    proc = validate(
        tmp_path,
        image_registry_upstreams=[*UPSTREAMS, {**inside, "port": 5012}],
        image_registry_upstream_credentials={"nvcr.io": ACCOUNT},
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
