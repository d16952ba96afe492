"""Parsing and decisions in the hardware roles' modules (nvidia_gpu_facts, smartnic_fw,
smartnic_config), on the real tools' documented output formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_lab.fakehw import FakeHardware, device_state
from tacc_lab.fakes.nvidia_mig import mig_minors
from tests.conftest import ROOT, role_module

load = role_module


gpu = load("nvidia_gpu", "nvidia_gpu_facts")
fw = load("smartnic_firmware", "smartnic_fw")
cfg = load("smartnic_firmware", "smartnic_config")


@pytest.mark.parametrize(
    ("model", "gres"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("NVIDIA GeForce RTX 3090", "rtx3090"),
        ("NVIDIA RTX A6000", "rtxa6000"),
        ("NVIDIA L40S", "l40s"),
    ],
)
def test_gres_type_from_model_name(model, gres):
    assert gpu.gres_type(model) == gres


def test_lspci_splits_gpus_from_nvswitches_and_ignores_audio():
    out = (
        "0000:05:00.0 0680: 10de:22a3 (rev a1)\n"
        "0000:17:00.0 0302: 10de:2330 (rev a1)\n"
        "0000:17:00.1 0403: 10de:22ba (rev a1)\n"
        "0000:65:00.0 0300: 10de:2204 (rev a1)\n"
    )
    gpus, switches = gpu.parse_lspci(out)
    assert [g["pci"] for g in gpus] == ["0000:17:00.0", "0000:65:00.0"]
    assert [s["pci"] for s in switches] == ["0000:05:00.0"]


def test_nvidia_smi_csv_rows():
    rows = gpu.parse_smi("0, NVIDIA H100 80GB HBM3, GPU-1a2b, 81559, 00000000:17:00.0, 550.54.15\n")
    assert rows == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-1a2b",
            "memory_mib": 81559,
            "pci": "0000:17:00.0",
            "driver_version": "550.54.15",
        }
    ]


# `nvidia-smi topo -m` of a two-socket, 56-core-per-socket HGX H100 with SMT (the
# shape NVIDIA documents for DGX H100): GPUs 0-3 near socket 0, 4-7 near socket 1.
def hgx_topo() -> str:
    header = ["", *(f"GPU{i}" for i in range(8)), "NIC0"]
    lines = ["\t".join([*header, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for i in range(8):
        links = [" X " if j == i else "NV18" for j in range(8)]
        near = ["0-55,112-167", "0"] if i < 4 else ["56-111,168-223", "1"]
        lines.append("\t".join([f"GPU{i}", *links, "PIX", *near, "", "N/A"]))
    lines.append("\t".join(["NIC0", *["PIX"] * 8, " X "]))
    return "\n".join([*lines, "", "Legend:", "", "  X    = Self", ""])


def cpu_tree(root, sockets: int, cores: int, threads: int):
    """A /sys/devices/system/cpu look-alike numbered as Linux numbers a two-socket server:
    the first threads socket by socket, then the second threads."""
    for thread in range(threads):
        for socket in range(sockets):
            for core in range(cores):
                topology = root / f"cpu{(thread * sockets + socket) * cores + core}" / "topology"
                topology.mkdir(parents=True)
                (topology / "physical_package_id").write_text(f"{socket}\n")
                (topology / "core_id").write_text(f"{core * 2}\n")  # core ids with gaps
    return root


def test_topo_matrix_gives_each_gpus_cores_in_slurms_numbers(tmp_path):
    """Issue [22] point 2: CPU affinity 0-55,112-167 (socket 0 and its second threads)
    is Slurm's logical cores 0-55; the NIC row and the legend are not GPUs."""
    affinity = gpu.parse_topo(hgx_topo())
    assert len(affinity) == 8 and affinity[0][:2] == [0, 1] and affinity[0][-1] == 167
    cores_of = gpu.logical_cores(cpu_tree(tmp_path, sockets=2, cores=56, threads=2))
    assert gpu.gpu_cores(affinity, cores_of) == ["0-55"] * 4 + ["56-111"] * 4


def test_gpus_near_every_core_need_no_cores(tmp_path):
    topo = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tPHB\t0-63\t0\t\tN/A\n"
        "GPU1\tPHB\t X \t0-63\t0\t\tN/A\n"
    )
    cores_of = gpu.logical_cores(cpu_tree(tmp_path, sockets=1, cores=64, threads=1))
    assert gpu.gpu_cores(gpu.parse_topo(topo), cores_of) == []


def test_a_terminals_underlined_header_and_a_gpu_without_affinity_still_read(tmp_path):
    """On a terminal nvidia-smi underlines the header; a GPU whose affinity the driver
    does not know ("N/A", seen in VMs) is near every core."""
    topo = (
        "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tSYS\t0-3\t0\t\tN/A\n"
        "GPU1\tSYS\t X \tN/A\tN/A\t\tN/A\n"
    )
    affinity = gpu.parse_topo(topo)
    assert affinity == [[0, 1, 2, 3], []]
    cores_of = gpu.logical_cores(cpu_tree(tmp_path, sockets=2, cores=4, threads=1))
    assert gpu.gpu_cores(affinity, cores_of) == ["0-3", "0-7"]


def test_affinity_beyond_the_cpu_topology_is_an_error(tmp_path):
    cores_of = gpu.logical_cores(cpu_tree(tmp_path, sockets=1, cores=4, threads=1))
    with pytest.raises(ValueError, match="GPU0 is near CPUs 4-7, not in the CPU topology"):
        gpu.gpu_cores([[0, 1, 2, 3, 4, 5, 6, 7]], cores_of)


def test_mstflint_query_fields():
    out = (
        "Image type:            FS4\n"
        "FW Version:            22.36.1010\n"
        "FW Release Date:       11.1.2023\n"
        "PSID:                  MT_0000000359\n"
    )
    assert fw.parse_query(out) == {"fw_version": "22.36.1010", "psid": "MT_0000000359"}


def test_mlxconfig_next_boot_values_and_enum_comparison():
    out = (
        "\nDevice #1:\n----------\n\nDevice type:    ConnectX6DX\n"
        "Configurations:                              Next Boot\n"
        "         LINK_TYPE_P1                        ETH(2)\n"
        "         SRIOV_EN                            True(1)\n"
        "         NUM_OF_VFS                          8\n"
    )
    values = cfg.parse_next_boot(out)
    assert values == {"LINK_TYPE_P1": "ETH(2)", "SRIOV_EN": "True(1)", "NUM_OF_VFS": "8"}
    assert cfg.same_value("ETH(2)", "ETH") and cfg.same_value("ETH(2)", "2")
    assert cfg.same_value("True(1)", "true") and cfg.same_value("8", "8")
    assert not cfg.same_value("ETH(2)", "IB") and not cfg.same_value("8", "16")


plan = load("nvidia_gpu", "nvidia_gpu_driver_plan")


def test_the_driver_plan_names_missing_packages_and_ones_at_another_version():
    installed = plan.parse_installed(
        "cuda-drivers-550\t550.54.15-1\tii \n"
        "nvidia-fabricmanager-550\t550.163.01-1\tii \n"
        "tacc-fake-linux-headers\t1.0\trc \n"  # removed, its configuration kept
    )
    assert installed == {
        "cuda-drivers-550": "550.54.15-1",
        "nvidia-fabricmanager-550": "550.163.01-1",
    }
    packages = ["tacc-fake-linux-headers", "cuda-drivers-550", "nvidia-fabricmanager-550"]
    pinned = ["cuda-drivers-550", "nvidia-fabricmanager-550"]
    assert plan.changes(installed, packages, pinned, "550.163.01") == [
        "install tacc-fake-linux-headers",
        "replace cuda-drivers-550 550.54.15-1 with 550.163.01",
    ]
    # 550.163.1 is not 550.163.01's prefix; with no version held only what is missing counts.
    assert plan.changes(installed, pinned, pinned, "550.163.1") == [
        "replace cuda-drivers-550 550.54.15-1 with 550.163.1",
        "replace nvidia-fabricmanager-550 550.163.01-1 with 550.163.1",
    ]
    assert plan.changes(installed, packages, pinned, "") == ["install tacc-fake-linux-headers"]


def test_the_plan_finds_the_driver_libraries_a_meta_package_downgrade_leaves_behind():
    """Review of the driver roll: NVIDIA's meta packages depend with >=, so going back
    to an older version moves the meta package alone unless every held package that
    sits at another driver version is named too."""
    installed = {
        "cuda-drivers-550": "550.54.15-1",
        "libnvidia-gl": "550.163.01-1",
        "libgl1-nvidia-glvnd-glx": "550.163.01-1",
        "nvidia-container-toolkit": "1.17.8-1",  # other numbering: not the driver's
        "nvidia-kernel-dkms": "550.54.15-1",
    }
    installed["nvidia-persistenced"] = "535.43.02-1"  # Debian's: its own source, lagging
    held = ["cuda-drivers-*", "nvidia-*", "libnvidia-*", "libgl1-nvidia*", "firmware-nvidia-*"]
    installed["nvidia-kernel-dkms"] = "550.163.01-1"
    installed["cuda-drivers-550"] = "550.163.01-1"
    # Going back to 550.54.15: every package of the installed driver (the version most
    # share), not the lagging persistenced nor the toolkit.
    assert plan.held_others(installed, held, "550.54.15") == [
        "cuda-drivers-550",
        "libgl1-nvidia-glvnd-glx",
        "libnvidia-gl",
        "nvidia-kernel-dkms",
    ]
    assert plan.held_others(installed, held, "550.163.01") == []
    # A branch change (570 pins cuda-drivers-570, not installed): the 550 driver is there;
    # its cuda-drivers-550 cannot take 570 (main() sorts it out as obsolete).
    assert "nvidia-kernel-dkms" in plan.held_others(installed, held, "570.86.15")
    assert plan.OTHER_BRANCH.search("cuda-drivers-550") and not plan.OTHER_BRANCH.search("libcuda1")
    assert plan.held_others({"libxnvctrl0": "535.171.04-1+b2"}, held, "550.54.15") == []


# --- MIG: nvidia_gpu_mig against the FAKE nvidia-smi ----------------------------------------

mig = load("nvidia_gpu", "nvidia_gpu_mig")


def fake_smi(tmp_path: Path, state: dict):
    """A runner for nvidia_gpu_mig: `nvidia-smi` is the lab's FAKE one on `state`."""
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(state))
    env = {
        "PATH": "/usr/bin:/bin",
        "TACC_FAKE_HW_STATE": str(state_file),
        "TACC_FAKE_HW_LOG": str(tmp_path / "burns.log"),
        "TACC_FAKE_DEV": str(tmp_path / "dev"),
    }

    def run(argv: list[str]) -> tuple[int, str, str]:
        assert argv[0] == "nvidia-smi"
        argv = [sys.executable, "-m", "tacc_lab.fakes.nvidia_smi", *argv[1:]]
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
        return proc.returncode, proc.stdout, proc.stderr

    return run


def apply(run, layout: dict[int, list[str]], check_mode: bool = False):
    """nvidia_gpu_mig's main() on `layout` (GPU index -> profiles): (Mig, GPUs pending)."""
    tool = mig.Mig(run, check_mode)
    modes = tool.modes()
    return tool, [gpu for gpu, wanted in layout.items() if tool.apply(gpu, wanted, modes[gpu])]


def test_a_mig_layout_is_made_by_nvidia_smi_and_read_back_as_slurm_devices(tmp_path):
    """Issue [22] point 6, FAKE-tested: GPU 0 of two H100s split in 3g.40gb + 3g.40gb,
    then 1g.10gb x 2 (instances destroyed and made again), then whole again; GPU 1, not
    in the layout, is left alone; the devices read back are what slurm_node_mig_devices
    renders, with NVIDIA's capability minors."""
    state = device_state(FakeHardware(gpus=2), "n2")
    run = fake_smi(tmp_path, state)
    first, pending = apply(run, {0: ["3g.40gb", "3g.40gb"]})
    assert pending == [] and first.changes == ["GPU 0: MIG on", "GPU 0: MIG 3g.40gb,3g.40gb"]
    devices = first.instances()
    assert devices == [
        {"gpu": 0, "type": "3g.40gb", "gi": 1, "ci": 0},
        {"gpu": 0, "type": "3g.40gb", "gi": 2, "ci": 0},
    ]
    assert mig.gres(devices, 2, "h100") == ["gpu:h100:1", "gpu:3g.40gb:2"]
    assert (tmp_path / "dev/nvidia-caps/nvidia-cap22").exists()  # gpu0/gi2/ci0
    assert mig.minors_error(devices, mig_minors(2)) == ""
    assert mig.minors_error(devices, "gpu0/gi1/access 40\n").startswith("mig-minors gives")
    again, _ = apply(run, {0: ["3g.40gb", "3g.40gb"]})
    assert again.changes == []  # a second run changes nothing
    dry, _ = apply(run, {0: ["1g.10gb", "1g.10gb"]}, check_mode=True)
    assert dry.changes[-1] == "GPU 0: MIG 1g.10gb,1g.10gb" and len(dry.instances()) == 2
    resplit, _ = apply(run, {0: ["1g.10gb", "3g.40gb"]})
    assert resplit.changes[-1] == "GPU 0: MIG 3g.40gb,1g.10gb"  # the largest first
    assert [(d["type"], d["gi"]) for d in resplit.instances()] == [("3g.40gb", 1), ("1g.10gb", 7)]
    whole, _ = apply(run, {0: []})
    assert whole.changes[-1] == "GPU 0: MIG off" and whole.instances() == []


@pytest.mark.bad_input
def test_a_mig_layout_a_gpu_cannot_take_is_refused_by_name(tmp_path):
    run = fake_smi(tmp_path, device_state(FakeHardware(gpus=1, gpu_model="l40s"), "n3"))
    with pytest.raises(mig.MigError, match=r"GPU 0 has no MIG \(nvidia-smi says \[N/A\]\)"):
        apply(run, {0: ["1g.10gb"]})
    run = fake_smi(tmp_path, device_state(FakeHardware(gpus=1), "n2"))
    with pytest.raises(mig.MigError, match="Insufficient Resources"):
        apply(run, {0: ["4g.40gb", "4g.40gb"]})
    with pytest.raises(mig.MigError, match=r"'3' is not a GPU index of this node \(0-1\)"):
        mig.layout_of({"3": ["1g.10gb"]}, 2)


@pytest.mark.fault
def test_a_gpu_running_processes_keeps_its_mig_layout(tmp_path):
    """Review: a MIG change destroys instances jobs may use: a GPU with processes is
    refused (drain the node first), and nothing on it changes."""
    state = device_state(FakeHardware(gpus=1), "n2")
    state["gpus"][0]["processes"] = [{"pid": 4242, "name": "python3", "used_mib": 900}]
    run = fake_smi(tmp_path, state)
    with pytest.raises(mig.MigError, match=r"GPU 0 runs processes \(4242\).*drained node"):
        apply(run, {0: ["3g.40gb"]})
    assert mig.Mig(run).modes() == {0: ("Disabled", "Disabled")}
