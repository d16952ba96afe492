"""The lab's registry token server (tacc_lab/registry_token_server.py), without a registry:
its key is private from its first byte, a token is a JWT whose RS256 signature the
certificate in its x5c header verifies (what Distribution checks against its
rootcertbundle), only the account in the users file gets one, and it grants what each
`repository:NAME:ACTIONS` scope asks of pull and push."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from tacc_lab import registry_token_server as server


def unpadded(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("token") / "keys"
    server.init(folder)
    return folder


def test_init_makes_a_private_key_and_a_ca_certificate_once(keys):
    assert (keys / "key.pem").stat().st_mode & 0o777 == 0o600
    before = (keys / "cert.pem").read_bytes()
    server.init(keys)
    assert (keys / "cert.pem").read_bytes() == before
    text = subprocess.run(
        ["openssl", "x509", "-noout", "-text", "-in", str(keys / "cert.pem")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "CA:TRUE" in text and "CN = tacc-lab-token" in text


def test_a_token_is_a_jwt_the_certificate_in_its_header_verifies(keys, tmp_path):
    tokens = server.TokenServer(keys, "tacc-lab-token", "svc", {"lab": "pw"})
    answer = tokens.token("lab", ["repository:tacc-lab/debian:pull,push,delete"])
    assert answer["token"] == answer["access_token"] and answer["expires_in"] == 300
    header_text, claims_text, signature = answer["token"].split(".")
    header, claims = json.loads(unpadded(header_text)), json.loads(unpadded(claims_text))
    assert header["alg"] == "RS256" and len(header["x5c"]) == 1
    assert claims["iss"] == "tacc-lab-token" and claims["aud"] == "svc"
    assert claims["sub"] == "lab" and claims["nbf"] < claims["exp"]
    assert claims["access"] == [
        {"type": "repository", "name": "tacc-lab/debian", "actions": ["pull", "push"]}
    ]
    # The x5c certificate's key verifies the signature over header.claims.
    der = tmp_path / "cert.der"
    der.write_bytes(base64.b64decode(header["x5c"][0]))
    public = subprocess.run(
        ["openssl", "x509", "-inform", "DER", "-in", str(der), "-pubkey", "-noout"],
        capture_output=True,
        check=True,
    ).stdout
    (tmp_path / "pub.pem").write_bytes(public)
    (tmp_path / "sig").write_bytes(unpadded(signature))
    verify = ["openssl", "dgst", "-sha256", "-verify", str(tmp_path / "pub.pem")]
    verify += ["-signature", str(tmp_path / "sig")]
    data = f"{header_text}.{claims_text}".encode()
    assert subprocess.run(verify, input=data, capture_output=True).returncode == 0
    assert subprocess.run(verify, input=data + b"x", capture_output=True).returncode != 0


@pytest.mark.security
@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer x",
        "Basic " + base64.b64encode(b"lab:wrong").decode(),
        "Basic " + base64.b64encode(b"other:pw").decode(),
        "Basic " + base64.b64encode("lab:pä".encode()).decode(),
        "Basic !!!",
    ],
)
def test_only_the_account_in_the_users_file_gets_a_token(keys, header):
    tokens = server.TokenServer(keys, "tacc-lab-token", "svc", {"lab": "pw"})
    assert tokens.account(header) is None
    assert tokens.account("Basic " + base64.b64encode(b"lab:pw").decode()) == "lab"
