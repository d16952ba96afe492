"""MUNGE credentials through the `munge` and `unmunge` commands (MUNGE 0.5.x): who a
request comes from, vouched for by the munged of the host it was made on.

encode runs `munge` (payload on stdin, credential on stdout): the credential names the
calling process's uid and gid, may be decoded by root only (--restrict-uid=0: the broker)
and lives TTL_SECONDS. decode runs `unmunge --numeric --keys=STATUS,UID,GID` (credential
on stdin): the metadata lines, a blank line, then the payload, all on stdout. munged
refuses a credential it decoded before (replayed), one past its time (expired) and one
from a host whose clock runs ahead (rewound); unmunge then still prints the metadata, but
exits with the error's number, which decode turns into CredentialRefused. Argv only, no
shell, each command bounded by TIMEOUT_SECONDS.
"""

from __future__ import annotations

import subprocess
from typing import NamedTuple

TIMEOUT_SECONDS = 5.0
TTL_SECONDS = 60
ENCODE = ["munge", "--restrict-uid=0", f"--ttl={TTL_SECONDS}"]
DECODE = ["unmunge", "--numeric", "--keys=STATUS,UID,GID"]
# MUNGE's error numbers (munge.h, munge_err_t), which unmunge exits with.
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
REFUSED = {
    8: "invalid (bad credential)",
    9: "invalid (unknown credential version)",
    10: "invalid (unknown cipher)",
    11: "invalid (unknown MAC)",
    12: "invalid (unknown compression)",
    13: "invalid (unknown security realm)",
    14: "invalid (it does not verify: another key?)",
    15: "expired",
    16: "rewound (made on a host whose clock runs ahead)",
    17: "replayed (already used once)",
    18: "unauthorized (restricted to another user)",
}


class MungeError(Exception):
    """MUNGE could not make or read a credential."""


class MungeUnavailable(MungeError):
    """munge or unmunge is missing here, or munged does not answer."""


class CredentialRefused(MungeError):
    """munged refused the credential: `reason` is expired, replayed, invalid, ..."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"credential refused: {reason}")
        self.reason = reason


class Decoded(NamedTuple):
    """What a valid credential vouches for: the encoding process's uid and gid, and the
    payload it carried."""

    uid: int
    gid: int
    payload: bytes


def run(argv: list[str], stdin: bytes) -> subprocess.CompletedProcess:
    """argv with stdin written to it; MungeUnavailable when it is missing or hangs."""
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, timeout=TIMEOUT_SECONDS, check=False
        )
    except FileNotFoundError:
        raise MungeUnavailable(f"{argv[0]} not found: is MUNGE installed here?") from None
    except subprocess.TimeoutExpired:
        raise MungeUnavailable(
            f"{argv[0]} did not answer within {TIMEOUT_SECONDS:g} s: is munged running?"
        ) from None


def said(proc: subprocess.CompletedProcess) -> str:
    """The command's own words (its last line on stderr), or its exit status."""
    lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def failure(command: str, proc: subprocess.CompletedProcess) -> MungeError:
    """The error of a munge command that exited non-zero."""
    if proc.returncode in REFUSED:
        return CredentialRefused(REFUSED[proc.returncode])
    if proc.returncode in (EMUNGE_SOCKET, EMUNGE_TIMEOUT):
        return MungeUnavailable(f"{command}: munged does not answer: {said(proc)}")
    return MungeError(f"{command} failed: {said(proc)}")


def encode(payload: bytes) -> str:
    """A credential carrying payload, for root on any host of this cluster's MUNGE key."""
    proc = run(ENCODE, payload)
    if proc.returncode != 0:
        raise failure("munge", proc)
    credential = proc.stdout.decode("ascii", "replace").strip()
    if not credential.startswith("MUNGE:"):
        raise MungeError("munge printed no credential")
    return credential


def decode(credential: bytes) -> Decoded:
    """The uid, gid and payload a credential vouches for; CredentialRefused when munged
    refuses it (expired, replayed, invalid), MungeUnavailable when it cannot ask."""
    proc = run(DECODE, credential)
    if proc.returncode != 0:
        raise failure("unmunge", proc)
    return parse(proc.stdout)


def parse(out: bytes) -> Decoded:
    """unmunge --numeric --keys=STATUS,UID,GID's output: metadata lines ("UID:  1001"),
    a blank line, the payload. CredentialRefused unless STATUS is 0 and UID and GID are
    numbers (the metadata never holds a blank line: every value is a number)."""
    head, blank, payload = out.partition(b"\n\n")
    if not blank:
        raise CredentialRefused("invalid (unmunge printed no metadata)")
    keys: dict[str, str] = {}
    for line in head.decode("ascii", "replace").splitlines():
        key, _, value = line.partition(":")
        keys[key.strip()] = value.strip()
    status = keys.get("STATUS", "")
    if status != "0":
        reason = REFUSED.get(int(status)) if status.isdigit() else None
        raise CredentialRefused(reason or f"invalid (status {status or 'missing'})")
    uid, gid = keys.get("UID", ""), keys.get("GID", "")
    if not (uid.isascii() and uid.isdigit() and gid.isascii() and gid.isdigit()):
        raise CredentialRefused("invalid (unmunge named no uid or gid)")
    return Decoded(int(uid), int(gid), payload)
