"""Container image references, as a task names them (`image:` in tcloud.yaml) and as the
instruction pins them.

A reference names its registry host, so the same task means the same image on any
cluster: `host[:port]/path/name[:tag]` or `...@sha256:<64 hex>` (the grammar of the OCI
distribution spec and Docker's reference package, with the registry part required:
no short names that a search list would expand differently per node).

At submit, tcloud asks the cluster's agent (`tacc-agent image resolve`) for the digest of
what the reference names now and writes the pinned form into the instruction: the
task's digest then covers the exact image bits and a rerun gets them again. The pinned
form keeps the tag for people to read (`host/name:tag@sha256:...`, valid in that grammar);
tools that refuse tag and digest together get `by_digest()`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# One path component: lowercase letters and digits, separated by ., _, __ or dashes.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
# The registry: a host name (with a dot or a port, or `localhost`) or an IPv4 address.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = rf"{_LABEL}(?:\.{_LABEL})*"
_PORT = r"[0-9]{1,5}"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_REFERENCE = re.compile(
    rf"(?P<host>{_HOST})(?::(?P<port>{_PORT}))?"
    rf"/(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?"
    rf"(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?"
)
MAX_LENGTH = 512
EXPECTED = (
    "an image reference with its registry: host[:port]/path/name[:tag] or "
    "host[:port]/path/name@sha256:<64 hex digits> (e.g. n1:5000/tacc/base:bookworm)"
)


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host or host:port
    path: str  # ns/name
    tag: str | None = None
    digest: str | None = None

    @property
    def repository(self) -> str:
        return f"{self.registry}/{self.path}"

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"

    def by_digest(self) -> str:
        """`registry/path@sha256:...` (no tag): what skopeo and registries take."""
        if not self.digest:
            raise ValueError(f"{self}: not pinned to a digest")
        return f"{self.repository}@{self.digest}"

    def with_digest(self, digest: str) -> ImageRef:
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"not a sha256 digest: {digest!r}")
        return ImageRef(self.registry, self.path, self.tag, digest)


def is_registry_host(host: str) -> bool:
    """A first component that names a registry (Docker's rule): it has a dot or a port,
    or is `localhost`."""
    return "." in host or ":" in host or host == "localhost"


_REGISTRY = re.compile(rf"(?P<host>{_HOST})(?::(?P<port>{_PORT}))?")


def is_registry(text: str) -> bool:
    """`text` is a registry as a reference names it (host[:port], Docker's rule)."""
    match = _REGISTRY.fullmatch(text)
    return bool(match) and is_registry_host(text) and int(match["port"] or 0) <= 65535


def parse_reference(text: str) -> ImageRef | None:
    """The reference `text` names, or None when it is not one with its registry."""
    if not isinstance(text, str) or len(text) > MAX_LENGTH:
        return None
    match = _REFERENCE.fullmatch(text)
    if not match:
        return None
    host = match["host"] + (f":{match['port']}" if match["port"] else "")
    if not is_registry(host):
        return None
    return ImageRef(host, match["path"], match["tag"], match["digest"])


def image_reference(value: object) -> str | None:
    """A Field check: None for a reference with its registry, else what is expected."""
    return None if parse_reference(str(value)) else EXPECTED


def unpinned(value: object) -> str | None:
    """A check for the instruction's `task.image`: it must be pinned to a digest."""
    ref = parse_reference(str(value))
    if ref is None:
        return EXPECTED
    if not ref.pinned:
        return (
            "an image pinned to a digest (name@sha256:...): tcloud resolves the reference "
            "at submit; submit with a tcloud of this version"
        )
    return None
