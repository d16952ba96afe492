"""The streamed upload's frame format both ways: tcloud.transfer.upload_stream writes it,
tacc_agent.tasks.store.receive reads it into the user's store (here over a pipe or a
BytesIO, as the agent's session would hand it over)."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent.errors import Rejected
from tacc_agent.tasks.store import delta as store
from tacc_agent.tasks.store import receive as store_receive
from tacc_agent.tasks.store.receive import HEADER_LIMIT, receive
from tcloud.transfer.upload import missing_blob
from tcloud.transfer.upload_stream import END_FRAME, Blob, frames

SIZE = 3 * (1 << 20) + 4321


class NoBar:
    def __init__(self) -> None:
        self.count = 0

    def add(self, count: int) -> None:
        self.count += count


def blob_of(path: Path, mode: int = 0o644) -> str:
    return f"{hashlib.sha256(path.read_bytes()).hexdigest()}-{mode:o}"


@pytest.fixture
def user_dir(tmp_path) -> Path:
    path = tmp_path / "user"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def source(tmp_path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(SIZE))
    return path


def ask_missing(user_dir: Path, names: list[str]) -> dict:
    return store.missing(user_dir, names)


def blobs_for(user_dir: Path, sources: dict[str, Path]) -> list[Blob]:
    """What tcloud builds from the `missing` answer for these {blob: local file}."""
    answer = ask_missing(user_dir, sorted(sources))
    return [
        Blob(name, answer["uploads"][name], answer["partial"].get(name, 0), size, path)
        for name in answer["missing"]
        for path, size in [(sources[name], sources[name].stat().st_size)]
    ]


def stream_of(blobs: list[Blob]) -> bytes:
    parts: list[bytes] = []
    frames(blobs, parts.append, NoBar())
    return b"".join(parts)


def partial_files(user_dir: Path) -> list[Path]:
    return sorted((user_dir / "store" / ".partial").iterdir())


def test_a_good_stream_stores_every_blob_read_only(user_dir, source, tmp_path):
    script = tmp_path / "run.sh"
    script.write_bytes(b"#!/bin/sh\necho hi\n")
    names = {blob_of(source): source, blob_of(script, 0o755): script}
    data = stream_of(blobs_for(user_dir, names))
    reader = io.BufferedReader(io.BytesIO(data + b"what follows is not ours"))
    answer = receive(user_dir, reader)
    assert sorted(answer["received"]) == sorted(names) and answer["bad"] == []
    assert answer["bytes"] == SIZE + script.stat().st_size
    assert reader.read() == b"what follows is not ours"  # nothing past the end frame
    for name, path in names.items():
        stored = user_dir / "store" / name
        assert stored.read_bytes() == path.read_bytes()
        want = 0o555 if name.endswith("-755") else 0o444
        assert stat.S_IMODE(stored.stat().st_mode) == want
    assert partial_files(user_dir) == []
    # The commit that follows finds them stored: nothing is hashed again.
    assert ask_missing(user_dir, sorted(names))["missing"] == []


def test_the_commit_after_a_stream_reads_no_blob_again(user_dir, source, monkeypatch):
    name = blob_of(source)
    blobs = blobs_for(user_dir, {name: source})
    receive(user_dir, io.BytesIO(stream_of(blobs)))

    def no_rehash(_path):
        raise AssertionError("the commit hashed a streamed blob again")

    monkeypatch.setattr(store, "sha256", no_rehash)
    assert store.commit_blob(user_dir / "store", user_dir / "store/.partial", name, blobs[0].upload)


def test_an_empty_stream_is_just_the_end_frame(user_dir):
    assert stream_of([]) == END_FRAME
    assert receive(user_dir, io.BytesIO(END_FRAME)) == {"received": [], "bad": [], "bytes": 0}


@pytest.mark.fault
def test_a_cut_stream_leaves_what_arrived_and_the_next_one_sends_only_the_rest(user_dir, source):
    name = blob_of(source)
    data = stream_of(blobs_for(user_dir, {name: source}))
    cut = len(data) - len(END_FRAME) - SIZE + (1 << 20)  # header and the first MiB
    with pytest.raises(Rejected, match="cut off"):
        receive(user_dir, io.BytesIO(data[:cut]))
    assert not (user_dir / "store" / name).exists()  # nothing half-written in the store
    [left] = partial_files(user_dir)
    assert left.read_bytes() == source.read_bytes()[: 1 << 20]
    # The next upload resumes it: `missing` offers the bytes, only the rest is sent.
    [blob] = blobs_for(user_dir, {name: source})
    assert blob.offset == 1 << 20
    bar = NoBar()
    parts: list[bytes] = []
    frames([blob], parts.append, bar)
    assert bar.count == SIZE - (1 << 20)
    assert receive(user_dir, io.BytesIO(b"".join(parts)))["received"] == [name]
    assert (user_dir / "store" / name).read_bytes() == source.read_bytes()


@pytest.mark.fault
def test_a_stream_cut_between_header_and_bytes_or_before_the_end_is_refused(user_dir, source):
    name = blob_of(source)
    data = stream_of(blobs_for(user_dir, {name: source}))
    header = data.split(b"\n", 1)[0] + b"\n"
    with pytest.raises(Rejected, match="cut off"):
        receive(user_dir, io.BytesIO(header))
    with pytest.raises(Rejected, match="before its end frame"):
        receive(user_dir, io.BytesIO(b""))


@pytest.mark.bad_input
def test_a_blob_whose_bytes_are_not_its_hash_is_dropped_and_named_bad(user_dir, source, tmp_path):
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    forged = tmp_path / "forged.bin"
    forged.write_bytes(os.urandom(SIZE))
    answer = receive(user_dir, io.BytesIO(stream_of([Blob(**{**blob.__dict__, "source": forged})])))
    assert answer == {"received": [], "bad": [name], "bytes": SIZE}
    assert not (user_dir / "store" / name).exists()
    assert partial_files(user_dir) == []


@pytest.mark.bad_input
def test_an_offset_that_is_not_what_the_partial_file_holds_is_refused(user_dir, source):
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    for offset in (1, SIZE):
        wrong = Blob(blob.name, blob.upload, offset, blob.size, source)
        with pytest.raises(Rejected, match="offset"):
            receive(user_dir, io.BytesIO(stream_of([wrong])))
    assert not (user_dir / "store" / name).exists()


@pytest.mark.security
def test_a_resumed_prefix_is_hashed_too(user_dir, source):
    """Bytes already in the partial file count: a forged prefix fails the blob."""
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    partial = user_dir / "store" / ".partial" / blob.upload
    partial.write_bytes(os.urandom(1000))  # not the file's first 1000 bytes
    resumed = Blob(blob.name, blob.upload, 1000, blob.size, source)
    assert receive(user_dir, io.BytesIO(stream_of([resumed])))["bad"] == [name]
    assert not (user_dir / "store" / name).exists()


def header(**fields) -> bytes:
    return json.dumps(fields).encode() + b"\n"


BLOB = "a" * 64 + "-644"
UPLOAD = f"{BLOB}.{'0' * 32}"


@pytest.mark.security
@pytest.mark.parametrize(
    "frame",
    [
        header(blob=BLOB, upload=f"../../{BLOB}.{'0' * 32}", offset=0, size=1),
        header(blob=BLOB, upload="../../../.bashrc", offset=0, size=1),
        header(blob=BLOB, upload=f"{'b' * 64}-644.{'0' * 32}", offset=0, size=1),
        header(blob=BLOB, upload=f"/tmp/{UPLOAD}", offset=0, size=1),
        header(blob="../store/x", upload=UPLOAD, offset=0, size=1),
        header(blob=BLOB, upload=UPLOAD, offset=-1, size=1),
        header(blob=BLOB, upload=UPLOAD, offset=2, size=1),
        header(blob=BLOB, upload=UPLOAD, offset=0, size=1 << 41),
        header(blob=BLOB, upload=UPLOAD, offset=0, size=1.5),
        header(blob=BLOB, upload=UPLOAD, offset=0, size=True),
        header(blob=BLOB, upload=UPLOAD, offset=0, size=1, extra=1),
        header(blob=BLOB, upload=UPLOAD),
        b"[]\n",
        b"not json\n",
        b"{" + b" " * HEADER_LIMIT + b"}\n",
    ],
)
def test_headers_with_path_tricks_or_bad_fields_are_refused_before_any_write(user_dir, frame):
    with pytest.raises(Rejected, match="upload stream"):
        receive(user_dir, io.BytesIO(frame + b"x" + END_FRAME))
    assert partial_files(user_dir) == []
    assert [p.name for p in (user_dir / "store").iterdir()] == [".partial"]


@pytest.mark.security
def test_a_partial_file_that_is_a_symlink_is_not_followed(user_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    store.ensure_dirs(user_dir)
    (user_dir / "store" / ".partial" / UPLOAD).symlink_to(outside)
    with pytest.raises(Rejected, match="upload stream"):
        receive(user_dir, io.BytesIO(header(blob=BLOB, upload=UPLOAD, offset=0, size=1) + b"x"))
    assert outside.read_bytes() == b""


@pytest.mark.bad_input
def test_a_blob_sent_twice_in_one_stream_is_refused(user_dir, source):
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    data = stream_of([blob]).removesuffix(END_FRAME)
    with pytest.raises(Rejected, match="twice"):
        receive(user_dir, io.BytesIO(data + data.split(b"\n", 1)[0] + b"\n" + END_FRAME))


@pytest.mark.security
def test_two_concurrent_streams_of_the_same_blob_both_succeed(user_dir, source):
    """Each upload writes its own partial file; whichever ends second finds the blob
    stored (its own file may already be gone): both succeed, the blob is the file."""
    name = blob_of(source)
    first, second = (blobs_for(user_dir, {name: source})[0] for _ in range(2))
    assert first.upload != second.upload
    answers: dict[str, dict] = {}

    def over_pipe(label: str, blob: Blob) -> None:
        read_end, write_end = os.pipe()
        with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as writer:

            def agent_side() -> None:
                answers[label] = receive(user_dir, reader)

            thread = threading.Thread(target=agent_side)
            thread.start()
            frames([blob], lambda data: (writer.write(data), writer.flush()), NoBar())
            writer.close()
            thread.join()

    threads = [
        threading.Thread(target=over_pipe, args=(label, blob))
        for label, blob in (("a", first), ("b", second))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers["a"]["received"] == answers["b"]["received"] == [name]
    assert (user_dir / "store" / name).read_bytes() == source.read_bytes()
    assert partial_files(user_dir) == []


@pytest.mark.security
def test_a_stored_blob_stays_read_only_and_a_resend_does_not_touch_it(user_dir, source):
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    receive(user_dir, io.BytesIO(stream_of([blob])))
    stored = user_dir / "store" / name
    inode = stored.stat().st_ino
    # A stream that names it again (another upload asked before it was stored).
    again = Blob(name, f"{name}.{'1' * 32}", 0, SIZE, source)
    assert receive(user_dir, io.BytesIO(stream_of([again])))["received"] == [name]
    assert stored.stat().st_ino == inode and stat.S_IMODE(stored.stat().st_mode) == 0o444
    assert stored.read_bytes() == source.read_bytes()
    assert partial_files(user_dir) == []


@pytest.mark.security
def test_a_second_writer_on_one_partial_file_is_refused_and_the_store_stays_exact(user_dir, source):
    """Two streams naming one partial file (a forged header, a stalled older tcloud):
    the second is refused while the first writes, so no byte the first did not hash
    can reach the store."""
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    partial = user_dir / "store" / ".partial" / blob.upload
    partial.write_bytes(source.read_bytes()[:1000])
    resumed = Blob(blob.name, blob.upload, 1000, blob.size, source)
    with partial.open("r+b") as other:  # another writer holds the file
        fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(Rejected, match="another upload is writing"):
            receive(user_dir, io.BytesIO(stream_of([resumed])))
    assert not (user_dir / "store" / name).exists()
    assert receive(user_dir, io.BytesIO(stream_of([resumed])))["received"] == [name]
    stored = user_dir / "store" / name
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == name.split("-")[0]


@pytest.mark.security
def test_bytes_appended_behind_the_stream_fail_the_blob_instead_of_entering_the_store(
    user_dir, source, monkeypatch
):
    """A writer that ignores the lock and appends while the stream is read: the file's
    size no longer matches the blob, so it is dropped (the store never gets it)."""
    name = blob_of(source)
    [blob] = blobs_for(user_dir, {name: source})
    partial = user_dir / "store" / ".partial" / blob.upload
    real_copy = store_receive.copy_exactly

    def copy_then_append(reader, count, digest, out):
        done = real_copy(reader, count, digest, out)
        with partial.open("ab") as sneaky:
            sneaky.write(b"unhashed")
        return done

    monkeypatch.setattr(store_receive, "copy_exactly", copy_then_append)
    answer = receive(user_dir, io.BytesIO(stream_of([blob])))
    assert answer["bad"] == [name]
    assert not (user_dir / "store" / name).exists()


@pytest.mark.fault
def test_a_partial_file_longer_than_its_blob_is_started_afresh(user_dir, source):
    """What a broken earlier upload left beyond the blob's size does not block it."""
    name = blob_of(source)
    answer = ask_missing(user_dir, [name])
    partial = user_dir / "store" / ".partial" / answer["uploads"][name]
    partial.write_bytes(os.urandom(SIZE + 50))

    entry = SimpleNamespace(size=SIZE, source=source)
    compiled = SimpleNamespace(manifest={"code/data.bin": entry})
    answer = ask_missing(user_dir, [name])
    assert answer["partial"][name] == SIZE + 50
    upload = answer["uploads"][name]
    blob = missing_blob(compiled, "code/data.bin", name, upload, answer["partial"])
    assert blob.offset == 0
    assert receive(user_dir, io.BytesIO(stream_of([blob])))["received"] == [name]
    assert (user_dir / "store" / name).read_bytes() == source.read_bytes()


@pytest.mark.fault
def test_a_bad_partial_an_older_upload_left_is_dropped_so_the_next_upload_succeeds(
    user_dir, source
):
    """The old-style .partial/<blob> of the right size but other bytes: the stream that
    resumed from its copy fails once, and the next upload is not fed it again."""
    name = blob_of(source)
    store.ensure_dirs(user_dir)
    (user_dir / "store" / ".partial" / name).write_bytes(os.urandom(SIZE))
    [blob] = blobs_for(user_dir, {name: source})
    assert blob.offset == SIZE
    assert receive(user_dir, io.BytesIO(stream_of([blob])))["bad"] == [name]
    [again] = blobs_for(user_dir, {name: source})
    assert again.offset == 0
    assert receive(user_dir, io.BytesIO(stream_of([again])))["received"] == [name]
    assert (user_dir / "store" / name).read_bytes() == source.read_bytes()
