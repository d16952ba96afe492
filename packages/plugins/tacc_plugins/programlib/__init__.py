"""Small libraries a plug-in hands to the user's program (fluid's early stopping, oort's
participant selection): stdlib-only modules the program imports by name.

The program runs in its own Python (the task's environment or image), which cannot
import the agent's packages, so `install` copies the module into the job's directory
(`<job dir>/.tacc/lib/`, the user's own, bound into containers with the rest of it) and
puts that directory first on the program's PYTHONPATH. Without the plug-in the module
is not there: a program imports it inside `try`, or asks `TACC_*` variables first.
"""

from __future__ import annotations

import os
from pathlib import Path

from tacc_contract.plugins import Launch

HERE = Path(__file__).resolve().parent
LIB_DIR = Path(".tacc") / "lib"


def install(launch: Launch, module: str) -> Path:
    """Copy programlib/<module>.py into the job's lib directory (atomically, and only when
    it differs: every rank of the job may do it at once) and prepend that directory to
    the program's PYTHONPATH. Returns the copy's path."""
    source = HERE / f"{module}.py"
    text = source.read_bytes()
    lib = launch.job_dir / LIB_DIR
    lib.mkdir(mode=0o700, parents=True, exist_ok=True)
    dest = lib / source.name
    try:
        current = dest.read_bytes()
    except FileNotFoundError:
        current = None
    if current != text:
        temporary = lib / f".{source.name}.{os.getpid()}.{launch.rank}"
        temporary.write_bytes(text)
        os.replace(temporary, dest)
    found = launch.env.get("PYTHONPATH", "")
    if str(lib) not in found.split(os.pathsep):
        launch.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(lib), found) if p)
    return dest
