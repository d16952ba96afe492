"""Where a task may upload from (tcloud/compile/local_paths.py): what is not a secret place."""

from __future__ import annotations

from pathlib import Path

from tcloud.compile import local_paths


def test_a_removable_drive_under_run_media_may_be_a_dataset_with_the_flag():
    assert local_paths.secret_in(Path("/run/media/alice/usb/data")) is None
    assert local_paths.secret_in(Path("/run/user/1000/gnupg")) == Path("/run/user")
