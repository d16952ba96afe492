"""Issue [20] point 6: a running site moves from Debian 12 (Slurm 22.05) to Debian 13
(Slurm 24.11), as docs/slurm-releases.md tells an operator to, on the factory's `upg` lab
(tests/integration/labs.py: UPGRADE, 10.77.15.0/24, three bookworm nodes, n1 the head
node with accounting, converged by site.yml):

1. history on 22.05: alice's jobs, and an account made by hand (physics, fair share 5)
   that inventory does not know; the job records are aged by a day in the database, as
   a site's history is (the archive's cut-off is at least an hour old);
2. playbooks/upgrade-export.yml refuses while a job is queued, then while a record is
   newer than its cut-off, and carries everything out once neither is left;
3. every node is reinstalled with Debian 13 (`tacc-lab reimage`, head node first) and
   site.yml --flush-cache converges them, FirstJobId set from the export;
4. playbooks/upgrade-import.yml loads the associations and job records (a re-run loads
   nothing again): alice's old jobs are in her `sacct`, the hand-made account is back,
   and her new job gets an id above the old ones.

`make upgrade-test` runs it (TACC_TEST_UPGRADE=1): it converges three nodes twice, which
make test's budget cannot take beside the other labs. It prints the transcript the issue
asks for (assoc and sacct before and after, and the new job).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import sys
import time
from pathlib import Path

import pytest
import yaml

from tacc_lab.releases import BOOKWORM, OS_ENV, TRIXIE
from tests.integration.lab_helpers import lab_cli, node_ok, node_sh, playbook, site
from tests.integration.labs import UPGRADE

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        os.environ.get("TACC_TEST_UPGRADE") != "1",
        reason="make upgrade-test runs it (TACC_TEST_UPGRADE=1): two 3-node converges",
    ),
    pytest.mark.skipif(
        bool(os.environ.get(OS_ENV)),
        reason=f"{OS_ENV} puts every lab on one release; this one moves between two",
    ),
]

NAME = UPGRADE.name
NODES = ("n1", "n2", "n3")  # the head node first, as an operator reinstalls them
ASSOC = "sacctmgr --noheader --parsable2 show assoc format=Account,User,Fairshare"
ALICE_SACCT = (
    "su - alice -c 'sacct --noheader --parsable2 --allocations --starttime=2020-01-01 "
    "--format=JobIDRaw,User,Account,State'"
)
# A day off every time in the job and step records: history from before the window.
AGE = (
    "mariadb slurm_acct_db -e 'UPDATE tacc_job_table SET time_submit=time_submit-86400, "
    "time_eligible=IF(time_eligible>0,time_eligible-86400,0), "
    "time_start=IF(time_start>0,time_start-86400,0), time_end=IF(time_end>0,time_end-86400,0); "
    "UPDATE tacc_step_table SET time_start=IF(time_start>0,time_start-86400,0), "
    "time_end=IF(time_end>0,time_end-86400,0)'"
)
TRANSCRIPT: list[str] = []


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


def record(title: str, node: str, script: str) -> str:
    """Run `script` on `node` and keep its output for the transcript."""
    out = sh(node, script)
    TRANSCRIPT.append(f"## {title}\n$ {script}\n{out.rstrip()}\n")
    return out


def wait_until_ended(jobs: list[str]) -> None:
    """Until the database has each of alice's jobs complete: slurmctld sends a job's start
    and end to slurmdbd in separate messages, and an end that comes first leaves a record
    without its user and eligible time until the start arrives."""
    deadline = time.monotonic() + 180
    query = (
        f"sacct --noheader --parsable2 --allocations --jobs={','.join(jobs)} "
        "--format=State,User,Eligible,End"
    )
    while True:
        rows = [line.split("|") for line in sh("n1", query).splitlines()]
        if len(rows) == len(jobs) and all(
            state in ("COMPLETED", "FAILED")
            and user == "alice"
            and eligible[:1].isdigit()
            and end[:1].isdigit()
            for state, user, eligible, end in rows
        ):
            return
        assert time.monotonic() < deadline, rows
        time.sleep(2)


def everything_in_the_database() -> str:
    """Root's view of every job record, for a failure's message."""
    return sh(
        "n1",
        "sacct -a -X -n -P -S 2020-01-01 -o JobIDRaw,User,Account,State,Submit,Start,End; "
        "mariadb slurm_acct_db -e 'SELECT id_job, id_user, id_assoc, state, time_submit, "
        "time_eligible, time_start, time_end FROM tacc_job_table'",
    )


def alice_submits(script: str, account: str = "") -> str:
    option = f"-A {account} " if account else ""
    out = sh("n1", f"su - alice -c 'sbatch --parsable {option}-N1 -t 2 --wrap \"{script}\"'")
    return out.strip().split(";")[0]


# Carried records whose association is not their own user's and account's here.
MISMATCHED = (
    "mariadb --batch --skip-column-names slurm_acct_db -e 'SELECT COUNT(*) FROM tacc_job_table j "
    "LEFT JOIN tacc_assoc_table a ON a.id_assoc = j.id_assoc "
    'WHERE j.id_user = 2001 AND NOT (a.user <=> "alice" AND a.acct <=> j.account)\''
)


@pytest.fixture(scope="module")
def story(shaped_lab, tmp_path_factory) -> dict:
    """What each step left, for the tests that check it (they run in order)."""
    carried = tmp_path_factory.mktemp("upgrade") / "carried"
    return {"inventory": shaped_lab.inventory, "carried": carried}


def export(story: dict, expect_ok: bool = True):
    proc, _ = playbook(
        story["inventory"],
        "playbooks/upgrade-export.yml",
        "-e",
        f"slurm_upgrade_local_dir={story['carried']}",
        expect_ok=expect_ok,
    )
    return proc


def test_u1_a_bookworm_site_has_history(story):
    assert sh("n1", "sinfo --version").startswith(f"slurm-wlm {BOOKWORM.slurm}.")
    # An account made and removed by hand: its association ids stay taken here, so the
    # new database numbers the associations after it differently.
    sh("n1", "sacctmgr -i add account scratch && sacctmgr -i delete account scratch")
    sh("n1", "sacctmgr -i add account physics Fairshare=5 Description=hand-made")
    sh("n1", "sacctmgr -i add user alice Account=physics Fairshare=3")
    jobs = [alice_submits("hostname") for _ in range(3)] + [alice_submits("hostname", "physics")]
    wait_until_ended(jobs)
    sh("n1", AGE)
    story["old_jobs"] = jobs
    record("before (22.05): associations", "n1", ASSOC)
    out = record("before (22.05): alice's sacct", "n1", ALICE_SACCT)
    listed = [line.split("|")[0] for line in out.splitlines()]
    assert listed == jobs, f"{out}\n{everything_in_the_database()}"


@pytest.mark.bad_input
def test_u2_a_queued_job_stops_the_export_before_anything_is_carried(story):
    held = sh("n1", "su - alice -c 'sbatch --parsable --hold -N1 --wrap true'").strip()
    proc = export(story, expect_ok=False)
    assert proc.returncode != 0
    assert f"jobs are still queued ({held} alice PENDING)" in proc.stdout, proc.stdout[-3000:]
    assert not (story["carried"] / "associations.cfg").exists()
    assert "drain" in sh("n2", "sinfo --noheader --Node --nodes=n2 --format=%T")
    sh("n1", f"scancel {held}")


@pytest.mark.bad_input
def test_u3_a_record_newer_than_the_archive_cut_off_stops_the_export(story):
    """The held job's record is minutes old: archive dump cannot take it yet."""
    proc = export(story, expect_ok=False)
    assert proc.returncode != 0
    assert "1 job records are newer than the archive's cut-off" in proc.stdout, proc.stdout[-3000:]


def test_u4_the_export_carries_it_all_out_root_only(story):
    sh("n1", AGE)  # two hours later, as the failure said
    export(story)
    carried: Path = story["carried"]
    assert stat.S_IMODE(carried.stat().st_mode) == 0o700
    assert "Cluster - 'tacc'" in (carried / "associations.cfg").read_text()
    assert "physics" in (carried / "associations.cfg").read_text()
    assert "CREATE DATABASE" in (carried / "accounting.sql").read_text()
    assert "'physics'" in (carried / "association_ids").read_text()
    assert int((carried / "first_job_db_inx").read_text()) > 1
    assert len(list((carried / "archive").iterdir())) >= 2  # jobs and steps
    highest = max(int(job) for job in story["old_jobs"]) + 1  # the cancelled held job
    assert int((carried / "first_job_id").read_text()) == highest + 1
    assert sh("n1", "sacct -a -X -n -S 2020-01-01 -o JobIDRaw").strip() == ""


@pytest.mark.security
def test_u4b_a_researcher_on_the_head_node_reads_nothing_of_the_export(story):
    """The backup holds every user's job records (and the database's password hashes):
    root's only, on the node as on the operator's machine."""
    base = "/var/lib/tacc-upgrade"
    for attempt in (
        f"ls {base}",
        f"ls {base}/archive",
        f"head -c1 {base}/accounting.sql",
        f"head -c1 {base}/associations.cfg",
    ):
        proc = node_sh(NAME, "n1", f"su - alice -c {shlex.quote(attempt)}")
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (attempt, proc)
    assert stat.S_IMODE((story["carried"] / "archive").stat().st_mode) == 0o700


def test_u5_every_node_is_reinstalled_with_trixie_and_converged(story):
    inventory: Path = story["inventory"]
    for node in NODES:
        proc = lab_cli(NAME, "reimage", node, "--os", TRIXIE.codename)
        assert proc.returncode == 0, proc.stderr
    lab_vars = yaml.safe_load(inventory.read_text())["all"]["vars"]
    first_job_id = int((story["carried"] / "first_job_id").read_text())
    story["first"] = first_job_id
    extra = {**lab_vars["slurm_extra_config"], "FirstJobId": first_job_id}
    (inventory.parent / "group_vars").mkdir(exist_ok=True)
    (inventory.parent / "group_vars/all.yml").write_text(
        "---\n" + yaml.safe_dump({"slurm_extra_config": extra})
    )
    # No job may run before the import (the carried records keep their indexes).
    site(inventory, "--flush-cache", "--skip-tags", "acceptance")
    assert sh("n3", "cat /etc/debian_version").startswith(f"{TRIXIE.version}.")
    assert sh("n1", "sinfo --version").startswith(f"slurm-wlm {TRIXIE.slurm}.")
    assert sh("n1", "sacct -a -X -n -S 2020-01-01 -o JobIDRaw").strip() == ""


def test_u6_the_import_loads_associations_and_history_once(story):
    inventory = story["inventory"]
    carried = f"slurm_upgrade_local_dir={story['carried']}"
    playbook(inventory, "playbooks/upgrade-import.yml", "-e", carried)
    site(inventory)  # now the acceptance jobs, then the nodes take jobs
    _, again = playbook(inventory, "playbooks/upgrade-import.yml", "-e", carried)
    assert again == {"n1": 0}, again
    # Each carried job points at its own user's and account's association here, though
    # the two databases numbered them differently.
    assert sh("n1", MISMATCHED).strip() == "0", everything_in_the_database()
    assoc = record("after (24.11): associations", "n1", ASSOC).splitlines()
    assert "physics||5" in assoc and "physics|alice|3" in assoc, assoc
    assert "research|alice|1" in assoc, assoc
    out = record("after (24.11): alice's sacct", "n1", ALICE_SACCT)
    old = [line.split("|") for line in out.splitlines()][: len(story["old_jobs"])]
    assert [row[0] for row in old] == story["old_jobs"], out
    accounts = ["research"] * 3 + ["physics"]
    assert [row[1:] for row in old] == [["alice", a, "COMPLETED"] for a in accounts], out
    # The new cluster's acceptance jobs kept their records beside the carried ones.
    ids = sh("n1", "sacct -a -X -n -P -S 2020-01-01 -o JobIDRaw").split()
    assert len(ids) == len(set(ids)) and max(map(int, ids)) >= int(story["first"]), ids
    assert set(story["old_jobs"]) <= set(ids), ids


def test_u7_a_new_job_runs_with_an_id_above_the_carried_ones(story):
    job = alice_submits("hostname")
    # From FirstJobId on (site.yml's acceptance jobs on the new cluster may come first).
    assert int(job) >= int((story["carried"] / "first_job_id").read_text()), job
    wait_until_ended([job])
    out = record("after (24.11): alice's sacct with her new job", "n1", ALICE_SACCT)
    assert re.search(rf"^{job}\|alice\|research\|COMPLETED$", out, re.M), out
    assert [line.split("|")[0] for line in out.splitlines()][:4] == story["old_jobs"], out
    print("\n".join(TRANSCRIPT), file=sys.stderr)
