"""The token server of the lab's public registry (tacc_lab/public_registry.py): Docker's
token authentication (https://distribution.github.io/distribution/spec/auth/token/), the
flow nvcr.io, Docker Hub and ghcr.io make every client go through, anonymous or not.

A client the registry answers 401 asks this server's /token for the scope it needs,
with its account in HTTP Basic; it gets a JWT signed by this server's key, whose
certificate the registry trusts (its auth.token.rootcertbundle) and whose x5c header
names it. Only the accounts in the users file get a token.

It runs on the lab's head node under python3, with openssl making its key and
certificate and signing each token (RS256: `openssl dgst -sha256 -sign`); it imports
nothing but the standard library.

    python3 registry_token_server.py init DIR
        DIR/key.pem (0600) and DIR/cert.pem, once
    python3 registry_token_server.py serve DIR ADDRESS PORT ISSUER SERVICE USERS_FILE
"""

from __future__ import annotations

import base64
import datetime
import hmac
import json
import secrets
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

TOKEN_SECONDS = 300
ACTIONS = ("pull", "push")


def init(directory: Path, issuer: str = "tacc-lab-token") -> None:
    """A signing key and its self-signed certificate, unless they are there."""
    key_file, cert_file = directory / "key.pem", directory / "cert.pem"
    if key_file.exists() and cert_file.exists():
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365"]
    argv += ["-keyout", str(key_file), "-out", str(cert_file), "-subj", f"/CN={issuer}"]
    argv += ["-addext", "basicConstraints=critical,CA:TRUE"]
    # umask 077: the key is root's only from its first byte.
    subprocess.run(argv, check=True, capture_output=True, umask=0o077)
    cert_file.chmod(0o644)


def base64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def der_of(pem: str) -> str:
    """A PEM certificate's DER, base64 (what a JWT's x5c header holds)."""
    return "".join(line for line in pem.splitlines() if line and not line.startswith("-----"))


def granted(scopes: list[str]) -> list[dict]:
    """The access claim: each `repository:NAME:ACTIONS` scope asked, with the actions
    this server grants (pull, push)."""
    access = []
    for scope in scopes:
        kind, _, rest = scope.partition(":")
        name, _, actions = rest.rpartition(":")
        if kind == "repository" and name:
            wanted = [a for a in actions.split(",") if a in ACTIONS]
            access.append({"type": kind, "name": name, "actions": wanted})
    return access


class TokenServer:
    def __init__(self, directory: Path, issuer: str, service: str, users: dict) -> None:
        self.key = directory / "key.pem"
        self.chain = [der_of((directory / "cert.pem").read_text())]
        self.issuer, self.service, self.users = issuer, service, users

    def signed(self, claims: dict) -> str:
        """The JWT of `claims`, signed RS256 by the key whose certificate x5c names."""
        header = {"typ": "JWT", "alg": "RS256", "x5c": self.chain}
        parts = [base64url(json.dumps(part).encode()) for part in (header, claims)]
        data = ".".join(parts).encode()
        argv = ["openssl", "dgst", "-sha256", "-sign", str(self.key)]
        signature = subprocess.run(argv, input=data, capture_output=True, check=True).stdout
        return f"{data.decode()}.{base64url(signature)}"

    def account(self, header: str) -> str | None:
        """The user whose Basic credentials `header` carries, when they are right."""
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except ValueError:
            return None
        known = self.users.get(user)
        matches = known and hmac.compare_digest(known.encode(), password.encode())
        return user if matches else None

    def token(self, user: str, scopes: list[str]) -> dict:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": user,
            "aud": self.service,
            "exp": now + TOKEN_SECONDS,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(16),
            "access": granted(scopes),
        }
        signed = self.signed(claims)
        issued = datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat()
        return {
            "token": signed,
            "access_token": signed,
            "expires_in": TOKEN_SECONDS,
            "issued_at": issued,
        }

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path != "/token":
                    self.send_error(404)
                    return
                query = parse_qs(url.query)
                user = server.account(self.headers.get("Authorization", ""))
                scopes = query.get("scope", [])
                print(f"token for {user or 'nobody'}: {' '.join(scopes) or '-'}", flush=True)
                if user is None or query.get("service", [""])[0] != server.service:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="tacc-lab public registry"')
                    self.end_headers()
                    return
                body = json.dumps(server.token(user, scopes)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:  # the line above says it
                return

        return Handler


def main(argv: list[str]) -> int:
    if argv[:1] == ["init"] and len(argv) == 2:
        init(Path(argv[1]))
        return 0
    if argv[:1] == ["serve"] and len(argv) == 7:
        directory, address, port, issuer, service, users_file = argv[1:]
        users = json.loads(Path(users_file).read_text())
        server = TokenServer(Path(directory), issuer, service, users)
        ThreadingHTTPServer((address, int(port)), server.handler()).serve_forever()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
