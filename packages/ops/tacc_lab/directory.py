"""The lab's LDAP directory (`tacc-lab up --directory`): who is in it, and the TLS files
and password the inventory hands roles/directory_server (slapd on n1) and roles/identity
(SSSD on every node).

The CA, the server certificate and the SSSD account's password are made once per lab on
this machine and kept under the lab's state directory (mode 0700; the key and password
files 0600); the inventory names the files, so the roles copy them from the control
machine as a site's own would be, and a `--limit` run needs no other host.
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tacc_lab.config import LabConfig
from tacc_lab.files import ensure_secret, write_private
from tacc_lab.researchers import DIRECTORY_RESEARCHERS

# (name, gid, members): carol's research group; dave is in none a site maps to an account.
DIRECTORY_GROUPS = (("vision", 30001, ("carol",)), ("visitors", 30002, ("dave",)))
MAPPED_GROUPS = ("vision",)  # the groups the lab maps to Slurm accounts
DOMAIN = "cluster.internal"  # roles/cluster_dns's default domain: the server's FQDN
BASE_DN = ",".join(f"dc={part}" for part in DOMAIN.split("."))
VALID_DAYS = 3650


@dataclass(frozen=True)
class DirectoryFiles:
    ca: Path
    cert: Path
    key: Path
    bind_password: str


def directory_dir(cfg: LabConfig) -> Path:
    """Where the lab keeps its directory's files; present: the lab has a directory."""
    return cfg.state_dir / "directory"


def has_directory(cfg: LabConfig) -> bool:
    return directory_dir(cfg).is_dir()


def remove_directory(cfg: LabConfig) -> None:
    shutil.rmtree(directory_dir(cfg), ignore_errors=True)


def server_uri(head: str) -> str:
    """The head's short name: /etc/hosts has it on every lab node, and the cluster DNS
    answers it (its certificate holds the FQDN and address too)."""
    return f"ldap://{head}"


def ensure_directory(cfg: LabConfig, head: str, head_address: str) -> DirectoryFiles:
    """The lab's CA, n1's certificate (its short name, FQDN and address) and the SSSD
    account's password: made on first use, then kept."""
    where = directory_dir(cfg)
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca, cert, key = where / "ca.crt", where / "server.crt", where / "server.key"
    if not (ca.exists() and cert.exists() and key.exists()):
        _make_tls(ca, cert, key, head, head_address)
    return DirectoryFiles(ca, cert, key, ensure_secret(where / "sssd-bind-password"))


def _make_tls(ca_file: Path, cert_file: Path, key_file: Path, head: str, head_address: str) -> None:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "TACC lab directory CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    fqdn = f"{head}.{DOMAIN}"
    names = [
        x509.DNSName(fqdn),
        x509.DNSName(head),
        x509.IPAddress(ipaddress.ip_address(head_address)),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, fqdn)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_private(
        key_file,
        key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )
    cert_file.write_text(cert.public_bytes(pem).decode())
    ca_file.write_text(ca.public_bytes(pem).decode())


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def directory_vars(files: DirectoryFiles, head: str, keys: dict[str, str]) -> dict:
    """Inventory variables of roles/directory_server and roles/identity for a lab whose
    head node runs the directory; `keys`: researcher name -> SSH public key line."""
    return {
        "directory_server_base_dn": BASE_DN,
        "directory_server_tls_ca_file": str(files.ca),
        "directory_server_tls_cert_file": str(files.cert),
        "directory_server_tls_key_file": str(files.key),
        "directory_server_bind_password": files.bind_password,
        "directory_server_users": [
            {"name": name, "uid": uid, "ssh_keys": [keys[name]] if name in keys else []}
            for name, uid in DIRECTORY_RESEARCHERS
        ],
        "directory_server_groups": [
            {"name": name, "gid": gid, "members": list(members)}
            for name, gid, members in DIRECTORY_GROUPS
        ],
        "identity_ldap_uri": server_uri(head),
        "identity_ldap_base_dn": BASE_DN,
        "identity_ldap_bind_dn": f"uid=sssd,ou=services,{BASE_DN}",
        "identity_ldap_bind_password": files.bind_password,
        "identity_ldap_ca_file": str(files.ca),
        # carol's group gives an account (roles/slurm, docs/directory.md); dave's none.
        "slurm_directory_accounts": [
            {"group": name, "account": name, "fairshare": 10}
            for name, _, _ in DIRECTORY_GROUPS
            if name in MAPPED_GROUPS
        ],
        # A user added to the group submits within seconds here (the default: 2min).
        "tacc_agent_accounts_sync_interval": "20s",
    }
