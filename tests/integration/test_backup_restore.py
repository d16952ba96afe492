"""Issue [21] point 4, backups that restore, on the factory's `hw` lab (labs.HW; site.yml
from the bare image, site_from_nothing.py): roles/backup's timer unit dumps the accounting
database, Slurm's state and the agent's records into a root-only folder; the database is
destroyed and playbooks/restore.yml puts it back: sacct shows the same history and sshare
the same fair share. A backup written by a newer Slurm is refused before anything stops.
"""

from __future__ import annotations

import re
import sys
import time

import pytest

from tests.integration.lab_helpers import node_ok, node_sh, playbook
from tests.integration.labs import HW

pytestmark = pytest.mark.lab

NAME = HW.name
BACKUPS = "/var/backups/tacc"
SACCT = "sacct -a -X -n -P -S 2020-01-01 -o JobID,User,Account,State,Start,End,NodeList"
SSHARE = "sshare -a -n -P -o Account,User,RawShares,NormShares,RawUsage"


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


def shares() -> dict[tuple[str, str], tuple[str, str, int]]:
    rows = [line.split("|") for line in sh("n1", SSHARE).splitlines() if line.strip()]
    return {(row[0].strip(), row[1]): (row[2], row[3], int(row[4] or 0)) for row in rows}


def cancelled_by_anyone(sacct: str) -> str:
    return re.sub(r"\|CANCELLED by \d+\|", "|CANCELLED|", sacct)


def records_sent() -> None:
    """Wait until slurmctld has sent every job record to slurmdbd."""
    deadline = time.monotonic() + 60
    while "DBD Agent queue size: 0" not in sh("n1", "sdiag"):
        assert time.monotonic() < deadline, "slurmctld's records never reached slurmdbd"
        time.sleep(2)


@pytest.fixture(scope="module")
def backup(site_from_nothing) -> dict:
    """Jobs of two users on record, then one run of the backup unit."""
    for user in ("alice", "bob"):
        job = node_sh(
            NAME, "n1", f"runuser -u {user} -- sbatch --wait -N1 --chdir=/tmp --wrap 'sleep 1'"
        )
        assert job.returncode == 0, job.stdout + job.stderr
    records_sent()
    before = {"sacct": sh("n1", SACCT), "sshare": shares()}
    sh("n1", "systemctl start tacc-backup.service")  # oneshot: returns when it is done
    run = sh("n1", f"ls -1 {BACKUPS}").split()[-1]
    return {**before, "inventory": site_from_nothing["inventory"], "run": f"{BACKUPS}/{run}"}


@pytest.mark.security
def test_d4_a_backup_run_is_root_only_and_says_what_wrote_it(backup):
    run = backup["run"]
    listing = sh("n1", f"stat -c '%n|%U:%G %a' {BACKUPS} {run} {run}/*").splitlines()
    modes = dict(line.split("|", 1) for line in listing)
    assert modes.pop(BACKUPS) == "root:root 700" and modes.pop(run) == "root:root 700"
    files = {path.rsplit("/", 1)[1]: mode for path, mode in modes.items()}
    assert {"MANIFEST", "accounting.sql.gz", "slurm-state.tar.gz"} <= set(files), files
    assert set(files.values()) == {"root:root 600"}, files
    manifest = sh("n1", f"cat {run}/MANIFEST")
    release = sh("n1", "sinfo --version").split()[-1]
    assert f"slurm_release={release}" in manifest.splitlines(), manifest
    assert sh("n1", "systemctl is-enabled tacc-backup.timer").strip() == "enabled"


@pytest.mark.fault
def test_d4_the_database_destroyed_and_restored_shows_the_same_history_and_fair_share(backup):
    assert len(backup["sacct"].splitlines()) >= 2, backup["sacct"]
    sh("n1", "systemctl stop slurmdbd && mariadb -e 'DROP DATABASE slurm_acct_db'")
    run, _ = playbook(backup["inventory"], "playbooks/restore.yml")
    print(run.stdout[-1500:])
    restored, after = sh("n1", SACCT), shares()
    # The transcript (pytest -s shows it): what sacct and sshare said before and after.
    print(
        "restore transcript:",
        f"$ {SACCT}  # before",
        backup["sacct"].rstrip(),
        f"$ {SACCT}  # after the restore",
        restored.rstrip(),
        f"sshare before: {backup['sshare']}",
        f"sshare after: {after}",
        sep="\n",
        file=sys.stderr,
    )
    # A job cancelled minutes before loses "by UID" (docs/operations.md "Backups").
    assert cancelled_by_anyone(restored) == cancelled_by_anyone(backup["sacct"])
    assert after.keys() == backup["sshare"].keys()
    for key, (raw, norm, usage) in backup["sshare"].items():
        assert after[key][:2] == (raw, norm), key
        # RawUsage decays (PriorityDecayHalfLife) while the test runs: within 1 %.
        assert abs(after[key][2] - usage) <= max(2, usage // 100), (key, usage, after[key])


@pytest.mark.bad_input
def test_d4_a_backup_from_a_newer_slurm_is_refused_before_anything_stops(backup):
    forged = f"{BACKUPS}/20991231T000000Z"
    sh(
        "n1",
        f"cp -a {backup['run']} {forged} && "
        f"sed -i 's/^slurm_release=.*/slurm_release=99.11.0/' {forged}/MANIFEST",
    )
    try:
        started = sh("n1", "systemctl show -P ActiveEnterTimestampMonotonic slurmctld slurmdbd")
        run, _ = playbook(backup["inventory"], "playbooks/restore.yml", expect_ok=False)
        assert run.returncode != 0
        said = " ".join(run.stdout.split())  # the message as one line (YAML output folds it)
        assert "was written by Slurm 99.11.0, newer than this host" in said, run.stdout[-3000:]
        after = sh("n1", "systemctl show -P ActiveEnterTimestampMonotonic slurmctld slurmdbd")
        assert after == started  # neither daemon was stopped
        assert cancelled_by_anyone(sh("n1", SACCT)) == cancelled_by_anyone(backup["sacct"])
    finally:
        node_sh(NAME, "n1", f"rm -rf {forged}")
