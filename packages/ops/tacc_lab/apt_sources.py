"""Read the host's active apt sources (one-line .list and deb822 .sources formats)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tacc_lab.errors import LabError

APT_SOURCE_PATHS = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def source_files(paths: tuple[Path, ...] = APT_SOURCE_PATHS) -> list[Path]:
    """Active source files; disabled ones (other suffixes) are skipped, as apt does."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in (".list", ".sources"))
        elif path.is_file():
            files.append(path)
    return files


def source_urls(text: str) -> list[str]:
    """Repository URLs in one sources file's text, in order."""
    urls: list[str] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith(("deb ", "deb-src ")):
            urls += [w for w in line.split() if "://" in w][:1]
        elif line.lower().startswith("uris:"):
            urls += line.split(":", 1)[1].split()
    return urls


def all_source_urls(paths: tuple[Path, ...] = APT_SOURCE_PATHS) -> list[str]:
    return [url for file in source_files(paths) for url in source_urls(file.read_text("utf-8"))]


def source_hosts(paths: tuple[Path, ...] = APT_SOURCE_PATHS) -> set[str]:
    hosts = set()
    for url in all_source_urls(paths):
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname:
            hosts.add(parts.hostname)
    return hosts


def debian_mirror(paths: tuple[Path, ...] = APT_SOURCE_PATHS) -> str:
    """The first active source that is not the security archive: debootstrap's mirror."""
    for url in all_source_urls(paths):
        if "security" not in url and urlsplit(url).scheme in ("http", "https"):
            return url
    raise LabError("no Debian mirror found in /etc/apt/sources.list{,.d}; debootstrap needs one")
