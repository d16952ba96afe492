"""The dashboard's MUNGE step (tacc_agent/dashboard/munge.py): unmunge's output as MUNGE
0.5.x prints it with --numeric --keys=STATUS,UID,GID, read as a pure function; the
commands run by argv with the payload or credential on stdin; every refusal (expired,
replayed, invalid) and a missing or silent munged are their own error, never a uid."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tacc_agent.dashboard import munge

# unmunge --numeric --keys=STATUS,UID,GID of a good credential (munge 0.5.15, Debian 12):
# each key padded to the widest key name (UID_RESTRICTION) plus one space, a blank line,
# then the payload as it was given (no newline added).
RECORDED = b'STATUS:          0\nUID:             1002\nGID:             1002\n\n{"ask":"job"}'
# The same credential decoded a second time: munged says replayed, unmunge still prints
# the metadata and the payload, and exits 17.
REPLAYED = b'STATUS:          17\nUID:             1002\nGID:             1002\n\n{"ask":"job"}'


def test_a_good_credential_names_its_uid_gid_and_payload():
    assert munge.parse(RECORDED) == munge.Decoded(1002, 1002, b'{"ask":"job"}')


def test_a_payload_with_blank_lines_of_its_own_is_kept_whole():
    out = b"STATUS:          0\nUID:             0\nGID:             0\n\na\n\nb\n"
    assert munge.parse(out) == munge.Decoded(0, 0, b"a\n\nb\n")


@pytest.mark.security
@pytest.mark.parametrize(
    ("out", "reason"),
    [
        (REPLAYED, "replayed"),
        (REPLAYED.replace(b"17", b"15", 1), "expired"),
        (b"STATUS:          0\nUID:             \nGID:             0\n\n{}", "invalid"),
        (b"STATUS:          0\nGID:             0\n\n{}", "invalid"),
        (b"UID:             0\nGID:             0\n\n{}", "invalid"),
        (b"", "invalid"),
        (b"STATUS:          0\nUID:             0\nGID:             0\n", "invalid"),
    ],
)
def test_output_that_is_not_a_good_credentials_is_refused(out, reason):
    with pytest.raises(munge.CredentialRefused) as refused:
        munge.parse(out)
    assert refused.value.reason.startswith(reason)
    assert str(refused.value).startswith(f"credential refused: {reason}")


def fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)


@pytest.fixture
def bin_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path


def test_encode_gives_the_payload_on_stdin_and_restricts_the_credential_to_root(bin_dir):
    fake(bin_dir, "munge", 'printf "%s|" "$@" >"$0.argv"; cat >"$0.in"; echo "MUNGE:AbC+/=:"')
    assert munge.encode(b'{"ask": "cluster"}') == "MUNGE:AbC+/=:"
    assert (bin_dir / "munge.in").read_bytes() == b'{"ask": "cluster"}'
    assert (bin_dir / "munge.argv").read_text() == "--restrict-uid=0|--ttl=60|"


def test_decode_gives_the_credential_on_stdin_and_reads_the_metadata(bin_dir):
    record = RECORDED.decode().replace("\n", "\\n").replace('"', '\\"')
    fake(bin_dir, "unmunge", f'printf "%s|" "$@" >"$0.argv"; cat >"$0.in"; printf "{record}"')
    assert munge.decode(b"MUNGE:xyz:") == munge.Decoded(1002, 1002, b'{"ask":"job"}')
    assert (bin_dir / "unmunge.in").read_bytes() == b"MUNGE:xyz:"
    assert (bin_dir / "unmunge.argv").read_text() == "--numeric|--keys=STATUS,UID,GID|"


@pytest.mark.security
@pytest.mark.parametrize(
    ("code", "reason"), [(17, "replayed"), (15, "expired"), (16, "rewound"), (14, "invalid")]
)
def test_unmunge_exiting_with_a_refusal_is_refused_whatever_it_printed(bin_dir, code, reason):
    """unmunge prints the metadata and payload of an expired or replayed credential (its
    contents are intact), with STATUS 0 only in a forgery of the output: the exit status
    alone refuses it."""
    good = RECORDED.decode().replace("\n", "\\n").replace('"', '\\"')
    fake(bin_dir, "unmunge", f'cat >/dev/null; printf "{good}"; exit {code}')
    with pytest.raises(munge.CredentialRefused) as refused:
        munge.decode(b"MUNGE:xyz:")
    assert refused.value.reason.startswith(reason)


@pytest.mark.fault
def test_munged_down_or_munge_missing_is_unavailable_not_refused(bin_dir, monkeypatch):
    fake(bin_dir, "unmunge", 'cat >/dev/null; echo "unmunge: Error: Failed to connect" >&2; exit 6')
    with pytest.raises(munge.MungeUnavailable, match="Failed to connect"):
        munge.decode(b"MUNGE:xyz:")
    sleep = shutil.which("sleep")
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(munge.MungeUnavailable, match="munge not found"):
        munge.encode(b"{}")
    fake(bin_dir, "munge", f"exec {sleep} 5")
    monkeypatch.setattr(munge, "TIMEOUT_SECONDS", 0.2)
    with pytest.raises(munge.MungeUnavailable, match="did not answer"):
        munge.encode(b"{}")
