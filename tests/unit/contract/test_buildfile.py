"""The build file of `image: {build: PATH}` (tacc_contract.buildfile): what is accepted,
normalized, ignored and refused (file:line and why), the files the COPY steps read and the
content key."""

from __future__ import annotations

import pytest

from tacc_contract.buildfile import (
    BuildFileError,
    Step,
    build_key,
    copied_files,
    find_build_file,
    parse,
    without_lines,
)

BASE = "n1:5000/tacc/base:bookworm"
PINNED = BASE + "@sha256:" + "a" * 64
SRC = "env/Containerfile"


def problems(text: str) -> list[str]:
    with pytest.raises(BuildFileError) as caught:
        parse(text, SRC)
    return [str(problem) for problem in caught.value.problems]


def test_a_full_file_normalized() -> None:
    text = (
        "# escape=\\\n"
        "ARG PY=3.11\n"
        f"FROM {BASE} AS build\n"
        "LABEL maintainer=x\n"
        "ARG VER=2.0\n"
        'ENV A=1 B="x y" \\\n'
        "    C=${VER}\n"
        "ENV LEGACY some words $A\n"
        "# a comment\n"
        "RUN pip install numpy==$VER \\\n"
        "    && echo done\n"
        'RUN ["python3", "-c", "print(1)"]\n'
        "WORKDIR /opt/app\n"
        "WORKDIR sub\n"
        "COPY requirements.txt src/ ./\n"
        'SHELL ["/bin/bash", "-c"]\n'
        'CMD ["ignored"]\n'
        "ENTRYPOINT x\n"
    )
    build = parse(text, SRC)
    assert build.source == SRC
    assert build.base == BASE
    assert build.base_line == 3
    assert build.steps == (
        Step("ARG", ("VER", "2.0"), 5),
        Step("ENV", (("A", "1"), ("B", "x y"), ("C", "2.0")), 6),
        Step("ENV", (("LEGACY", "some words 1"),), 8),
        Step("RUN", ("shell", "pip install numpy==$VER     && echo done"), 10),
        Step("RUN", ("exec", ("python3", "-c", "print(1)")), 12),
        Step("WORKDIR", ("/opt/app",), 13),
        Step("WORKDIR", ("/opt/app/sub",), 14),
        Step("COPY", (("requirements.txt", "src/"), "./"), 15),
        Step("SHELL", ("/bin/bash", "-c"), 16),
    )


def test_substitution_forms() -> None:
    text = (
        f"FROM {BASE}\n"
        "ARG A=a\n"
        "ENV X=${A:-d} Y=${NONE:-d} Z=${A:+set} W=${NONE:+set} Q='$A' E=\\$A\n"
        "ENV P=/opt/bin:$PATH\n"
    )
    env = parse(text, SRC).steps[1].args
    assert dict(env) == {
        "X": "a",
        "Y": "${NONE:-d}",
        "Z": "set",
        "W": "${NONE:+set}",
        "Q": "$A",
        "E": "$A",
    }
    # A variable the file does not define stays as written; the builder gives the base env.
    assert parse(text, SRC).steps[2].args == (("P", "/opt/bin:$PATH"),)
    with_base = parse(text, SRC, base_env={"PATH": "/usr/bin"})
    assert dict(with_base.steps[1].args)["Y"] == "d"
    assert dict(with_base.steps[1].args)["W"] == ""
    assert with_base.steps[2].args == (("P", "/opt/bin:/usr/bin"),)


def test_env_values_before_the_line_and_env_over_arg() -> None:
    text = f"FROM {BASE}\nENV a=1\nENV a=2 b=$a\nARG a=3\nENV c=$a\n"
    steps = parse(text, SRC).steps
    assert steps[1].args == (("a", "2"), ("b", "1"))
    assert steps[3].args == (("c", "2"),)


def test_pre_from_args_substitute_the_base_and_carry_when_declared_again() -> None:
    text = "ARG TAG=bookworm\nFROM n1:5000/tacc/base:${TAG}\nARG TAG\nENV T=$TAG\n"
    build = parse(text, SRC)
    assert build.base == BASE
    assert build.steps == (
        Step("ARG", ("TAG", "bookworm"), 3),
        Step("ENV", (("T", "bookworm"),), 4),
    )


def test_backtick_escape_directive() -> None:
    text = f"# escape=`\nFROM {BASE}\nRUN echo a `\n  b\nENV W=C:\\dir\n"
    steps = parse(text, SRC).steps
    assert steps[0] == Step("RUN", ("shell", "echo a   b"), 3)
    assert steps[1].args == (("W", "C:\\dir"),)


def test_a_blank_line_inside_a_continuation_does_not_end_it() -> None:
    steps = parse(f"FROM {BASE}\nRUN a \\\n\n  b\n", SRC).steps
    assert steps == (Step("RUN", ("shell", "a   b"), 2),)


def test_copy_json_form_and_globs() -> None:
    steps = parse(f'FROM {BASE}\nCOPY ["a b.txt", "*.py", "/dst/"]\n', SRC).steps
    assert steps == (Step("COPY", (("a b.txt", "*.py"), "/dst/"), 2),)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", f"{SRC}: empty build file: expected FROM <image reference>"),
        ("# only a comment\n\n", f"{SRC}: empty build file"),
        ("RUN true\n", f"{SRC}:1: RUN: expected FROM <image reference> first"),
        ("ARG A=1\n", f"{SRC}: no FROM"),
        ("FROM ubuntu\n", f"{SRC}:1: FROM: expected an image reference with its registry"),
        ("FROM --platform=linux/amd64 " + BASE + "\n", f"{SRC}:1: FROM: flags (--platform)"),
        (
            f"FROM {BASE}\nFROM {BASE}\n",
            f"{SRC}:2: FROM: a second FROM (line 1 is the first): multi-stage",
        ),
        (
            f"FROM {BASE}\nUSER nobody\n",
            f"{SRC}:2: USER: not supported: the container runs as the job's user",
        ),
        (
            f"FROM {BASE}\nADD x /x\n",
            f"{SRC}:2: ADD: not supported: use COPY; ADD's URLs and archive",
        ),
        (f"FROM {BASE}\nONBUILD RUN x\n", f"{SRC}:2: ONBUILD: not supported"),
        (
            f"FROM {BASE}\nRUN --mount=type=cache,target=/c pip install x\n",
            f"{SRC}:2: RUN: flags (--mount",
        ),
        (f"FROM {BASE}\nRUN <<EOF\necho\nEOF\n", f"{SRC}:2: RUN: here-documents"),
        (f"FROM {BASE}\nFROBNICATE x\n", f"{SRC}:2: FROBNICATE: unknown instruction FROBNICATE"),
        (f"FROM {BASE}\nCOPY --from=build /a /b\n", f"{SRC}:2: COPY: flags (--from=build)"),
        (f"FROM {BASE}\nCOPY --chown=1:1 a /b\n", f"{SRC}:2: COPY: flags (--chown=1:1)"),
        (
            f"FROM {BASE}\nCOPY ../secret /b\n",
            f"{SRC}:2: COPY: source '../secret': expected a path inside",
        ),
        (f"FROM {BASE}\nCOPY /etc/passwd /b\n", f"{SRC}:2: COPY: source '/etc/passwd'"),
        (f"FROM {BASE}\nCOPY a/../../b /b\n", f"{SRC}:2: COPY: source 'a/../../b'"),
        (
            f"FROM {BASE}\nCOPY a b /dir\n",
            f"{SRC}:2: COPY: several sources need a destination ending in '/'",
        ),
        (f"FROM {BASE}\nCOPY a\n", f"{SRC}:2: COPY: expected COPY <source>... <destination>"),
        (f"FROM {BASE}\nSHELL /bin/bash -c\n", f"{SRC}:2: SHELL: expected a JSON list of strings"),
        (f"FROM {BASE}\nENV\n", f"{SRC}:2: ENV: expected ENV key=value"),
        (f"FROM {BASE}\nENV ONLYKEY\n", f"{SRC}:2: ENV: expected ENV key=value"),
        (f"FROM {BASE}\nENV a=1 b\n", f"{SRC}:2: ENV: expected key=value, got 'b'"),
        (f'FROM {BASE}\nENV a="open\n', f"{SRC}:2: ENV: unterminated quote"),
        (f"FROM {BASE}\nENV a=${{b#x}}\n", f"{SRC}:2: ENV: ${{b#...}}: only ${{X}}"),
        (f"FROM {BASE}\nARG 1bad=2\n", f"{SRC}:2: ARG: expected ARG name[=default], got '1bad=2'"),
        (f"FROM {BASE}\nWORKDIR\n", f"{SRC}:2: WORKDIR: expected a directory"),
        (f"FROM {BASE}\nRUN\n", f"{SRC}:2: RUN: expected a command"),
        (f"FROM {BASE}\nUSER", f"{SRC}:2: USER: not supported"),
    ],
)
def test_refused(text: str, expected: str) -> None:
    found = problems(text)
    assert any(line.startswith(expected) for line in found), found


def test_every_problem_is_reported_in_file_order() -> None:
    text = f"FROM {BASE}\nUSER x\nADD a b\nRUN ok\nFROM {BASE}\n"
    found = problems(text)
    assert [line.split(":")[1] for line in found] == ["2", "3", "5"]


def test_ignored_instructions_are_not_steps() -> None:
    ignored = (
        "LABEL a=b\nEXPOSE 80\nCMD x\nENTRYPOINT y\nSTOPSIGNAL TERM\nHEALTHCHECK NONE\n"
        "VOLUME /v\nMAINTAINER me\n"
    )
    assert parse(f"FROM {BASE}\n{ignored}", SRC).steps == ()


def test_over_the_size_limit() -> None:
    text = f"FROM {BASE}\n" + ("RUN true\n" * 30000)
    assert problems(text) == [f"{SRC}: over 256 KiB: not a build file"]


def test_copied_files_directories_globs_and_dot() -> None:
    files = ["Containerfile", "requirements.txt", "src/a.py", "src/sub/b.py", "notes.md", "x.py"]
    build = parse(f"FROM {BASE}\nCOPY requirements.txt *.py src/ /app/\n", SRC)
    assert copied_files(build, files) == ["requirements.txt", "src/a.py", "src/sub/b.py", "x.py"]
    everything = parse(f"FROM {BASE}\nCOPY . /app\n", SRC)
    assert copied_files(everything, files) == sorted(files)
    nested_glob = parse(f"FROM {BASE}\nCOPY src/*.py /app/\n", SRC)
    assert copied_files(nested_glob, files) == ["src/a.py"]


def test_a_copy_source_matching_nothing_names_its_line() -> None:
    build = parse(f"FROM {BASE}\nRUN true\nCOPY missing.txt /app/\n", SRC)
    with pytest.raises(BuildFileError) as caught:
        copied_files(build, ["Containerfile"])
    assert str(caught.value).startswith(f"{SRC}:3: COPY: source 'missing.txt' matches no file")


def test_build_key_covers_content_not_layout() -> None:
    files = {
        "Containerfile": ("0" * 64, False),
        "req.txt": ("1" * 64, False),
        "other": ("2" * 64, False),
    }
    text = f"FROM {BASE}\nCOPY req.txt /r\nRUN pip install -r /r\n"
    key = build_key(parse(text, SRC), PINNED, files)
    assert key.startswith("sha256:") and len(key) == 71
    # Comments, blank lines, ignored instructions, the file's name: same key.
    relaid = f"# c\n\nFROM {BASE}\nLABEL x=y\nCOPY  req.txt   /r\n\nRUN pip install -r /r\n"
    assert build_key(parse(relaid, "Dockerfile"), PINNED, files) == key
    # A file the build does not read: same key; one it reads, a step, the base: another.
    assert build_key(parse(text, SRC), PINNED, {**files, "other": ("3" * 64, False)}) == key
    assert build_key(parse(text, SRC), PINNED, {**files, "req.txt": ("4" * 64, False)}) != key
    assert build_key(parse(text + "RUN true\n", SRC), PINNED, files) != key
    assert build_key(parse(text, SRC), BASE + "@sha256:" + "b" * 64, files) != key
    # The tag is for people: the key follows the digest only.
    assert build_key(parse(text, SRC), "n1:5000/tacc/base@sha256:" + "a" * 64, files) == key


def test_build_key_needs_a_pinned_base() -> None:
    with pytest.raises(ValueError, match="pinned"):
        build_key(parse(f"FROM {BASE}\n", SRC), BASE, {})


def test_without_lines_and_find_build_file() -> None:
    one = parse(f"FROM {BASE}\nRUN a\n", SRC)
    two = parse(f"\n\nFROM {BASE}\n\nRUN a\n", SRC)
    assert one != two and without_lines(one) == without_lines(two)
    assert find_build_file(["Dockerfile", "Containerfile"]) == "Containerfile"
    assert find_build_file(["Dockerfile"]) == "Dockerfile"
    assert find_build_file(["x"]) is None
