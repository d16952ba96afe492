"""`scontrol show KIND --oneliner` records (tacc_agent/slurm/oneliner.py): Key=Value words,
values with spaces kept whole, a record naming a key twice refused for jobs."""

from __future__ import annotations

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import oneliner
from tests.unit.fake_slurm import FakeSlurm, answer

# As Slurm 22.05 prints a drained node (the lab's n3)
NODE = (
    "NodeName=n3 Arch=x86_64 CoresPerSocket=1 CfgTRES=cpu=2,mem=23G State=IDLE+DRAIN "
    "OS=Linux 6.1.0-27-amd64 #1 SMP Debian Reason=tacc: mounts: /mnt/x not mounted "
    "[root@2026-11-22T20:26:01]"
)
JOB = (
    "JobId=12 JobName=lr=0.1 two words UserId=alice(1001) GroupId=alice(1001) "
    "JobState=RUNNING Reason=None Restarts=0 WorkDir=/shared/tcloud/alice/jobs/12 "
    "Comment=x UserId=bob(1002)"
)


def test_scontrol_values_with_spaces_are_kept_whole():
    record = oneliner.parse_oneliner(NODE)
    assert record["OS"] == "Linux 6.1.0-27-amd64 #1 SMP Debian"
    assert record["CfgTRES"] == "cpu=2,mem=23G" and record["State"] == "IDLE+DRAIN"
    assert record["Reason"] == "tacc: mounts: /mnt/x not mounted [root@2026-11-22T20:26:01]"


def test_a_key_after_the_first_copy_continues_the_value_before_it():
    record = oneliner.parse_oneliner(JOB)
    assert (record["JobName"], record["UserId"]) == ("lr=0.1 two words", "alice(1001)")
    assert record["Comment"] == "x UserId=bob(1002)"


@pytest.mark.security
def test_a_job_record_that_names_a_key_twice_is_refused():
    assert oneliner.repeated_key(JOB) == "UserId"
    assert oneliner.job_record_of(JOB) is None
    assert oneliner.repeated_key(NODE) == ""
    assert oneliner.job_record_of(NODE) == oneliner.parse_oneliner(NODE)


def test_show_reads_each_line_and_an_unknown_job_is_none(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.when("scontrol show node", answer(0, NODE + "\n\n"))
    assert [r["NodeName"] for r in oneliner.show("node", "n3")] == ["n3"]
    assert fake.calls[-1] == ["scontrol", "show", "node", "--oneliner", "n3"]
    assert oneliner.show("job", "99") == []  # Slurm no longer remembers it
    fake.when("scontrol show node", answer(1, "", "Node n9 not found"))
    with pytest.raises(AgentError, match="scontrol failed: Node n9 not found"):
        oneliner.show("node", "n9")
