"""`tcloud` command line (its verbs arrive with later issues; see docs/architecture.md)."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tcloud", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    args = parser.parse_args(argv)
    if args.version:
        try:
            print(version("tacc-stack"))
        except PackageNotFoundError:
            print("unknown")
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
