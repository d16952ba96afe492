"""`tacc-lab up --os trixie|bookworm` (issue [20] point 1): each release gets the host's
apt sources under its own suite names, a running lab keeps its nodes' release, and a
wrong name is one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tacc_lab import lab, releases
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.releases import BOOKWORM, TRIXIE
from tacc_lab.state import LabState, NodeRecord, load_state, save_state

DEB822 = """\
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
"""
ONE_LINE = (
    "deb http://deb.debian.org/debian bookworm main\n"
    "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"
    "deb http://mirror.example/bookworm.d/debian bookworm-backports main\n"
)


def test_the_hosts_suites_are_renamed_for_the_nodes_release():
    assert releases.retarget(DEB822, "bookworm", "trixie") == DEB822.replace("bookworm", "trixie")
    assert releases.retarget(ONE_LINE, "bookworm", "trixie").splitlines() == [
        "deb http://deb.debian.org/debian trixie main",
        "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main",  # a vendor's word
        "deb http://mirror.example/bookworm.d/debian trixie-backports main",
    ]
    assert releases.retarget(DEB822, "bookworm", "bookworm") == DEB822


def test_a_trixie_host_gives_bookworm_nodes_their_suites():
    trixie_host = DEB822.replace("bookworm", "trixie")
    assert releases.retarget(trixie_host, "trixie", "bookworm") == DEB822


def test_the_host_release_comes_from_os_release(tmp_path: Path):
    os_release = tmp_path / "os-release"
    os_release.write_text('PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nVERSION_CODENAME=trixie\n')
    assert releases.host_codename(os_release) == "trixie"


@pytest.mark.bad_input
def test_a_host_without_a_codename_is_a_clear_error(tmp_path: Path):
    os_release = tmp_path / "os-release"
    os_release.write_text('NAME="Something"\n')
    with pytest.raises(LabError, match="no VERSION_CODENAME; the lab needs a Debian host"):
        releases.host_codename(os_release)
    with pytest.raises(LabError, match="unreadable"):
        releases.host_codename(tmp_path / "absent")


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["jessie", "Trixie", "13", ""])
def test_an_unknown_release_names_the_known_ones(name):
    with pytest.raises(LabError, match="expected one of trixie, bookworm"):
        releases.release_named(name)


@pytest.mark.bad_input
def test_a_bad_tacc_lab_os_names_the_variable():
    with pytest.raises(LabError, match="TACC_LAB_OS: unknown node OS 'sid'"):
        releases.requested_release({releases.OS_ENV: "sid"})
    assert releases.requested_release({}) is None
    assert releases.requested_release({releases.OS_ENV: "trixie"}) is TRIXIE


def lab_with_nodes(os: str | None) -> LabState:
    state = LabState(subnet="10.77.0.0/24", os=os)
    state.nodes["n1"] = NodeRecord("n1", 1, "10.77.0.11")
    return state


def test_a_new_lab_runs_what_was_asked(monkeypatch):
    cfg = LabConfig.create("t", "10.77.0.0/24")
    monkeypatch.delenv(releases.OS_ENV, raising=False)
    empty = LabState(subnet="10.77.0.0/24")
    assert lab._release_for(cfg, empty, TRIXIE) is TRIXIE
    assert lab._release_for(cfg, empty, None) is releases.DEFAULT
    monkeypatch.setenv(releases.OS_ENV, "trixie")
    assert lab._release_for(cfg, empty, None) is TRIXIE


@pytest.mark.bad_input
def test_a_running_lab_keeps_its_nodes_release(monkeypatch):
    cfg = LabConfig.create("t", "10.77.0.0/24")
    monkeypatch.setenv(releases.OS_ENV, "trixie")
    assert lab._release_for(cfg, lab_with_nodes("trixie"), None) is TRIXIE
    assert lab._release_for(cfg, lab_with_nodes(None), None) is BOOKWORM  # an older lab's state
    with pytest.raises(LabError, match="runs bookworm nodes; `up` keeps its nodes' OS"):
        lab._release_for(cfg, lab_with_nodes("bookworm"), TRIXIE)


def test_a_reimaged_node_keeps_its_own_image_and_an_older_state_loads(tmp_path):
    """`tacc-lab reimage` records the node's image and release; a state written before
    (no such fields) loads with None: the lab's."""
    where = tmp_path / "state.json"
    old = '{"subnet": "10.77.0.0/24", "nodes": {"n1": {"name": "n1", "index": 1, "address": "a"}}}'
    where.write_text(old)
    node = load_state(where).nodes["n1"]
    assert (node.image, node.os) == (None, None)
    state = lab_with_nodes("bookworm")
    state.nodes["n1"].image, state.nodes["n1"].os = "/images/trixie", "trixie"
    save_state(where, state)
    assert load_state(where).nodes["n1"] == state.nodes["n1"]


def test_reimaging_a_node_of_a_lab_that_is_not_up_changes_nothing(tmp_path):
    cfg = LabConfig.create("t", "10.77.0.0/24", state_root=tmp_path)
    with pytest.raises(LabError, match="lab 't' is not up"):
        lab.reimage(cfg, "n1", TRIXIE, log=lambda _: None)
    assert not cfg.state_file.exists()


def test_a_reimage_moves_the_lab_and_that_node_only():
    """The other nodes keep booting the image they run (their disks are of it), even
    after a power cut; the reimaged node and the nodes added later boot the new one."""
    state = lab_with_nodes("bookworm")
    state.image = "/images/bookworm"
    state.nodes["n2"] = NodeRecord("n2", 2, "10.77.0.12", pid=42)
    lab.record_reimage(state, state.nodes["n2"], Path("/images/trixie"), TRIXIE)
    n1, n2 = state.nodes["n1"], state.nodes["n2"]
    assert (n1.image, n1.os) == ("/images/bookworm", "bookworm")
    assert (n2.image, n2.os, n2.pid) == ("/images/trixie", "trixie", None)
    assert (state.image, state.release) == ("/images/trixie", TRIXIE)


def test_nodes_added_under_a_named_flavor_boot_its_image_the_others_keep_theirs(
    monkeypatch, tmp_path
):
    """TACC_LAB_IMAGE_FLAVOR on a running lab: the nodes `up` adds boot that flavor's
    image (a server racked later, from the site's image), the running ones keep theirs."""
    bare, prebaked = tmp_path / "trixie-bare", tmp_path / "trixie-prebaked"
    bare.mkdir()
    prebaked.mkdir()
    cfg = LabConfig.create("t", "10.77.0.0/24", state_root=tmp_path)
    state = lab_with_nodes("trixie")
    state.image = str(bare)
    images = {"bare": bare, "prebaked": prebaked}
    monkeypatch.setattr(
        lab, "ensure_image", lambda *_, **__: (images[os.environ["TACC_LAB_IMAGE_FLAVOR"]], None)
    )
    monkeypatch.delenv("TACC_LAB_IMAGE_FLAVOR", raising=False)
    assert lab._image_for(cfg, state, TRIXIE, print) == (bare, None)  # none named: the lab's
    assert state.nodes["n1"].image is None
    monkeypatch.setenv("TACC_LAB_IMAGE_FLAVOR", "bare")
    assert lab._image_for(cfg, state, TRIXIE, print) == (bare, None)  # the same image
    assert state.nodes["n1"].image is None
    monkeypatch.setenv("TACC_LAB_IMAGE_FLAVOR", "prebaked")
    assert lab._image_for(cfg, state, TRIXIE, print) == (prebaked, None)
    assert (state.nodes["n1"].image, state.nodes["n1"].os) == (str(bare), "trixie")
