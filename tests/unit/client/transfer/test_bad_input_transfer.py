"""Bad input in file transfers (issue [7]), against a fake SFTP server that answers what a
hostile or broken cluster could: names that climb out of the download directory, local
symlinks to write through, names that are not UTF-8, transfers cut half way. Nothing is
written outside the destination, no partial file is left on either side, and every
failure is a TcloudError with a message (never a traceback)."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from tcloud.errors import TcloudError, UsageError
from tcloud.transfer import files
from tcloud.transfer.upload import send

pytestmark = pytest.mark.bad_input

DIR, FILE, LINK = stat.S_IFDIR | 0o700, stat.S_IFREG | 0o600, stat.S_IFLNK | 0o777


class FakeSFTP:
    """A remote tree {path: bytes | None (a directory) | ("link", target)}."""

    def __init__(self, tree: dict, listing: dict | None = None, fail_after: int | None = None):
        self.tree = dict(tree)
        self.listing = listing or {}  # dir -> names to list instead of the real ones
        self.fail_after = fail_after  # bytes a transfer delivers before the link drops

    # --- download side
    def listdir_attr(self, path: str):
        if path not in self.tree:
            raise FileNotFoundError(path)
        names = self.listing.get(path)
        if isinstance(names, Exception):
            raise names
        if names is None:
            names = [p[len(path) + 1 :] for p in self.tree if p.rpartition("/")[0] == path]
        return [
            SimpleNamespace(filename=name, st_mode=self.mode(f"{path}/{name}"), st_size=0)
            for name in names
        ]

    def mode(self, path: str) -> int:
        value = self.tree.get(path, b"")
        return DIR if value is None else LINK if isinstance(value, tuple) else FILE

    def get(self, remote: str, local: str) -> None:
        data = self.tree.get(remote, b"payload")
        with open(local, "wb") as handle:
            if self.fail_after is not None:
                handle.write(data[: self.fail_after])
                raise OSError("connection reset (simulated)")
            handle.write(data)

    # --- upload side
    def normalize(self, path: str) -> str:
        return "/home/u"

    def stat(self, path: str):
        if path not in self.tree:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_mode=self.mode(path))

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        self.tree[path] = None

    def put(self, local: str, remote: str) -> None:
        data = Path(local).read_bytes()
        if self.fail_after is not None:
            self.tree[remote] = data[: self.fail_after]
            raise OSError("connection reset (simulated)")
        self.tree[remote] = data

    def chmod(self, path: str, mode: int) -> None:
        pass

    def posix_rename(self, old: str, new: str) -> None:
        self.tree[new] = self.tree.pop(old)

    def remove(self, path: str) -> None:
        del self.tree[path]


def everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


WORKDIR = "/w/job"


@pytest.mark.parametrize(
    "name", ["../escape.txt", "../../etc/cron.d/x", "..", ".", "a/../../b", "x\0y"]
)
def test_download_refuses_names_that_leave_the_directory(tmp_path, name):
    sftp = FakeSFTP({f"{WORKDIR}/outputs": None}, listing={f"{WORKDIR}/outputs": [name]})
    dest = tmp_path / "dest"
    with pytest.raises(TcloudError, match=r"refusing the file name .* \(not a plain name\)"):
        files.download(sftp, WORKDIR, dest)
    assert everything_under(tmp_path) == ["dest", "dest/outputs"]


def test_download_does_not_write_through_a_local_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    dest = tmp_path / "dest"
    (dest / "outputs").mkdir(parents=True)
    (dest / "outputs/result.txt").symlink_to(victim)
    sftp = FakeSFTP({f"{WORKDIR}/outputs": None, f"{WORKDIR}/outputs/result.txt": b"evil"})
    with pytest.raises(TcloudError, match=r"result\.txt is a symlink; refusing to write through"):
        files.download(sftp, WORKDIR, dest)
    assert victim.read_text() == "keep me\n"


def test_download_does_not_descend_a_local_directory_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    (dest / "outputs").mkdir(parents=True)
    (dest / "outputs/sub").symlink_to(elsewhere)
    sftp = FakeSFTP(
        {
            f"{WORKDIR}/outputs": None,
            f"{WORKDIR}/outputs/sub": None,
            f"{WORKDIR}/outputs/sub/x": b"evil",
        }
    )
    with pytest.raises(TcloudError, match="sub is a symlink"):
        files.download(sftp, WORKDIR, dest)
    assert list(elsewhere.iterdir()) == []


def test_download_skips_remote_symlinks(tmp_path):
    sftp = FakeSFTP(
        {
            f"{WORKDIR}/outputs": None,
            f"{WORKDIR}/outputs/ok.txt": b"ok\n",
            f"{WORKDIR}/outputs/key": ("link", "/root/.ssh/id_ed25519"),
        }
    )
    assert files.download(sftp, WORKDIR, tmp_path / "dest") == 1
    assert everything_under(tmp_path / "dest") == ["outputs", "outputs/ok.txt"]


def test_download_of_a_non_utf8_remote_name_is_named(tmp_path):
    error = UnicodeDecodeError("utf-8", b"caf\xe9", 3, 4, "invalid continuation byte")
    sftp = FakeSFTP({f"{WORKDIR}/outputs": None}, listing={f"{WORKDIR}/outputs": error})
    with pytest.raises(TcloudError, match="holds a file name that is not UTF-8; rename it"):
        files.download(sftp, WORKDIR, tmp_path / "dest")


def test_a_cut_download_leaves_no_partial_file(tmp_path):
    sftp = FakeSFTP(
        {f"{WORKDIR}/outputs": None, f"{WORKDIR}/outputs/model.pt": b"x" * 1000}, fail_after=100
    )
    with pytest.raises(TcloudError, match=r"download of .*model\.pt failed: connection reset"):
        files.download(sftp, WORKDIR, tmp_path / "dest")
    assert everything_under(tmp_path / "dest") == ["outputs"]


def test_a_cut_upload_leaves_no_partial_file_on_the_cluster(tmp_path):
    (tmp_path / "data.bin").write_bytes(b"x" * 1000)
    sftp = FakeSFTP({"/u": None, "/u/files": None}, fail_after=100)
    with pytest.raises(TcloudError, match=r"upload of .*data\.bin failed: connection reset"):
        files.upload(sftp, "/u", tmp_path / "data.bin", None)
    assert sorted(sftp.tree) == ["/u", "/u/files"]
    sftp.fail_after = None
    assert files.upload(sftp, "/u", tmp_path / "data.bin", None) == 1
    assert sorted(sftp.tree) == ["/u", "/u/files", "/u/files/data.bin"]


def test_upload_refuses_before_sending_anything(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("a\n")
    (tree / "passwd").symlink_to("/etc/passwd")
    sftp = FakeSFTP({"/u": None})
    with pytest.raises(TcloudError, match="passwd: upload: symlink to /etc/passwd, outside"):
        files.upload(sftp, "/u", tree, "tree")
    with pytest.raises(TcloudError, match="outside your cluster directory"):
        files.upload(sftp, "/u", tree / "a.txt", "../../etc/a.txt")
    assert sorted(sftp.tree) == ["/u"]


def test_a_file_that_vanished_since_hashing_is_named(tmp_path):
    progress = SimpleNamespace(add=lambda n: None)
    with pytest.raises(TcloudError, match=r"gone\.bin: cannot read: No such file or directory"):
        send(FakeSFTP({}), tmp_path / "gone.bin", "/u/store/.partial/x", 0, progress)


@pytest.mark.parametrize(
    ("info", "said"),
    [
        ({"job_id": "41", "sweep": False}, "--best: job 41 is not a sweep"),
        (
            {"job_id": "42", "sweep": True, "best": None, "trials": [{"job_id": "42_0"}]},
            "--best: no trial of sweep 42 has reported its metric at a rung yet",
        ),
        (
            {"job_id": "43", "sweep": True, "best": "43_9", "trials": [{"job_id": "43_0"}]},
            "--best: no trial of sweep 43 has reported its metric",
        ),
    ],
)
def test_best_of_a_job_that_is_no_sweep_or_has_no_best_yet_says_why(info, said):
    """Issue [24] point 3: `tcloud download JOB --best` names why there is nothing to
    fetch (and fetches nothing)."""
    with pytest.raises(UsageError, match=re.escape(said)):
        files.download_best(FakeSFTP({}), info, Path("/nonexistent"))


@pytest.mark.parametrize("index", ["..", "../x", "", "a/b", None])
def test_a_best_trial_name_that_is_no_plain_name_is_refused(index):
    info = {"job_id": "44", "sweep": True, "best": "44_1", "workdir": "/w"}
    info["trials"] = [{"job_id": "44_1", "trial": index}]
    with pytest.raises(TcloudError, match="refusing the trial name"):
        files.download_best(FakeSFTP({}), info, Path("/nonexistent"))
