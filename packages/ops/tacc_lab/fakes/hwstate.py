"""FAKE (lab only): the shared device state behind the fake GPU and Mellanox NIC tools.

No real tool is imitated here. One JSON file (``$TACC_FAKE_HW_STATE``, default
``/etc/tacc-fake-hw/state.json``) describes the node's GPUs, NVSwitches and ConnectX NICs; writes
hold an ``flock`` on ``<state>.lock`` and replace the file atomically. Firmware burns and config
changes are appended to ``$TACC_FAKE_HW_LOG`` (default ``/var/log/tacc-fake-hw/burns.log``).

``python3 -m tacc_lab.fakes.hwstate reboot`` does what a reboot does to the cards: pending
firmware starts running and ``next_boot`` config becomes the current config.
``python3 -m tacc_lab.fakes.hwstate show`` prints the state.

The NVIDIA kernel module is the state's ``driver_version`` (the module loaded; absent: none)
and ``driver_built`` (the one DKMS built for the next boot). The FAKE ``nvidia-kernel-dkms``
package runs ``hwstate module-built VERSION`` after its install: with no module loaded it is
loaded at once (``modprobe nvidia`` on a node without nouveau), with another one loaded it
waits for the boot, when its unit runs ``hwstate load-driver``. Until then the FAKE
``nvidia-smi`` of the new version reports the version mismatch the real one does.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_STATE = "/etc/tacc-fake-hw/state.json"
DEFAULT_LOG = "/var/log/tacc-fake-hw/burns.log"

State = dict[str, Any]


class HwError(Exception):
    """A tool-level failure: the message goes to stderr and the tool exits with ``rc``."""

    def __init__(self, message: str, rc: int = 1) -> None:
        super().__init__(message)
        self.rc = rc


def run_cli(produce: Callable[[list[str]], list[str]], argv: list[str] | None) -> int:
    """Run a fake tool: print the lines `produce` returns, or its HwError on stderr with
    the error's exit code."""
    try:
        lines = produce(sys.argv[1:] if argv is None else argv)
    except HwError as err:
        sys.stdout.flush()
        print(err, file=sys.stderr)
        return err.rc
    print("\n".join(lines))
    return 0


def state_path() -> Path:
    return Path(os.environ.get("TACC_FAKE_HW_STATE", DEFAULT_STATE))


def log_path() -> Path:
    return Path(os.environ.get("TACC_FAKE_HW_LOG", DEFAULT_LOG))


def load() -> State:
    """The current state, with missing lists and per-NIC fields filled in (a missing file is
    a node with no fake hardware)."""
    try:
        state = json.loads(state_path().read_text())
    except FileNotFoundError:
        state = {}
    for key in ("gpus", "nvswitches", "nics"):
        state.setdefault(key, [])
    for nic in state["nics"]:
        nic.setdefault("pending_fw", None)
        for key in ("config", "next_boot"):
            nic[key] = {name: str(value) for name, value in nic.get(key, {}).items()}
        # Factory defaults (mlxconfig -e): the config as first seen, kept once written.
        nic.setdefault("defaults", dict(nic["config"]))
    return state


def save(state: State) -> None:
    """Write the state atomically (temp file in the same directory, then os.replace)."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def update() -> Iterator[State]:
    """Load under an exclusive lock and save on normal exit; an exception leaves it unchanged."""
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load()
        yield state
        save(state)


def log_event(tool: str, pci: str, event: str) -> None:
    """Append one line: ISO time, tool, PCI address, event."""
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    with open(path, "a") as out:
        out.write(f"{stamp} {tool} {pci} {event}\n")


def normalize_pci(address: str) -> str:
    """``3b:00.0`` -> ``0000:3b:00.0`` (lower case), as the mst tools accept either."""
    address = address.strip().lower()
    return address if address.count(":") == 2 else f"0000:{address}"


def find_nic(state: State, address: str) -> dict[str, Any] | None:
    wanted = normalize_pci(address)
    return next((nic for nic in state["nics"] if normalize_pci(nic["pci"]) == wanted), None)


def flash_fw(nic: dict[str, Any]) -> str:
    """The firmware version on flash: a burned but not yet running one wins."""
    return nic["pending_fw"] or nic["fw_version"]


def reboot(state: State) -> list[tuple[str, str]]:
    """Apply pending firmware and next-boot config; returns (pci, event) per changed NIC."""
    changes = []
    for nic in state["nics"]:
        parts = []
        if nic["pending_fw"]:
            parts.append(f"fw={nic['pending_fw']}")
            nic["fw_version"], nic["pending_fw"] = nic["pending_fw"], None
        if nic["next_boot"]:
            parts.extend(f"{key}={value}" for key, value in nic["next_boot"].items())
            nic["config"].update(nic["next_boot"])
            nic["next_boot"] = {}
        if parts:
            changes.append((nic["pci"], f"reboot applied {' '.join(parts)}"))
    return changes


def module_built(state: State, version: str) -> str:
    """DKMS built `version`'s module: loaded now when none is, else at the next boot."""
    state["driver_built"] = version
    if not state.get("driver_version"):
        state["driver_version"] = version
        return f"module {version} loaded"
    if state["driver_version"] == version:
        return f"module {version} already loaded"
    return f"module {version} built; {state['driver_version']} stays loaded until a reboot"


def load_driver(state: State) -> str:
    """At boot: the module built last is the one loaded."""
    built = state.get("driver_built")
    if not built:
        return "no module built"
    state["driver_version"] = built
    return f"module {built} loaded at boot"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["show"]:
        print(json.dumps(load(), indent=2))
        return 0
    if (len(args) == 2 and args[0] == "module-built") or args == ["load-driver"]:
        with update() as state:
            event = module_built(state, args[1]) if len(args) == 2 else load_driver(state)
        log_event("hwstate", "nvidia", event)
        print(event)
        return 0
    if args != ["reboot"]:
        print("usage: hwstate {reboot|show|module-built VERSION|load-driver}", file=sys.stderr)
        return 2
    with update() as state:
        changes = reboot(state)
        for pci, event in changes:
            log_event("hwstate", pci, event)
    for pci, event in changes:
        print(f"{pci}: {event}")
    if not changes:
        print("nothing pending")
    return 0


if __name__ == "__main__":
    sys.exit(main())
