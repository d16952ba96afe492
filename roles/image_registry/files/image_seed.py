#!/usr/bin/python3
"""Push OCI archives into the local registry, each only while it lacks that digest.

Usage: image_seed.py --registry HOST:PORT [--scheme http|https] [--check] [--wait S]
       [--seed-registry 127.0.0.1:PORT --seed-command BIN --seed-config FILE
        [--seed-user USER]] -- ARCHIVE NAME ...

For each ARCHIVE (an oci-archive) and NAME (ns/name:tag) it compares the archive's
manifest digest with the one the registry serves under NAME (--registry: the serving
instance, read-only to the cluster network) and pushes with `skopeo copy
--preserve-digests` only when they differ (or NAME is absent). Pushes go to a writable
instance on the loopback (--seed-registry) that it starts (`BIN serve FILE`, as
--seed-user) only when a push is needed and stops afterwards; without --seed-command
--seed-registry must already run. It then checks the serving instance serves the pushed
digest. --check says what it would push and starts and pushes nothing. Every line it
prints names an image; the last line is `changed` or `ok` (the role's changed_when).
Runs on the registry host. Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

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


def answers(url: str) -> None:
    """Raises unless `url` answers. The registry is this host's own: its certificate is
    not checked here (the clients check it)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=5, context=context):  # noqa: S310 (http/https built here)
        return


def wait_for(
    registry: str, seconds: int, scheme: str = "http", alive: subprocess.Popen | None = None
) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            answers(f"{scheme}://{registry}/v2/")
            return
        except urllib.error.HTTPError:
            return  # it answers (e.g. 401): it runs
        except (urllib.error.URLError, OSError) as exc:
            if alive is not None and alive.poll() is not None:
                raise SeedError(f"the registry at {registry} exited ({alive.returncode})") from exc
            if time.monotonic() > deadline:
                raise SeedError(f"the registry at {registry} did not answer: {exc}") from exc
            time.sleep(1)


def push(archive: str, target: str) -> None:
    proc = skopeo(
        "copy",
        "--quiet",
        "--preserve-digests",
        "--dest-tls-verify=false",
        f"oci-archive:{archive}",
        target,
    )
    if proc.returncode != 0:
        raise SeedError(f"skopeo copy {archive} {target}: {proc.stderr.decode().strip()}")


PR_SET_PDEATHSIG = 1


def stop_with_parent(parent: int) -> None:
    """In the seeding instance's process, before exec (after its user switch, which
    would clear it): SIGTERM when this script dies, even by SIGKILL, so no writable
    listener outlives a killed seeding."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


@contextmanager
def seeding_instance(args: argparse.Namespace) -> Iterator[None]:
    """The writable loopback instance, running for the duration (started here when
    --seed-command names it, then stopped)."""
    if not args.seed_command:
        wait_for(args.seed_registry, args.wait)
        yield
        return
    user = {"user": args.seed_user, "group": args.seed_user, "extra_groups": []}
    as_user = user if args.seed_user else {}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [args.seed_command, "serve", args.seed_config],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            **as_user,
            preexec_fn=functools.partial(stop_with_parent, os.getpid()),  # single-threaded
        )
        try:
            try:
                wait_for(args.seed_registry, args.wait, alive=proc)
            except SeedError as exc:
                log.seek(0)
                tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                raise SeedError(f"{exc}: {' / '.join(tail) or 'no output'}") from exc
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", required=True, help="the serving instance, HOST:PORT")
    parser.add_argument("--scheme", choices=["http", "https"], default="http")
    parser.add_argument("--seed-registry", required=True, help="the writable loopback instance")
    parser.add_argument("--seed-command", default="", help="starts it: BIN serve --seed-config")
    parser.add_argument("--seed-config", default="")
    parser.add_argument("--seed-user", default="")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--wait", type=int, default=60)
    parser.add_argument("pairs", nargs="*", metavar="ARCHIVE NAME")
    args = parser.parse_args(argv)
    if len(args.pairs) % 2:
        parser.error("give ARCHIVE NAME pairs")
    if args.seed_command and not args.seed_config:
        parser.error("--seed-command needs --seed-config")
    if not args.seed_registry.startswith(("127.", "localhost:", "[::1]:")):
        parser.error("--seed-registry must be on the loopback (it is writable)")
    try:
        wait_for(args.registry, args.wait, args.scheme)
        pending: list[tuple[str, str, str]] = []
        would = False
        for archive, name in zip(args.pairs[::2], args.pairs[1::2], strict=True):
            local = manifest_digest(f"oci-archive:{archive}")
            if local is None:
                raise SeedError(f"{archive}: not an OCI archive skopeo can read")
            served = manifest_digest(f"docker://{args.registry}/{name}", "--tls-verify=false")
            if served == local:
                print(f"present {name} {local}")
            elif args.check:
                print(f"would push {name} {local} (the registry serves {served or 'nothing'})")
                would = True
            else:
                pending.append((archive, name, local))
        if pending:
            with seeding_instance(args):
                for archive, name, _ in pending:
                    push(archive, f"docker://{args.seed_registry}/{name}")
        for _, name, local in pending:
            after = manifest_digest(f"docker://{args.registry}/{name}", "--tls-verify=false")
            if after != local:
                raise SeedError(f"{name}: pushed {local} but the registry serves {after}")
            print(f"pushed {name} {local}")
    except SeedError as exc:
        print(f"image_seed: {exc}", file=sys.stderr)
        return 1
    print("changed" if pending or would else "ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
