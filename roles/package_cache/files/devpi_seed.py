#!/usr/bin/env python3
"""Make a devpi-server hold the cluster's index and the wheels uploaded into it.

Idempotent: it creates the user and the index when they are missing (or fixes them),
uploads each wheel the index does not hold yet, and prints "changed" as its last line
only when it did something (with --check: when it would). Standard library only.

Passwords come from a JSON file {"root": ..., "user": ...} (0600, root), never from
the command line or a log. devpi's JSON API, as devpi-client uses it:
  POST /+login {"user", "password"} -> result.password is a token;
  header X-Devpi-Auth: base64("user:token") authenticates later requests;
  PUT /USER {"password"} creates a user, PATCH /USER {"password"} sets its password;
  PUT /USER/INDEX {"type", "bases", "volatile"} creates an index, PATCH changes it;
  POST /USER/INDEX/ multipart ":action"=file_upload, name, version, content uploads.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

JSON = {"Accept": "application/json", "Content-Type": "application/json"}
# name-version(-build)?-python-abi-platform.whl (PEP 427)
_WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
CHUNK = 1 << 20


class SeedError(Exception):
    pass


def normalize(name: str) -> str:
    """PEP 503 project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> tuple[str, str]:
    match = _WHEEL_RE.match(path.name)
    if not match:
        raise SeedError(f"{path.name}: not a wheel file name (name-version-...-platform.whl)")
    return match.group("name"), match.group("version")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Devpi:
    def __init__(self, url: str, timeout: float) -> None:
        if not url.startswith(("http://", "https://")):
            raise SeedError(f"--url {url!r}: expected an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.auth: str | None = None

    def request(
        self, method: str, path: str, body=None, headers: dict | None = None, length=None
    ) -> tuple[int, dict]:
        """(status, JSON answer or {}); HTTP errors are answers, not exceptions."""
        all_headers = dict(JSON)
        all_headers.update(headers or {})
        if self.auth:
            all_headers["X-Devpi-Auth"] = self.auth
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        if length is not None:
            all_headers["Content-Length"] = str(length)
        # Only http(s): the constructor checked the URL.
        req = urllib.request.Request(  # noqa: S310
            self.url + path, data=body, method=method, headers=all_headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _json(err.read())

    def wait(self, seconds: float) -> bool:
        """True once the server answers /+api (devpi-server takes a while to start)."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self.request("GET", "/+api")[0] == 200:
                    return True
            except OSError:
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(1)

    def login(self, user: str, password: str) -> bool:
        status, answer = self.request("POST", "/+login", {"user": user, "password": password})
        if status != 200:
            return False
        token = answer["result"]["password"]
        self.auth = base64.b64encode(f"{user}:{token}".encode()).decode()
        return True

    def upload(self, index_path: str, wheel: Path) -> tuple[int, str]:
        """POST the wheel as multipart/form-data, streamed from disk."""
        name, version = wheel_name_version(wheel)
        boundary = uuid.uuid4().hex
        head = b""
        for key, value in ((":action", "file_upload"), ("name", name), ("version", version)):
            head += (
                f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'
            ).encode()
        head += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="content"; '
            f'filename="{wheel.name}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        tail = f"\r\n--{boundary}--\r\n".encode()

        def body():
            yield head
            with wheel.open("rb") as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
            yield tail

        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
        length = len(head) + wheel.stat().st_size + len(tail)
        status, answer = self.request("POST", index_path + "/", body(), headers, length)
        return status, answer.get("message", "")


def _json(raw: bytes) -> dict:
    try:
        data = json.loads(raw or b"{}")
    except ValueError:
        return {"message": raw.decode(errors="replace")[:300]}
    return data if isinstance(data, dict) else {}


def read_credentials(path: Path) -> dict[str, str]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(
        isinstance(data.get(key), str) and data[key] for key in ("root", "user")
    ):
        raise SeedError(f"{path}: expected a JSON object with non-empty 'root' and 'user'")
    return data


def index_config(bases: list[str], user: str) -> dict:
    """The index as it must be: only its owner uploads (packages and tox results: devpi
    lets anyone post tox results by default, which could fill the cache's disk)."""
    return {
        "type": "stage",
        "bases": bases,
        "volatile": False,
        "acl_upload": [user],
        "acl_toxresult_upload": [user],
    }


def seed(
    server: Devpi,
    creds: dict,
    user: str,
    index: str,
    bases: list[str],
    wheels: list[Path],
    check: bool,
    log,
) -> bool:
    """Bring the server to the wanted state; True if anything changed (or would)."""
    changed = False
    if not server.login("root", creds["root"]):
        raise SeedError(
            "devpi refused root's password: the server keeps the password it was created "
            "with; set package_cache_root_password to it (or change it with devpi-client)"
        )
    status, _ = server.request("GET", f"/{user}")
    if status == 404:
        log(f"create user {user}")
        changed = True
        if not check:
            _expect(server.request("PUT", f"/{user}", {"password": creds["user"]}), f"PUT /{user}")
    elif not Devpi(server.url, server.timeout).login(user, creds["user"]):
        log(f"set {user}'s password")
        changed = True
        if not check:
            _expect(
                server.request("PATCH", f"/{user}", {"password": creds["user"]}),
                f"PATCH /{user}",
            )
    wanted = index_config(bases, user)
    status, answer = server.request("GET", f"/{user}/{index}")
    projects: set[str] = set()
    if status == 404:
        log(f"create index {user}/{index} (bases {', '.join(bases)})")
        changed = True
        if not check:
            _expect(server.request("PUT", f"/{user}/{index}", wanted), f"PUT /{user}/{index}")
    else:
        current = answer.get("result", {})
        projects = {normalize(p) for p in current.get("projects", [])}
        if any(current.get(key) != value for key, value in wanted.items()):
            log(f"set {user}/{index} to {wanted}")
            changed = True
            if not check:
                merged = {k: v for k, v in current.items() if k != "projects"} | wanted
                _expect(
                    server.request("PATCH", f"/{user}/{index}", merged),
                    f"PATCH /{user}/{index}",
                )
    changed = direct_mirrors(server, bases, check, log) or changed
    uploader = Devpi(server.url, server.timeout)
    logged_in = False
    for wheel in wheels:
        if not wheel.is_file():
            if check:
                log(f"upload {wheel.name} (not on this host yet)")
                changed = True
                continue
            raise SeedError(f"{wheel}: no such file")
        name, _ = wheel_name_version(wheel)
        held = _held_files(server, user, index, name) if normalize(name) in projects else {}
        digest = sha256(wheel)
        if held.get(wheel.name) == digest:
            continue
        if wheel.name in held:
            raise SeedError(
                f"{user}/{index} already holds a different {wheel.name} (sha256 "
                f"{held[wheel.name]}, this one {digest}); the index is not volatile: "
                "remove the old file with devpi-client first"
            )
        log(f"upload {wheel.name} to {user}/{index}")
        changed = True
        if check:
            continue
        if not logged_in:
            if not uploader.login(user, creds["user"]):
                raise SeedError(f"devpi refused {user}'s password")
            logged_in = True
        status, message = uploader.upload(f"/{user}/{index}", wheel)
        if status != 200:
            raise SeedError(f"upload of {wheel.name} failed: HTTP {status} {message}".strip())
    return changed


def direct_mirrors(server: Devpi, bases: list[str], check: bool, log) -> bool:
    """Make each mirror base ask upstream for one project's page at a time instead of
    first fetching upstream's whole project list (PyPI's: hundreds of thousands of names,
    tens of seconds). A cold devpi-server whose list fetch outlasts --request-timeout
    answers "does not exist" for projects that do exist; without the list it asks for
    the project itself, and only upstream's own 404 is a missing project."""
    changed = False
    for base in bases:
        status, answer = server.request("GET", f"/{base}")
        current = answer.get("result", {}) if status == 200 else {}
        if current.get("type") != "mirror" or current.get("mirror_no_project_list") is True:
            continue
        log(f"set {base} to mirror_no_project_list=True")
        changed = True
        if not check:
            merged = {k: v for k, v in current.items() if k != "projects"}
            merged["mirror_no_project_list"] = True
            _expect(server.request("PATCH", f"/{base}", merged), f"PATCH /{base}")
    return changed


def _held_files(server: Devpi, user: str, index: str, name: str) -> dict[str, str]:
    """basename -> sha256 of the files this index itself holds for a project (the JSON
    view also lists its bases' files; those are under another index's path)."""
    status, answer = server.request("GET", f"/{user}/{index}/{normalize(name)}")
    if status != 200:
        return {}
    own = f"/{user}/{index}/+f/"
    held = {}
    for release in answer.get("result", {}).values():
        for link in release.get("+links", []) if isinstance(release, dict) else []:
            href = link.get("href", "")
            if own in href:
                held[href.rsplit("/", 1)[-1]] = link.get("hashes", {}).get("sha256", "")
    return held


def _expect(answer: tuple[int, dict], what: str) -> None:
    status, body = answer
    if status not in (200, 201):
        raise SeedError(f"{what}: HTTP {status} {body.get('message', '')}".strip())


def warm(server: Devpi, user: str, index: str, log) -> None:
    """Ask for one project once: a fresh devpi-server first fetches the mirror's whole
    project list (tens of seconds), which would otherwise fall on the first build."""
    try:
        status, _ = server.request("GET", f"/{user}/{index}/+simple/pip/")
    except OSError as exc:
        status = str(exc)
    if status != 200:
        log(f"warning: {user}/{index}/+simple/pip/ answered {status} (is upstream reachable?)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="devpi-server, e.g. http://127.0.0.1:3141")
    parser.add_argument("--credentials", required=True, type=Path)
    parser.add_argument("--user", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--bases", default="root/pypi", help="comma-separated base indexes")
    parser.add_argument("--wait", type=float, default=300, help="seconds to wait for the server")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per request")
    parser.add_argument("--no-warm", action="store_true", help="skip the mirror warm-up")
    parser.add_argument("--check", action="store_true", help="change nothing; say what would")
    parser.add_argument("wheels", nargs="*", type=Path)
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr)

    try:
        server = Devpi(args.url, args.timeout)
        if args.check and not args.credentials.exists():
            log("no credentials yet: everything would be created")
            print("changed")
            return 0
        creds = read_credentials(args.credentials)
        if not server.wait(1 if args.check else args.wait):
            if args.check:
                log(f"{args.url} does not answer (not started yet): everything would be created")
                print("changed")
                return 0
            raise SeedError(f"{args.url} did not answer within {args.wait:.0f} s")
        bases = [b for b in args.bases.split(",") if b]
        changed = seed(server, creds, args.user, args.index, bases, args.wheels, args.check, log)
        if not args.check and not args.no_warm:
            warm(server, args.user, args.index, log)
    except (SeedError, OSError, ValueError) as exc:
        print(f"devpi_seed: error: {exc}", file=sys.stderr)
        return 1
    if changed:
        print("changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
