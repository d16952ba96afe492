"""What makes the upload fast, held in place (issue [12]): the store lists its partial
files once per request (not once per blob), a commit checks its paths and makes its
directories without a pass over every pair, the client writes the stream one SSH
packet at a time, and the SSH transport offers its AEAD ciphers first, nothing added."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
import yaml

from tacc_agent.errors import Rejected
from tacc_agent.tasks.store import delta as store
from tacc_agent.tasks.store import receive as store_receive
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError
from tcloud.transfer import manifest
from tcloud.transfer.hashcache import HashCache
from tcloud.transfer.upload_stream import Blob, frames
from tcloud.transport import wire
from tcloud.transport.packet import CHANNEL_WRITE


class NoBar:
    def add(self, count: int) -> None:
        pass


def blob_of(data: bytes, mode: int = 0o644) -> str:
    return f"{hashlib.sha256(data).hexdigest()}-{mode:o}"


@pytest.fixture
def user_dir(tmp_path) -> Path:
    path = tmp_path / "user"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def no_glob(monkeypatch):
    """Fail on a glob of the partial directory (one per blob made `missing` quadratic)."""

    glob = Path.glob

    def refuse(self, pattern, **options):
        # Python 3.13's rglob goes through glob: only the partial directory's count.
        if self.name == ".partial":
            raise AssertionError(f"a glob per blob: {self}/{pattern}")
        return glob(self, pattern, **options)

    monkeypatch.setattr(Path, "glob", refuse)


def test_partials_by_blob_lists_each_uploads_file_under_its_blob(tmp_path):
    one, two = blob_of(b"one"), blob_of(b"two")
    names = [f"{one}.{'a' * 32}", f"{one}.{'b' * 32}", f"{two}.{'c' * 32}", one, "junk"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    listed = store.partials_by_blob(tmp_path)
    assert sorted(p.name for p in listed[one]) == sorted(names[:2])
    assert [p.name for p in listed[two]] == [names[2]]
    assert set(listed) == {one, two}  # the older tcloud's <blob> file: partial_files adds it
    assert store.partial_files(tmp_path, one, listed)[-1] == tmp_path / one
    assert store.partials_by_blob(tmp_path / "absent") == {}


def test_missing_of_many_blobs_lists_the_partial_directory_once(user_dir, no_glob):
    names = [blob_of(str(i).encode()) for i in range(50)]
    answer = store.missing(user_dir, names)
    assert answer["missing"] == names and answer["partial"] == {}


def test_missing_still_offers_what_a_cut_upload_left(user_dir, no_glob):
    name = blob_of(b"0123456789")
    first = store.missing(user_dir, [name])["uploads"][name]
    (user_dir / "store" / ".partial" / first).write_bytes(b"01234")
    again = store.missing(user_dir, [name])
    assert again["partial"] == {name: 5}
    assert (user_dir / "store" / ".partial" / again["uploads"][name]).read_bytes() == b"01234"


def test_a_stream_then_its_commit_store_every_blob_and_leave_no_partial_file(
    user_dir, tmp_path, no_glob
):
    sources = {}
    for i in range(20):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(os.urandom(1000 + i))
        sources[blob_of(path.read_bytes())] = path
    answer = store.missing(user_dir, sorted(sources))
    # An older cut upload's partial file of one blob, there before the stream.
    victim = sorted(sources)[0]
    stale = user_dir / "store" / ".partial" / f"{victim}.{'0' * 32}"
    stale.write_bytes(b"stale")
    blobs = [
        Blob(name, answer["uploads"][name], 0, sources[name].stat().st_size, sources[name])
        for name in answer["missing"]
    ]
    parts: list[bytes] = []
    frames(blobs, parts.append, NoBar())
    got = store_receive.receive(user_dir, io.BufferedReader(io.BytesIO(b"".join(parts))))
    assert sorted(got["received"]) == sorted(sources) and got["bad"] == []
    assert list((user_dir / "store" / ".partial").iterdir()) == []


def test_a_commit_of_nested_files_links_each_one_into_its_directory(tmp_path, no_glob):
    project = tmp_path / "project"
    expected = {}
    for i in range(30):
        relpath = f"d{i % 3}/sub{i % 2}/f{i}.txt" if i % 5 else f"top{i}.txt"
        (project / relpath).parent.mkdir(parents=True, exist_ok=True)
        (project / relpath).write_text(f"file {i}\n")
        expected[f"code/{relpath}"] = f"file {i}\n"
    (project / "tcloud.yaml").write_text(yaml.safe_dump({"name": "nested", "run": ["true"]}))
    expected["code/tcloud.yaml"] = (project / "tcloud.yaml").read_text()
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    user_dir = tmp_path / "user"
    user_dir.mkdir(mode=0o700)
    job = Path(store.commit_local(user_dir, instruction)["workdir"])
    found = {
        path.relative_to(job).as_posix(): path.read_text()
        for path in (job / "code").rglob("*")
        if path.is_file()
    }
    assert found == expected
    assert list((user_dir / "store" / ".partial").iterdir()) == []
    assert store.folders("code/d1/sub/x") == ["code", "code/d1", "code/d1/sub"]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "paths",
    [["code/a", "code/a/b"], ["code/a/b/c", "code/a/b"], ["code/x/y", "code/x/y/z/w"]],
)
def test_a_file_that_is_also_a_directory_is_refused(paths):
    request = {"manifest": {path: blob_of(path.encode()) for path in paths}}
    with pytest.raises(Rejected, match="no file may also be a directory"):
        store.checked_request(request)


def test_paths_that_only_share_a_prefix_are_accepted():
    paths = ["code/a", "code/ab/c", "code/a.txt", "code/a-b/c"]
    request = {"manifest": {path: blob_of(path.encode()) for path in paths}}
    _, manifest, _ = store.checked_request(request)
    assert sorted(manifest) == sorted(paths)


def test_the_stream_writes_one_ssh_packet_at_a_time(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(5 * CHANNEL_WRITE + 7))
    blob = Blob(blob_of(path.read_bytes()), "u", 3, path.stat().st_size, path)
    parts: list[bytes] = []
    sent = frames([blob], parts.append, NoBar())
    data = [part for part in parts[1:-1]]
    assert sent == path.stat().st_size - 3
    assert all(isinstance(part, bytes) and len(part) <= CHANNEL_WRITE for part in data)
    assert b"".join(data) == path.read_bytes()[3:]


def test_preferred_ciphers_moves_the_aead_ones_first_and_adds_nothing():
    offered = ("aes128-ctr", "aes256-ctr", "aes256-gcm@openssh.com", "aes128-gcm@openssh.com")
    ordered = wire.preferred_ciphers(offered)
    assert ordered[:2] == wire.AEAD_CIPHERS
    assert sorted(ordered) == sorted(offered)
    assert wire.preferred_ciphers(("aes128-ctr", "aes256-ctr")) == ("aes128-ctr", "aes256-ctr")


@pytest.mark.security
def test_a_tuned_transport_offers_no_cipher_paramiko_would_not(monkeypatch):
    left, right = socket.socketpair()
    with left, right:
        default = paramiko.Transport(left)
        tuned = wire.transport(right)
        assert set(tuned.preferred_ciphers) == set(default.preferred_ciphers)
        assert tuned.preferred_ciphers[0] == "aes128-gcm@openssh.com"
    left, right = socket.socketpair()
    with left, right:
        disabled = {"ciphers": list(wire.AEAD_CIPHERS)}
        tuned = wire.transport(left, disabled_algorithms=disabled)
        assert not set(wire.AEAD_CIPHERS) & set(tuned.preferred_ciphers)


def project_of(tmp_path: Path, count: int) -> Path:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    for i in range(count):
        (project / "data" / f"f{i:03d}.bin").write_bytes(os.urandom(manifest.POOL_MIN_SIZE + i))
    (project / "tcloud.yaml").write_text(yaml.safe_dump({"name": "many", "run": ["true"]}))
    return project


def test_files_hashed_in_parallel_give_the_digests_of_one_at_a_time(tmp_path, monkeypatch):
    project = project_of(tmp_path, 40)
    task = load_task(project / "tcloud.yaml")
    parallel = manifest.build_manifest(task)
    monkeypatch.setattr(manifest, "HASH_THREADS", 1)
    assert manifest.build_manifest(task) == parallel
    for relpath, entry in parallel.items():
        data = (project / relpath.removeprefix("code/")).read_bytes()
        assert entry.sha256 == hashlib.sha256(data).hexdigest(), relpath


def test_the_hash_cache_answers_what_it_knows_without_the_pool(tmp_path):
    project = project_of(tmp_path, 30)
    task = load_task(project / "tcloud.yaml")
    with HashCache(tmp_path / "cache.sqlite") as cache:
        first = manifest.build_manifest(task, cache)
        assert (cache.misses, cache.hits) == (31, 0)
    hashed_by_call = []

    class Recording(HashCache):
        def __call__(self, path: Path, info: os.stat_result) -> str:
            hashed_by_call.append(path.name)
            return super().__call__(path, info)

    with Recording(tmp_path / "cache.sqlite") as cache:
        assert manifest.build_manifest(task, cache) == first
        assert (cache.misses, cache.hits) == (0, 31)
    assert hashed_by_call == ["tcloud.yaml"]  # the 30 large ones: known(), never the pool


@pytest.mark.fault
def test_a_file_that_changes_while_it_is_hashed_is_not_remembered(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"old contents")
    walked = os.stat(path)  # the walk's stat; then the file changes before it is read
    path.write_bytes(b"new contents, longer")
    with HashCache(tmp_path / "cache.sqlite") as cache:
        assert cache(path, walked) == hashlib.sha256(b"new contents, longer").hexdigest()
        assert cache.changed == 1
    with HashCache(tmp_path / "cache.sqlite") as cache:
        assert cache.known(path, walked) is None  # never the new contents under the old stat


@pytest.mark.bad_input
def test_a_file_that_cannot_be_read_is_refused_in_its_place_among_the_problems(tmp_path):
    """The pool's read errors join the walk's problems where one-at-a-time hashing would
    have put them (here: before the symlink that follows it, after the one before)."""
    project = project_of(tmp_path, 3)
    (project / "data" / "a-link").symlink_to("/etc/hostname")
    (project / "data" / "z-link").symlink_to("/etc/hostname")

    def hasher(path: Path, info: os.stat_result) -> str:
        if path.name == "f001.bin":
            raise PermissionError(13, "Permission denied")
        return manifest.sha256_file(path)

    task = load_task(project / "tcloud.yaml")
    with pytest.raises(TaskFileError) as caught:
        manifest.build_manifest(task, hasher)
    messages = [
        (problem.path.rsplit("/", 1)[-1], problem.message[:20]) for problem in caught.value.problems
    ]
    assert [name for name, _ in messages] == ["a-link", "f001.bin", "z-link"]
    assert messages[1][1] == "cannot read: Permiss"


def test_the_stream_and_the_manifest_load_no_ssh_stack():
    """A command the connection master serves writes the stream without paramiko."""
    probe = (
        "import sys\n"
        "import tcloud.transfer.upload_stream, tcloud.transfer.manifest\n"
        "import tcloud.transfer.hashcache\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'paramiko'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.fault
def test_a_job_number_whose_directory_is_being_removed_is_skipped(tmp_path, monkeypatch):
    """rename(2) refuses a number whose old job is still being removed (ENOTEMPTY); by
    the time place() looked, it was gone, and the commit failed. The next number is used."""
    jobs = tmp_path / "jobs"
    building = jobs / ".building-x"
    building.mkdir(parents=True)
    real_rename, calls = os.rename, []

    def rename(source, target):
        calls.append(Path(target).name)
        if len(calls) == 1:  # -1 was being removed: non-empty then, gone now
            raise OSError(errno.ENOTEMPTY, "Directory not empty")
        real_rename(source, target)

    monkeypatch.setattr(store.os, "rename", rename)
    placed = store.place(building, jobs, "ab" * 32)
    assert calls == ["abababababab-1", "abababababab-2"]
    assert placed == jobs / "abababababab-2" and placed.is_dir()
