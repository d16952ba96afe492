"""Cluster side of tcloud's delta upload (layer 2 -> cluster).

`missing`: which blobs ("<sha256>-<mode>") the user's store lacks, and how much of
each a cut upload already left in store/.partial/. `commit`: hash each uploaded blob,
move good ones into store/ read-only (0444/0555), drop bad ones, then build the job's
own directory jobs/<digest12>-<n>/ from hard links to the store: every submission gets
an immutable tree, and a resubmit never touches a running job's files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from tacc_agent.errors import Rejected
from tacc_agent.instruction import digest_of, parse

BLOB = re.compile(r"[0-9a-f]{64}-[0-7]{3}")


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


def missing(user_dir: Path, blobs: list[str]) -> dict:
    check_names(blobs)
    store, partial, _ = store_dirs(user_dir)
    ensure_dirs(user_dir)
    lacking, started = [], {}
    for name in blobs:
        if not (store / name).exists():
            lacking.append(name)
            with contextlib.suppress(OSError):
                started[name] = (partial / name).stat().st_size
    return {"missing": lacking, "partial": started, "userdir": str(user_dir)}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


TOP_DIRS = ("code", "datasets")


def safe_relpath(relpath: object, tops: tuple[str, ...] = TOP_DIRS) -> str:
    """A normalized path under one of tops; Rejected otherwise."""
    text = str(relpath)
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if not isinstance(relpath, str) or text.startswith("/") or ".." in parts or len(parts) < 2 \
            or parts[0] not in tops:  # fmt: skip
        raise Rejected(f"manifest path {text!r} must be a relative path under {' or '.join(tops)}/")
    return "/".join(parts)


def checked_request(request: dict) -> tuple[list[str], dict[str, str], dict[str, str]]:
    blobs, manifest, files = (
        request.get("blobs", []),
        request.get("manifest", {}),
        request.get("files", {}),
    )
    if not isinstance(blobs, list) or not isinstance(manifest, dict) or not isinstance(files, dict):
        raise Rejected("expected blobs: [names], manifest: {path: name}, files: {name: text}")
    paths = [safe_relpath(p) for p in manifest]
    if len(set(paths)) != len(paths) or any(
        other.startswith(p + "/") for p in paths for other in paths
    ):
        raise Rejected("manifest paths must be unique and no file may also be a directory")
    if set(files) - {"instruction.json"}:
        raise Rejected("only instruction.json may be sent as a file")
    return blobs, dict(zip(paths, manifest.values(), strict=True)), files


def place(building: Path, jobs: Path, digest: str) -> Path:
    """Rename a finished tree to the first free jobs/<digest12>-<n> (atomic)."""
    number = 1
    while True:
        candidate = jobs / f"{digest[:12]}-{number}"
        try:
            os.rename(building, candidate)  # fails if candidate exists (non-empty)
            return candidate
        except OSError:
            if not candidate.exists():
                raise
            number += 1


def blob_name(sha256: str, mode: int) -> str:
    """A file's name in the store: its content and its mode (0o644 or 0o755)."""
    return f"{sha256}-{mode:o}"


def commit_local(user_dir: Path, instruction) -> dict:
    """Commit an instruction compiled on this host (tcloud.compiler.Instruction) without
    an upload: its files are staged from where they are, as SFTP would leave them (tests,
    tools/gpu_check.py)."""
    names = {path: blob_name(e.sha256, e.mode) for path, e in instruction.manifest.items()}
    ensure_dirs(user_dir)
    for path, entry in instruction.manifest.items():
        if not (user_dir / "store" / names[path]).exists():
            (user_dir / "store" / ".partial" / names[path]).write_bytes(entry.source.read_bytes())
    files = {"instruction.json": json.dumps(instruction.document)}
    return commit(user_dir, sorted(set(names.values())), names, instruction.digest, files)


def commit(user_dir: Path, blobs: list[str], manifest: dict[str, str], digest: str,
           files: dict[str, str]) -> dict:  # fmt: skip
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
    bad = []
    for name in blobs:
        final, staged = store / name, partial / name
        if final.exists() or not staged.exists():
            continue
        try:
            if sha256(staged) != name.split("-")[0]:
                staged.unlink()
                bad.append(name)
                continue
            staged.chmod(0o555 if name.endswith("-755") else 0o444)
            os.replace(staged, final)
        except FileNotFoundError:  # a concurrent commit of the same blob moved it first
            continue
    lacking = [n for n in set(manifest.values()) if not (store / n).exists()]
    if bad or lacking:
        return {"workdir": None, "bad": sorted(set(bad) | set(lacking))}
    # Built aside and renamed into place: a failure leaves no half-built job directory.
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=jobs))
    try:
        for relpath, name in sorted(manifest.items()):
            target = building / relpath
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.link(store / name, target)
        (building / "instruction.json").write_text(files["instruction.json"])
        for sub in ("logs", "outputs", "status"):
            (building / sub).mkdir(mode=0o700, exist_ok=True)
        workdir = place(building, jobs, digest)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return {"workdir": str(workdir), "userdir": str(user_dir), "bad": []}


def handle(user_dir: Path, request: dict) -> dict:
    if request.get("op") == "missing":
        blobs = request.get("blobs", [])
        if not isinstance(blobs, list):
            raise Rejected("expected blobs: [names]")
        return missing(user_dir, blobs)
    if request.get("op") == "commit":
        blobs, manifest, files = checked_request(request)
        return commit(user_dir, blobs, manifest, request.get("digest", ""), files)
    raise Rejected(f"unknown store operation {json.dumps(request.get('op'))}")
