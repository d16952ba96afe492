"""The lab's container base image (`tacc-lab up --container-image`): what the build runs,
what names its cache entry, and that a cached archive is reused without building."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tacc_lab import oci_image, releases
from tacc_lab.errors import LabError
from tacc_lab.prereqs import CONTAINER_IMAGE_COMMANDS, check_prerequisites


def test_the_build_is_minbase_bookworm_with_python_numpy_mpi4py_and_openmpi() -> None:
    argv = oci_image.mmdebstrap_argv([Path("/etc/apt/sources.list")])
    assert argv[0] == "mmdebstrap"
    assert "--variant=minbase" in argv and "--format=tar" in argv
    include = next(a for a in argv if a.startswith("--include=")).split("=", 1)[1].split(",")
    assert {"python3", "python3-numpy", "python3-mpi4py", "openmpi-bin"} <= set(include)
    # suite, "-" (the tar on stdout), then this host's apt sources
    assert argv[-3:] == ["bookworm", "-", "/etc/apt/sources.list"]
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv


def test_the_image_has_the_files_ch_run_binds_onto() -> None:
    hook = next(a for a in oci_image.mmdebstrap_argv([]) if a.startswith("--customize-hook="))
    for target in ("/etc/hosts", "/etc/resolv.conf"):
        assert f'touch "$1{target}"' in hook


def test_the_image_carries_a_marker_the_node_does_not_have() -> None:
    """Node and image are both Debian 12: /etc/tacc-image tells them apart."""
    hook = next(a for a in oci_image.mmdebstrap_argv([]) if a.startswith("--customize-hook="))
    assert 'echo tacc/base:bookworm > "$1/etc/tacc-image"' in hook


def test_device_nodes_are_filtered_out_of_the_layer() -> None:
    """A rootless `umoci unpack` cannot create device nodes; /dev itself stays."""
    assert oci_image.FILTER_ARGV == ["mmtarfilter", "--path-exclude=/dev/*"]


def test_umoci_makes_one_layer_with_a_path_in_its_config(tmp_path: Path) -> None:
    steps = oci_image.umoci_argvs(tmp_path / "layout", tmp_path / "rootfs.tar")
    assert [step[:2] for step in steps] == [
        ["umoci", "init"],
        ["umoci", "new"],
        ["umoci", "raw"],
        ["umoci", "config"],
        ["umoci", "gc"],
    ]
    assert steps[2][-1] == str(tmp_path / "rootfs.tar")
    assert f"PATH={oci_image.IMAGE_PATH}" in steps[3]
    archive = oci_image.skopeo_archive_argv(tmp_path / "layout", tmp_path / "a.tar")
    assert archive[-2:] == [
        f"oci:{tmp_path}/layout:bookworm",
        f"oci-archive:{tmp_path}/a.tar:bookworm",
    ]


def test_the_cache_key_follows_the_package_list_only() -> None:
    key = oci_image.build_key()
    assert key == oci_image.build_key()
    assert key != oci_image.build_key(packages=(*oci_image.PACKAGES, "python3-scipy"))
    assert key != oci_image.build_key(suite="trixie")
    assert key == oci_image.build_key(packages=tuple(reversed(oci_image.PACKAGES)))
    assert oci_image.archive_path(Path("/c"), key) == Path(f"/c/base-bookworm-{key[:16]}.oci.tar")


def test_a_cached_archive_is_reused_without_building(tmp_path: Path, monkeypatch) -> None:
    archive = oci_image.archive_path(tmp_path)
    archive.write_bytes(b"cached")

    def no_build(*_args, **_kwargs):
        raise AssertionError("built although cached")

    monkeypatch.setattr(oci_image, "_write_layer", no_build)
    image = oci_image.ensure_oci_image(tmp_path, log=lambda _m: None)
    assert (image.archive, image.seed_name, image.build_seconds) == (
        archive,
        "tacc/base:bookworm",
        None,
    )


@pytest.mark.bad_input
def test_missing_build_tools_name_their_packages(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(oci_image, "missing_commands", lambda **_kw: {"umoci": "umoci"})
    with pytest.raises(LabError, match=r"--container-image needs umoci; .*apt-get install umoci"):
        oci_image.ensure_oci_image(tmp_path, log=lambda _m: None)
    assert not list(tmp_path.glob("*.oci.tar"))


@pytest.mark.bad_input
def test_up_with_the_option_checks_the_build_tools_first() -> None:
    def which(cmd: str) -> str | None:
        return None if cmd in ("umoci", "skopeo") else f"/usr/bin/{cmd}"

    with pytest.raises(LabError, match="apt-get install skopeo umoci"):
        check_prerequisites(euid=0, which=which, container_image=True)
    check_prerequisites(euid=0, which=which)  # a lab without the option needs neither
    assert {"mmdebstrap", "mmtarfilter", "umoci", "skopeo"} == set(CONTAINER_IMAGE_COMMANDS)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MARKER_FILE", "/etc/other-marker"),
        ("SEED_NAME", "tacc/base:other"),
        ("FILTER_ARGV", ["mmtarfilter", "--path-exclude=/dev/*", "--path-exclude=/tmp/*"]),
        ("IMAGE_PATH", "/usr/bin:/bin"),
    ],
)
def test_the_cache_key_covers_the_marker_seed_name_filter_and_config(
    monkeypatch, name: str, value: object
) -> None:
    """Each decides what the archive holds: changing one must not reuse the old archive."""
    before = oci_image.build_key()
    monkeypatch.setattr(oci_image, name, value)
    assert oci_image.build_key() != before


def test_the_cache_key_covers_the_umoci_config_words(monkeypatch) -> None:
    before = oci_image.build_key()
    real = oci_image.umoci_argvs

    def other_cmd(layout: Path, layer: Path) -> list[list[str]]:
        return [
            [word.replace("/bin/bash", "/bin/sh") for word in argv] for argv in real(layout, layer)
        ]

    monkeypatch.setattr(oci_image, "umoci_argvs", other_cmd)
    assert oci_image.build_key() != before


def test_leftovers_go_but_a_fresh_build_and_the_previous_archive_stay(tmp_path: Path) -> None:
    """Killed builds' scratch directories (a day old) go; the archive before the current
    one stays (a lab may be copying it into its registry), older ones go."""
    now = 1_000_000_000.0
    day = oci_image.SCRATCH_MAX_AGE
    killed, running = tmp_path / ".build-killed", tmp_path / ".build-running"
    for scratch, age in ((killed, day + 60), (running, 600)):
        (scratch / "layout").mkdir(parents=True)
        os.utime(scratch, (now - age, now - age))
    current = oci_image.archive_path(tmp_path)
    previous = tmp_path / "base-bookworm-1111111111111111.oci.tar"
    oldest = tmp_path / "base-bookworm-2222222222222222.oci.tar"
    for archive, age in ((current, 0), (previous, 3600), (oldest, 7200)):
        archive.write_bytes(b"oci")
        os.utime(archive, (now - age, now - age))
    oci_image._remove_leftovers(tmp_path, current, now=now)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".build-running", current.name, previous.name]
    )


def test_a_debian_13_host_builds_the_bookworm_image_from_bookworm_suites(
    tmp_path: Path, monkeypatch
) -> None:
    """On a trixie host the host's sources name trixie: mmdebstrap gets them renamed for
    bookworm (before, it asked trixie's archive for bookworm and apt failed)."""
    host_sources = tmp_path / "debian.sources"
    host_sources.write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie trixie-updates\n"
        "Components: main\n"
    )
    monkeypatch.setattr(releases, "source_files", lambda: [host_sources])
    monkeypatch.setattr(releases, "host_codename", lambda: "trixie")
    monkeypatch.setattr(oci_image, "missing_commands", lambda **_kw: {})
    seen: list[str] = []

    class Built(Exception):
        pass

    def write_layer(sources: list[Path], _layer: Path) -> None:
        seen.extend(source.read_text() for source in sources)
        raise Built

    monkeypatch.setattr(oci_image, "_write_layer", write_layer)
    with pytest.raises(Built):
        oci_image.ensure_oci_image(tmp_path / "cache", log=lambda _m: None)
    assert seen == [host_sources.read_text().replace("trixie", "bookworm")]
