"""tcloud's known_hosts reader (tcloud/transport/known_hosts.py) beyond the security cases."""

from __future__ import annotations

import paramiko

from tcloud.transport import known_hosts


def test_the_first_line_of_a_host_and_key_type_wins(tmp_path):
    """As paramiko's own reader has it: a later line for the same host (another file,
    an old entry further down) does not replace the key the host was first listed with."""
    first, later = paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate()
    path = tmp_path / "known_hosts"
    path.write_text(
        known_hosts.entry("login.example.org", first)
        + known_hosts.entry("login.example.org", later)
    )
    keys = known_hosts.load([path]).keys.lookup("login.example.org")
    assert keys[first.get_name()] == first
