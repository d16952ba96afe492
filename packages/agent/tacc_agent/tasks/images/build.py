"""Container images built on the cluster from the task's build file (`image: {build:
PATH}`, tacc_contract.buildfile), once per user and content, and reused like pulled ones.

tcloud pinned the base to its digest and computed the build's key (the content address
of base, steps and the files COPY reads) at submit; the instruction carries both in
task.image_build. The batch step makes sure `<userdir>/images/<key hex>/` holds the
result, in the same shape as a pulled image (`rootfs/` and the marker `tacc-image.json`),
so listing, the job's record, the mount points and the wrappers treat both alike.
Building, under the same POSIX lock as a pull of that directory (concurrent jobs of the
user wait and reuse what the first built):

1. parse the build file again from the job's own files (`<job_dir>/code/<file>`) and
   recompute the key from them: a mismatch is refused (the files are not what tcloud
   hashed);
2. make sure the base is in the cache (imagecache.ensure: pulled once per digest);
3. copy its rootfs into a private work directory beside the cache (`cp -a`);
4. run the steps: RUN with Charliecloud's `ch-run -w --uid=0 --gid=0` (writable, root
   in an unprivileged user namespace: the files stay the user's; `pip install` works,
   chown to other users does not), with only the build's environment (the base image's,
   ARG and ENV so far, the agent's package index and proxies) from a private file,
   never on the command line; COPY from the build context with Docker's rules, nothing
   outside the context and nothing outside the rootfs; WORKDIR made; SHELL kept;
5. write the marker and rename the result into place. Any failure removes the work
   directory; an interrupted build leaves one that the next build of the key removes.

Every step's output goes to the job's log prefixed `build: `. Only Charliecloud builds
(the node's container_runtime); the others are refused before anything is done.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import os
import posixpath
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol
from urllib.parse import urlsplit

from tacc_agent import locks
from tacc_agent.errors import AGENT_FAILED, AgentError
from tacc_agent.tasks.execute import proctree
from tacc_agent.tasks.execute.containers import DEFAULT_PATH
from tacc_agent.tasks.images import cache as imagecache
from tacc_agent.tasks.jobs import records
from tacc_contract import buildfile
from tacc_contract.buildfile import BuildFile, BuildFileError, Step
from tacc_contract.instruction import FILE as INSTRUCTION

BUILD_PREFIX = ".build-"
RUNTIME = "charliecloud"
NEEDS_CHARLIECLOUD = (
    "local image builds need Charliecloud (container_runtime: charliecloud) on the node"
)
DEFAULT_SHELL = ("/bin/sh", "-c")
# The agent's own variables a RUN step gets (the cluster's way out and its package index).
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
MAX_SYMLINKS = 40  # as the kernel's ELOOP limit
LAST_LINE_CHARS = 300

Log = Callable[[str], None]
Sink = Callable[[str], None]


class StepTimeout(Exception):
    """A RUN step ran past the build timeout (the runner stopped it)."""


class Runner(Protocol):
    """Runs one RUN step's argv in the writable `rootfs` as root of a user namespace, in
    `cwd` (a path in the image), with exactly the variables of `env_file` (KEY='VALUE'
    lines); every output line goes to `sink`; returns the exit status."""

    def __call__(
        self, rootfs: Path, argv: Sequence[str], cwd: str, env_file: Path, sink: Sink
    ) -> int: ...


@dataclass(frozen=True)
class ChRun:
    """The real RUN: Charliecloud 0.31's ch-run, writable (-w), as uid/gid 0 inside
    (--uid=0 --gid=0: an unprivileged user namespace, root only inside), with a private
    /tmp (-t: the node's /tmp stays out of the image) and only the build's variables
    (--unset-env='*', then --set-env=FILE with --env-no-expand: values as written).
    Checked on a lab node as an unprivileged user. Bounded by `timeout` seconds."""

    timeout: float = 3600.0
    binary: str = "ch-run"

    def argv(self, rootfs: Path, argv: Sequence[str], cwd: str, env_file: Path) -> list[str]:
        return [
            self.binary,
            "-w",
            "--uid=0",
            "--gid=0",
            "--private-tmp",
            "--unset-env=*",
            "--env-no-expand",
            f"--set-env={env_file}",
            f"--cd={cwd}",
            str(rootfs),
            "--",
            *argv,
        ]

    def __call__(
        self, rootfs: Path, argv: Sequence[str], cwd: str, env_file: Path, sink: Sink
    ) -> int:
        environ = dict(os.environ)
        environ.setdefault("USER", getpass.getuser())  # ch-run wants $USER
        before = set(proctree.descendants(os.getpid()))
        try:
            child = subprocess.Popen(
                self.argv(rootfs, argv, cwd, env_file),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environ,
                start_new_session=True,
            )
        except FileNotFoundError:
            missing = f"{self.binary} is not installed on this node (container_runtime role)"
            raise AgentError(missing, AGENT_FAILED) from None

        def pump() -> None:
            for raw in iter(child.stdout.readline, b""):  # type: ignore[union-attr]
                sink(raw.decode("utf-8", "replace").rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = child.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            stop_session(child)
            raise StepTimeout from None
        finally:  # what the step left running ends with it, as a RUN's container does
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            proctree.kill_new_descendants(before)
            reader.join(5)
        return 128 - code if code < 0 else code


def stop_session(child: subprocess.Popen) -> None:
    """TERM, a short grace, then KILL to the step's whole session (its own group)."""
    for number, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace or None)
            return


@dataclass
class BuildState:
    """What the steps so far set: the variables, the working directory, the shell.
    Docker's rule for the variables: an ENV (the base image's or the file's) wins over
    an ARG of the same name, whatever their order. The agent's variables (the cluster's
    package index and proxies, which no image can know) come over the base image's and
    the ARGs; the file's own ENV comes over everything."""

    base_env: dict[str, str]
    agent_env: dict[str, str]
    cwd: str = "/"
    shell: tuple[str, ...] = DEFAULT_SHELL
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def run_env(self) -> dict[str, str]:
        return {
            "PATH": DEFAULT_PATH,
            "HOME": "/root",
            **self.args,
            **self.base_env,
            **self.agent_env,
            **self.env,
        }

    def image_env(self) -> dict[str, str]:
        """The result's own variables (what container_env uses): ARGs and the agent's
        variables are for the build only."""
        return {**self.base_env, **self.env}


def key_hex(image_build: Mapping) -> str:
    key = str(image_build.get("key", ""))
    if not buildfile.KEY.fullmatch(key):
        raise AgentError(
            f"task.image_build.key: expected sha256:<64 hex>, not {key!r}", AGENT_FAILED
        )
    return key.split(":", 1)[1]


def label(image_build: Mapping) -> str:
    return f"build {image_build.get('file', '')}"


def agent_variables(package_index: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The package index (the cluster's cache) and the agent's own proxies: a RUN's way
    to packages from a node that has no other."""
    found = {name: environ[name] for name in PROXY_VARIABLES if environ.get(name)}
    if package_index:
        found["PIP_INDEX_URL"] = package_index
        parts = urlsplit(package_index)
        if parts.scheme == "http" and parts.hostname:
            found["PIP_TRUSTED_HOST"] = parts.hostname
    return found


def write_env_file(path: Path, env: Mapping[str, str], where: str) -> None:
    """KEY='VALUE' lines for ch-run --set-env (0.31 strips one pair of single quotes
    around a value and nothing else, so any value without a newline passes as is)."""
    lines = []
    for key, value in sorted(env.items()):
        problem = env_file_problem(key, value)
        if problem:
            raise AgentError(
                f"{where}: the variable {key!r} {problem}; a RUN step cannot get it", AGENT_FAILED
            )
        lines.append(f"{key}='{value}'\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(lines)


def env_file_problem(key: str, value: str) -> str:
    """Why KEY='VALUE' cannot carry this variable ("" when it can)."""
    for text, what in ((key, "name"), (value, "value")):
        if "\n" in text:
            return "holds a newline" if what == "value" else "has a newline in its name"
        if "\0" in text:
            return f"has a NUL byte in its {what}"
    if not key:
        return "has an empty name"
    if "=" in key:
        return "has '=' in its name"
    return ""


# ---------------------------------------------------------------- paths in the image
def in_image(rootfs: Path, path: str) -> Path:
    """A path in the image as a host path below `rootfs`, with its symbolic links
    resolved as the container sees them (an absolute link from the image's root, `..`
    stopping at it): never a place outside the rootfs."""
    todo = [p for p in PurePosixPath(posixpath.join("/", path)).parts if p != "/"]
    done: list[str] = []
    hops = 0
    while todo:
        name = todo.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        here = rootfs.joinpath(*done, name)
        if here.is_symlink():
            hops += 1
            if hops > MAX_SYMLINKS:
                raise AgentError(f"{path}: too many symbolic links in the image", AGENT_FAILED)
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [p for p in PurePosixPath(target).parts if p != "/"] + todo
            continue
        done.append(name)
    return rootfs.joinpath(*done)


@contextlib.contextmanager
def writable(directory: Path) -> Iterator[None]:
    """The user may write in `directory` (an image directory of theirs whose mode lacks
    u+w, as some images ship): its mode back afterwards."""
    mode = stat.S_IMODE(directory.stat().st_mode)
    wanted = mode | stat.S_IWUSR | stat.S_IXUSR
    if wanted != mode:
        directory.chmod(wanted)
    try:
        yield
    finally:
        if wanted != mode:
            with contextlib.suppress(OSError):
                directory.chmod(mode)


def make_dirs(rootfs: Path, path: str, where: str) -> Path:
    """mkdir -p of a path in the image (0755, links resolved inside the image)."""
    parts = [p for p in PurePosixPath(posixpath.join("/", path)).parts if p != "/"]
    for count in range(1, len(parts) + 1):
        here = in_image(rootfs, "/".join(parts[:count]))
        if here.is_dir():
            continue
        if here.exists():
            raise AgentError(
                f"{where}: {'/' + '/'.join(parts[:count])} is not a directory in the image",
                AGENT_FAILED,
            )
        with writable(here.parent):
            here.mkdir(mode=0o755)
    return in_image(rootfs, path)


def place_file(source: Path, rootfs: Path, dest: str, mode: int, where: str) -> None:
    """One file at `dest` in the image, replacing what is there (a symbolic link too,
    unless it leads to a directory, which then receives the file under its name)."""
    parent = make_dirs(rootfs, posixpath.dirname(posixpath.join("/", dest)), where)
    target = parent / posixpath.basename(dest)
    if target.is_symlink() and in_image(rootfs, dest).is_dir():
        parent, target = in_image(rootfs, dest), in_image(rootfs, dest) / source.name
    if target.is_dir() and not target.is_symlink():
        raise AgentError(
            f"{where}: {dest} is a directory in the image; name a file or end "
            "the destination with '/'",
            AGENT_FAILED,
        )
    with writable(parent):
        if target.is_symlink() or target.exists():
            target.unlink()
        # A new file, never through a link: nothing else runs in the image between steps
        # (a RUN's leftovers are stopped with it), and O_EXCL|O_NOFOLLOW holds even then.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as written, source.open("rb") as read:
            shutil.copyfileobj(read, written, 1 << 20)
            os.fchmod(written.fileno(), mode)


# ---------------------------------------------------------------- the job's files
@dataclass(frozen=True)
class Context:
    """The build context: `<job_dir>/code/<context>/`, and of it exactly the files the
    job's manifest names (what tcloud uploaded and hashed), with their modes."""

    root: Path
    modes: dict[str, int]

    def source(self, relative: str, where: str) -> Path:
        path = self.root / relative
        real, top = os.path.realpath(path), os.path.realpath(self.root)
        if os.path.commonpath([real, top]) != top or not os.path.isfile(real):
            raise AgentError(
                f"{where}: {relative} is not a file inside the build context", AGENT_FAILED
            )
        return Path(real)

    def digest(self, relative: str, where: str) -> str:
        sha = hashlib.sha256()
        with self.source(relative, where).open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
        return sha.hexdigest()


def job_context(job_dir: Path, image_build: Mapping) -> Context:
    context = str(image_build.get("context", ""))
    if context.startswith("/") or ".." in PurePosixPath(context).parts:
        raise AgentError(
            f"task.image_build.context: expected a directory inside the task, not {context!r}",
            AGENT_FAILED,
        )
    manifest = (records.read_json(job_dir / INSTRUCTION) or {}).get("manifest") or {}
    prefix = posixpath.join("code", context, "") if context else "code/"
    modes = {}
    for path, entry in manifest.items():
        if path.startswith(prefix):
            mode = entry[2] if isinstance(entry, list) and len(entry) > 2 else 0o644
            modes[path[len(prefix) :]] = mode if isinstance(mode, int) else 0o644
    return Context(job_dir / "code" / context if context else job_dir / "code", modes)


def read_build_file(
    job_dir: Path, image_build: Mapping, base_env: Mapping[str, str] | None = None
) -> BuildFile:
    name = str(image_build.get("file", ""))
    if not name or name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise AgentError(
            f"task.image_build.file: expected a file inside the task, not {name!r}", AGENT_FAILED
        )
    path = job_dir / "code" / name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AgentError(
            f"{name}: cannot read the build file from the job's files: {exc}", AGENT_FAILED
        ) from None
    try:
        return buildfile.parse(text, name, base_env=base_env)
    except BuildFileError as exc:
        raise AgentError(str(exc), AGENT_FAILED) from None


def check_key(build: BuildFile, image_build: Mapping, context: Context) -> None:
    """The key tcloud computed at submit, again from the job's own files."""
    try:
        copied = buildfile.copied_files(build, context.modes)
        files = {
            path: (context.digest(path, build.source), bool(context.modes[path] & 0o111))
            for path in copied
        }
        key = buildfile.build_key(build, str(image_build.get("base", "")), files)
    except (BuildFileError, ValueError) as exc:
        raise AgentError(str(exc), AGENT_FAILED) from None
    if key != image_build.get("key"):
        raise AgentError(
            f"{build.source}: the build's content does not match its key (tcloud computed "
            f"{image_build.get('key')}, the job's files give {key}); submit again",
            AGENT_FAILED,
        )


# ---------------------------------------------------------------- the steps
def copy_step(
    step: Step, build: BuildFile, context: Context, rootfs: Path, state: BuildState, log: Log
) -> None:
    """COPY with Docker's rules: a directory source copies its contents; a file goes to
    dest, or under it when dest ends in '/' (or is a directory); several sources (or a
    glob matching several) need a dest ending in '/'."""
    where = f"{build.source}:{step.line}"
    sources, dest = step.args
    dest = posixpath.join(state.cwd, dest)  # a relative dest is below WORKDIR
    roots: list[tuple[str, list[str]]] = []  # (matched source, its files)
    for source in sources:
        files = buildfile.source_files(source, context.modes)
        if not files:
            problem = buildfile.unmatched(build, step.line, source)
            raise AgentError(str(BuildFileError([problem])), AGENT_FAILED)
        depth = buildfile.source_depth(source)
        matched: dict[str, list[str]] = {}
        for path in files:
            matched.setdefault("/".join(path.split("/")[:depth]), []).append(path)
        roots += sorted(matched.items())
    if (len(sources) > 1 or len(roots) > 1) and not dest.endswith("/"):
        raise AgentError(
            f"{where}: COPY with several sources needs a destination ending "
            f"in '/', not {step.args[1]!r}",
            AGENT_FAILED,
        )
    count = 0
    for root, files in roots:
        is_dir = files != [root]
        for path in files:
            if is_dir:
                relative = path[len(root) + 1 :] if root else path
                target = posixpath.join(dest, relative)
            elif dest.endswith("/") or in_image(rootfs, dest).is_dir():
                target = posixpath.join(dest, posixpath.basename(path))
            else:
                target = dest
            # What the key covers: executable or not (0755 / 0644), never more of the mode.
            mode = 0o755 if context.modes.get(path, 0o644) & 0o111 else 0o644
            place_file(context.source(path, where), rootfs, target, mode, where)
            count += 1
        if is_dir:
            make_dirs(rootfs, dest, where)
    log(f"build: {count} file(s) copied")


def run_step(
    step: Step,
    build: BuildFile,
    rootfs: Path,
    env_file: Path,
    state: BuildState,
    runner: Runner,
    timeout: float,
    log: Log,
) -> None:
    where = f"{build.source}:{step.line}"
    form, body = step.args
    argv = [*state.shell, body] if form == "shell" else list(body)
    write_env_file(env_file, state.run_env(), where)
    make_dirs(rootfs, state.cwd, where)
    last = ["(no output)"]

    def sink(line: str) -> None:
        if line.strip():
            last[0] = line.strip()
        log(f"build: {line}")

    try:
        code = runner(rootfs, argv, state.cwd, env_file, sink)
    except StepTimeout:
        raise AgentError(
            f"{where}: RUN took longer than {timeout:g} s (image_build_timeout_seconds)",
            AGENT_FAILED,
        ) from None
    finally:
        env_file.unlink(missing_ok=True)
    if code != 0:
        raise AgentError(f"{where}: RUN exited {code}: {last[0][-LAST_LINE_CHARS:]}", AGENT_FAILED)


def describe(step: Step) -> str:
    if step.kind == "RUN":
        form, body = step.args
        return f"RUN {body if form == 'shell' else list(body)}"
    if step.kind == "COPY":
        return f"COPY {' '.join(step.args[0])} {step.args[1]}"
    if step.kind == "ENV":
        return "ENV " + " ".join(key for key, _ in step.args)
    if step.kind == "ARG":
        return f"ARG {step.args[0]}"
    return f"{step.kind} {' '.join(str(a) for a in step.args)}"


def shown_path(filename: object, rootfs: Path, context: Context) -> str:
    """An OSError's file as the build file's author knows it: a path in the image, or
    one in the build context; never the node's work directory."""
    if not isinstance(filename, (str, bytes, os.PathLike)):
        return ""
    path = os.fsdecode(filename)
    for root, shown in ((str(rootfs), "{}"), (str(context.root), "{} in the build context")):
        if path == root or path.startswith(root + "/"):
            return shown.format("/" + path[len(root) :].lstrip("/"))
    return ""


def step_failure(
    exc: OSError | ValueError, where: str, kind: str, rootfs: Path, context: Context
) -> AgentError:
    """A step's OS or value error (a name too long, a directory a RUN made unreadable,
    a NUL byte in a path or argument) as the job's positioned reason."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        path = shown_path(exc.filename, rootfs, context)
        return AgentError(f"{where}: {kind}: {reason}{': ' + path if path else ''}", AGENT_FAILED)
    reason = "a NUL byte in a path or argument" if "null" in str(exc) else str(exc)
    return AgentError(f"{where}: {kind}: {reason}", AGENT_FAILED)


def apply_steps(
    build: BuildFile,
    context: Context,
    rootfs: Path,
    env_file: Path,
    state: BuildState,
    runner: Runner,
    timeout: float,
    log: Log,
) -> None:
    total = len(build.steps)
    for number, step in enumerate(build.steps, 1):
        where = f"{build.source}:{step.line}"
        log(f"build: step {number}/{total} ({where}): {describe(step)}")
        try:
            apply_step(step, build, context, rootfs, env_file, state, runner, timeout, log)
        except (OSError, ValueError) as exc:
            raise step_failure(exc, where, step.kind, rootfs, context) from None


def apply_step(
    step: Step,
    build: BuildFile,
    context: Context,
    rootfs: Path,
    env_file: Path,
    state: BuildState,
    runner: Runner,
    timeout: float,
    log: Log,
) -> None:
    if step.kind == "ARG":
        name, default = step.args
        if default is not None:
            state.args[name] = default
    elif step.kind == "ENV":
        state.env.update(dict(step.args))
    elif step.kind == "WORKDIR":
        state.cwd = posixpath.normpath(posixpath.join(state.cwd, step.args[0]))
        make_dirs(rootfs, state.cwd, f"{build.source}:{step.line}")
    elif step.kind == "SHELL":
        state.shell = tuple(step.args)
    elif step.kind == "COPY":
        copy_step(step, build, context, rootfs, state, log)
    elif step.kind == "RUN":
        run_step(step, build, rootfs, env_file, state, runner, timeout, log)
    else:  # the contract only yields the kinds above
        raise AgentError(f"{build.source}:{step.line}: {step.kind} cannot be built", AGENT_FAILED)


def copy_rootfs(source: Path, target: Path) -> None:
    """The base's files into the work directory: cp -a (a reflink where the filesystem
    has them), so the base in the cache is never written."""
    argv = ["cp", "-a", "--reflink=auto", "--", str(source), str(target)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1][-LAST_LINE_CHARS:]
        raise AgentError(f"cannot copy the base image's files: {last}", AGENT_FAILED)


def base_cwd(base_dir: Path) -> str:
    """The base image's working directory (its config's WorkingDir, umoci's spec)."""
    spec = records.read_json(base_dir / imagecache.SPEC) or {}
    cwd = (spec.get("process") or {}).get("cwd") or "/"
    return cwd if isinstance(cwd, str) and cwd.startswith("/") else "/"


@dataclass(frozen=True)
class BuildSettings:
    """The agent's settings a build uses."""

    lock_timeout: float
    step_timeout: float = 3600.0
    package_index: str = ""
    runtime: str = RUNTIME


def build(
    job_dir: Path,
    image_build: Mapping,
    target: Path,
    base: dict,
    runner: Runner,
    settings: BuildSettings,
    job_id: str,
    log: Log,
) -> dict:
    """Build in a private work directory beside the cache, rename it into place with its
    marker; the work directory goes whatever happens."""
    work = target.parent / f"{BUILD_PREFIX}{target.name}-{os.getpid()}"
    imagecache.remove_tree(work)
    work.mkdir(mode=0o700)
    start = time.monotonic()
    bundle, env_file = work / "bundle", work / "env"
    try:
        bundle.mkdir(mode=0o700)
        copy_rootfs(Path(base["path"]), bundle / imagecache.ROOTFS)
        base_env = base.get("env") or {}
        steps = read_build_file(job_dir, image_build, base_env)
        state = BuildState(
            dict(base_env),
            agent_variables(settings.package_index, os.environ),
            cwd=base_cwd(Path(base["path"]).parent),
        )
        apply_steps(
            steps,
            job_context(job_dir, image_build),
            bundle / imagecache.ROOTFS,
            env_file,
            state,
            runner,
            settings.step_timeout,
            log,
        )
        marker = {
            "digest": image_build["key"],
            "reference": label(image_build),
            "build": {"file": image_build["file"], "base": image_build["base"]},
            "path": str(target / imagecache.ROOTFS),
            "built_by_job": job_id,
            "built_on": socket.gethostname(),
            "seconds": round(time.monotonic() - start, 2),
            "bytes": imagecache.tree_bytes(bundle / imagecache.ROOTFS),
            "time": time.time(),
            "env": state.image_env(),
            "runtime": settings.runtime,
        }
        records.write_json(bundle / imagecache.MARKER, marker)
        bundle.rename(target)
    finally:
        imagecache.remove_tree(work)
    return marker


def clear_stale_builds(images: Path, hex_key: str) -> None:
    """What interrupted builds left: this key's (its lock is held by this process: none
    is running), and any other key's whose lock can be taken at once (no build of that
    key is running anywhere). Never the lock of a key held here: a second POSIX lock of
    the same process on that file would succeed, and closing it would release the one
    held."""
    for left in images.glob(f"{BUILD_PREFIX}*-*"):
        key = left.name[len(BUILD_PREFIX) :].rsplit("-", 1)[0]
        if key == hex_key:
            imagecache.remove_tree(left)
        elif buildfile.KEY.fullmatch(f"sha256:{key}"):
            lock = images / f"{key}.lock"
            with contextlib.suppress(OSError), locks.lock_file(lock, locks.POSIX) as free:
                if free:  # taken at once: no build of that key runs anywhere
                    imagecache.remove_tree(left)


def holder_of(holder: Path) -> str:
    """Who builds the key now (the holder file of its lock), in words."""
    found = records.read_json(holder) or {}
    if not found.get("job"):
        return "another job of yours"
    since = time.strftime("%H:%M:%S", time.localtime(float(found.get("since") or 0)))
    return f"job {found['job']} on {found.get('host', '?')} (building since {since})"


def build_wait(steps: BuildFile, settings: BuildSettings, puller: object) -> float:
    """How long a job waits for another one's build of the same key: as long as that
    build may take (waiting for the base's lock, the base's pull with skopeo and umoci,
    the copy, each RUN to its timeout); Slurm's time limit bounds the waiting job."""
    runs = sum(1 for step in steps.steps if step.kind == "RUN")
    pull = float(getattr(puller or imagecache.SkopeoUmoci(), "timeout", settings.lock_timeout))
    return 2 * settings.lock_timeout + 2 * pull + runs * settings.step_timeout


@contextlib.contextmanager
def build_lock(
    images: Path, hex_key: str, job_id: str, what: str, log: Log, wait: Callable[[], float]
) -> Iterator[None]:
    """The key's lock (the same file imagecache's mount points take), with a holder file
    naming the job that builds, so the jobs that wait say whom they wait for; `wait()`:
    how long at most (asked only if someone holds it)."""
    holder = images / f"{hex_key}.holder"
    seconds = functools.cache(wait)  # asked once, and only if someone holds the lock

    def waiting(limit: float) -> None:
        log(f"{what}: waiting for {holder_of(holder)} (at most {limit:g} s)")

    lock = images / f"{hex_key}.lock"
    with locks.lock_file(lock, locks.POSIX, within=seconds, waiting=waiting, mode=0o666) as taken:
        if not taken:
            raise AgentError(
                f"{what}: still being built by {holder_of(holder)} after "
                f"{seconds():g} s; submit again later",
                AGENT_FAILED,
            )
        try:
            records.write_json(
                holder,
                {
                    "job": job_id,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "since": time.time(),
                },
            )
            yield
        finally:
            with contextlib.suppress(OSError):
                holder.unlink()


@contextlib.contextmanager
def build_errors(what: str) -> Iterator[None]:
    """What no step names (the cache directory, the copy of the base, the marker): an
    OS error as the job's reason, never a traceback."""
    try:
        yield
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise AgentError(f"{what}: {reason}", AGENT_FAILED) from None


def ensure_build(
    user_dir: Path,
    job_dir: Path,
    image_build: Mapping,
    job_id: str,
    log: Log,
    settings: BuildSettings,
    runner: Runner | None = None,
    puller: imagecache.Puller | None = None,
) -> dict:
    """The ready image's record (as imagecache.ensure's), building it if no job of the
    user has yet. `image_build`: the instruction's task.image_build."""
    if settings.runtime != RUNTIME:
        raise AgentError(NEEDS_CHARLIECLOUD, AGENT_FAILED)
    hex_key = key_hex(image_build)
    short, name = hex_key[:12], image_build.get("file", "")
    what = f"image build {name} {short}"
    with build_errors(what):
        images = imagecache.images_dir(user_dir)
        images.mkdir(mode=0o700, exist_ok=True)
        target = images / hex_key

        def wait() -> float:
            return build_wait(read_build_file(job_dir, image_build), settings, puller)

        with build_lock(images, hex_key, job_id, what, log, wait):
            marker = imagecache.ready(target)
            if marker:
                log(f"{what}: reused (built by job {marker.get('built_by_job')})")
                return {**marker, "path": str(target / imagecache.ROOTFS)}
            check_key(
                read_build_file(job_dir, image_build),
                image_build,
                job_context(job_dir, image_build),
            )
            clear_stale_builds(images, hex_key)
            if target.exists():  # a directory without its marker was never finished
                imagecache.remove_tree(target)
            base = imagecache.ensure(
                user_dir,
                str(image_build["base"]),
                job_id,
                log,
                settings.lock_timeout,
                puller,
                settings.runtime,
            )
            log(f"{what}: building FROM {image_build['base']} ...")
            runner = runner or ChRun(settings.step_timeout)
            marker = build(job_dir, image_build, target, base, runner, settings, job_id, log)
            mib = marker["bytes"] / 2**20
            log(f"{what}: built in {marker['seconds']} s ({mib:.0f} MiB)")
    return marker
