"""FAKE (lab only): writes fake Mellanox firmware image files for the fake ``mstflint``.

No real tool is imitated; real images (``fw-ConnectX6Dx-rel-*.bin``) are opaque FS4 binaries.
A fake image is a short text header naming the PSID and FW version and the SHA-256 of the
payload, a blank line, then a few KiB of payload bytes derived from PSID and version::

    mkimage.py --psid MT_0000000359 --version 22.39.1002 --out fw.bin [--corrupt]

``--corrupt`` flips payload bytes after the checksum is computed, so ``mstflint`` refuses to burn
it and its sha256 differs from the good image's. The file's sha256 is printed on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

MAGIC = b"TACC-FAKE-FW 1"
PAYLOAD_BLOCKS = 128  # 32-byte blocks: 4 KiB of payload
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")


def make_payload(psid: str, version: str) -> bytes:
    """Deterministic payload bytes: a SHA-256 chain over PSID and version."""
    blocks = (
        hashlib.sha256(f"{psid}:{version}:{i}".encode()).digest() for i in range(PAYLOAD_BLOCKS)
    )
    return b"".join(blocks)


def build(psid: str, version: str, corrupt: bool = False) -> bytes:
    payload = bytearray(make_payload(psid, version))
    header = [
        MAGIC.decode(),
        f"psid={psid}",
        f"version={version}",
        f"payload_size={len(payload)}",
        f"payload_sha256={hashlib.sha256(payload).hexdigest()}",
    ]
    if corrupt:
        for offset in range(64, len(payload), 512):
            payload[offset] ^= 0xFF
    return ("\n".join(header) + "\n\n").encode() + bytes(payload)


def parse(data: bytes) -> dict[str, object]:
    """Header fields plus ``checksum_ok``; raises ValueError if this is not a fake image."""
    head, sep, payload = data.partition(b"\n\n")
    lines = head.decode("ascii", errors="replace").splitlines()
    if not sep or not lines or lines[0] != MAGIC.decode():
        raise ValueError("Invalid image signature")
    fields = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    if not {"psid", "version", "payload_sha256"} <= fields.keys():
        raise ValueError("Invalid image header")
    return {
        "psid": fields["psid"],
        "version": fields["version"],
        "checksum_ok": hashlib.sha256(payload).hexdigest() == fields["payload_sha256"],
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mkimage.py", description=__doc__.splitlines()[0])
    parser.add_argument("--psid", required=True)
    parser.add_argument("--version", required=True, help="FW version, e.g. 22.39.1002")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--corrupt", action="store_true", help="break the payload checksum")
    args = parser.parse_args(argv)
    if not VERSION_RE.match(args.version):
        parser.error(f"--version {args.version!r} is not MAJOR.MINOR.SUBMINOR")
    if not re.match(r"^\S+$", args.psid):
        parser.error("--psid must be one word")
    data = build(args.psid, args.version, corrupt=args.corrupt)
    args.out.write_bytes(data)
    print(hashlib.sha256(data).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
