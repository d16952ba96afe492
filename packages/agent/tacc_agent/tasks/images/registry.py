"""The cluster's side of an image reference: what digest a registry reference names now
(`tacc-agent image resolve REF`, asked by tcloud at submit) and the copy of an image's
bits by that digest into an OCI layout (the image cache's pull, tasks/images/cache.py).

Both go through skopeo. The registries' HTTP/TLS settings come from
/etc/containers/registries.conf.d/ (the container_runtime role writes the cluster
registry's entry there), never from the task nor the caller's own containers settings:
skopeo runs with a HOME that holds none and without the CONTAINERS_* variables, so no
registries.conf a user writes in ~/.config/containers turns TLS off or sends a listed
registry's name elsewhere.

With image_registries set, a reference to another registry is refused (check_allowed):
at `image resolve`, at submit for a task's image or build base (tasks/schedule/submit.py),
and before a job runs or pulls one (tasks/execute/launch.py). It keeps tasks to the
listed registries; it is not a network boundary (anyone with a shell can run skopeo):
egress rules keep the nodes off the others.

The digest is the sha256 of the manifest's raw bytes as the registry serves them
(`skopeo inspect --raw`, one request): for a single manifest and for an index alike it
is the digest the registry addresses the image by, so `name@sha256:...` fetches exactly
these bytes again.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected
from tacc_contract.images import EXPECTED, ImageRef, parse_reference

FIELD = "image"
# skopeo (logrus) ends a failure with: time="..." level=fatal msg="...".
_LOGRUS_MESSAGE = re.compile(r'level=(?:fatal|error) msg="((?:[^"\\]|\\.)*)"')
# skopeo's wrapping, which only repeats the reference the message already names.
_WRAPPING = re.compile(r'^Error parsing image name "[^"]*": ')
MAX_ANSWER = 400


def parsed(reference: str) -> ImageRef:
    """The reference, or Rejected naming it and what is expected."""
    ref = parse_reference(reference)
    if ref is None:
        raise Rejected(f"{reference!r} is not an image reference: expected {EXPECTED}", FIELD)
    return ref


def check_allowed(ref: ImageRef, allowed: tuple[str, ...]) -> None:
    """Rejected unless the reference's registry is one the cluster takes images from
    (the agent's image_registries; empty: any)."""
    if allowed and ref.registry not in allowed:
        raise Rejected(
            f"{ref}: the registry {ref.registry} is not one this cluster takes images from; "
            f"it allows {', '.join(allowed)} (the agent's image_registries, from the "
            "inventory's tacc_image_registry and tacc_image_upstreams)",
            FIELD,
        )


def check_task(image: object, image_build: dict | None, allowed: tuple[str, ...]) -> None:
    """check_allowed for a task's image, or its build file's base."""
    reference = image_build.get("base") if image_build else image
    ref = parse_reference(reference) if isinstance(reference, str) else None
    if ref is not None:
        check_allowed(ref, allowed)


# The variables skopeo reads its settings from that a caller could point elsewhere.
_CALLER_SETTINGS = ("HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "REGISTRY_AUTH_FILE")
# A HOME that holds no containers settings: skopeo then reads the system's alone.
NO_HOME = "/nonexistent"


def skopeo_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment skopeo runs in: the caller's, without what would make it read
    the caller's own registries.conf, policy or credentials."""
    env = dict(os.environ if environ is None else environ)
    for name in [*_CALLER_SETTINGS, *(n for n in env if n.startswith("CONTAINERS_"))]:
        env.pop(name, None)
    env["HOME"] = NO_HOME
    return env


def skopeo_binary(configured: str = "skopeo") -> str:
    found = shutil.which(configured)
    if not found:
        raise AgentError(
            f"{configured} is not installed on this node (the container_runtime role "
            "installs it); cannot reach the image registry",
            AGENT_CLUSTER,
        )
    return found


def registry_answer(stderr: str) -> str:
    """skopeo's own error, one line: its logrus message when it wrote one, else its
    last non-empty line, trimmed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    last = lines[-1]
    match = _LOGRUS_MESSAGE.search(last)
    text = match.group(1).replace('\\"', '"').replace("\\\\", "\\") if match else last
    text = _WRAPPING.sub("", text)
    return text if len(text) <= MAX_ANSWER else text[: MAX_ANSWER - 3] + "..."


def source_of(ref: ImageRef) -> str:
    """What skopeo fetches: by digest when pinned (skopeo refuses tag and digest
    together), else the tag (or `latest`, as registries default)."""
    return f"docker://{ref.by_digest() if ref.pinned else ref}"


def run_skopeo(argv: list[str], ref: ImageRef, what: str, timeout: float) -> bytes:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env=skopeo_env(),
        )
    except subprocess.TimeoutExpired:
        raise AgentError(
            f"{ref}: the registry did not answer {what} within {timeout:g} s", AGENT_CLUSTER
        ) from None
    if proc.returncode != 0:
        answer = registry_answer(proc.stderr.decode(errors="replace"))
        raise Rejected(f"{ref}: the registry answered: {answer}", FIELD)
    return proc.stdout


def resolve(
    reference: str, timeout: float, allowed: tuple[str, ...] = (), skopeo: str = "skopeo"
) -> dict:
    """IMAGE_RESOLVED: the reference, its pinned form and the digest it names now, from
    a registry in `allowed` (empty: any)."""
    ref = parsed(reference)
    check_allowed(ref, allowed)
    argv = [skopeo_binary(skopeo), "inspect", "--raw", source_of(ref)]
    manifest = run_skopeo(argv, ref, "the manifest request", timeout)
    if not manifest:
        raise Rejected(f"{ref}: the registry answered an empty manifest", FIELD)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    if ref.pinned and digest != ref.digest:
        raise Rejected(
            f"{ref}: the registry served a manifest whose digest is {digest}, not the one "
            "the reference pins",
            FIELD,
        )
    return {"reference": reference, "pinned": str(ref.with_digest(digest)), "digest": digest}


def copy_to_layout(
    ref: ImageRef, layout: Path, tag: str, timeout: float, skopeo: str = "skopeo"
) -> None:
    """The pinned image's bits into the OCI layout `layout` as `tag`; the digest in the
    source makes skopeo check every byte it copies against it. (Which registries a job
    may pull from, launch.job_container checks before any pull or reuse: check_task.)"""
    argv = [skopeo_binary(skopeo), "copy", "--quiet", source_of(ref), f"oci:{layout}:{tag}"]
    run_skopeo(argv, ref, "the image copy", timeout)
