"""The token server of the lab's public registry (tacc_lab/public_registry.py): Docker's
token authentication (https://distribution.github.io/distribution/spec/auth/token/), the
flow nvcr.io, Docker Hub and ghcr.io make every client go through, anonymous or not.

A client the registry answers 401 asks this server's /token for the scope it needs,
with its account in HTTP Basic; it gets a JWT signed by this server's key, whose
certificate the registry trusts (its auth.token.rootcertbundle) and whose x5c header
names it. Only the accounts in the users file get a token.

It runs on the lab's head node, under Debian's python3 with python3-jwt and
python3-cryptography (which public_registry.py installs there); it is not imported on
this machine.

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
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

TOKEN_SECONDS = 300
ACTIONS = ("pull", "push")


def init(directory: Path, issuer: str = "tacc-lab-token") -> None:
    """A signing key and its self-signed certificate, unless they are there."""
    key_file, cert_file = directory / "key.pem", directory / "cert.pem"
    if key_file.exists() and cert_file.exists():
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


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
        self.key = (directory / "key.pem").read_bytes()
        cert = x509.load_pem_x509_certificate((directory / "cert.pem").read_bytes())
        self.chain = [base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()]
        self.issuer, self.service, self.users = issuer, service, users

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
        signed = jwt.encode(claims, self.key, algorithm="RS256", headers={"x5c": self.chain})
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
