"""Issue [3]: the smartnic_firmware role against FAKE ConnectX-6 Dx devices (tacc-lab
fake-hw) on n2 and n3, rolled by playbooks/firmware.yml one node at a time. Every burn
the fake mstflint performs is logged on the node; the log proves what was burned when.
Runs in CI as root, on the factory's `fw` lab (tests/integration/labs.py: FIRMWARE).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.lab_helpers import lab_cli, node_sh, playbook
from tests.integration.labs import FIRMWARE

pytestmark = pytest.mark.lab

NAME = FIRMWARE.name
PSID = "MT_0000000359"
PCI = "0000:3b:00.0"
NODES = ("n2", "n3")
BURN_LOG = "/var/log/tacc-fake-hw/burns.log"


def make_image(path, version: str, *, corrupt: bool = False) -> str:
    mkimage = str(ROOT / "packages/ops/tacc_lab/fakes/mkimage.py")
    argv = [sys.executable, mkimage, "--psid", PSID, "--version", version, "--out", str(path)]
    argv += ["--corrupt"] if corrupt else []
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def burns(node: str) -> list[str]:
    proc = node_sh(NAME, node, f"cat {BURN_LOG} 2>/dev/null || true")
    return [line for line in proc.stdout.splitlines() if " burn " in line]


def flash_version(node: str) -> str:
    out = node_sh(NAME, node, f"mstflint -d {PCI} q").stdout
    return next(line.split()[-1] for line in out.splitlines() if line.startswith("FW Version:"))


@pytest.fixture(scope="module")
def lab(shaped_lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fw")
    inventory = shaped_lab.inventory
    for node in NODES:
        fake = lab_cli(NAME, "fake-hw", node, "--nics", "1", "--nic-fw", "22.36.1010")
        assert fake.returncode == 0, fake.stderr
        # A provisioned node has package lists (site.yml); this fresh one needs them.
        assert node_sh(NAME, node, "apt-get update -qq").returncode == 0
    good = tmp / "fw-22.39.1002.bin"
    images = {"good_sha": make_image(good, "22.39.1002"), "good": good}
    images["next_sha"] = make_image(tmp / "genuine-22.40.1000.bin", "22.40.1000")
    images["corrupt"] = tmp / "corrupt-22.40.1000.bin"
    make_image(images["corrupt"], "22.40.1000", corrupt=True)
    return inventory, tmp, images


def firmware(lab, version, src, sha, *extra, expect_ok=True):
    inventory, tmp, _ = lab
    varfile = tmp / "fw-vars.json"
    varfile.write_text(
        json.dumps(
            {
                "smartnic_firmware_images": {
                    PSID: {"version": version, "src": str(src), "sha256": sha}
                }
            }
        )
    )
    return playbook(
        inventory,
        "playbooks/firmware.yml",
        "-e",
        f"@{varfile}",
        "-e",
        "smartnic_firmware_serial=1",
        *extra,
        expect_ok=expect_ok,
    )


@pytest.fixture(scope="module")
def history(lab):
    """The runs, in order, with the burn log after each."""
    _, _, images = lab
    good = ("22.39.1002", images["good"], images["good_sha"])
    steps = {}
    run, changed = firmware(lab, *good)  # burning not enabled
    steps["off"] = (run, changed, {n: burns(n) for n in NODES})
    run, changed = firmware(lab, *good, "-e", "smartnic_firmware_burn=true", "--check", "--diff")
    steps["check_before"] = (run, changed, {n: burns(n) for n in NODES})
    run, changed = firmware(lab, *good, "-e", "smartnic_firmware_burn=true")
    steps["burn"] = (run, changed, {n: burns(n) for n in NODES})
    run, changed = firmware(lab, *good, "-e", "smartnic_firmware_burn=true")
    steps["again"] = (run, changed, {n: burns(n) for n in NODES})
    run, changed = firmware(lab, *good, "-e", "smartnic_firmware_burn=true", "--check")
    steps["check_after"] = (run, changed, {n: burns(n) for n in NODES})
    # The inventory names the genuine 22.40 image's checksum; the file is corrupted.
    run, changed = firmware(
        lab,
        "22.40.1000",
        images["corrupt"],
        images["next_sha"],
        "-e",
        "smartnic_firmware_burn=true",
        expect_ok=False,
    )
    steps["bad"] = (run, changed, {n: burns(n) for n in NODES})
    for node in NODES:  # the burn log across all runs (shown with pytest -s)
        print(f"--- {node}:{BURN_LOG}\n" + node_sh(NAME, node, f"cat {BURN_LOG}").stdout)
    return steps


def text(run) -> str:
    """The run's output with line wrapping undone (the YAML callback folds messages)."""
    return " ".join(run.stdout.split())


def test_nothing_is_burned_without_the_opt_in(history):
    run, _, log = history["off"]
    assert log == {"n2": [], "n3": []}
    assert "wanted 22.39.1002: differs; burning is off" in text(run)


def test_check_mode_reports_the_burn_and_burns_nothing(history):
    run, _, log = history["check_before"]
    assert log == {"n2": [], "n3": []}
    assert "would stage the image and burn" in text(run)


def test_first_real_run_burns_each_device_once(history):
    run, changed, log = history["burn"]
    for node in NODES:
        assert len(log[node]) == 1, log
        assert "from=22.36.1010 to=22.39.1002" in log[node][0]
        assert flash_version(node) == "22.39.1002"
        assert changed[node] > 0
        fact = json.loads(node_sh(NAME, node, "cat /etc/ansible/facts.d/smartnic.fact").stdout)
        assert fact["reset_pending"] is True
        assert fact["reasons"] == [f"{PCI}: 22.36.1010 -> 22.39.1002"]
    # serial: 1 -> one node per batch
    assert run.stdout.count("PLAY [SmartNIC firmware and settings, rolling]") == 2


def test_second_run_and_check_mode_burn_nothing(history):
    for step in ("again", "check_after"):
        _, changed, log = history[step]
        assert set(changed.values()) == {0}, (step, changed)
        assert all(len(log[node]) == 1 for node in NODES), (step, log)


def test_bad_checksum_aborts_the_host_and_the_rollout_leaving_devices_unchanged(history):
    run, _, log = history["bad"]
    assert run.returncode != 0
    assert "has sha256" in text(run) and "nothing burned" in text(run)
    assert all(len(log[node]) == 1 for node in NODES), log
    for node in NODES:
        assert flash_version(node) == "22.39.1002"
    # max_fail_percentage 0: the first batch failed, so n3 was never touched.
    assert "n3" not in run.stdout.split("PLAY RECAP")[-1]
