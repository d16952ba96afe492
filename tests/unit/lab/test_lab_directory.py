"""`tacc-lab up --directory` (issue [21] point 1): the lab's CA, n1's certificate and the
SSSD account's password are made once and kept private, and the inventory makes n1 the
directory with researchers carol and dave, every node reading users from it."""

from __future__ import annotations

import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tacc_lab import directory
from tacc_lab.config import LabConfig
from tests.unit.lab.test_lab_inventory import render_lab


@pytest.fixture
def lab(tmp_path) -> LabConfig:
    return LabConfig.create("lab", "10.77.0.0/24", state_root=tmp_path / "state")


def test_the_files_are_made_once_and_the_secrets_are_private(lab: LabConfig) -> None:
    files = directory.ensure_directory(lab, "n1", "10.77.0.11")
    assert directory.directory_dir(lab).stat().st_mode & 0o777 == 0o700
    assert files.key.stat().st_mode & 0o777 == 0o600
    assert len(files.bind_password) >= 16
    password_file = directory.directory_dir(lab) / "sssd-bind-password"
    assert password_file.stat().st_mode & 0o777 == 0o600
    again = directory.ensure_directory(lab, "n1", "10.77.0.11")
    assert again == files and files.cert.read_bytes() == again.cert.read_bytes()


def test_the_server_certificate_names_n1_as_clients_reach_it(lab: LabConfig) -> None:
    files = directory.ensure_directory(lab, "n1", "10.77.0.11")
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["n1.cluster.internal", "n1"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.77.0.11")]
    assert directory.server_uri("n1") == "ldap://n1"
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


def test_the_inventory_makes_n1_the_directory_and_points_every_node_at_it(
    lab: LabConfig,
) -> None:
    files = directory.ensure_directory(lab, "n1", "10.77.0.11")
    keys = {"carol": "ssh-ed25519 AAAAcarol carol@tacc-lab-lab", "alice": "ssh-ed25519 AAAAa"}
    data = render_lab(
        3, {"alice": keys["alice"]}, directory=directory.directory_vars(files, "n1", keys)
    )["all"]
    assert data["children"]["directory_server"]["hosts"] == {"n1": None}
    variables = data["vars"]
    assert variables["identity_ldap_uri"] == "ldap://n1"
    assert variables["identity_ldap_ca_file"] == str(files.ca)
    assert variables["directory_server_tls_key_file"] == str(files.key)
    assert variables["identity_ldap_bind_password"] == files.bind_password
    users = {user["name"]: user for user in variables["directory_server_users"]}
    assert users["carol"] == {"name": "carol", "uid": 20001, "ssh_keys": [keys["carol"]]}
    assert users["dave"]["ssh_keys"] == []  # no key handed in: none in the directory
    groups = {group["name"]: group["members"] for group in variables["directory_server_groups"]}
    assert groups == {"vision": ["carol"], "visitors": ["dave"]}
    # the inventory's own researchers stay local users beside the directory's
    assert [user["name"] for user in variables["common_cluster_users"]] == ["alice"]


def test_a_lab_without_the_option_has_no_directory(lab: LabConfig) -> None:
    assert not directory.has_directory(lab)
    directory.ensure_directory(lab, "n1", "10.77.0.11")
    assert directory.has_directory(lab)
    directory.remove_directory(lab)
    assert not directory.has_directory(lab)
