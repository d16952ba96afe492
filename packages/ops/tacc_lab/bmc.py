"""The lab's stand-in for a server's BMC: runs systemd-nspawn for one node and powers the
node on again when it reboots itself, so `reboot` (and Ansible's reboot module) in a lab
node really restarts it, as on hardware. systemd-nspawn ends with status 133 when the
container asks for a reboot; systemd-nspawn@.service restarts it for that status alone
(RestartForceExitStatus=133), and so does this, once the node's old veth is gone: the
kernel tears the old network namespace down asynchronously, and a boot that finds the
veth still there fails ("Failed to add new veth interfaces ... File exists"), which left
a rebooted node off for good on a slower machine.

Run as `python -m tacc_lab.bmc -- systemd-nspawn ARGS...` (nodes.start_node). SIGTERM and
SIGINT go to systemd-nspawn (which halts the container) and end the loop.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from types import FrameType

from tacc_lab.network import clear_stale_veth

REBOOT_STATUS = 133


MACHINE_FLAG = "--machine="


def machine_of(command: list[str]) -> str:
    """The node's machine name in systemd-nspawn's arguments ("" when none)."""
    return next(
        (arg.removeprefix(MACHINE_FLAG) for arg in command if arg.startswith(MACHINE_FLAG)), ""
    )


def clear_network_of(command: list[str]) -> None:
    """What a reboot waits for: the node's old veth gone (tacc_lab.network)."""
    machine = machine_of(command)
    if machine:
        clear_stale_veth(machine)


class Bmc:
    def __init__(
        self, command: list[str], before_boot: Callable[[list[str]], None] = clear_network_of
    ) -> None:
        self.command = command
        self.before_boot = before_boot  # run before each power-on after a reboot
        self.child: subprocess.Popen | None = None
        self.stopping = False

    def forward(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self.forward)
        boots = 0
        while True:
            boots += 1
            self.child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
            status = self.child.wait()
            if status != REBOOT_STATUS or self.stopping:
                return status
            print(f"tacc-lab bmc: the node rebooted itself; power-on {boots + 1}", flush=True)
            self.before_boot(self.command)
            if self.stopping:  # told to stop while it waited: the node stays off
                return status


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m tacc_lab.bmc -- systemd-nspawn ARGS...", file=sys.stderr)
        return 2
    return Bmc(args).run()


if __name__ == "__main__":
    sys.exit(main())
