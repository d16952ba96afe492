"""Cluster side of the delta upload (runs on the login node, Python stdlib only).

Reads one JSON request on stdin, writes one JSON answer on stdout:
  {"op": "missing", "userdir": D, "blobs": [NAME...]}
      -> {"missing": [NAME...], "partial": {NAME: bytes already uploaded}}
  {"op": "commit", "userdir": D, "blobs": [NAME...], "manifest": {PATH: NAME},
   "digest": HEX, "files": {NAME: TEXT}}
      -> {"workdir": PATH, "bad": [NAME...]}
A blob NAME is "<sha256>-<mode>". Uploads land in store/.partial/NAME; commit hashes each
one, moves good ones into store/ read-only (0444/0555) and drops bad ones, then builds
jobs/<digest12>-<n>/ from hard links to the store: every job gets its own immutable
tree, and a resubmit never touches a running job's files. Everything is private (0700).
"""

import contextlib
import hashlib
import json
import os
import sys


def paths(userdir):
    store = os.path.join(userdir, "store")
    return store, os.path.join(store, ".partial"), os.path.join(userdir, "jobs")


def ensure_dirs(userdir):
    for path in (userdir, *paths(userdir)):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)


def missing(request):
    store, partial, _ = paths(request["userdir"])
    ensure_dirs(request["userdir"])
    lacking, started = [], {}
    for name in request["blobs"]:
        if not os.path.exists(os.path.join(store, name)):
            lacking.append(name)
            with contextlib.suppress(OSError):
                started[name] = os.path.getsize(os.path.join(partial, name))
    return {"missing": lacking, "partial": started}


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def commit(request):
    userdir = request["userdir"]
    store, partial, jobs = paths(userdir)
    ensure_dirs(userdir)
    bad = []
    for name in request["blobs"]:
        final = os.path.join(store, name)
        staged = os.path.join(partial, name)
        if os.path.exists(final) or not os.path.exists(staged):
            continue
        if sha256(staged) != name.split("-")[0]:
            os.unlink(staged)
            bad.append(name)
            continue
        os.chmod(staged, 0o555 if name.endswith("-755") else 0o444)
        os.replace(staged, final)
    lacking = [
        n for n in set(request["manifest"].values()) if not os.path.exists(os.path.join(store, n))
    ]
    if bad or lacking:
        return {"workdir": None, "bad": sorted(set(bad) | set(lacking))}
    prefix = request["digest"][:12]
    number = 1
    while True:
        workdir = os.path.join(jobs, f"{prefix}-{number}")
        try:
            os.mkdir(workdir, 0o700)
            break
        except FileExistsError:
            number += 1
    for relpath, name in sorted(request["manifest"].items()):
        target = os.path.join(workdir, relpath)
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        os.link(os.path.join(store, name), target)
    for relpath, text in request.get("files", {}).items():
        with open(os.path.join(workdir, relpath), "w") as handle:
            handle.write(text)
    os.makedirs(os.path.join(workdir, "logs"), mode=0o700, exist_ok=True)
    os.makedirs(os.path.join(workdir, "outputs"), mode=0o700, exist_ok=True)
    return {"workdir": workdir, "userdir": userdir, "bad": []}


def main():
    os.umask(0o077)
    request = json.load(sys.stdin)
    request["userdir"] = os.path.expanduser(request["userdir"])
    answer = {"missing": missing, "commit": commit}[request["op"]](request)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
