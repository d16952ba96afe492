"""A task's container image on tcloud's side (tacc_contract.images): at submit its
reference is resolved to the digest it names now by the cluster's agent (`tacc-agent
image resolve`, before anything is uploaded), so the instruction and its digest pin the
exact image; a reference the cluster cannot resolve is a problem of the task file, on
its `image:` line, with the registry's answer. And the caller's images cached on the
cluster (`tacc-agent image ls`, `tcloud images`)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tacc_contract import answers, protocol, verbs
from tacc_contract.errors import Problem, TaskFileError
from tacc_contract.images import parse_reference
from tacc_contract.protocol import AGENT
from tacc_contract.schema import field_position
from tcloud import timing
from tcloud.compile.compiler import ImageResolver
from tcloud.compile.tasks import DICT_SOURCE, Task
from tcloud.errors import TcloudError
from tcloud.transport import agent

if TYPE_CHECKING:
    import paramiko

FIELD = "image"
# What `tcloud images` shows of each cached image, in this order.
COLUMNS = ("digest", "reference", "runtime", "pulled_by_job", "size", "path")


def position(task: Task) -> tuple[int, int]:
    """Line and column of the task file's `image:` value; (0, 0) for a dict task (its
    problems name the field only) or a file that cannot be read again."""
    return (0, 0) if task.source == DICT_SOURCE else field_position(Path(task.source), FIELD)


def one_line(text: str) -> str:
    """The registry's answer as one line of plain text: its lines joined by "; ", what
    a terminal would act on (escapes, control characters) shown escaped."""
    lines = "; ".join(line.strip() for line in text.splitlines() if line.strip())
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in lines)


def unresolved(task: Task, reference: str, answer: str) -> TaskFileError:
    """The cluster could not resolve the reference: a problem of the task (exit 3) on its
    `image:` line, with the registry's answer as the agent gave it (on one line)."""
    line, column = position(task)
    answer = answer.removeprefix(f"{reference}: ")  # the agent's own prefix: named once
    message = f"the cluster cannot resolve {reference}: {one_line(answer)}"
    return TaskFileError([Problem(task.source, line, column, FIELD, message)])


def pinned_answer(reference: str, answer: dict) -> str:
    """The pinned reference the agent answered, checked: a reference of the same
    repository and tag, pinned to the digest it says, which is the user's own digest when
    they pinned one (the cluster checks it again)."""
    asked = parse_reference(reference)
    pinned = parse_reference(answer["pinned"])
    if (
        asked is None
        or pinned is None
        or pinned.digest != answer["digest"]
        or pinned.repository != asked.repository
        or pinned.tag != asked.tag
        or (asked.digest is not None and pinned.digest != asked.digest)
    ):
        raise TcloudError(
            f"the cluster's {AGENT} answered {answer['pinned']!r} (digest "
            f"{answer['digest']!r}) for the image {reference!r}: not that image pinned to "
            "a digest (is it up to date?)"
        )
    return answer["pinned"]


def resolve(client: paramiko.SSHClient, userdir: str | None, task: Task, reference: str) -> str:
    """`reference` pinned to the digest it names now (`host/path:tag@sha256:...`), as
    the cluster's agent resolves it. Any refusal by the agent (no such image, registry
    unreachable, ...) is a TaskFileError naming the `image:` line; a lost connection or an
    agent without the verb stays a cluster error (exit 4)."""
    words = verbs.IMAGE_RESOLVE.request(reference=reference)
    session = agent.session(client)
    with timing.step(" ".join(words)):
        rc, answer = session.request(words, userdir)
    message = protocol.error_message(answer)
    if rc != 0 and message is not None:
        if "invalid choice" in message:  # an agent from before images (argparse's words)
            raise agent.older_agent("it does not know the verb `image resolve`")
        raise unresolved(task, reference, message)
    return pinned_answer(reference, agent.answered(verbs.IMAGE_RESOLVE, rc, answer))


def resolver(client: paramiko.SSHClient, userdir: str | None, task: Task) -> ImageResolver:
    """compile_task's resolve_image for this task: called only when it names an image."""
    return partial(resolve, client, userdir, task)


def cached(client: paramiko.SSHClient, userdir: str | None) -> list[answers.Image]:
    """The caller's images cached on the cluster: {"digest", "reference", "path", ...}."""
    return agent.call(client, verbs.IMAGE_LS, userdir)


UNITS = ("B", "K", "M", "G", "T")


def size(count: int | None) -> str:
    """Bytes for people: 512B, 12.0K, 340.5M, 1.2G."""
    if count is None:
        return ""
    value, power = float(count), 0
    while value >= 1024 and power < len(UNITS) - 1:
        value, power = value / 1024, power + 1
    return f"{count}B" if power == 0 else f"{value:.1f}{UNITS[power]}"


def without_digest(reference: str, digest: str) -> str:
    """A pinned reference as the table shows it next to its digest: `host/path:tag`
    (the digest once, in its own column); any other reference as it is."""
    ref = parse_reference(reference)
    if ref is None or ref.digest != digest:
        return reference
    return str(replace(ref, digest=None))


def reference_text(image: dict) -> str:
    """What the REFERENCE column says: the reference as the task named it, or for an
    image built from a build file `build FILE FROM BASE` (the base's tag, its digest
    being in the build's key)."""
    build = image.get("build")
    if not build:
        return without_digest(image["reference"], image["digest"])
    base = parse_reference(build["base"])
    shown = str(replace(base, digest=None)) if base is not None and base.tag else build["base"]
    return f"build {build['file']} FROM {shown}"


def by_job(image: dict) -> str:
    """The job that pulled or built the cached copy ('' when unknown)."""
    job = image.get("built_by_job") if image.get("build") else image.get("pulled_by_job")
    return "" if job is None else str(job)


def rows(images: list[dict]) -> list[dict]:
    """`tcloud images`' table rows (COLUMNS), one per cached image (pulled or built)."""
    return [
        {
            "digest": image["digest"],
            "reference": reference_text(image),
            "runtime": image.get("runtime", ""),
            "pulled_by_job": by_job(image),
            "size": size(image.get("bytes")),
            "path": image["path"],
        }
        for image in images
    ]
