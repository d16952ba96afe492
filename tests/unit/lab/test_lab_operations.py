"""The lab's part in issue [15]: its BMC boots a node that reboots itself (and nothing
else), and its inventory turns on the cluster DNS, monitoring and accounting."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_lab.bmc import REBOOT_STATUS, Bmc, clear_network_of, machine_of, main
from tacc_lab.inventory import (
    ALERT_WEBHOOK_PORT,
    HEAD_GROUPS,
)
from tacc_lab.lab import ensure_accounting_password
from tests.unit.lab.test_lab_inventory import render_lab


def counted(tmp_path: Path, statuses: list[int]) -> list[str]:
    """A command that exits with the next of `statuses` at each run (and counts runs)."""
    script = tmp_path / "node.py"
    script.write_text(
        "import pathlib, sys\n"
        f"runs = pathlib.Path({str(tmp_path / 'runs')!r})\n"
        "n = int(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text(str(n + 1))\n"
        f"sys.exit({statuses!r}[n])\n"
    )
    return [sys.executable, str(script)]


def test_the_bmc_boots_a_node_again_after_each_reboot_and_stops_at_a_power_off(tmp_path):
    command = counted(tmp_path, [REBOOT_STATUS, REBOOT_STATUS, 0])
    assert Bmc(command).run() == 0
    assert (tmp_path / "runs").read_text() == "3"


@pytest.mark.fault
def test_the_bmc_waits_for_the_old_veth_before_each_boot_after_a_reboot(tmp_path):
    """A reboot that boots again while the kernel still tears the old veth down fails
    ("File exists") and left the node off for good (CI, stop 60): each power-on after a
    reboot first clears the node's old veth, named from systemd-nspawn's --machine."""
    cleared: list[str] = []
    command = [*counted(tmp_path, [REBOOT_STATUS, 0]), "--machine=tacc-hw-n2"]
    assert Bmc(command, lambda argv: cleared.append(machine_of(argv))).run() == 0
    assert cleared == ["tacc-hw-n2"] and (tmp_path / "runs").read_text() == "2"
    assert Bmc(command).before_boot is clear_network_of  # what tacc-lab's nodes get


@pytest.mark.fault
def test_a_stop_that_comes_while_the_bmc_waits_for_the_veth_keeps_the_node_off(tmp_path):
    """`tacc-lab down` during that wait must not see the node booted again behind it."""
    command = counted(tmp_path, [REBOOT_STATUS, 0])
    bmc = Bmc(command, lambda _argv: bmc.forward(signal.SIGTERM, None))
    assert bmc.run() == REBOOT_STATUS
    assert (tmp_path / "runs").read_text() == "1"


@pytest.mark.fault
def test_a_node_that_fails_is_not_booted_again(tmp_path):
    command = counted(tmp_path, [1, 0])
    assert Bmc(command).run() == 1
    assert (tmp_path / "runs").read_text() == "1"


@pytest.mark.fault
def test_sigterm_reaches_the_node_and_ends_the_bmc(tmp_path):
    """`tacc-lab down` (SIGTERM) halts the node: the BMC passes it on and does not boot it
    again, even when the node ends with the reboot status."""
    node = tmp_path / "node.py"
    node.write_text(
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: sys.exit({REBOOT_STATUS}))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    bmc = subprocess.Popen(
        [sys.executable, "-m", "tacc_lab.bmc", "--", sys.executable, str(node)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert bmc.stdout is not None and bmc.stdout.readline() == "up\n"
    bmc.send_signal(signal.SIGTERM)
    assert bmc.wait(timeout=10) == REBOOT_STATUS  # (a guard against a hang)
    assert "power-on" not in bmc.stdout.read()


@pytest.mark.bad_input
def test_the_bmc_without_a_command_says_how_to_call_it(capsys):
    assert main(["--"]) == 2
    assert "usage: python -m tacc_lab.bmc -- systemd-nspawn" in capsys.readouterr().err


def lab_inventory(password: str | None) -> dict:
    """Three nodes, no researchers."""
    return render_lab(3, {}, accounting_password=password)["all"]


def test_the_head_node_serves_names_and_monitoring_and_accounting_is_on():
    lab = lab_inventory("s3cret-password")
    assert {"cluster_dns", "monitoring"} <= set(HEAD_GROUPS)
    assert lab["children"]["cluster_dns"]["hosts"] == {"n1": None}
    assert lab["children"]["monitoring"]["hosts"] == {"n1": None}
    settings = lab["vars"]
    assert settings["slurm_accounting_enabled"] is True
    assert settings["slurm_dbd_db_password"] == "s3cret-password"  # noqa: S105 (a test value)
    assert settings["monitoring_alert_webhook_url"].startswith(
        f"http://127.0.0.1:{ALERT_WEBHOOK_PORT}/"
    )
    assert settings["rolling_boot_time_command"] == "cut -d' ' -f22 /proc/1/stat"
    assert settings["slurm_accounts"] == []  # no researchers in this one
    assert "slurm_accounting_enabled" not in lab_inventory(None)["vars"]


@pytest.mark.security
def test_the_accounting_password_is_made_once_private_and_kept(tmp_path):
    class Cfg:
        state_dir = tmp_path

    first = ensure_accounting_password(Cfg())  # type: ignore[arg-type]
    where = tmp_path / "secrets" / "slurmdbd-db-password"
    assert len(first) >= 32 and where.read_text() == first
    assert oct(where.stat().st_mode & 0o777) == "0o600"
    assert oct(where.parent.stat().st_mode & 0o777) == "0o700"
    assert ensure_accounting_password(Cfg()) == first  # type: ignore[arg-type]
