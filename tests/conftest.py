"""Shared fixtures: the project root and a runner for the installed console scripts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


def run_cli(*argv: str, env: dict[str, str] | None = None, cwd: Path = ROOT, timeout=600):
    """Run an installed console script (tacc-lab, tcloud, ...) and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
