"""The lab's inventory with and without its container image: n1 runs the registry and
seeds the image only with `--container-image`; other labs skip the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tacc_lab import lab
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.inventory import (
    REGISTRY_GROUP,
    ContainerImage,
    InventoryNode,
    NodeHardware,
    groups_for,
    render_inventory,
)
from tacc_lab.oci_image import OciImage

ARCHIVE = Path("/var/cache/tacc-lab/oci/base-bookworm-0123456789abcdef.oci.tar")


def render(image: ContainerImage | None, *, login_node: bool = True) -> dict:
    nodes = [InventoryNode(f"n{i}", f"10.77.0.{10 + i}", i) for i in (1, 2, 3)]
    if login_node:
        nodes.append(InventoryNode("login1", "10.77.0.10", 0))
    text = render_inventory(
        nodes,
        ssh_key=Path("/k"),
        known_hosts=Path("/kh"),
        proxy_url="http://10.77.0.1:3128",
        lab_name="lab",
        hardware=NodeHardware(cpus=2, memory_mb=4000),
        subnet="10.77.0.0/24",
        researchers={},
        container_image=image,
        public_registry_password="upstream-pw",  # noqa: S106 (a test value)
    )
    return yaml.safe_load(text)["all"]


def test_with_a_container_image_n1_is_the_registry_and_seeds_it() -> None:
    data = render(ContainerImage(ARCHIVE, "tacc/base:bookworm"))
    assert list(data["children"][REGISTRY_GROUP]["hosts"]) == ["n1"]
    lab_vars = data["vars"]
    assert lab_vars["tacc_image_registry"] == "n1:5000"
    assert lab_vars["tacc_image_registry_insecure"] is True
    assert lab_vars["image_registry_port"] == 5000
    assert lab_vars["image_registry_seed"] == [
        {"archive": str(ARCHIVE), "name": "tacc/base:bookworm"}
    ]
    assert lab_vars["container_runtime_enabled"] is True
    assert lab_vars["container_runtime_name"] == "charliecloud"


def test_the_lab_allows_its_stand_in_for_nvcr_io_and_only_n1_holds_its_account() -> None:
    """Issue [24]: the site's one public registry, nvcr.io, is the lab's stand-in on n1
    (tacc_lab/public_registry.py), cached on n1:5010; the cache's account at it is a
    host variable of the registry host alone."""
    data = render(ContainerImage(ARCHIVE, "tacc/base:bookworm"))
    assert data["vars"]["tacc_image_upstreams"] == [
        {"registry": "nvcr.io", "url": "http://10.77.0.11:5080", "insecure": True, "port": 5010}
    ]
    account = {"nvcr.io": {"username": "lab", "password": "upstream-pw"}}
    assert data["hosts"]["n1"]["image_registry_upstream_credentials"] == account
    others = [host for name, host in data["hosts"].items() if name != "n1"]
    assert others and all("image_registry_upstream_credentials" not in h for h in others)
    assert "upstream-pw" not in yaml.safe_dump(data["vars"])


def test_without_one_there_is_no_registry_and_no_runtime() -> None:
    data = render(None)
    assert REGISTRY_GROUP not in data["children"]
    lab_vars = data["vars"]
    assert lab_vars["container_runtime_enabled"] is False
    assert "image_registry_seed" not in lab_vars and "tacc_image_registry" not in lab_vars


def test_a_one_node_lab_runs_registry_and_containers_on_n1() -> None:
    groups = groups_for(1, 1, image_registry=True)
    assert {REGISTRY_GROUP, "slurm_compute", "login"} <= set(groups)
    assert REGISTRY_GROUP not in groups_for(1, 3)
    assert REGISTRY_GROUP not in groups_for(2, 3, image_registry=True)
    assert REGISTRY_GROUP not in groups_for(0, 3, login_node=True, image_registry=True)


def test_the_example_inventory_has_the_registry_group_and_names_it(project_root: Path) -> None:
    example = yaml.safe_load((project_root / "inventory/example/hosts.yml").read_text())
    assert list(example["all"]["children"][REGISTRY_GROUP]["hosts"]) == ["ctl1"]
    cluster = yaml.safe_load(
        (project_root / "inventory/example/group_vars/all/cluster.yml").read_text()
    )
    assert cluster["tacc_image_registry"] == f"ctl1:{cluster['image_registry_port']}"
    assert cluster["tacc_image_registry_insecure"] is False


def test_site_runs_the_registry_before_the_runtime_and_both_before_the_agent(
    project_root: Path,
) -> None:
    plays = yaml.safe_load((project_root / "playbooks/site.yml").read_text())
    plays = [play for play in plays if "roles" in play]  # not import_playbook entries
    roles = [role["role"] for play in plays for role in play["roles"]]
    hosts = {play["roles"][0]["role"]: play["hosts"] for play in plays}
    assert (
        roles.index("image_registry") < roles.index("container_runtime") < roles.index("tacc_agent")
    )
    assert hosts["image_registry"] == "image_registry"
    assert hosts["container_runtime"] == "slurm_compute:login"


def lab_with_fake_build(tmp_path: Path, monkeypatch) -> tuple[LabConfig, list[int]]:
    """A lab config under tmp_path whose image build only counts its calls."""
    builds: list[int] = []
    archive = tmp_path / "base.oci.tar"

    def fake_build(log=print) -> OciImage:
        builds.append(1)
        archive.write_bytes(b"oci")
        return OciImage(archive, "tacc/base:bookworm", 12.5)

    monkeypatch.setattr(lab, "ensure_oci_image", fake_build)
    monkeypatch.setattr(lab, "archive_path", lambda: archive)  # the current build's name
    return LabConfig.create("ctr", "10.77.31.0/24", state_root=tmp_path / "state"), builds


def test_the_option_is_kept_by_a_later_up_and_dropped_by_no(tmp_path: Path, monkeypatch) -> None:
    cfg, builds = lab_with_fake_build(tmp_path, monkeypatch)
    assert lab._container_image_for(cfg, None, print) == (None, None)  # a new lab: none
    image, seconds = lab._container_image_for(cfg, True, print)
    assert (image, seconds) == (
        ContainerImage(tmp_path / "base.oci.tar", "tacc/base:bookworm"),
        12.5,
    )
    assert lab.lab_container_image(cfg) == image
    assert lab._container_image_for(cfg, None, print) == (image, None)  # kept, not rebuilt
    assert builds == [1]
    assert lab._container_image_for(cfg, False, print) == (None, None)
    assert lab.lab_container_image(cfg) is None


def test_a_kept_option_rebuilds_an_archive_the_cache_lost(tmp_path: Path, monkeypatch) -> None:
    cfg, builds = lab_with_fake_build(tmp_path, monkeypatch)
    image, _ = lab._container_image_for(cfg, True, print)
    assert image is not None
    image.archive.unlink()
    again, seconds = lab._container_image_for(cfg, None, print)
    assert again == image and seconds == 12.5 and builds == [1, 1]


def test_a_kept_archive_of_an_earlier_build_is_built_again(tmp_path: Path, monkeypatch) -> None:
    """After the build changed (a new key, e.g. BUILD_FORMAT), a lab that kept the old
    archive must not go on seeding it."""
    cfg, builds = lab_with_fake_build(tmp_path, monkeypatch)
    earlier = tmp_path / "base-bookworm-0123456789abcdef.oci.tar"
    earlier.write_bytes(b"old oci")
    lab._save_container_image(cfg, ContainerImage(earlier, "tacc/base:bookworm"))
    image, seconds = lab._container_image_for(cfg, None, print)
    assert image == ContainerImage(tmp_path / "base.oci.tar", "tacc/base:bookworm")
    assert seconds == 12.5 and builds == [1]
    assert lab.lab_container_image(cfg) == image


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "text", ["{}", "[]", '{"archive": 5, "name": "tacc/base:bookworm"}', '{"archive": "/a"}']
)
def test_a_malformed_container_image_file_is_a_lab_error(tmp_path: Path, text: str) -> None:
    cfg = LabConfig.create("ctr", "10.77.31.0/24", state_root=tmp_path / "state")
    cfg.state_dir.mkdir(parents=True)
    cfg.container_image_file.write_text(text)
    with pytest.raises(LabError, match=r"expected \{\"archive\": PATH.*run `tacc-lab down`"):
        lab.lab_container_image(cfg)


def test_the_container_image_file_is_written_whole(tmp_path: Path, monkeypatch) -> None:
    """Written next to its name and renamed: a crash never leaves half a file to parse."""
    cfg, _ = lab_with_fake_build(tmp_path, monkeypatch)
    renames: list[tuple[str, str]] = []
    real_replace = lab.os.replace

    def replace(src, dst) -> None:
        renames.append((Path(src).name, Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(lab.os, "replace", replace)
    lab._container_image_for(cfg, True, print)
    name = cfg.container_image_file.name
    assert renames == [(f".{name}.partial", name)]
    assert sorted(p.name for p in cfg.state_dir.iterdir()) == [name]
