"""The lab's fake GPU/NIC tools (tacc_lab.fakes): real output formats, burns, config, reboot."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_agent.health.checks.gpu import check_gpus
from tacc_lab.fakehw import FakeHardware, build_cpu_tree, device_state
from tests.conftest import ROOT, role_module

PCI = "0000:3b:00.0"
UUID0 = "GPU-5f2a1c3e-8b7d-4e6f-9a1b-2c3d4e5f6a7b"
UUID1 = "GPU-6a3b2d4f-9c8e-4f7a-8b2c-3d4e5f6a7b8c"
STATE = {
    "gpus": [
        # Listed out of bus order on purpose: the tools number GPUs by PCI address.
        {
            "pci": "0000:2a:00.0",
            "device_id": "2330",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": UUID1,
            "memory_mib": 81559,
        },
        {
            "pci": "0000:17:00.0",
            "device_id": "2330",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": UUID0,
            "memory_mib": 81559,
        },
    ],
    "nvswitches": [{"pci": "0000:05:00.0", "device_id": "22a3"}],
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
    "nics": [
        {
            "pci": PCI,
            "device_type": "ConnectX6DX",
            "part_number": "MCX623106AN-CDA_Ax",
            "description": "ConnectX-6 Dx EN adapter card; 100GbE; Dual-port QSFP56; PCIe 4.0 x16",
            "psid": "MT_0000000359",
            "fw_version": "22.36.1010",
            "base_guid": "b8cef60300a1b2c4",
            "base_mac": "b8cef6a1b2c4",
            "config": {
                "LINK_TYPE_P1": "ETH(2)",
                "LINK_TYPE_P2": "ETH(2)",
                "SRIOV_EN": "False(0)",
                "NUM_OF_VFS": "0",
            },
            "next_boot": {},
            "pending_fw": None,
        }
    ],
}


class Lab:
    """A state file and burn log under tmp_path, and a runner for the fake tools."""

    def __init__(self, tmp_path: Path, state: dict) -> None:
        self.tmp = tmp_path
        self.state_file = tmp_path / "etc" / "state.json"
        self.log_file = tmp_path / "log" / "burns.log"
        self.state_file.parent.mkdir()
        self.state_file.write_text(json.dumps(state))

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run_argv([sys.executable, "-m", f"tacc_lab.fakes.{tool}", *args], cwd=ROOT)

    def run_argv(self, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "TACC_FAKE_HW_STATE": str(self.state_file),
            "TACC_FAKE_HW_LOG": str(self.log_file),
        }
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=60)

    def ok(self, tool: str, *args: str) -> str:
        proc = self.run(tool, *args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == ""
        return proc.stdout

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def nic(self) -> dict:
        return self.state()["nics"][0]

    def log_lines(self) -> list[str]:
        return self.log_file.read_text().splitlines() if self.log_file.exists() else []

    def image(self, version: str, psid: str = "MT_0000000359", *extra: str) -> tuple[Path, str]:
        out = self.tmp / f"fw-{psid}-{version}{'-'.join(extra)}.bin"
        sha = self.ok("mkimage", "--psid", psid, "--version", version, "--out", str(out), *extra)
        return out, sha.strip()


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    return Lab(tmp_path, STATE)


# --- lspci -----------------------------------------------------------------------------------


def test_lspci_numeric_by_vendor(lab):
    assert lab.ok("lspci", "-D", "-n", "-d", "10de:") == (
        "0000:05:00.0 0680: 10de:22a3 (rev a1)\n"
        "0000:17:00.0 0302: 10de:2330 (rev a1)\n"
        "0000:2a:00.0 0302: 10de:2330 (rev a1)\n"
    )
    assert lab.ok("lspci", "-D", "-n", "-d", "15b3:") == "0000:3b:00.0 0200: 15b3:101d\n"


def test_lspci_names_and_plain_listing(lab):
    assert lab.ok("lspci", "-D", "-nn", "-d", "10de:2330").splitlines() == [
        "0000:17:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB]"
        " [10de:2330] (rev a1)",
        "0000:2a:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB]"
        " [10de:2330] (rev a1)",
    ]
    assert lab.ok("lspci").splitlines() == [
        "05:00.0 Bridge: NVIDIA Corporation GH100 [H100 NVSwitch] (rev a1)",
        "17:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)",
        "2a:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)",
        "3b:00.0 Ethernet controller: Mellanox Technologies MT2892 Family [ConnectX-6 Dx]",
    ]


def test_lspci_no_match_and_bad_option(lab):
    proc = lab.run("lspci", "-D", "-n", "-d", "8086:")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    proc = lab.run("lspci", "-Z")
    assert proc.returncode == 2
    assert "invalid option -- 'Z'" in proc.stderr


# --- nvidia-smi ------------------------------------------------------------------------------


def test_nvidia_smi_list(lab):
    assert lab.ok("nvidia_smi", "-L") == (
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {UUID0})\n"
        f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {UUID1})\n"
    )


def test_nvidia_smi_query_gpu_csv(lab):
    fields = "--query-gpu=index,name,uuid,memory.total,pci.bus_id,driver_version"
    assert lab.ok("nvidia_smi", fields, "--format=csv").splitlines() == [
        "index, name, uuid, memory.total [MiB], pci.bus_id, driver_version",
        f"0, NVIDIA H100 80GB HBM3, {UUID0}, 81559 MiB, 00000000:17:00.0, 550.54.15",
        f"1, NVIDIA H100 80GB HBM3, {UUID1}, 81559 MiB, 00000000:2A:00.0, 550.54.15",
    ]
    out = lab.ok("nvidia_smi", "--query-gpu=pci.bus_id,memory.total", "--format=csv,noheader")
    assert out == "00000000:17:00.0, 81559 MiB\n00000000:2A:00.0, 81559 MiB\n"
    out = lab.ok("nvidia_smi", "--query-gpu=memory.total,index", "--format=csv,noheader,nounits")
    assert out == "81559, 0\n81559, 1\n"


def test_nvidia_smi_bad_field(lab):
    proc = lab.run("nvidia_smi", "--query-gpu=index,fan.speedz", "--format=csv")
    assert proc.returncode == 2
    assert 'Field "fan.speedz" is not a valid field to query.' in proc.stderr


def test_nvidia_smi_table(lab):
    lines = lab.ok("nvidia_smi").splitlines()
    header = (
        "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15"
        "      CUDA Version: 12.4     |"
    )
    assert header in lines
    assert any("NVIDIA H100 80GB HBM3" in line and "00000000:17:00.0" in line for line in lines)
    assert {len(line) for line in lines[1:] if line.strip()} == {91}


def test_nvidia_smi_figures_and_health_fields_feed_the_agent(tmp_path):
    gpus = [dict(STATE["gpus"][0]), dict(STATE["gpus"][1], ecc_uncorrected=3)]
    lab = Lab(tmp_path, {**STATE, "gpus": gpus})
    fields = "--query-gpu=index,utilization.gpu,power.draw,remapped_rows.failure"
    assert lab.ok("nvidia_smi", fields, "--format=csv").splitlines() == [
        "index, utilization.gpu [%], power.draw [W], remapped_rows.failure",
        "0, 0 %, 70.00 W, No",
        "1, 0 %, 70.00 W, No",
    ]
    smi = tmp_path / "nvidia-smi"  # the agent's GPU check, run against the fake
    smi.write_text(
        f"#!/bin/sh\nTACC_FAKE_HW_STATE={lab.state_file} exec {sys.executable} "
        f'-m tacc_lab.fakes.nvidia_smi "$@"\n'
    )
    smi.chmod(0o755)
    result = check_gpus(str(smi), 2, str(tmp_path / "kern.log"), {}, 10)
    assert result.status == "fail" and re.fullmatch(
        r"GPU \d: 3 uncorrected ECC errors", result.detail
    )
    watts = [s.value for s in result.samples if s.name == "gpu_power_watts"]
    assert watts == [70.0, 70.0]


def test_nvidia_smi_without_gpus_exits_6(tmp_path):
    lab = Lab(tmp_path, {**STATE, "gpus": []})
    for args in ([], ["-L"], ["--query-gpu=name", "--format=csv"]):
        proc = lab.run("nvidia_smi", *args)
        assert proc.returncode == 6
        assert proc.stdout == "No devices were found\n"


# --- mstflint and mkimage --------------------------------------------------------------------

QUERY = """\
Image type:            FS4
FW Version:            22.36.1010
FW Release Date:       N/A
Product Version:       22.36.1010
Description:           UID                GuidsNumber
Base GUID:             b8cef60300a1b2c4        4
Base MAC:              b8cef6a1b2c4            4
Image VSD:             N/A
Device VSD:            N/A
PSID:                  MT_0000000359
Security Attributes:   N/A
"""


def test_mstflint_query_device(lab):
    assert lab.ok("mstflint", "-d", PCI, "q") == QUERY
    assert lab.ok("mstflint", "-d", "3b:00.0", "query") == QUERY


def test_mstflint_unknown_device(lab):
    proc = lab.run("mstflint", "-d", "0000:99:00.0", "q")
    assert proc.returncode == 1
    assert proc.stderr == (
        "-E- Cannot open Device: 0000:99:00.0. No such file or directory. MFE_CR_ERROR\n"
    )


def test_mkimage_and_image_query(lab):
    good, sha = lab.image("22.39.1002")
    assert sha == hashlib.sha256(good.read_bytes()).hexdigest()
    assert lab.image("22.39.1002")[1] == sha  # deterministic
    bad, bad_sha = lab.image("22.39.1002", "MT_0000000359", "--corrupt")
    assert bad_sha != sha
    assert bad.stat().st_size == good.stat().st_size
    out = lab.ok("mstflint", "-i", str(good), "q")
    assert "FW Version:            22.39.1002\n" in out
    assert "PSID:                  MT_0000000359\n" in out
    proc = lab.run("mstflint", "-i", str(lab.tmp / "missing.bin"), "q")
    assert proc.returncode == 1
    assert "-E- Cannot open" in proc.stderr


def test_mstflint_burn(lab):
    image, sha = lab.image("22.39.1002")
    out = lab.ok("mstflint", "-d", PCI, "-i", str(image), "-y", "burn")
    assert out == (
        "\n"
        "    Current FW version on flash:  22.36.1010\n"
        "    New FW version:               22.39.1002\n"
        "\n"
        "Burning FW image without signatures - OK\n"
        "Restoring signature                     - OK\n"
        "-I- To load new FW run mstfwreset or reboot machine.\n"
    )
    nic = lab.nic()
    assert (nic["fw_version"], nic["pending_fw"]) == ("22.36.1010", "22.39.1002")
    query = lab.ok("mstflint", "-d", PCI, "q")
    assert "FW Version:            22.39.1002\nFW Version(Running):   22.36.1010\n" in query
    [line] = lab.log_lines()
    stamp, tool, pci, event = line.split(" ", 3)
    assert (tool, pci) == ("mstflint", PCI)
    assert stamp.startswith("20") and "T" in stamp
    assert event == f"burn from=22.36.1010 to=22.39.1002 image={image} sha256={sha}"
    assert sorted(p.name for p in lab.state_file.parent.iterdir()) == [
        "state.json",
        "state.json.lock",
    ]


@pytest.mark.parametrize(
    ("psid", "extra", "yes", "message"),
    [
        (
            "MT_0000000999",
            (),
            "-y",
            "-E- PSID mismatch. The PSID on flash (MT_0000000359) differs from the PSID in the"
            " given image (MT_0000000999).",
        ),
        ("MT_0000000359", ("--corrupt",), "-y", "-E- Burning FS4 image failed: Bad CRC"),
        ("MT_0000000359", (), None, "use -y for non-interactive"),
    ],
    ids=["psid-mismatch", "corrupted-image", "no-yes"],
)
def test_mstflint_burn_refused(lab, psid, extra, yes, message):
    image, _ = lab.image("22.39.1002", psid, *extra)
    before = lab.state_file.read_bytes()
    proc = lab.run("mstflint", "-d", PCI, "-i", str(image), *([yes] if yes else []), "b")
    assert proc.returncode == 1
    assert message in proc.stderr
    assert proc.stderr.startswith("-E- ")
    assert lab.state_file.read_bytes() == before
    assert lab.log_lines() == []
    assert lab.ok("mstflint", "-d", PCI, "q") == QUERY


def test_fakes_run_as_standalone_files(lab):
    """Lab nodes get the files copied somewhere, not the package: no relative imports there."""
    lib = lab.tmp / "lib"
    shutil.copytree(ROOT / "packages" / "ops" / "tacc_lab" / "fakes", lib)
    proc = lab.run_argv([sys.executable, str(lib / "mstflint.py"), "-d", PCI, "q"], cwd=lab.tmp)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, QUERY, "")
    proc = lab.run_argv([sys.executable, str(lib / "lspci.py"), "-Dn", "-d", "15b3:"], cwd=lab.tmp)
    assert proc.stdout == "0000:3b:00.0 0200: 15b3:101d\n"


# --- mlxconfig -------------------------------------------------------------------------------

DEVICE_BLOCK = """
Device #1:
----------

Device type:    ConnectX6DX
Name:           MCX623106AN-CDA_Ax
Description:    ConnectX-6 Dx EN adapter card; 100GbE; Dual-port QSFP56; PCIe 4.0 x16
Device:         0000:3b:00.0

"""


def test_mlxconfig_query(lab):
    assert lab.ok("mlxconfig", "-d", PCI, "q") == DEVICE_BLOCK + (
        "Configurations:                                     Next Boot\n"
        "        LINK_TYPE_P1                                ETH(2)\n"
        "        LINK_TYPE_P2                                ETH(2)\n"
        "        SRIOV_EN                                    False(0)\n"
        "        NUM_OF_VFS                                  0\n"
    )
    out = lab.ok("mlxconfig", "-d", PCI, "q", "SRIOV_EN")
    assert out.endswith("Next Boot\n        SRIOV_EN                                    False(0)\n")


def test_mlxconfig_set(lab):
    out = lab.ok("mlxconfig", "-d", PCI, "-y", "set", "SRIOV_EN=1", "NUM_OF_VFS=8")
    assert out == DEVICE_BLOCK + (
        "Configurations:                                     Next Boot       New\n"
        "        SRIOV_EN                                    False(0)        True(1)\n"
        "        NUM_OF_VFS                                  0               8\n"
        "\n"
        " Apply new Configuration? (y/n) [n] : y\n"
        "Applying... Done!\n"
        "-I- Please reboot machine to load new configurations.\n"
    )
    nic = lab.nic()
    assert nic["next_boot"] == {"SRIOV_EN": "True(1)", "NUM_OF_VFS": "8"}
    assert nic["config"]["SRIOV_EN"] == "False(0)"
    query = lab.ok("mlxconfig", "-d", PCI, "q")
    assert "        SRIOV_EN                                    True(1)\n" in query
    assert "        NUM_OF_VFS                                  8\n" in query
    assert lab.log_lines()[0].endswith(f" mlxconfig {PCI} set SRIOV_EN=True(1) NUM_OF_VFS=8")


@pytest.mark.parametrize(
    ("param", "stored"),
    [
        ("LINK_TYPE_P1=IB", "IB(1)"),
        ("LINK_TYPE_P1=ib", "IB(1)"),
        ("LINK_TYPE_P1=1", "IB(1)"),
        ("LINK_TYPE_P2=VPI(3)", "VPI(3)"),
        ("SRIOV_EN=True", "True(1)"),
        ("sriov_en=true", "True(1)"),
        ("SRIOV_EN=1", "True(1)"),
        ("NUM_OF_VFS=016", "16"),
    ],
)
def test_mlxconfig_set_normalizes(lab, param, stored):
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", param)
    key = param.split("=")[0].upper()
    assert lab.nic()["next_boot"] == {key: stored}


def test_mlxconfig_set_is_idempotent(lab):
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", "LINK_TYPE_P1=IB", "NUM_OF_VFS=4")
    state, query = lab.state_file.read_bytes(), lab.ok("mlxconfig", "-d", PCI, "q")
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", "LINK_TYPE_P1=1", "NUM_OF_VFS=4")
    assert lab.state_file.read_bytes() == state
    assert lab.ok("mlxconfig", "-d", PCI, "q") == query
    # Setting the current value back cancels the pending change.
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", "LINK_TYPE_P1=ETH", "NUM_OF_VFS=0")
    assert lab.nic()["next_boot"] == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-y", "set", "FOO_BAR=1"], "-E- The Device doesn't support FOO_BAR parameter"),
        (["-y", "set", "LINK_TYPE_P1=7"], "bad value '7' for LINK_TYPE_P1"),
        (["-y", "set", "NUM_OF_VFS=many"], "bad value 'many' for NUM_OF_VFS"),
        (["set", "SRIOV_EN=1"], "use -y for non-interactive"),
        (["q", "FOO_BAR"], "-E- The Device doesn't support FOO_BAR parameter"),
    ],
)
def test_mlxconfig_refusals_change_nothing(lab, args, message):
    before = lab.state_file.read_bytes()
    proc = lab.run("mlxconfig", "-d", PCI, *args)
    assert proc.returncode == 1
    assert message in proc.stderr
    assert lab.state_file.read_bytes() == before
    assert lab.log_lines() == []


def test_mlxconfig_verbose_query(lab):
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", "SRIOV_EN=True")
    assert lab.ok("mlxconfig", "-d", PCI, "-e", "q") == DEVICE_BLOCK + (
        "Configurations:                                     Default         Current"
        "         Next Boot\n"
        "        LINK_TYPE_P1                                ETH(2)          ETH(2)"
        "          ETH(2)\n"
        "        LINK_TYPE_P2                                ETH(2)          ETH(2)"
        "          ETH(2)\n"
        "*       SRIOV_EN                                    False(0)        False(0)"
        "        True(1)\n"
        "        NUM_OF_VFS                                  0               0"
        "               0\n"
        "The '*' shows parameters with next value different from default/current value.\n"
    )


# --- mlxfwmanager and reboot -----------------------------------------------------------------


def mlxfwmanager_block(versions: str) -> str:
    return (
        "Querying Mellanox devices firmware ...\n"
        "\n"
        "Device #1:\n"
        "----------\n"
        "\n"
        "  Device Type:      ConnectX6DX\n"
        "  Part Number:      MCX623106AN-CDA_Ax\n"
        "  Description:      ConnectX-6 Dx EN adapter card; 100GbE; Dual-port QSFP56;"
        " PCIe 4.0 x16\n"
        "  PSID:             MT_0000000359\n"
        "  PCI Device Name:  0000:3b:00.0\n"
        "  Base GUID:        b8cef60300a1b2c4\n"
        "  Base MAC:         b8cef6a1b2c4\n"
        "  Versions:         Current        Available\n"
        f"{versions}"
        "\n"
        "  Status:           No matching image found\n"
        "\n"
    )


def test_mlxfwmanager_query(lab):
    expected = mlxfwmanager_block("     FW             22.36.1010     N/A\n")
    assert lab.ok("mlxfwmanager", "--query") == expected
    assert lab.ok("mlxfwmanager", "-d", PCI, "--query") == expected
    proc = lab.run("mlxfwmanager", "-d", "0000:99:00.0", "--query")
    assert proc.returncode == 1
    assert "-E- No devices found" in proc.stderr


def test_reboot_applies_pending_firmware_and_config(lab):
    image, _ = lab.image("22.39.1002")
    lab.ok("mstflint", "-d", PCI, "-i", str(image), "-y", "burn")
    lab.ok("mlxconfig", "-d", PCI, "-y", "set", "LINK_TYPE_P1=IB", "SRIOV_EN=1")
    assert lab.ok("mlxfwmanager", "--query") == mlxfwmanager_block(
        "     FW             22.39.1002     N/A\n     FW (Running)   22.36.1010     N/A\n"
    )

    out = lab.ok("hwstate", "reboot")
    assert out == f"{PCI}: reboot applied fw=22.39.1002 LINK_TYPE_P1=IB(1) SRIOV_EN=True(1)\n"
    nic = lab.nic()
    assert (nic["fw_version"], nic["pending_fw"], nic["next_boot"]) == ("22.39.1002", None, {})
    assert nic["config"]["LINK_TYPE_P1"] == "IB(1)"
    assert lab.ok("mlxfwmanager", "--query") == mlxfwmanager_block(
        "     FW             22.39.1002     N/A\n"
    )
    assert "FW Version(Running)" not in lab.ok("mstflint", "-d", PCI, "q")
    verbose = lab.ok("mlxconfig", "-d", PCI, "-e", "q")
    assert "*       LINK_TYPE_P1                                ETH(2)          IB(1)" in verbose
    # An InfiniBand port 1 makes the card an Infiniband controller on the bus.
    assert lab.ok("lspci", "-D", "-n", "-d", "15b3:") == "0000:3b:00.0 0207: 15b3:101d\n"
    assert lab.log_lines()[-1].split(" ", 3)[1:3] == ["hwstate", PCI]
    assert lab.ok("hwstate", "reboot") == "nothing pending\n"


def test_nvidia_smi_topo_of_two_sockets_reads_as_each_sockets_cores(tmp_path):
    """Issue [22] point 2: the FAKE 2-socket, 8-GPU node (`tacc-lab fake-hw n2 --gpus 8
    --sockets 2 --cores-per-socket 8`) prints `nvidia-smi topo -m` that the nvidia_gpu
    role's module turns into Cores=0-7 for GPUs 0-3 and 8-15 for GPUs 4-7, against the
    fake CPU sysfs tree written beside it."""
    hw = FakeHardware(gpus=8, nvswitches=2, sockets=2, cores_per_socket=8)
    state = device_state(hw, "n2")
    build_cpu_tree(tmp_path / "cpu", state["cpu"])
    lab = Lab(tmp_path, state)
    topo = lab.ok("nvidia_smi", "topo", "-m")
    header, first = topo.splitlines()[:2]
    assert header.split("\t")[-3:] == ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    assert first.split("\t")[:3] == ["GPU0", " X ", "NV18"]
    module = role_module("nvidia_gpu", "nvidia_gpu_facts")
    cores = module.gpu_cores(module.parse_topo(topo), module.logical_cores(tmp_path / "cpu"))
    assert cores == ["0-7"] * 4 + ["8-15"] * 4
    assert lab.run("nvidia_smi", "topo", "-x").returncode == 2


# --- the FAKE driver's kernel module: loaded at install, or after a reboot ------------------


def smi_of(lab: Lab, version: str, *args: str) -> subprocess.CompletedProcess[str]:
    """nvidia-smi as the FAKE driver package `version` installs it (its library's version)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "TACC_FAKE_HW_STATE": str(lab.state_file),
        "TACC_FAKE_NVML_VERSION": version,
    }
    argv = [sys.executable, "-m", "tacc_lab.fakes.nvidia_smi", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def test_a_driver_upgrade_runs_the_old_module_until_a_reboot(tmp_path):
    """As on a real node: the first install's module loads at once (no nouveau); an
    upgrade's waits for the boot, and until then the new nvidia-smi exits 18 with NVML's
    version mismatch; with no module at all it exits 9."""
    lab = Lab(tmp_path, {k: v for k, v in STATE.items() if k != "driver_version"})
    none = smi_of(lab, "550.54.15", "-L")
    assert none.returncode == 9 and "couldn't communicate with the NVIDIA driver" in none.stdout
    assert lab.ok("hwstate", "module-built", "550.54.15") == "module 550.54.15 loaded\n"
    assert smi_of(lab, "550.54.15", "-L").returncode == 0
    out = lab.ok("hwstate", "module-built", "550.163.01")
    assert out == "module 550.163.01 built; 550.54.15 stays loaded until a reboot\n"
    mismatch = smi_of(lab, "550.163.01", "--query-gpu=driver_version", "--format=csv")
    assert mismatch.returncode == 18
    assert mismatch.stdout == (
        "Failed to initialize NVML: Driver/library version mismatch\n"
        "NVML library version: 550.163\n"
    )
    assert lab.ok("hwstate", "load-driver") == "module 550.163.01 loaded at boot\n"
    after = smi_of(lab, "550.163.01", "--query-gpu=driver_version", "--format=csv,noheader")
    assert (after.returncode, after.stdout) == (0, "550.163.01\n550.163.01\n")
    assert lab.state()["nics"][0]["pending_fw"] is None  # the cards are not touched
