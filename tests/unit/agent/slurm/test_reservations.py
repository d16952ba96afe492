"""Reservations (tacc_agent/slurm/reservations.py): `scontrol show reservation NAME
--oneliner` read as records, the root-only maintenance one created and deleted."""

from __future__ import annotations

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import reservations
from tests.unit.fake_slurm import FakeSlurm, answer

SHOWN = (
    "ReservationName=tacc-accept-n2 StartTime=2026-11-24T20:16:47 "
    "EndTime=2026-11-24T20:48:47 Duration=00:32:00 Nodes=n[2-3] NodeCnt=2 CoreCnt=4 "
    "Features=(null) PartitionName=(null) Flags=MAINT,IGNORE_JOBS,SPEC_NODES "
    "TRES=cpu=4 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE"
)


@pytest.fixture
def slurm(monkeypatch) -> FakeSlurm:
    return FakeSlurm().install(monkeypatch)


def test_a_reservation_shown_exists_and_one_not_found_does_not(slurm):
    slurm.when("scontrol show reservation", answer(0, SHOWN + "\n"))
    assert reservations.exists("tacc-accept-n2")
    assert not reservations.exists("tacc-accept-n")  # a name's prefix is not the name
    slurm.when("scontrol show reservation", answer(1, "", "Reservation x not found"))
    assert not reservations.exists("x")


@pytest.mark.fault
def test_a_controller_that_cannot_say_is_an_error(slurm):
    slurm.when("scontrol show reservation", answer(1, "", "Unable to contact slurm controller"))
    with pytest.raises(AgentError, match="scontrol failed: Unable to contact"):
        reservations.exists("tacc-accept-n2")


def test_the_maintenance_reservation_created_and_deleted(slurm):
    reservations.create_maintenance("tacc-accept-n2", ["n2", "n3"], 32, 5)
    assert slurm.reservations == {"tacc-accept-n2": "n2,n3"}
    assert slurm.calls[-1][3:] == [
        "ReservationName=tacc-accept-n2",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
        "StartTime=now",
        "Duration=32",
        "Nodes=n2,n3",
    ]
    assert reservations.exists("tacc-accept-n2")
    reservations.delete("tacc-accept-n2")
    assert slurm.reservations == {} and slurm.changes() == ["create n2,n3", "delete"]
