"""A task's build file (`image: {build: PATH}` in tcloud.yaml): a Containerfile or
Dockerfile that starts from a registry image and adds the task's software, built on the
cluster once per content.

The accepted language is a Dockerfile subset. `dockerfile-parse` (Red Hat's parser) splits
the file into instructions with their lines (continuations, comments, the escape
directive); this module checks each instruction and normalizes the ones that change the
image into `Step`s:

- FROM: exactly one, the first instruction after optional ARGs, naming a reference with
  its registry host (`tacc_contract.images`); `AS name` is accepted and ignored.
- ARG, ENV, RUN (shell and exec form), COPY (sources inside the context), WORKDIR, SHELL.
- LABEL, EXPOSE, CMD, ENTRYPOINT, STOPSIGNAL, HEALTHCHECK, VOLUME, MAINTAINER: accepted and
  ignored (tacc runs the task's own `run` lines).
- Everything else is refused with the file, the line and why.

Variables (`$X`, `${X}`, `${X:-word}`, `${X:+word}`) are substituted like Docker's from the
ARG and ENV values before them, in ENV, WORKDIR, COPY and ARG defaults (and pre-FROM ARGs
in FROM). A variable the file does not define (the base image's `$PATH`, say) is kept as
written: the client cannot know the base image's environment. The builder parses again
with `base_env=` (the base image's environment) to get the values it runs with; there an
undefined variable is empty, as in Docker.

`build_key` is the content address of the result: the base by digest, the escape
character, the raw text of each instruction that changes the image (continuations
joined; not lines, comments or ignored instructions: with the base pinned, that text
determines every substitution, where the kept-as-written steps would not tell `$X` from
an escaped or quoted one) and the digest and executable bit of exactly the files the COPY
steps read. tcloud computes it at submit, the agent again from the job's own files.

Lines are split at newlines only (a carriage return before one is dropped); a NUL or
another control character (but tab) in an instruction that changes the image, text that
is not valid UTF-8, or a file that ends inside a continuation is refused with its line.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from dockerfile_parse import DockerfileParser

from tacc_contract.errors import Problem
from tacc_contract.images import EXPECTED as REFERENCE_EXPECTED
from tacc_contract.images import parse_reference

BUILD_FILES = ("Containerfile", "Dockerfile")
MAX_BYTES = 256 * 1024
# 2: the raw instruction text instead of the kept-as-written steps; files as [sha256, executable].
KEY_FORMAT = 2
KEY = re.compile(r"sha256:[0-9a-f]{64}")

IGNORED = frozenset(
    {"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "STOPSIGNAL", "HEALTHCHECK", "VOLUME", "MAINTAINER"}
)
REFUSED = {
    "USER": "not supported: the container runs as the job's user",
    "ADD": "not supported: use COPY; ADD's URLs and archive unpacking are not supported",
    "ONBUILD": "not supported: ONBUILD only matters to images built FROM this one",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLAG = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(?:=\S*)?(?:\s|$)")
_ESCAPE_DIRECTIVE = re.compile(r"\s*#\s*escape\s*=\s*([\\`])\s*$", re.IGNORECASE)
_DIRECTIVE = re.compile(r"\s*#\s*[A-Za-z]+\s*=.*$")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f]")


@dataclass(frozen=True)
class Step:
    """One instruction that changes the image, normalized.

    ARG: (name, default | None); ENV: ((key, value), ...) substituted;
    RUN: ("shell", text) or ("exec", (argv...)); COPY: ((src, ...), dest) substituted;
    WORKDIR: (path,) substituted, a relative one joined with the previous WORKDIR of the
    file (still relative when there is none: relative to the base image's); SHELL: (argv...).
    """

    kind: str
    args: tuple
    line: int


@dataclass(frozen=True)
class BuildFile:
    source: str  # the file's path as named in errors (relative to the task dir)
    base: str  # the FROM reference as written (pre-FROM ARGs substituted)
    base_line: int
    steps: tuple[Step, ...]
    # What the key covers besides the base: (kind, raw text) of each instruction that
    # changes the image (pre-FROM ARGs too), continuations joined; and the escape character.
    instructions: tuple[tuple[str, str], ...] = ()
    escape: str = "\\"


class BuildFileError(Exception):
    """A build file that cannot be used; `.problems` holds each problem, in file order."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column))
        super().__init__("\n".join(str(p) for p in self.problems))


class _Unsupported(ValueError):
    """A substitution form this subset does not take."""


# -- variable substitution and word splitting (Docker's shell lexer, the subset used here) --


class _Lexer:
    """Docker's word processing: quotes, the escape character and `$` substitution.
    `env` is the scope; `strict` False keeps an undefined variable as written."""

    def __init__(self, text: str, env: Mapping[str, str], escape: str, strict: bool) -> None:
        self.text = text
        self.pos = 0
        self.env = env
        self.escape = escape
        self.strict = strict

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _next(self) -> str:
        ch = self._peek()
        self.pos += 1
        return ch

    def words(self) -> list[str]:
        """The words of the text, split at unquoted whitespace, dequoted and substituted."""
        words: list[str] = []
        while True:
            while self._peek().isspace():
                self.pos += 1
            if not self._peek():
                return words
            words.append(self._word(split=True))

    def whole(self) -> str:
        """The text as one word (no splitting), dequoted and substituted."""
        return self._word(split=False)

    def _word(self, split: bool) -> str:
        out: list[str] = []
        while True:
            ch = self._peek()
            if not ch or (split and ch.isspace()):
                return "".join(out)
            self.pos += 1
            if ch == self.escape:
                out.append(self._next())
            elif ch == "'":
                out.append(self._until("'"))
            elif ch == '"':
                out.append(self._double_quoted())
            elif ch == "$":
                out.append(self._variable())
            else:
                out.append(ch)

    def _until(self, end: str) -> str:
        start = self.pos
        found = self.text.find(end, start)
        if found < 0:
            raise _Unsupported(f"unterminated quote {end}")
        self.pos = found + 1
        return self.text[start:found]

    def _double_quoted(self) -> str:
        out: list[str] = []
        while True:
            ch = self._next()
            if not ch:
                raise _Unsupported('unterminated quote "')
            if ch == '"':
                return "".join(out)
            if ch == self.escape and self._peek() in ('"', "$", self.escape):
                out.append(self._next())
            elif ch == "$":
                out.append(self._variable())
            else:
                out.append(ch)

    def _variable(self) -> str:
        start = self.pos - 1
        if self._peek() == "{":
            self.pos += 1
            name = self._name()
            if not name:
                raise _Unsupported("expected a variable name after ${")
            operator, word = "", ""
            if self.text.startswith((":-", ":+"), self.pos):
                operator = self.text[self.pos : self.pos + 2]
                self.pos += 2
                word = self._braced_word()
            elif self._peek() != "}":
                raise _Unsupported(
                    f"${{{name}{self._peek()}...}}: only ${{X}}, ${{X:-default}} and "
                    "${X:+value} are supported"
                )
            self.pos += 1  # the closing brace
            written = self.text[start : self.pos]
        else:
            name = self._name()
            if not name:
                return "$"
            operator, word, written = "", "", self.text[start : self.pos]
        return self._value(name, operator, word, written)

    def _name(self) -> str:
        match = _NAME.match(self.text, self.pos)
        if not match:
            return ""
        self.pos = match.end()
        return match.group()

    def _braced_word(self) -> str:
        """The word of ${X:-word} up to its closing brace, itself substituted."""
        out: list[str] = []
        while True:
            ch = self._peek()
            if not ch:
                raise _Unsupported("unterminated ${")
            if ch == "}":
                return "".join(out)
            self.pos += 1
            if ch == self.escape:
                out.append(self._next())
            elif ch == "$":
                out.append(self._variable())
            else:
                out.append(ch)

    def _value(self, name: str, operator: str, word: str, written: str) -> str:
        if name not in self.env and not self.strict:
            return written
        value = self.env.get(name)
        if operator == ":-":
            return value if value else word
        if operator == ":+":
            return word if value else ""
        return value or ""


# -- parsing --


@dataclass
class _State:
    source: str
    escape: str
    base_env: Mapping[str, str] | None
    problems: list[Problem]
    global_args: dict[str, str]
    scope: dict[str, str]  # ARG and ENV values so far (after FROM)
    workdir: str = ""
    after_from: bool = False
    env_names: set[str] = field(default_factory=set)  # ENV overrides ARG of the same name

    def problem(self, line: int, field: str, message: str) -> None:
        self.problems.append(Problem(self.source, line, 0, field, message))

    def lexer(self, text: str) -> _Lexer:
        if not self.after_from:
            return _Lexer(text, self.global_args, self.escape, strict=False)
        strict = self.base_env is not None
        env = {**(self.base_env or {}), **self.scope}
        return _Lexer(text, env, self.escape, strict)


def _escape_character(lines: list[str]) -> str:
    for line in lines:
        match = _ESCAPE_DIRECTIVE.match(line)
        if match:
            return match.group(1)
        if not _DIRECTIVE.match(line):
            break
    return "\\"


def _lines(text: str) -> list[str]:
    """The file's lines, split at newlines only (str.splitlines would also split at form
    feeds, \\x1c-\\x1e, U+2028 ...), a carriage return before one dropped (Docker's rule)."""
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _instructions(lines: list[str]) -> list[dict]:
    """dockerfile-parse's instructions, comments left out. A blank line inside a
    continuation does not end it (Docker's rule): blank lines are read as comments."""
    text = "".join(("#" if not line.strip() else line) + "\n" for line in lines)
    parser = DockerfileParser(fileobj=io.StringIO(text), env_replace=False)
    return [entry for entry in parser.structure if entry["instruction"] != "COMMENT"]


def _dangling_continuation(lines: list[str], escape: str) -> int:
    """The line (1-based) of a continuation the file ends in, else 0: dockerfile-parse
    drops such a last instruction silently."""
    continuation = re.compile(re.escape(escape) + r"[ \t]*$")
    for number in range(len(lines), 0, -1):
        line = lines[number - 1].strip()
        if not line or line.startswith("#"):
            continue
        return number if continuation.search(line) else 0
    return 0


def _bad_text(value: object) -> str:
    """Why a step's value cannot be used (a control character, not UTF-8), else ""."""
    if isinstance(value, tuple):
        return next((why for why in map(_bad_text, value) if why), "")
    if not isinstance(value, str):
        return ""
    control = _CONTROL.search(value)
    if control:
        return (
            f"holds the control character {control.group()!r}: "
            "expected text without NUL or control characters (but tab)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "holds text that is not valid UTF-8 (a lone surrogate)"
    return ""


def parse(text: str, source: str, base_env: Mapping[str, str] | None = None) -> BuildFile:
    """The build file `text` (named `source` in errors), checked and normalized.

    `base_env`: the base image's environment, given by the builder only: then every
    variable is substituted (undefined ones are empty); without it, variables the file
    does not define stay as written (what the key covers)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise BuildFileError(
            [Problem(source, 0, 0, "", f"over {MAX_BYTES // 1024} KiB: not a build file")]
        )
    lines = _lines(text)
    escape = _escape_character(lines)
    instructions = _instructions(lines)
    if not instructions:
        raise BuildFileError(
            [Problem(source, 0, 0, "", "empty build file: expected FROM <image reference>")]
        )
    state = _State(source, escape, base_env, [], {}, {})
    dangling = _dangling_continuation(lines, escape)
    if dangling:
        state.problem(
            dangling,
            "",
            f"the file ends inside a continuation (the line ends with {escape}): "
            "finish the instruction or remove the trailing escape",
        )
    base, base_line = "", 0
    steps: list[Step] = []
    counted: list[tuple[str, str]] = []
    for entry in instructions:
        kind, value, line = entry["instruction"], entry["value"].strip(), entry["startline"] + 1
        if kind != "FROM" and kind not in IGNORED:
            counted.append((kind, _key_text(kind, value, escape)))
        if kind == "FROM":
            if base_line:
                state.problem(
                    line,
                    "FROM",
                    f"a second FROM (line {base_line} is the first): "
                    "multi-stage builds are not supported",
                )
                continue
            base_line = line
            base = _base(state, value, line)
            state.after_from = True
            continue
        if not base_line:
            if kind == "ARG":
                for name, default in _arg(state, value, line):
                    if default is not None:
                        state.global_args[name] = default
                continue
            state.problem(line, kind, "expected FROM <image reference> first (ARGs may precede it)")
            base_line = -1  # report this once, then check the rest
            state.after_from = True
            continue
        if kind in IGNORED:
            continue
        if kind in REFUSED:
            state.problem(line, kind, REFUSED[kind])
            continue
        handler = _HANDLERS.get(kind)
        if handler is None:
            state.problem(line, kind, f"unknown instruction {kind}")
            continue
        steps.extend(_checked(state, handler, kind, entry["value"], line))
    if not base_line:
        state.problem(0, "", "no FROM: expected FROM <image reference>")
    if state.problems:
        raise BuildFileError(state.problems)
    return BuildFile(source, base, base_line, tuple(steps), tuple(counted), escape)


def _key_text(kind: str, value: str, escape: str) -> str:
    """The raw text the key covers: as written, but where the instruction splits its text
    into words (ARG, COPY but its JSON form, ENV key=value ...) the words joined by one
    space -- the same words, quotes and escapes kept, so the same meaning -- so spacing
    does not change it."""
    first = value.split(None, 1)
    splits = kind == "ARG" or (kind == "COPY" and not value.startswith("["))
    if not (splits or (kind == "ENV" and first and "=" in first[0])):
        return value
    try:
        return " ".join(_raw_words(_Lexer(value, {}, escape, strict=False)))
    except _Unsupported:
        return value  # refused by its handler anyway


def _checked(state: _State, handler, kind: str, value: str, line: int) -> list[Step]:
    """The handler's steps; a control character, text that is not UTF-8 (in the raw
    text, or from a JSON escape) or nesting too deep for Python is a problem of the line."""
    why = _bad_text(value)  # before strip(), which takes \v, \f, \x1c-\x1f too
    if why:
        state.problem(line, kind, why)
        return []
    value = value.strip()
    try:
        steps = handler(state, value, line)
    except RecursionError:
        state.problem(line, kind, "nested too deeply")
        return []
    for step in steps:
        why = _bad_text(step.args)
        if why:
            state.problem(line, kind, why)
            return []
    return steps


def _base(state: _State, value: str, line: int) -> str:
    if value.startswith("--"):
        state.problem(
            line, "FROM", "flags (--platform) are not supported: the node's platform is used"
        )
        return ""
    words = value.split()
    if len(words) == 3 and words[1].lower() == "as":
        words = words[:1]
    if len(words) != 1:
        state.problem(line, "FROM", f"expected FROM <image reference> [AS name], got {value!r}")
        return ""
    try:
        reference = _Lexer(words[0], state.global_args, state.escape, strict=True).whole()
    except RecursionError:
        state.problem(line, "FROM", "nested too deeply")
        return ""
    except _Unsupported as exc:
        state.problem(line, "FROM", str(exc))
        return ""
    if parse_reference(reference) is None:
        state.problem(line, "FROM", f"expected {REFERENCE_EXPECTED}, got {reference!r}")
        return ""
    return reference


def _words(state: _State, kind: str, value: str, line: int) -> list[str] | None:
    try:
        return state.lexer(value).words()
    except _Unsupported as exc:
        state.problem(line, kind, str(exc))
        return None


def _arg(state: _State, value: str, line: int) -> list[tuple[str, str | None]]:
    words = _words(state, "ARG", value, line)
    if not words:
        if words is not None:
            state.problem(line, "ARG", "expected ARG name[=default]")
        return []
    declared: list[tuple[str, str | None]] = []
    for word in words:
        name, has_default, default = word.partition("=")
        if not _NAME.fullmatch(name):
            state.problem(line, "ARG", f"expected ARG name[=default], got {word!r}")
            continue
        declared.append((name, default if has_default else None))
    return declared


def _arg_steps(state: _State, value: str, line: int) -> list[Step]:
    steps = []
    for name, default in _arg(state, value, line):
        if default is None:
            default = state.global_args.get(name)  # a pre-FROM ARG declared again
        if default is not None and name not in state.env_names:
            state.scope[name] = default
        steps.append(Step("ARG", (name, default), line))
    return steps


def _env_steps(state: _State, value: str, line: int) -> list[Step]:
    try:
        pairs = _env_pairs(state, value)
    except _Unsupported as exc:
        state.problem(line, "ENV", str(exc))
        return []
    if not pairs:
        state.problem(line, "ENV", "expected ENV key=value ... or ENV key value")
        return []
    for key, _ in pairs:
        if not key or "=" in key or any(ch.isspace() for ch in key):
            state.problem(line, "ENV", f"expected a variable name, got {key!r}")
            return []
    state.scope.update(pairs)
    state.env_names.update(key for key, _ in pairs)
    return [Step("ENV", tuple(pairs), line)]


def _env_pairs(state: _State, value: str) -> list[tuple[str, str]]:
    raw = _Lexer(value, {}, state.escape, strict=False)
    first = value.split(None, 1)
    if not first:
        return []
    if "=" not in first[0]:  # the legacy form: ENV key value (the rest of the line)
        if len(first) < 2:
            raise _Unsupported("expected ENV key=value ... or ENV key value")
        return [(first[0], state.lexer(first[1]).whole())]
    pairs = []
    for word in _raw_words(raw):
        if "=" not in word:
            raise _Unsupported(f"expected key=value, got {word!r}")
        key, _, val = word.partition("=")
        pairs.append((state.lexer(key).whole(), state.lexer(val).whole()))
    return pairs


def _raw_words(lexer: _Lexer) -> list[str]:
    """Words split at unquoted whitespace, quotes and escapes kept (to be processed
    each on its own, as Docker does for ENV's key=value words)."""
    words, start, quote, text, i = [], None, "", lexer.text, 0
    while i < len(text):
        ch = text[i]
        if start is None and not ch.isspace():
            start = i
        if quote:
            if ch == lexer.escape and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch == lexer.escape:
            i += 1
        elif ch in "'\"":
            quote = ch
        elif ch.isspace() and start is not None:
            words.append(text[start:i])
            start = None
        i += 1
    if quote:
        raise _Unsupported(f"unterminated quote {quote}")
    if start is not None:
        words.append(text[start:])
    return words


def _json_list(value: str) -> list[str] | None:
    if not value.startswith("["):
        return None
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    if isinstance(parsed, list) and parsed and all(isinstance(item, str) for item in parsed):
        return parsed
    return None


def _flags_refused(state: _State, kind: str, value: str, line: int, what: str) -> bool:
    if _FLAG.match(value):
        state.problem(line, kind, f"flags ({value.split()[0]}) are not supported: {what}")
        return True
    if value.startswith("<<"):
        state.problem(line, kind, "here-documents (<<) are not supported")
        return True
    return False


def _run_steps(state: _State, value: str, line: int) -> list[Step]:
    if _flags_refused(
        state, "RUN", value, line, "RUN takes a command only (no --mount, --network)"
    ):
        return []
    if not value:
        state.problem(line, "RUN", "expected a command")
        return []
    argv = _json_list(value)
    if argv is not None:
        return [Step("RUN", ("exec", tuple(argv)), line)]
    return [Step("RUN", ("shell", value), line)]


def _copy_steps(state: _State, value: str, line: int) -> list[Step]:
    if _flags_refused(
        state,
        "COPY",
        value,
        line,
        "COPY takes sources and a destination (no --from, --chown, --chmod, --link)",
    ):
        return []
    listed = _json_list(value)
    if listed is not None:
        try:
            words = [state.lexer(item).whole() for item in listed]
        except _Unsupported as exc:
            state.problem(line, "COPY", str(exc))
            return []
    else:
        found = _words(state, "COPY", value, line)
        if found is None:
            return []
        words = found
    if len(words) < 2:
        state.problem(line, "COPY", "expected COPY <source>... <destination>")
        return []
    sources, dest = tuple(words[:-1]), words[-1]
    bad = [source for source in sources if _outside(source)]
    if bad:
        state.problem(
            line,
            "COPY",
            f"source {bad[0]!r}: expected a path inside the build context (relative, no '..')",
        )
        return []
    if len(sources) > 1 and not dest.endswith("/"):
        state.problem(
            line, "COPY", f"several sources need a destination ending in '/', got {dest!r}"
        )
        return []
    return [Step("COPY", (sources, dest), line)]


def _outside(source: str) -> bool:
    return not source or source.startswith("/") or ".." in source.split("/")


def _workdir_steps(state: _State, value: str, line: int) -> list[Step]:
    try:
        path = state.lexer(value).whole() if value else ""
    except _Unsupported as exc:
        state.problem(line, "WORKDIR", str(exc))
        return []
    if not path:
        state.problem(line, "WORKDIR", "expected a directory")
        return []
    if not path.startswith("/") and state.workdir:
        path = posixpath.join(state.workdir, path)
    state.workdir = path
    return [Step("WORKDIR", (path,), line)]


def _shell_steps(state: _State, value: str, line: int) -> list[Step]:
    argv = _json_list(value)
    if argv is None:
        state.problem(line, "SHELL", 'expected a JSON list of strings, e.g. ["/bin/bash", "-c"]')
        return []
    return [Step("SHELL", tuple(argv), line)]


_HANDLERS = {
    "ARG": _arg_steps,
    "ENV": _env_steps,
    "RUN": _run_steps,
    "COPY": _copy_steps,
    "WORKDIR": _workdir_steps,
    "SHELL": _shell_steps,
}


# -- the files a build reads, and its key --


def _pattern_parts(source: str) -> list[str]:
    normal = posixpath.normpath(source)
    if normal == ".":
        return []
    # Go's filepath.Match negates a class with ^, fnmatch with !.
    return [part.replace("[^", "[!") for part in normal.split("/")]


def _matches(parts: list[str], path: str) -> bool:
    """Whether `path` is the source or lies under it (a directory source)."""
    names = path.split("/")
    if len(names) < len(parts):
        return False
    return all(fnmatch.fnmatchcase(name, part) for name, part in zip(names, parts, strict=False))


def source_files(source: str, context_files: Iterable[str]) -> list[str]:
    """The files (sorted) one COPY source names, of `context_files` (distinct paths): the
    file itself, or the files below a directory it names (globs per path component)."""
    parts = _pattern_parts(source)
    return sorted(path for path in context_files if _matches(parts, path))


def source_depth(source: str) -> int:
    """How many leading components of a matched file the source names ("." names the
    whole context: 0), so the files it matched can be grouped by what they matched."""
    return len(_pattern_parts(source))


def unmatched(build: BuildFile, line: int, source: str) -> Problem:
    """A COPY source that matches no file of the context, on its line."""
    message = (
        f"source {source!r} matches no file in the build context "
        "(the build file's directory, as tcloud uploads it)"
    )
    return Problem(build.source, line, 0, "COPY", message)


def copied_files(build: BuildFile, context_files: Iterable[str]) -> list[str]:
    """The files (relative to the context, '/'-separated, sorted) the COPY steps read, of
    `context_files` (every file in the context); a source that matches none is an error
    naming its COPY line."""
    files = sorted(set(context_files))
    copied: set[str] = set()
    problems: list[Problem] = []
    for step in build.steps:
        if step.kind != "COPY":
            continue
        for source in step.args[0]:
            found = source_files(source, files)
            if not found:
                problems.append(unmatched(build, step.line, source))
            copied.update(found)
    if problems:
        raise BuildFileError(problems)
    return sorted(copied)


def build_key(build: BuildFile, base_pinned: str, files: Mapping[str, tuple[str, bool]]) -> str:
    """`sha256:<64 hex>` over the base by digest, the escape character, the raw text of
    the instructions that change the image, and the sha256 (hex) and executable bit of
    each file the COPY steps read (`files`: every context file, by relative path ->
    (sha256 hex, executable)). The builder applies the mode: 0755 executable, else 0644."""
    reference = parse_reference(base_pinned)
    if reference is None or not reference.pinned:
        raise ValueError(f"{base_pinned!r}: expected the base pinned to a digest")
    copied = copied_files(build, files)
    canonical = {
        "format": KEY_FORMAT,
        "base": reference.by_digest(),
        "escape": build.escape,
        "instructions": [list(pair) for pair in build.instructions],
        "files": {path: [files[path][0], bool(files[path][1])] for path in copied},
    }
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()


def without_lines(build: BuildFile) -> BuildFile:
    """The same build with every line 0 (to compare two parses by content)."""
    return replace(build, base_line=0, steps=tuple(replace(step, line=0) for step in build.steps))


def find_build_file(names: Iterable[str]) -> str | None:
    """Of the file names in a directory, the build file it holds (Containerfile first)."""
    present = set(names)
    return next((name for name in BUILD_FILES if name in present), None)
