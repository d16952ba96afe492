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
from pathlib import Path

from tacc_agent.errors import Rejected
from tacc_agent.instruction import digest_of

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


def safe_relpath(relpath: str) -> str:
    parts = Path(relpath).parts
    if not relpath or Path(relpath).is_absolute() or ".." in parts:
        raise Rejected(f"manifest path {relpath!r} must be relative and stay inside the job")
    return relpath


def new_job_dir(jobs: Path, digest: str) -> Path:
    number = 1
    while True:
        candidate = jobs / f"{digest[:12]}-{number}"
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            number += 1


def commit(user_dir: Path, blobs: list[str], manifest: dict[str, str], digest: str,
           files: dict[str, str]) -> dict:  # fmt: skip
    check_names(blobs + list(manifest.values()))
    if not isinstance(digest, str) or not BLOB.fullmatch(f"{digest}-644"):
        raise Rejected("instruction digest must be 64 hex digits")
    document = files.get("instruction.json")
    if document is None or digest_of(json.loads(document)) != digest:
        raise Rejected("instruction.json does not match the instruction digest")
    store, partial, jobs = store_dirs(user_dir)
    ensure_dirs(user_dir)
    bad = []
    for name in blobs:
        final, staged = store / name, partial / name
        if final.exists() or not staged.exists():
            continue
        if sha256(staged) != name.split("-")[0]:
            staged.unlink()
            bad.append(name)
            continue
        staged.chmod(0o555 if name.endswith("-755") else 0o444)
        os.replace(staged, final)
    lacking = [n for n in set(manifest.values()) if not (store / n).exists()]
    if bad or lacking:
        return {"workdir": None, "bad": sorted(set(bad) | set(lacking))}
    workdir = new_job_dir(jobs, digest)
    for relpath, name in sorted(manifest.items()):
        target = workdir / safe_relpath(relpath)
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.link(store / name, target)
    for relpath, text in files.items():
        (workdir / safe_relpath(relpath)).write_text(text)
    for sub in ("logs", "outputs", "status"):
        (workdir / sub).mkdir(mode=0o700, exist_ok=True)
    return {"workdir": str(workdir), "userdir": str(user_dir), "bad": []}


def handle(user_dir: Path, request: dict) -> dict:
    if request.get("op") == "missing":
        return missing(user_dir, list(request.get("blobs", [])))
    if request.get("op") == "commit":
        return commit(
            user_dir,
            list(request.get("blobs", [])),
            dict(request.get("manifest", {})),
            request.get("digest", ""),
            {k: str(v) for k, v in dict(request.get("files", {})).items()},
        )
    raise Rejected(f"unknown store operation {json.dumps(request.get('op'))}")
