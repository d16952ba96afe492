#!/usr/bin/python3
"""Push OCI archives into the local registry, each only while it lacks that digest.

Usage: image_seed.py --registry localhost:5000 [--check] [--wait S] -- ARCHIVE NAME ...

For each ARCHIVE (an oci-archive) and NAME (ns/name:tag) it compares the archive's
manifest digest with the one the registry serves under NAME and pushes with
`skopeo copy --preserve-digests` only when they differ (or NAME is absent); --check says
what it would push and pushes nothing. Every line it prints names an image; the last
line is `changed` or `ok` (the role's changed_when). Runs on the registry host, talking
to it over the loopback (plain HTTP). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

ABSENT_MARKERS = ("manifest unknown", "name unknown", "not found")


class SeedError(Exception):
    pass


def skopeo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["skopeo", *args], capture_output=True, check=False)


def manifest_digest(image: str, *extra: str) -> str | None:
    """sha256 of the raw manifest skopeo reads for `image`; None when it is absent."""
    proc = skopeo("inspect", "--raw", *extra, image)
    if proc.returncode == 0:
        return "sha256:" + hashlib.sha256(proc.stdout).hexdigest()
    error = proc.stderr.decode(errors="replace").strip()
    if any(marker in error.lower() for marker in ABSENT_MARKERS):
        return None
    raise SeedError(f"skopeo inspect {image}: {error}")


def wait_for(registry: str, seconds: int) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"http://{registry}/v2/", timeout=5):
                return
        except (urllib.error.URLError, OSError) as exc:
            if time.monotonic() > deadline:
                raise SeedError(f"the registry at {registry} did not answer: {exc}") from exc
            time.sleep(1)


def seed(registry: str, archive: str, name: str, *, check: bool) -> bool:
    """Push `archive` as `name` unless the registry holds its digest; True if it (would) push."""
    local = manifest_digest(f"oci-archive:{archive}")
    if local is None:
        raise SeedError(f"{archive}: not an OCI archive skopeo can read")
    target = f"docker://{registry}/{name}"
    served = manifest_digest(target, "--tls-verify=false")
    if served == local:
        print(f"present {name} {local}")
        return False
    if check:
        print(f"would push {name} {local} (the registry serves {served or 'nothing'})")
        return True
    proc = skopeo(
        "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false",
        f"oci-archive:{archive}", target,
    )  # fmt: skip
    if proc.returncode != 0:
        raise SeedError(f"skopeo copy {archive} {target}: {proc.stderr.decode().strip()}")
    after = manifest_digest(target, "--tls-verify=false")
    if after != local:
        raise SeedError(f"{name}: pushed {local} but the registry serves {after}")
    print(f"pushed {name} {local}")
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--wait", type=int, default=60)
    parser.add_argument("pairs", nargs="*", metavar="ARCHIVE NAME")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give ARCHIVE NAME pairs")
    try:
        wait_for(args.registry, args.wait)
        changed = False
        for archive, name in zip(args.pairs[::2], args.pairs[1::2], strict=True):
            changed |= seed(args.registry, archive, name, check=args.check)
    except SeedError as exc:
        print(f"image_seed: {exc}", file=sys.stderr)
        return 1
    print("changed" if changed else "ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
