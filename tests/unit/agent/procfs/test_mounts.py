"""This process's mount table (tacc_agent/procfs/mounts.py): mountinfo's escapes, the
options of the mount and of its superblock together."""

from __future__ import annotations

import pytest

from tacc_agent.procfs.mounts import mount_table, parse_mountinfo

MOUNTINFO = (
    "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "40 22 0:40 / /shared rw,nosuid,relatime shared:2 - nfs4 n1:/shared rw,vers=4.2\n"
    "41 22 0:41 / /with\\040space rw - tmpfs tmpfs rw\n"
    "not a mountinfo line\n"
)


def test_mountinfo_is_read_with_its_escapes_and_both_option_sets():
    table = parse_mountinfo(MOUNTINFO)
    assert sorted(table) == ["/", "/shared", "/with space"]
    assert table["/with space"].fstype == "tmpfs"
    shared = table["/shared"]
    assert (shared.fstype, shared.source) == ("nfs4", "n1:/shared")
    assert {"nosuid", "vers=4.2"} <= shared.options


def test_the_table_is_this_process_mountinfo(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self/mountinfo").write_text(MOUNTINFO)
    assert mount_table(str(tmp_path)) == parse_mountinfo(MOUNTINFO)
    assert "/" in mount_table()  # the real one
    with pytest.raises(OSError):
        mount_table(str(tmp_path / "none"))
