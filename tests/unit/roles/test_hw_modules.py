"""Parsing and decisions in the hardware roles' modules (nvidia_gpu_facts, smartnic_fw,
smartnic_config), on the real tools' documented output formats."""

from __future__ import annotations

import pytest

from tests.conftest import role_module

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
