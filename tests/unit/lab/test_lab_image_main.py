"""`python -m tacc_lab.image` (make demo runs it beside the venv's install): a cached image
is reported without a build, and a cache it cannot create is one line and exit 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_lab import image
from tacc_lab.releases import DEFAULT

OPS = Path(__file__).resolve().parents[3] / "packages" / "ops"


def run_image_main(cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TACC_LAB_IMAGE_CACHE": str(cache), "PYTHONPATH": str(OPS)}
    return subprocess.run(
        [sys.executable, "-m", "tacc_lab.image"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_cached_image_is_reported_without_a_build(tmp_path: Path) -> None:
    target = tmp_path / f"{DEFAULT.codename}-{image.image_digest()}"
    target.mkdir()
    (target / image.COMPLETE_MARK).write_text("0\n")
    proc = run_image_main(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"node image {target.name}: cached"


@pytest.mark.bad_input
def test_unusable_cache_is_one_line_and_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_image_main(blocker / "cache")
    assert proc.returncode == 1
    assert proc.stderr.startswith("tacc-lab image: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
