"""The client's import path runs on macOS and Windows: no POSIX-only module (fcntl, pwd,
termios, resource, ...) and no POSIX-only os/signal attribute (os.getuid, os.setsid,
signal.SIGKILL, ...) is used by tcloud, tacc_contract or tacc_plugins unless guarded.

Two checks: a subprocess that blocks those modules, deletes those attributes and says
it is Windows or macOS (sys.platform) before importing every client-side module and
running `tcloud validate` and `tcloud submit --dry-run` on examples/hello; and an AST scan
for every use, which must sit under `if sys.platform ...`/`if os.name ...`/
`if hasattr(os, ...)`, in a try whose except catches ImportError or AttributeError, or
in a function whose docstring says it is POSIX-only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ROOT / "packages"
CLIENT_SIDE = {"client": "tcloud", "contract": "tacc_contract", "plugins": "tacc_plugins"}
PROJECT = ("tcloud", "tacc_contract", "tacc_plugins", "tacc_agent", "tacc_lab")
# Not on the client's import path: the libraries a plug-in copies into a job for the
# user's program, which runs on the cluster's Linux nodes (tacc_fluid locks with fcntl).
CLUSTER_ONLY = "tacc_plugins.programlib"

POSIX_MODULES = (
    "fcntl",
    "pwd",
    "grp",
    "termios",
    "resource",
    "tty",
    "pty",
    "posix",
    "syslog",
    "crypt",
    "spwd",
    "nis",
    "readline",
    "curses",
)
POSIX_ATTRIBUTES = {
    "os": (
        "getuid",
        "geteuid",
        "getgid",
        "getegid",
        "getgroups",
        "chown",
        "lchown",
        "fchown",
        "setsid",
        "setpgid",
        "getpgid",
        "getpgrp",
        "killpg",
        "fork",
        "forkpty",
        "getloadavg",
        "statvfs",
        "mkfifo",
        "uname",
        "nice",
        "sync",
    ),
    "signal": (
        "SIGHUP",
        "SIGUSR1",
        "SIGUSR2",
        "SIGKILL",
        "SIGALRM",
        "SIGCHLD",
        "SIGQUIT",
        "SIGPIPE",
        "SIGSTOP",
        "SIGCONT",
        "SIGTSTP",
        "alarm",
        "setitimer",
        "pause",
    ),
}
GUARD_NAMES = ("platform", "hasattr", "os.name")  # words in an if-test that make it a guard
GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError", "OSError"}

# Run in a fresh interpreter: first everything once for real (so the standard library
# and paramiko are loaded as on this machine), then the project's modules again from
# scratch with the POSIX-only parts gone and another platform's name.
PROBE = textwrap.dedent(
    """
    import contextlib, importlib, io, json, os, pkgutil, signal, sys

    PACKAGES, PROJECT, BLOCKED, ATTRIBUTES, PLATFORM, EXAMPLE, SKIP = json.loads(sys.argv[1])

    def every_module():
        names = []
        for package in PACKAGES:
            module = importlib.import_module(package)
            names.append(package)
            for info in pkgutil.walk_packages(module.__path__, package + "."):
                if info.name.startswith(SKIP):
                    continue
                importlib.import_module(info.name)
                names.append(info.name)
        return names

    def run_cli():
        from tcloud.cli import main
        outputs = []
        for argv in (["validate", EXAMPLE], ["submit", "--dry-run", EXAMPLE]):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                try:
                    code = main(argv)
                except SystemExit as exc:
                    code = exc.code
            outputs.append([argv, code, out.getvalue()])
        return outputs

    names = every_module()
    before = run_cli()
    for name in list(sys.modules):
        if name.split(".")[0] in PROJECT:
            del sys.modules[name]
    for name in BLOCKED:
        sys.modules[name] = None
    for module_name, attributes in ATTRIBUTES.items():
        module = sys.modules[module_name]
        for attribute in attributes:
            if hasattr(module, attribute):
                delattr(module, attribute)
    sys.platform = PLATFORM
    names = every_module()
    after = run_cli()
    print(json.dumps({"modules": names, "before": before, "after": after}))
    """
)


def probe(platform: str) -> dict:
    argv = [
        list(CLIENT_SIDE.values()),
        list(PROJECT),
        list(POSIX_MODULES),
        POSIX_ATTRIBUTES,
        platform,
        str(ROOT / "examples" / "hello"),
        CLUSTER_ONLY + ".",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"on {platform} (emulated):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_client_imports_and_validates_without_posix_only_modules(platform):
    result = probe(platform)
    assert "tcloud.cli" in result["modules"]
    for (argv, code, text), (_, real_code, real_text) in zip(
        result["after"], result["before"], strict=True
    ):
        assert code == real_code == 0, f"tcloud {' '.join(argv)} on {platform}: exit {code}"
        assert text == real_text, f"tcloud {' '.join(argv)} prints otherwise on {platform}"


def is_guard_test(test: ast.expr) -> bool:
    text = ast.unparse(test)
    return any(word in text for word in GUARD_NAMES)


def catches_guard_exception(node: ast.Try) -> bool:
    for handler in node.handlers:
        caught = handler.type
        names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
        if any(ast.unparse(name).split(".")[-1] in GUARD_EXCEPTIONS for name in names if name):
            return True
    return False


def posix_only_function(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    doc = ast.get_docstring(node) or ""
    return "posix-only" in doc.lower().replace(" ", "-")


def unguarded_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node

    def guarded(node: ast.AST) -> bool:
        child, parent = node, parents.get(node)
        while parent is not None:
            in_guarded_branch = (
                isinstance(parent, ast.If | ast.IfExp)
                and child is not parent.test
                and is_guard_test(parent.test)
            )
            in_guarded_try = (
                isinstance(parent, ast.Try)
                and child in parent.body
                and catches_guard_exception(parent)
            )
            if in_guarded_branch or in_guarded_try or posix_only_function(parent):
                return True
            child, parent = parent, parents.get(parent)
        return False

    uses = [(node, posix_use(node)) for node in ast.walk(tree)]
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {what} unguarded"
        for node, what in sorted(((n, w) for n, w in uses if w), key=lambda pair: pair[0].lineno)
        if not guarded(node)
    ]


def posix_use(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        hits = [a.name for a in node.names if a.name.split(".")[0] in POSIX_MODULES]
        return f"import {', '.join(hits)}" if hits else None
    if isinstance(node, ast.ImportFrom) and not node.level:
        module = node.module or ""
        if module.split(".")[0] in POSIX_MODULES:
            return f"from {module} import"
        hits = [a.name for a in node.names if a.name in POSIX_ATTRIBUTES.get(module, ())]
        return f"from {module} import {', '.join(hits)}" if hits else None
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.attr in POSIX_ATTRIBUTES.get(node.value.id, ())
    ):
        return f"{node.value.id}.{node.attr}"
    return None


def client_side_files() -> list[Path]:
    cluster_only = PACKAGES / "plugins" / Path(*CLUSTER_ONLY.split("."))
    return sorted(
        path
        for dist, package in CLIENT_SIDE.items()
        for path in (PACKAGES / dist / package).rglob("*.py")
        if cluster_only not in path.parents
    )


def test_no_unguarded_posix_only_use_on_the_client_side():
    problems = [problem for path in client_side_files() for problem in unguarded_uses(path)]
    assert not problems, (
        "POSIX-only on the client's import path (guard with `if sys.platform ...`, "
        "`hasattr(os, ...)`, try/except ImportError, or a function documented POSIX-only):\n"
        + "\n".join(problems)
    )


def test_the_scan_tells_guarded_from_unguarded(tmp_path, monkeypatch):
    sample = tmp_path / "sample.py"
    sample.write_text(
        textwrap.dedent(
            '''
            import os, sys
            import fcntl
            try:
                import pwd
            except ImportError:
                pwd = None
            if sys.platform != "win32":
                import termios
            UID = os.getuid() if hasattr(os, "getuid") else None
            def lock(fd):
                """POSIX-only: an advisory lock."""
                import fcntl
                fcntl.flock(fd, fcntl.LOCK_EX)
            def owner():
                return os.geteuid()
            '''
        )
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = unguarded_uses(sample)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "import fcntl unguarded",
        "os.geteuid unguarded",
    ]
