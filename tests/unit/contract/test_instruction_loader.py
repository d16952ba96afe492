"""The agent composes instruction.json with libyaml (fast) only after json.loads bounded
its depth: libyaml's composer recurses in C and a deep enough list crashes the process."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tacc_contract import instruction

CRASH_DEPTH = 200_000  # libyaml's composer segfaults near 100,000 (PyYAML 6, this machine)

PARSE_DEEP = f"""
import sys
from tacc_contract.instruction import InvalidInstruction, parse
deep = '[' * {CRASH_DEPTH} + ']' * {CRASH_DEPTH}
text = '{{"format": "tacc-instruction/1", "run": ' + deep + '}}'
try:
    parse(text, "instruction.json")
except InvalidInstruction as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.security
@pytest.mark.bad_input
def test_a_deeply_nested_instruction_is_refused_not_a_crash():
    done = subprocess.run([sys.executable, "-c", PARSE_DEEP], capture_output=True, text=True)
    assert done.returncode == 3, (done.returncode, done.stderr[-400:])
    assert "nested too deeply" in done.stdout


def test_json_goes_to_the_fast_composer_and_gives_the_same_tree():
    text = '{"a": [1, "two", {"b": null}], "c": "d"}'
    fast = instruction.compose(text)
    slow = yaml.compose(text, Loader=yaml.SafeLoader)
    assert yaml.serialize(fast) == yaml.serialize(slow)
    assert (fast.start_mark.line, fast.value[1][1].start_mark.line) == (0, 0)


@pytest.mark.bad_input
def test_text_that_is_not_json_is_composed_by_python_and_its_error_names_the_line():
    where = r"(?s)not valid JSON: .*line 2, column 9"
    with pytest.raises(instruction.InvalidInstruction, match=where):
        instruction.parse('{"a": 1,\n  "b": [}', "instruction.json")
