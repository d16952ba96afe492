"""What slurmctld says of itself (tacc_agent/slurm/controller.py): `scontrol ping` and
`scontrol show config`."""

from __future__ import annotations

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import controller
from tests.unit.fake_slurm import FakeSlurm, answer

# As Slurm 22.05 prints them
CONFIG = """\
Configuration data as of 2026-11-24T20:16:47
AccountingStorageEnforce = associations,limits,qos,safe
AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu
AccountingStorageType   = accounting_storage/slurmdbd
ClusterName             = tacc
SchedulerParameters     = bf_continue,bf_window=2880

Cgroup Support Configuration:
AllowedRAMSpace         = 100.0%
"""


@pytest.mark.parametrize(
    ("text", "up"),
    [
        ("Slurmctld(primary) at n1 is UP\n", True),
        ("Slurmctld(primary) at n1 is DOWN\nSlurmctld(backup) at n4 is UP\n", True),
        ("Slurmctld(primary) at n1 is DOWN\n", False),
    ],
)
def test_a_controller_is_up_when_any_answers_ping(text, up):
    assert controller.slurmctld_up(text) is up


@pytest.mark.bad_input
def test_a_ping_without_a_controller_line_is_an_error():
    with pytest.raises(AgentError, match="scontrol ping: no controller line"):
        controller.slurmctld_up("slurm_load_ctl_conf error\n")


def test_settings_by_name_values_kept_whole(monkeypatch):
    found = controller.parse_config(CONFIG)
    assert found["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert found["ClusterName"] == "tacc"
    assert found["SchedulerParameters"] == "bf_continue,bf_window=2880"
    assert "Configuration data as of 2026-11-24T20:16:47" not in found
    fake = FakeSlurm().install(monkeypatch)
    fake.when("scontrol show config", answer(0, CONFIG))
    assert controller.show_config(5)["AccountingStorageType"] == "accounting_storage/slurmdbd"
