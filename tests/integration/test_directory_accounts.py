"""Issue [21] point 2, accounts that follow the directory, on the factory's `hw` lab
(tests/integration/labs.py: HW; converged from the bare image by site_from_nothing.py):
the lab maps the directory group `vision` (carol) to the Slurm account `vision`; dave's
group `visitors` is mapped to none. site.yml gave carol her association and her private
workspace; the timer (every 20 s in the lab, 2 minutes by default) follows the directory
from then on: dave added to `vision` submits without a playbook run, and removed again he
is held (no new job) while his running job finishes (the default policy, finish), then
loses the association. A directory user in no mapped group cannot submit, read another's
workspace or reach a compute node over SSH.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.lab_helpers import lab_ssh_as, node_ok, node_sh
from tests.integration.labs import HW

pytestmark = pytest.mark.lab

NAME = HW.name
GROUP_DN = "cn=vision,ou=groups,dc=cluster,dc=internal"
WORKSPACE = "/shared/tcloud"
SYNC_WAIT = 120  # seconds: several rounds of the lab's 20 s timer


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


def as_user(user: str, command: str, node: str = "n1"):
    return node_sh(NAME, node, f"runuser -u {user} -- {command}")


def associations(user: str) -> list[str]:
    out = sh("n1", f"sacctmgr -nP show assoc where user={user} format=Account,MaxSubmit")
    return out.split()


def membership(user: str, change: str):
    """ldapmodify of the group `vision` as root over ldapi: `change` add or delete."""
    ldif = f"dn: {GROUP_DN}\nchangetype: modify\n{change}: memberUid\nmemberUid: {user}\n"
    return node_sh(NAME, "n1", f"printf '{ldif}' | ldapmodify -Q -Y EXTERNAL -H ldapi:///")


def set_member(user: str, present: bool) -> None:
    change = membership(user, "add" if present else "delete")
    assert change.returncode == 0, change.stdout + change.stderr


def job_state(job_id: str) -> str:
    return sh("n1", f"squeue -h -j {job_id} -o %T").strip()


def wait_for(what: str, done, seconds: float = SYNC_WAIT):
    deadline = time.monotonic() + seconds
    while not (result := done()):
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(3)
    return result


@pytest.fixture(scope="module")
def site(site_from_nothing) -> dict:
    return site_from_nothing


def test_d2_a_mapped_groups_member_has_an_association_and_a_private_workspace(site):
    assert associations("carol") == ["vision|"], associations("carol")
    assert sh("n1", f"stat -c '%U:%G %a' {WORKSPACE}/carol").strip() == "carol:carol 700"
    job = as_user("carol", "sbatch --parsable -N1 --chdir=/tmp --wait --wrap true")
    assert job.returncode == 0, job.stdout + job.stderr  # --wait: the job's exit status
    # The timer is on, on the controller, and its last round changed nothing and failed not.
    state = sh("n1", "systemctl is-active tacc-accounts-sync.timer tacc-workspaces-sync.timer")
    assert state.split() == ["active", "active"], state


@pytest.mark.security
def test_d2_a_user_in_no_mapped_group_cannot_submit_read_a_workspace_or_reach_a_node(site):
    assert associations("dave") == []
    refused = as_user("dave", "sbatch -N1 --wrap true")
    assert refused.returncode != 0, refused.stdout
    assert "Invalid account" in refused.stderr, refused.stderr
    read = as_user("dave", f"ls {WORKSPACE}/carol")
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    assert node_sh(NAME, "n1", f"test -e {WORKSPACE}/dave").returncode != 0  # none for him
    for node in ("n2", "n3"):
        ssh = lab_ssh_as(NAME, "dave", node, "id -un")
        assert ssh.returncode == 255 and "dave" not in ssh.stdout, (node, ssh)


@pytest.mark.fault
def test_d2_added_to_the_group_he_submits_removed_his_job_finishes_then_he_is_gone(site):
    """No playbook run: the timer alone. Policy finish: held, the running job ends as it
    would, the association goes at the next round after it."""
    set_member("dave", True)
    try:
        wait_for("dave's association", lambda: associations("dave") == ["vision|"])
        workspace = f"stat -c '%U:%G %a' {WORKSPACE}/dave 2>/dev/null || true"
        wait_for("dave's workspace", lambda: sh("n1", workspace).strip() == "dave:dave 700")
        job = as_user("dave", "sbatch --parsable -N1 --chdir=/tmp --wrap 'sleep 60'")
        assert job.returncode == 0, job.stdout + job.stderr
        job_id = job.stdout.strip()
        wait_for("dave's job running", lambda: job_state(job_id) == "RUNNING", 60)
        set_member("dave", False)
        wait_for("dave held", lambda: associations("dave") == ["vision|0"])
        refused = as_user("dave", "sbatch -N1 --wrap true")
        assert refused.returncode != 0, refused.stdout
        assert job_state(job_id) == "RUNNING"
        wait_for("dave's job ended", lambda: job_state(job_id) == "", 90)
        state = sh("n1", f"sacct -n -X -j {job_id} -o State").split()
        assert state == ["COMPLETED"], state
        wait_for("dave's association gone", lambda: associations("dave") == [])
    finally:
        node_sh(NAME, "n1", "scancel -u dave")
        membership("dave", "delete")  # as it was (ldapmodify fails if he is not in it)
