"""The prebaked node image (`make demo` only): its package list follows the roles, it is
opt-in and named apart from the bare image every test lab boots, and each flavor prunes
only its own superseded images."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tacc_lab import image, prebake
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.releases import BOOKWORM, DEFAULT, TRIXIE

SUITE = DEFAULT.codename
ROLES = Path(__file__).resolve().parents[3] / "roles"
# Debian package lists the roles install on the lab's nodes (the lab's inventory picks
# ganesha for nfs_server and no chrony: common_time_sync none).
ROLE_PACKAGE_VARS = {
    "common": ["common_packages"],
    "munge": ["munge_packages"],
    "nfs_client": ["nfs_client_packages"],
    "rdma": ["rdma_packages"],
    "nvidia_gpu": ["nvidia_gpu_prereq_packages"],
    "smartnic_firmware": ["smartnic_firmware_packages"],
    "slurm": [
        "slurm_packages_controller",
        "slurm_packages_compute",
        "slurm_packages_login",
        "slurm_packages_dbd",
    ],
    "slurm_pam_adopt": ["slurm_pam_adopt_packages"],
    "mpi": ["mpi_openmpi_packages", "mpi_mpi4py_packages", "mpi_pmix_packages"],
    "package_cache": ["package_cache_packages"],
    "tacc_agent": ["tacc_agent_packages"],
    "node_exporter": ["node_exporter_packages"],
}


def debian_vars(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "vars" / "Debian.yml").read_text())


def role_packages() -> set[str]:
    wanted = set(debian_vars("nfs_server")["nfs_server_packages"]["ganesha"])
    for role, names in ROLE_PACKAGE_VARS.items():
        variables = debian_vars(role)
        for name in names:
            wanted |= set(variables[name])
    return wanted


def test_the_image_holds_every_package_the_roles_install_on_lab_nodes() -> None:
    baked = set(prebake.ROLE_PACKAGES) | set(image.PACKAGES)
    missing = role_packages() - baked - set(prebake.LEFT_TO_ROLES)
    assert not missing, f"add to prebake.ROLE_PACKAGES: {sorted(missing)}"
    assert not baked & set(prebake.LEFT_TO_ROLES)


def test_recommends_a_role_leaves_out_are_left_out_of_the_image(tmp_path: Path) -> None:
    """node_exporter installs without Recommends: the image must not bring its collectors'
    timers (scripts on every prebaked node that no bare-image node runs)."""
    tasks = yaml.safe_load((ROLES / "node_exporter/tasks/main.yml").read_text())
    install = next(t for t in tasks if t.get("name") == "Install the node exporter (Debian family)")
    assert install["ansible.builtin.apt"]["install_recommends"] is False
    assert "prometheus-node-exporter" in prebake.ROLE_PACKAGES
    assert "prometheus-node-exporter-collectors" in prebake.SKIPPED_RECOMMENDS
    argv = prebake.mmdebstrap_argv("trixie", image.PACKAGES, tmp_path / "root", [])
    hook = next(arg for arg in argv if "APT::Install-Recommends=true" in arg)
    assert "prometheus-node-exporter-collectors-" in hook


def test_service_accounts_are_the_common_roles_fixed_ids() -> None:
    """The packages' files are owned by these IDs; the role would otherwise renumber the
    accounts and leave munge unable to read its own directories."""
    defaults = yaml.safe_load((ROLES / "common" / "defaults" / "main.yml").read_text())
    wanted = {
        (a["name"], a["uid"], a["gid"], a["comment"]) for a in defaults["common_service_accounts"]
    }
    assert {(n, uid, uid, comment) for n, uid, comment in prebake.SERVICE_ACCOUNTS} == wanted


def test_every_disabled_daemon_is_started_by_a_role() -> None:
    started = set()
    for tasks in ROLES.glob("*/tasks/*.yml"):
        for task in yaml.safe_load(tasks.read_text()) or []:
            for module in (
                "ansible.builtin.service",
                "ansible.builtin.systemd",
                "ansible.builtin.systemd_service",
            ):
                args = task.get(module) if isinstance(task, dict) else None
                if args and args.get("enabled") is True:
                    started.add(str(args["name"]))
    assert set(prebake.GROUP_DAEMONS) <= started


def test_package_names_are_plain_words_on_the_hook_command_line(tmp_path: Path) -> None:
    """The customize hook is a shell line mmdebstrap runs: only package-name characters."""
    for name in prebake.ROLE_PACKAGES + prebake.GROUP_DAEMONS:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", name), name
    sources = [tmp_path / "debian.sources"]
    argv = prebake.mmdebstrap_argv("trixie", image.PACKAGES, tmp_path / "root", sources)
    assert argv[0] == "mmdebstrap"
    assert argv[-3:] == ["trixie", str(tmp_path / "root"), str(sources[0])]
    assert f"--include={','.join(image.PACKAGES)}" in argv
    assert str(tmp_path / "root") in argv


def test_bare_is_the_default_and_prebaked_is_opt_in() -> None:
    assert image.image_flavor({}) == image.BARE
    assert image.image_flavor({image.FLAVOR_ENV: ""}) == image.BARE
    assert image.image_flavor({image.FLAVOR_ENV: "prebaked"}) == image.PREBAKED


@pytest.mark.bad_input
def test_an_unknown_flavor_is_one_clear_error() -> None:
    with pytest.raises(
        LabError, match="TACC_LAB_IMAGE_FLAVOR='fast' is not one of: bare, prebaked"
    ):
        image.image_flavor({image.FLAVOR_ENV: "fast"})


def test_the_flavors_are_named_apart(tmp_path: Path) -> None:
    cfg = LabConfig.create("t", "10.77.0.0/24", image_cache=tmp_path)
    bare = image.image_path(cfg)
    prebaked = image.image_path(cfg, image.PREBAKED)
    assert bare.name == f"{SUITE}-{image.image_digest()}"
    assert prebaked.name.startswith(f"{SUITE}-prebaked-")
    assert image.image_digest(image.PREBAKED) != image.image_digest()


def test_each_release_has_its_own_images(tmp_path: Path) -> None:
    cfg = LabConfig.create("t", "10.77.0.0/24", image_cache=tmp_path)
    for flavor in image.FLAVORS:
        trixie = image.image_path(cfg, flavor, TRIXIE)
        bookworm = image.image_path(cfg, flavor, BOOKWORM)
        assert trixie.name.startswith("trixie-") and bookworm.name.startswith("bookworm-")
        assert image.image_digest(flavor, TRIXIE) != image.image_digest(flavor, BOOKWORM)


def test_a_cached_prebaked_image_is_used_without_a_build(tmp_path: Path) -> None:
    cfg = LabConfig.create("t", "10.77.0.0/24", image_cache=tmp_path)
    target = image.image_path(cfg, image.PREBAKED)
    target.mkdir()
    (target / image.COMPLETE_MARK).write_text("0\n")
    assert image.ensure_image(cfg, flavor=image.PREBAKED) == (target, None)


def test_each_flavor_prunes_only_its_own_old_images(tmp_path: Path) -> None:
    cfg = LabConfig.create("t", "10.77.0.0/24", image_cache=tmp_path)
    old_bare = tmp_path / f"{SUITE}-{'0' * 16}"
    old_prebaked = tmp_path / f"{SUITE}-prebaked-{'0' * 16}"
    new_bare = tmp_path / f"{SUITE}-{'1' * 16}"
    new_prebaked = tmp_path / f"{SUITE}-prebaked-{'1' * 16}"
    for path in (old_bare, old_prebaked, new_bare, new_prebaked):
        path.mkdir()
    image._prune_old_images(cfg, keep=new_prebaked, flavor=image.PREBAKED)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (old_bare, new_bare, new_prebaked)
    )
    image._prune_old_images(cfg, keep=new_bare)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (new_bare, new_prebaked)
    )


def test_a_release_prunes_only_its_own_old_images(tmp_path: Path) -> None:
    cfg = LabConfig.create("t", "10.77.0.0/24", image_cache=tmp_path)
    old_trixie, new_trixie = (tmp_path / f"trixie-{n * 16}" for n in "01")
    bookworm = tmp_path / f"bookworm-{'0' * 16}"
    for path in (old_trixie, new_trixie, bookworm):
        path.mkdir()
    image._prune_old_images(cfg, keep=new_trixie, release=TRIXIE)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([bookworm.name, new_trixie.name])


def test_the_image_ships_no_munge_key_build_settings_or_pasted_sources(tmp_path: Path) -> None:
    pasted = ("etc/apt/sources.list.d/0000debian.sources",)
    for relative in prebake.SHARED_SECRETS + prebake.BUILD_ONLY_FILES + pasted:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("x")
    prebake.finish(tmp_path)
    for relative in prebake.SHARED_SECRETS + prebake.BUILD_ONLY_FILES + pasted:
        assert not (tmp_path / relative).exists()


@pytest.mark.security
def test_hook_lines_quote_every_word() -> None:
    line = prebake.in_root(["useradd", "--comment", "it's $(x)", "u"])
    assert line == "chroot \"$1\" useradd --comment 'it'\"'\"'s $(x)' u"
