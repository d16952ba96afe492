"""The lab's stand-in for a server's BMC: runs systemd-nspawn for one node and powers the
node on again when it reboots itself, so `reboot` (and Ansible's reboot module) in a lab
node really restarts it, as on hardware. systemd-nspawn ends with status 133 when the
container asks for a reboot; systemd-nspawn@.service restarts it for that status alone
(RestartForceExitStatus=133), and so does this.

Run as `python -m tacc_lab.bmc -- systemd-nspawn ARGS...` (nodes.start_node). SIGTERM and
SIGINT go to systemd-nspawn (which halts the container) and end the loop.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from types import FrameType

REBOOT_STATUS = 133


class Bmc:
    def __init__(self, command: list[str]) -> None:
        self.command = command
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
