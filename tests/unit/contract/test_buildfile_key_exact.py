"""The build key tells apart what builds differently (review of issue 19, findings 1, 2,
4, 7, 8 and the contract side of 3): a variable left as written vs an escaped or quoted
`$`, a file's executable bit, and the build file's text is refused with its line where it
holds a control character, text that is not UTF-8, JSON nested too deep, or ends inside a
continuation; lines are split at newlines only."""

from __future__ import annotations

import pytest

from tacc_contract.buildfile import KEY_FORMAT, BuildFileError, Step, build_key, parse

BASE = "n1:5000/tacc/base:bookworm"
PINNED = BASE + "@sha256:" + "a" * 64
SRC = "Containerfile"
FILES = {"tool.sh": ("1" * 64, False)}


def key(body: str, files: dict = FILES) -> str:
    return build_key(parse(f"FROM {BASE}\n{body}", SRC), PINNED, files)


def problems(text: str) -> list[str]:
    with pytest.raises(BuildFileError) as caught:
        parse(text, SRC)
    return [str(problem) for problem in caught.value.problems]


def test_the_key_format_is_bumped() -> None:
    assert KEY_FORMAT >= 2


@pytest.mark.security
@pytest.mark.parametrize(
    "variants",
    [
        ["ENV A=$X", "ENV A=\\$X", "ENV A='$X'"],
        ["ENV A=${X:-d}", "ENV A=\\${X:-d}", "ENV A='${X:-d}'"],
        ["ENV A $X", "ENV A \\$X"],
        ["WORKDIR /$X", "WORKDIR /\\$X", "WORKDIR '/$X'"],
        ["COPY tool.sh /$X", "COPY tool.sh /\\$X", "COPY tool.sh '/$X'"],
        ["ARG A=$X", "ARG A=\\$X"],
    ],
)
def test_an_undefined_variable_and_an_escaped_dollar_get_different_keys(variants) -> None:
    keys = {key(body + "\n") for body in variants}
    assert len(keys) == len(variants)


def test_the_escape_character_is_part_of_the_key() -> None:
    body = f"FROM {BASE}\nENV A=`$X\n"
    tick = build_key(parse("# escape=`\n" + body, SRC), PINNED, {})
    assert tick != build_key(parse(body, SRC), PINNED, {})


def test_spacing_between_words_keeps_the_key_spacing_inside_quotes_does_not() -> None:
    assert key("COPY tool.sh   /t\n") == key("COPY  tool.sh /t\n")
    assert key("ENV A=1    B=2\n") == key("ENV A=1 B=2\n")
    assert key('ENV A="1  2"\n') != key('ENV A="1 2"\n')
    assert key("ENV A 1  2\n") != key("ENV A 1 2\n")
    assert key("WORKDIR /a  b\n") != key("WORKDIR /a b\n")
    assert key('COPY ["tool.sh", "/a  b"]\n') != key('COPY ["tool.sh", "/a b"]\n')


@pytest.mark.security
def test_a_files_executable_bit_is_part_of_the_key() -> None:
    plain = key("COPY tool.sh /t\n", {"tool.sh": ("1" * 64, False)})
    assert plain != key("COPY tool.sh /t\n", {"tool.sh": ("1" * 64, True)})
    # A file the build does not copy: its mode does not matter.
    extra = {"tool.sh": ("1" * 64, False), "other": ("2" * 64, True)}
    assert key("COPY tool.sh /t\n", extra) == plain


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ("WORKDIR /a\x00b", "WORKDIR"),
        ('RUN ["echo", "a\\u0000b"]', "RUN"),
        ("RUN echo a\x00b", "RUN"),
        ("ENV A=a\x01b", "ENV"),
        ('ENV A="a\\u0000b"', None),  # no JSON in ENV: a literal backslash-u, accepted
        ('COPY ["tool.sh", "/a\\u001bb"]', "COPY"),
        ('SHELL ["/bin/sh\\u0000", "-c"]', "SHELL"),
        ("ARG A=x\x0by", "ARG"),  # \v splits words: A=x and y, both valid
        ("ENV A=a\rb", "ENV"),
    ],
)
def test_control_characters_are_refused_with_their_line(body: str, kind: str | None) -> None:
    text = f"FROM {BASE}\nRUN true\n{body}\n"
    if kind is None:
        parse(text, SRC)
        return
    [problem] = problems(text)
    assert problem.startswith(f"{SRC}:3: {kind}: holds the control character")
    assert "expected text without NUL or control characters" in problem


def test_a_tab_is_fine_and_crlf_line_ends_are_dropped() -> None:
    build = parse(f'FROM {BASE}\r\nENV A="a\tb"\r\nRUN echo x\r\n', SRC)
    assert build.steps == (Step("ENV", (("A", "a\tb"),), 2), Step("RUN", ("shell", "echo x"), 3))


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "body",
    ['RUN ["echo", "\\ud800"]', 'COPY ["tool.sh", "/\\udfff"]', "ENV A=\ud800", "RUN echo \udcff"],
)
def test_text_that_is_not_utf8_is_refused_with_its_line(body: str) -> None:
    [problem] = problems(f"FROM {BASE}\n{body}\n")
    assert problem.startswith(f"{SRC}:2: ") and "not valid UTF-8" in problem


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "body",
    [
        "RUN " + "[" * 100000,
        "SHELL " + "[" * 100000,
        "COPY " + "[" * 100000,
        "ENV A=" + "${X:-" * 30000 + "}" * 30000,
        "WORKDIR /" + "${X:-" * 30000 + "}" * 30000,
    ],
)
def test_deep_nesting_is_a_problem_of_its_line_not_a_crash(body: str) -> None:
    try:
        build = parse(f"FROM {BASE}\n{body}\n", SRC)
    except BuildFileError as exc:
        assert all(problem.line == 2 for problem in exc.problems)
    else:  # a shell-form RUN of brackets is the shell's business
        assert build.steps[0].kind == "RUN"


def test_deep_nesting_in_from_is_a_problem_of_its_line() -> None:
    [problem] = problems("ARG X=1\nFROM " + "${X:-" * 30000 + "}" * 30000 + "\n")
    assert problem.startswith(f"{SRC}:2: FROM: ")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "line"),
    [
        (f"FROM {BASE}\nRUN make install \\\n", 2),
        (f"FROM {BASE}\nRUN make install \\   \n\n# a comment\n\n", 2),
        (f"FROM {BASE}\nUSER x \\", 2),
        (f"# escape=`\nFROM {BASE}\nRUN a `\n", 3),
        (f"FROM {BASE}\nRUN a \\\n  b \\\n", 3),
    ],
)
def test_a_file_ending_inside_a_continuation_is_refused(text: str, line: int) -> None:
    found = problems(text)
    assert any(
        p.startswith(f"{SRC}:{line}: ") and "ends inside a continuation" in p for p in found
    ), found


def test_a_finished_continuation_and_a_trailing_comment_are_fine() -> None:
    build = parse(f"FROM {BASE}\nRUN a \\\n  b\n# done \\\n", SRC)
    assert build.steps == (Step("RUN", ("shell", "a   b"), 2),)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "separator", ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
)
def test_lines_split_at_newlines_only(separator: str) -> None:
    text = f"FROM {BASE}\nRUN echo a{separator}USER root\nRUN b\n"
    if separator in "\x0b\x0c\x1c\x1d\x1e":
        # A C0 control character: refused on its (unshifted) line, no USER split off.
        [problem] = problems(text)
        assert problem.startswith(f"{SRC}:2: RUN: holds the control character")
        return
    build = parse(text, SRC)
    assert build.steps == (
        Step("RUN", ("shell", f"echo a{separator}USER root"), 2),
        Step("RUN", ("shell", "b"), 3),
    )
