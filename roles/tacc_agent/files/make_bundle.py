"""Pack the node side of a tacc-stack checkout (the distributions tacc-contract,
tacc-plugins and tacc-agent under packages/; never the client, the lab or its FAKE
tools) into a reproducible .tar.gz (sorted, fixed owners and times, no caches), so the
same source always gives the same bytes and Ansible copies it only when the source
changed. The tarball holds one directory per distribution, each installable with pip.
Prints "changed" or "unchanged".

usage: make_bundle.py SOURCE_DIR DEST.tar.gz
"""

import gzip
import io
import sys
import tarfile
from pathlib import Path

# distribution directory under packages/ -> its one top-level Python package
DISTRIBUTIONS = {"contract": "tacc_contract", "plugins": "tacc_plugins", "agent": "tacc_agent"}
SKIP_PARTS = {"__pycache__"}


def members(source: Path) -> list[Path]:
    found = []
    for dist, package in DISTRIBUTIONS.items():
        root = source / "packages" / dist
        found.append(root / "pyproject.toml")
        found += [
            p
            for p in (root / package).rglob("*")
            if p.is_file() and not SKIP_PARTS & set(p.parts) and p.suffix != ".pyc"
        ]
    return sorted(found)


def bundle(source: Path) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in members(source):
            info = tarfile.TarInfo(f"src/{path.relative_to(source / 'packages')}")
            data = path.read_bytes()
            info.size, info.mtime, info.uid, info.gid = len(data), 0, 0, 0
            info.mode = 0o755 if path.stat().st_mode & 0o100 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def main() -> int:
    source, dest = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    data = bundle(source)
    if dest.exists() and dest.read_bytes() == data:
        print("unchanged")
        return 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(data)
    print("changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
