"""Run host commands as argv lists (never through a shell) and turn failures into LabError."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from tacc_lab.errors import LabError


def run(argv: Sequence[str], *, check: bool = True, input_text: str | None = None) -> str:
    """Run `argv`, return stdout; raise LabError naming the command and its stderr on failure."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, input=input_text, check=False
        )
    except FileNotFoundError as exc:
        raise LabError(f"command not found: {argv[0]}") from exc
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise LabError(
            f"`{' '.join(argv)}` failed with exit {proc.returncode}: " + " | ".join(detail)
        )
    return proc.stdout
