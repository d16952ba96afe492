"""Cluster side of tcloud's delta upload (layer 2 -> cluster).

`missing`: which blobs ("<sha256>-<mode>") the user's store lacks, and for each the
file of this upload alone, store/.partial/<blob>.<random>, started from a copy of what
a cut upload already left there. `commit`: hash each uploaded file, link good ones into
store/ read-only (0444/0555; a blob another upload committed first is kept), drop the
blob's partial files, then build the job's own directory jobs/<digest12>-<n>/ from hard
links to the store: every submission gets an immutable tree, and a resubmit never
touches a running job's files. Two submits of the same new file (the same user, at
once) each write their own partial file, so both succeed and no blob is ever mixed.

A streamed upload (tacc_agent.tasks.store.receive) hashes each blob as it arrives and
installs it with `install_blob` on its last byte: its commit then finds the blob in the
store and reads nothing again. `missing` may carry the commit too ("commit": its
request): when nothing is missing it is done at once, one round trip for a resubmit.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tacc_agent.errors import Rejected
from tacc_agent.procfs.processes import own_fd_path
from tacc_agent.tasks.schedule.instruction import parse
from tacc_contract.instruction import digest_of
from tacc_contract.protocol import blob_name

BLOB = re.compile(r"[0-9a-f]{64}-[0-7]{3}")
# One upload's partial file of a blob: store/.partial/<blob>.<32 hex digits>.
UPLOAD = re.compile(r"([0-9a-f]{64}-[0-7]{3})\.[0-9a-f]{32}")
# A partial file nothing wrote to for this long belongs to a cut upload: the next upload
# of its blob takes it over (renamed, not copied), and the others of that blob go.
IDLE_SECONDS = 120
# Partial files of uploads nobody resumed go after this long (they count on the quota).
ABANDONED_SECONDS = 7 * 24 * 3600


def store_dirs(user_dir: Path) -> tuple[Path, Path, Path]:
    store = user_dir / "store"
    return store, store / ".partial", user_dir / "jobs"


def ensure_dirs(user_dir: Path) -> None:
    for path in store_dirs(user_dir):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)


def check_names(names: list[str]) -> None:
    bad = [n for n in names if not isinstance(n, str) or not BLOB.fullmatch(n)]
    if bad:
        raise Rejected(f"not a blob name: {bad[0]!r}")


def new_upload(name: str) -> str:
    """A partial file name no other upload of the blob uses."""
    return f"{name}.{secrets.token_hex(16)}"


# Each upload's partial files of each blob, from one listing of store/.partial: a call
# on many blobs lists the directory once, not once per blob (a glob per blob made
# `missing` and `commit` of 1,000 new blobs quadratic: a second and more).
Partials = dict[str, list[Path]]


def partials_by_blob(partial: Path) -> Partials:
    """store/.partial/<blob>.<32 hex digits> files, by blob (one listing)."""
    found: Partials = defaultdict(list)
    with contextlib.suppress(FileNotFoundError), os.scandir(partial) as entries:
        for entry in entries:
            if match := UPLOAD.fullmatch(entry.name):
                found[match.group(1)].append(partial / entry.name)
    return found


def partial_files(partial: Path, name: str, listed: Partials | None = None) -> list[Path]:
    """Every partial file of blob `name`: each upload's own (from `listed` when given:
    partials_by_blob, taken earlier in this call), and the one an older tcloud appended
    to (store/.partial/<blob>)."""
    if listed is None:
        found = [p for p in partial.glob(f"{name}.*") if UPLOAD.fullmatch(p.name)]
    else:
        found = listed.get(name, [])
    return [*found, partial / name]


def size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def idle_for(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def start_upload(partial: Path, name: str, listed: Partials | None = None) -> tuple[str, int]:
    """(this upload's partial file, bytes already in it). What a cut upload left is taken
    over when idle (renamed: one upload wins it), else copied, never shared: another
    upload may still be appending to it. Idle partial files of the blob then go, so
    repeated cut uploads do not pile copies up on the user's quota. `listed`: the
    partial files as this call listed them (partials_by_blob); one another upload
    starts meanwhile is its own, left alone either way."""
    upload, now = new_upload(name), time.time()
    known = partial_files(partial, name, listed)
    sources = sorted(known, key=size_or_zero, reverse=True)
    sources = [path for path in sources if size_or_zero(path) > 0]
    for source in sources:
        if idle_for(source, now) < IDLE_SECONDS:
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile: start afresh
                shutil.copyfile(source, partial / upload)
            break
        with contextlib.suppress(FileNotFoundError):  # another upload took it over first
            os.rename(source, partial / upload)
            break
    for path in known:
        if path.name != upload and idle_for(path, now) >= IDLE_SECONDS:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return upload, size_or_zero(partial / upload)


def drop_abandoned(partial: Path) -> None:
    """Partial files of uploads nobody came back to for ABANDONED_SECONDS."""
    now = time.time()
    with contextlib.suppress(FileNotFoundError):
        for path in partial.iterdir():
            if idle_for(path, now) >= ABANDONED_SECONDS:
                with contextlib.suppress(OSError):
                    path.unlink()


def drop_partials(partial: Path, name: str, listed: Partials | None = None) -> None:
    for path in partial_files(partial, name, listed):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def missing(user_dir: Path, blobs: list[str]) -> dict:
    check_names(blobs)
    store, partial, _ = store_dirs(user_dir)
    ensure_dirs(user_dir)
    drop_abandoned(partial)
    listed = partials_by_blob(partial)
    lacking, started, uploads = [], {}, {}
    for name in blobs:
        if (store / name).exists():
            continue
        upload, size = start_upload(partial, name, listed)
        if (store / name).exists():  # committed by another upload meanwhile
            with contextlib.suppress(FileNotFoundError):
                (partial / upload).unlink()
            continue
        lacking.append(name)
        uploads[name] = upload
        if size:
            started[name] = size
    return {"missing": lacking, "partial": started, "uploads": uploads, "userdir": str(user_dir)}


def sha256(path: Path) -> str:
    with path.open("rb", buffering=0) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def blob_sha256(name: str) -> str:
    return name.split("-")[0]


def read_only_mode(name: str) -> int:
    return 0o555 if name.endswith("-755") else 0o444


TOP_DIRS = ("code", "datasets")


def safe_relpath(relpath: object, tops: tuple[str, ...] = TOP_DIRS) -> str:
    """A normalized path under one of tops; Rejected otherwise."""
    text = str(relpath)
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if (
        not isinstance(relpath, str)
        or text.startswith("/")
        or ".." in parts
        or len(parts) < 2
        or parts[0] not in tops
    ):
        raise Rejected(f"manifest path {text!r} must be a relative path under {' or '.join(tops)}/")
    return "/".join(parts)


def folders(relpath: str) -> list[str]:
    """The directories a normalized relative path lies in: a/b/c -> a, a/b."""
    parts = relpath.split("/")
    return ["/".join(parts[:end]) for end in range(1, len(parts))]


def checked_request(request: dict) -> tuple[list[str], dict[str, str], dict[str, str]]:
    blobs, manifest, files = (
        request.get("blobs", []),
        request.get("manifest", {}),
        request.get("files", {}),
    )
    if not isinstance(blobs, list) or not isinstance(manifest, dict) or not isinstance(files, dict):
        raise Rejected("expected blobs: [names], manifest: {path: name}, files: {name: text}")
    paths = [safe_relpath(p) for p in manifest]
    unique = set(paths)
    if len(unique) != len(paths) or any(folder in unique for p in paths for folder in folders(p)):
        raise Rejected("manifest paths must be unique and no file may also be a directory")
    if set(files) - {"instruction.json"}:
        raise Rejected("only instruction.json may be sent as a file")
    return blobs, dict(zip(paths, manifest.values(), strict=True)), files


def checked_uploads(uploads: object) -> dict[str, str]:
    """A commit's {blob: the partial file `missing` named for this upload of it}."""
    wrong = "expected uploads: {blob: <blob>.<32 hex digits>}, as `missing` named them"
    if not isinstance(uploads, dict):
        raise Rejected(wrong)
    for name, upload in uploads.items():
        match = UPLOAD.fullmatch(upload) if isinstance(upload, str) else None
        if not match or match.group(1) != name:
            raise Rejected(wrong)
    return uploads


def place(building: Path, jobs: Path, digest: str) -> Path:
    """Rename a finished tree to the first free jobs/<digest12>-<n> (atomic)."""
    number = 1
    while True:
        candidate = jobs / f"{digest[:12]}-{number}"
        try:
            os.rename(building, candidate)  # fails if candidate exists (non-empty)
            return candidate
        except OSError as exc:
            # Taken (by another submit; or a job being removed, gone by now: asking
            # whether it exists afterwards raised a rename that only lost that race).
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            number += 1


def commit_local(user_dir: Path, instruction) -> dict:
    """Commit an instruction compiled on this host (tcloud.compile.compiler.Instruction) without
    an upload: its files are staged from where they are, as SFTP would leave them (tests,
    tools/gpu_check.py)."""
    names = {path: blob_name(e.sha256, e.mode) for path, e in instruction.manifest.items()}
    ensure_dirs(user_dir)
    uploads: dict[str, str] = {}
    for path, entry in instruction.manifest.items():
        name = names[path]
        if name not in uploads and not (user_dir / "store" / name).exists():
            uploads[name] = new_upload(name)
            (user_dir / "store" / ".partial" / uploads[name]).write_bytes(entry.source.read_bytes())
    files = {"instruction.json": json.dumps(instruction.document)}
    return commit(user_dir, sorted(uploads), names, instruction.digest, files, uploads)


def commit_blob(
    store: Path, partial: Path, name: str, upload: str | None, listed: Partials | None = None
) -> bool:
    """Link one upload's partial file of blob `name` into the store, read-only; False
    when its content is not the blob. Either way the blob's partial files go (another
    upload of it still running finds the blob committed when it commits)."""
    if upload is None:
        if (store / name).exists() or not (partial / name).exists():
            return True  # not sent by this upload: the store has it, or the job lacks it
        upload = name  # an older tcloud appended to store/.partial/<blob> and named none
    final, staged = store / name, partial / upload
    try:
        good = final.exists() or sha256(staged) == blob_sha256(name)
    except FileNotFoundError:  # dropped by another upload's commit of the same blob
        return True
    if not good:
        drop_partials(partial, name, listed)
        return False
    # Gone meanwhile: the commit finds it lacking.
    install_blob(store, partial, name, staged, listed=listed)
    return True


def link_open_file(fd: int, target: Path) -> None:
    """A hard link to the open file fd at target: linkat(2) of /proc/self/fd/<fd> with
    AT_SYMLINK_FOLLOW (os.link uses linkat only when it is given a directory fd)."""
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.link(own_fd_path(fd), target, src_dir_fd=root, follow_symlinks=True)
    finally:
        os.close(root)


def install_blob(
    store: Path,
    partial: Path,
    name: str,
    staged: Path,
    fd: int | None = None,
    listed: Partials | None = None,
) -> bool:
    """Link staged (whose content is known to be blob `name`) into the store read-only,
    then drop the blob's partial files (another upload of it still running finds the
    blob in the store). With fd (staged, open), the open file itself is made read-only
    and linked (/proc/self/fd), not whatever the path names by then. False when staged
    is gone and the store lacks the blob (another upload dropped it after a bad copy):
    the blob is to be sent again. `listed`: the partial files as the caller listed them
    (partials_by_blob); staged goes whether it is among them or not."""
    final = store / name
    try:
        if not final.exists():
            with contextlib.suppress(FileExistsError):  # another upload linked it first
                if fd is None:
                    staged.chmod(read_only_mode(name))
                    os.link(staged, final)
                else:
                    os.fchmod(fd, read_only_mode(name))
                    link_open_file(fd, final)
    except FileNotFoundError:
        if not final.exists():
            return False
    with contextlib.suppress(FileNotFoundError):
        staged.unlink()
    drop_partials(partial, name, listed)
    return True


def commit(
    user_dir: Path,
    blobs: list[str],
    manifest: dict[str, str],
    digest: str,
    files: dict[str, str],
    uploads: dict[str, str] | None = None,
) -> dict:
    check_names(blobs + list(manifest.values()))
    if not isinstance(digest, str) or not BLOB.fullmatch(f"{digest}-644"):
        raise Rejected("instruction digest must be 64 hex digits")
    try:
        document = json.loads(files["instruction.json"])
    except (KeyError, TypeError, ValueError):
        raise Rejected("commit needs instruction.json, as JSON") from None
    if digest_of(document) != digest:
        raise Rejected("instruction.json does not match the instruction digest")
    # Refused here, before a blob is moved or a directory made: the client is not trusted.
    parse(files["instruction.json"], "instruction.json")
    store, partial, jobs = store_dirs(user_dir)
    ensure_dirs(user_dir)
    uploads = checked_uploads(uploads or {})
    listed = partials_by_blob(partial) if blobs else {}
    bad = [n for n in blobs if not commit_blob(store, partial, n, uploads.get(n), listed)]
    lacking = [n for n in set(manifest.values()) if not (store / n).exists()]
    if bad or lacking:
        return {"workdir": None, "bad": sorted(set(bad) | set(lacking))}
    # Built aside and renamed into place: a failure leaves no half-built job directory.
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=jobs))
    try:
        made: set[Path] = set()
        for relpath, name in sorted(manifest.items()):
            target = building / relpath
            if target.parent not in made:  # each directory once, not once per file
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                made.add(target.parent)
            os.link(store / name, target)
        (building / "instruction.json").write_text(files["instruction.json"])
        # code/ too: a task with no files (a dict task of the SDK) still runs in it.
        for sub in ("code", "logs", "outputs", "status"):
            (building / sub).mkdir(mode=0o700, exist_ok=True)
        workdir = place(building, jobs, digest)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return {"workdir": str(workdir), "userdir": str(user_dir), "bad": []}


def commit_request(user_dir: Path, request: dict) -> dict:
    blobs, manifest, files = checked_request(request)
    uploads = checked_uploads(request.get("uploads", {}))
    return commit(user_dir, blobs, manifest, request.get("digest", ""), files, uploads)


def missing_then_commit(user_dir: Path, request: dict) -> dict:
    """`missing`; with "commit" (a commit request of no blobs) and nothing missing, the
    commit too: its workdir and bad join the answer (a resubmit of nothing new is one
    round trip; with "submit", the agent then sbatches the workdir as after a commit)."""
    blobs = request.get("blobs", [])
    if not isinstance(blobs, list):
        raise Rejected("expected blobs: [names]")
    then = request.get("commit")
    if then is not None and (not isinstance(then, dict) or then.get("blobs", []) != []):
        raise Rejected("expected commit: a commit request with no blobs")
    answer = missing(user_dir, blobs)
    answer["receive"] = True  # this store takes a streamed upload (store_receive)
    if then is not None and not answer["missing"]:
        answer.update(commit_request(user_dir, then))
    return answer


def handle(user_dir: Path, request: dict) -> dict:
    if request.get("op") == "missing":
        return missing_then_commit(user_dir, request)
    if request.get("op") == "commit":
        return commit_request(user_dir, request)
    raise Rejected(f"unknown store operation {json.dumps(request.get('op'))}")
