"""Issue [21] point 3: a controller that survives its node, on the hw lab (site.yml from
the bare image, site_from_nothing.py). As a site adds a second head to a running
cluster (docs/operations.md "A backup controller"): n1's saved state is moved to the
controllers' shared storage (a host folder on every lab node, the lab's stand-in for a
NAS), n4 joins as the backup controller and a second login host (`tacc-lab up --nodes 4
--backup-controller`, from the prebaked image: a server racked later, installed from the
site's image) and site.yml runs. Then n1's power is cut while a 2-node job runs
and another waits: the backup takes over, both jobs end, researchers' tcloud (its config
names n4 as a fallback login host) keeps working; n1 powered back takes control again.
Runs last on the lab (modules in name order): it grows the lab and cuts n1's power.

The takeover time (the cut to the first `squeue` answered) is printed to stderr with
the transcript (pytest -s shows it; docs/operations.md "A backup controller" keeps the
measured one)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tacc_lab.backup_controller import NODE_DIR
from tacc_lab.demo import researcher_env
from tacc_lab.image import PREBAKED
from tests.conftest import run_cli
from tests.integration.lab_helpers import (
    lab_cli,
    node_ok,
    node_sh,
    site,
    status,
    submit,
    wait_state,
)
from tests.integration.labs import HW, MITOGEN

pytestmark = pytest.mark.lab

NAME = HW.name
PRIMARY, BACKUP = "n1", "n4"
NODES = HW.nodes + 1  # the backup controller joins
STATE = f"{NODE_DIR}/slurm-state"
SLURMCTLD_LOG = "/var/log/slurm/slurmctld.log"
SQUEUE = "timeout 20 squeue -h -o %i"  # a controller in control answers; a standby does not
REMOVED_PACKAGE = "python3-mpi4py"  # the mpi role's, on n3: nothing depends on it


@pytest.fixture(scope="module")
def heads(site_from_nothing) -> Path:
    """The running hw site given a backup controller, the documented way: slurmctld
    stopped, its state copied to the shared folder, the new head in inventory, site.yml."""
    inventory = site_from_nothing["inventory"]
    # Removed by hand since the last run: the run below must put it back, though the
    # roles skip an install whose packages dpkg has (test_a_package_removed_by_hand...).
    node_ok(NAME, "n3", f"apt-get remove -y -q {REMOVED_PACKAGE}")
    node_ok(
        NAME,
        PRIMARY,
        f"systemctl stop slurmctld && install -d -o slurm -g slurm -m 0700 {STATE} "
        f"&& cp -a /var/lib/slurm/slurmctld/. {STATE}/",
    )
    grow = "up", "--nodes", str(NODES), "--backup-controller", "--inventory", str(inventory)
    # n4 is a server racked later, installed from the site's image (the prebaked one): n1-n3
    # proved the install from nothing, and keep running the bare image.
    up = lab_cli(NAME, *grow, flavor=PREBAKED)
    assert up.returncode == 0, up.stderr
    site(inventory, strategy=MITOGEN)
    return inventory


@pytest.fixture(scope="module")
def alice(heads, tmp_path_factory):
    env = researcher_env(NAME, "alice")
    home = tmp_path_factory.mktemp("alice")

    def tcloud_cli(*argv: str):
        return run_cli("tcloud", *argv, env=env, cwd=home)

    return tcloud_cli


def say(transcript: list[str], start: float, line: str) -> None:
    transcript.append(f"[{time.monotonic() - start:6.1f} s] {line}")
    print(transcript[-1], file=sys.stderr, flush=True)


def task(root: Path, name: str, run: list[str], cpus: int = 1) -> Path:
    root.mkdir()
    limits = {"nodes": 2, "cpus": cpus, "mem": "100M", "time": "10"}
    (root / "tcloud.yaml").write_text(json.dumps({"name": name, "resources": limits, "run": run}))
    return root


def ping(node: str) -> str:
    return node_sh(NAME, node, "timeout 20 scontrol ping").stdout


def state_saved_after(moment: float, limit: float = 90) -> float:
    """Seconds until the shared job_state was written after `moment` (epoch seconds):
    Slurm saves a few seconds after a change, else within a minute."""
    began = time.monotonic()
    stat = f"stat -c %.9Y {STATE}/job_state"
    while float(node_ok(NAME, BACKUP, stat).strip()) <= moment:
        assert time.monotonic() - began < limit, f"{PRIMARY} never saved its state"
        time.sleep(1)
    return time.monotonic() - began


def diagnosis() -> str:
    """The backup's view when the test fails: the nodes, the queue, its log's end."""
    return node_sh(
        NAME,
        BACKUP,
        "timeout 20 scontrol show node n2 n3; timeout 20 squeue -t all; "
        f"tail -n 40 {SLURMCTLD_LOG}",
    ).stdout


def test_both_controllers_run_and_share_their_saved_state(heads):
    conf = node_ok(
        NAME, BACKUP, "grep -E '^(SlurmctldHost|StateSaveLocation)=' /etc/slurm/slurm.conf"
    )
    assert conf.split() == [
        f"SlurmctldHost={PRIMARY}(10.77.11.11)",
        f"SlurmctldHost={BACKUP}(10.77.11.14)",
        f"StateSaveLocation={NODE_DIR}/slurm-state",
    ]
    answer = ping(BACKUP)
    assert f"Slurmctld(primary) at {PRIMARY} is UP" in answer, answer
    assert f"Slurmctld(backup) at {BACKUP} is UP" in answer, answer
    # The primary writes the state the backup will read; root and slurm alone see it.
    listing = node_ok(
        NAME, BACKUP, f"stat -c '%U %a' {NODE_DIR}/slurm-state; ls {NODE_DIR}/slurm-state"
    )
    assert listing.startswith("slurm 700\n") and "job_state" in listing, listing
    options = node_ok(NAME, "n2", "cat /etc/default/slurmd")
    assert "--conf-server 10.77.11.11:6817,10.77.11.14:6817" in options, options


@pytest.mark.fault
def test_a_package_removed_by_hand_is_installed_again_by_the_next_run(heads):
    """The roles skip an install whose packages are all installed (roles/common reads
    dpkg once per run): one removed since the last run is not, so it comes back."""
    status = node_ok(NAME, "n3", f"dpkg-query --show --showformat='${{Status}}' {REMOVED_PACKAGE}")
    assert status == "install ok installed", status


@pytest.mark.fault
def test_the_backup_takes_over_when_the_primary_loses_power(heads, alice, tmp_path):
    transcript: list[str] = []
    start = time.monotonic()
    # Every CPU of the smaller compute node (n3; n2 is a FAKE 16-core node): the second
    # job, on both nodes too, waits for them (it did not with one CPU).
    cpus = node_ok(NAME, PRIMARY, "sinfo -h -N -n n2,n3 -o %c").split()
    whole = min(int(count) for count in cpus)
    running = submit(
        alice,
        task(
            tmp_path / "a",
            "outlives-n1",
            ['for i in $(seq 1 60); do sleep 1; done; echo "running job ended on $(hostname)"'],
            cpus=whole,
        ),
    )
    wait_state(alice, running, ("RUNNING",), 120)
    queued = submit(alice, task(tmp_path / "b", "waits", ['echo "queued job ran on $(hostname)"']))
    submitted = time.time()  # the nodes' clock too (containers share the kernel's)
    assert status(alice, queued)["state"] == "QUEUED"
    say(transcript, start, f"job {running} RUNNING on n2,n3; job {queued} QUEUED")
    # Slurm writes its state a few seconds after a change: the cut comes once the primary
    # has saved both jobs, as they are now (what it had not saved is lost with it).
    saved = state_saved_after(submitted)
    say(transcript, start, f"{PRIMARY} saved its state to {STATE} ({saved:.1f} s later)")
    logged = int(node_ok(NAME, BACKUP, f"wc -l < {SLURMCTLD_LOG}").strip())
    off = lab_cli(NAME, "poweroff", PRIMARY)
    assert off.returncode == 0 and "power cut" in off.stdout, off
    cut = time.monotonic()
    say(transcript, start, f"{PRIMARY} power cut")
    powered_back = False
    try:
        while node_sh(NAME, BACKUP, SQUEUE).returncode != 0:
            assert time.monotonic() - cut < 180, f"{BACKUP} never took over:\n{ping(BACKUP)}"
            time.sleep(1)
        takeover = time.monotonic() - cut
        say(transcript, start, f"{BACKUP} answers squeue: takeover {takeover:.1f} s after the cut")
        say(
            transcript,
            start,
            f"scontrol ping on {BACKUP}: " + " / ".join(ping(BACKUP).split("\n")).strip(),
        )
        # Researchers' tcloud falls back to n4 (tacc-lab user lists it) while n1 is off.
        for job, line in (
            (running, "running job ended on n"),
            (queued, "queued job ran on n"),
        ):
            info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"), 240)
            assert info["state"] == "COMPLETED", info
            log = alice("logs", job).stdout
            assert line + "2" in log and line + "3" in log, log
            say(transcript, start, f"job {job} {info['state']}; tcloud logs: {line}2, {line}3")
        listed = alice("ps").stdout
        assert running in listed and queued in listed, listed
        say(transcript, start, f"tcloud ps lists both (through {BACKUP})")
        up = lab_cli(NAME, "up", "--nodes", str(NODES), "--inventory", str(heads))
        assert up.returncode == 0, up.stderr
        powered_back = True
        say(transcript, start, f"{PRIMARY} powered on (tacc-lab up)")
        deadline = time.monotonic() + 240
        while (
            f"Slurmctld(primary) at {PRIMARY} is UP" not in (answer := ping(PRIMARY))
            or node_sh(NAME, PRIMARY, SQUEUE).returncode != 0
        ):
            assert time.monotonic() < deadline, f"{PRIMARY} never took control back:\n{answer}"
            time.sleep(2)
        say(
            transcript,
            start,
            f"{PRIMARY} answers squeue again: " + " / ".join(answer.split("\n")).strip(),
        )
        # n1 read the state n4 saved as it stopped (the unit's ExecStartPre asked it to):
        # the jobs that ended under n4 stay ended, none runs twice.
        listed = node_ok(NAME, PRIMARY, "timeout 20 squeue -h -t all -o '%i %T'")
        states = dict(line.split() for line in listed.splitlines())
        # (a job that ended minutes ago is listed COMPLETED, or no longer at all)
        assert {states.get(running, "COMPLETED"), states.get(queued, "COMPLETED")} == {
            "COMPLETED"
        }, listed
        # (n4 kept their records for slurmdbd, on n1, in the shared state: sent on return.)
        expected = sorted([f"{running}|COMPLETED", f"{queued}|COMPLETED"])
        sacct = f"sacct -X -n -P -j {running},{queued} -o JobID,State"
        deadline = time.monotonic() + 60
        while sorted(accounted := node_ok(NAME, PRIMARY, sacct).split()) != expected:
            assert time.monotonic() < deadline, accounted
            time.sleep(2)
        since_cut = f"tail -n +{logged + 1} {SLURMCTLD_LOG} | grep -c 'Old state possible'"
        stale = node_sh(NAME, BACKUP, since_cut)
        assert stale.stdout.strip() in ("", "0"), f"{BACKUP} handed back old state"
        say(transcript, start, f"{PRIMARY} has {BACKUP}'s last state: both jobs ended, once")
        after = submit(
            alice, task(tmp_path / "c", "after", ['echo "after the return on $(hostname)"'])
        )
        info = wait_state(alice, after, ("COMPLETED", "FAILED", "CANCELLED"), 180)
        assert info["state"] == "COMPLETED", info
        say(transcript, start, f"job {after} submitted after the return: COMPLETED")
    except AssertionError:
        transcript.append(f"what {BACKUP} says:\n{diagnosis()}")
        raise
    finally:
        if not powered_back:
            lab_cli(NAME, "up", "--nodes", str(NODES), "--inventory", str(heads))
        print("\n".join(["failover transcript:", *transcript]), file=sys.stderr)
