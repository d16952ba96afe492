"""Where a task may upload from: `code.workdir` and `datasets[].local`.

A task file is often someone else's (a cloned repository, an example): by default it
uploads only from its own directory. A path outside it (after `~` and every symlink
are resolved) needs `--allow-outside-paths` on `tcloud submit`/`validate`, and submit
names each such path. Well-known places of secrets (SSH and GnuPG keys, cloud and
cluster credentials, /etc, ...) are never uploaded, with or without the flag, nor is a
directory that holds one (a home directory with its ~/.ssh).
"""

from __future__ import annotations

import sys
from pathlib import Path

ALLOW_FLAG = "--allow-outside-paths"
# Refused even with ALLOW_FLAG: the path itself, anything under it, anything holding it.
SECRET_PATHS = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.pgpass",
    "~/.git-credentials",
    "~/.pypirc",
    "~/.npmrc",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.vault-token",
    "~/.terraform.d",
    "~/.config/gh",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    # Under /run: session keyrings and agents, container and Kubernetes secrets; not
    # /run/media, where removable drives (datasets) are mounted.
    "/run/user",
    "/run/secrets",
    "/var/run/secrets",
)
# macOS and Windows file systems ignore case: ~/.SSH is ~/.ssh there.
CASE_BLIND = sys.platform in ("darwin", "win32")


def resolve(base_dir: Path, text: str) -> Path:
    """A task's local path as it will be read: `~` expanded, relative to the task's
    directory, every symlink resolved."""
    return (base_dir / Path(text).expanduser()).resolve()


def secret_places() -> list[Path]:
    places = []
    for text in SECRET_PATHS:
        path = Path(text).expanduser()
        places += [path, path.resolve()]
    return list(dict.fromkeys(places))


def folded(path: Path) -> Path:
    return Path(str(path).casefold()) if CASE_BLIND else path


def secret_in(path: Path) -> Path | None:
    """The secret place `path` is, is inside, or holds (one that exists), else None."""
    seen = folded(path)
    for secret in secret_places():
        place = folded(secret)
        if seen == place or place in seen.parents:
            return secret
        if seen in place.parents and secret.exists():
            return secret
    return None


def is_inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def problem(base_dir: Path, text: str, allow_outside: bool) -> str | None:
    """Why `text` (a task's local path) may not be uploaded, or None."""
    path = resolve(base_dir, text)
    secret = secret_in(path)
    if secret is not None:
        what = "is" if path == secret else "is inside" if secret in path.parents else "holds"
        return (
            f"{path} {what} {secret}, a place of secrets (keys, credentials); tcloud never "
            f"uploads it, even with {ALLOW_FLAG}"
        )
    if not allow_outside and not is_inside(path, base_dir.resolve()):
        return (
            f"{path} is outside the task's directory {base_dir.resolve()}; pass "
            f"{ALLOW_FLAG} to upload it"
        )
    return None


def outside(base_dir: Path, texts: list[str]) -> list[Path]:
    """The resolved paths among `texts` that are outside the task's directory."""
    paths = [resolve(base_dir, text) for text in texts]
    return [path for path in paths if not is_inside(path, base_dir.resolve())]
