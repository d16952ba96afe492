"""Jinja filters: a string written as one value of a Slurm configuration file
(slurm.conf, slurmdbd.conf) so that Slurm reads back exactly that string.

How Slurm 22.05 reads a line (src/common/parse_config.c):
1. a `#` preceded by an even number of backslashes starts a comment;
2. a line ending in an odd number of backslashes continues on the next line;
3. every backslash is then dropped and the character after it kept (`\\#` -> `#`,
   `\\\\` -> `\\`);
4. a value is either `"..."` (anything but a double quote, spaces allowed) or a run of
   non-space characters.

So a value is written with `\\` before every backslash and `#`, and in double quotes
when it holds a space or tab. What no line can hold: nothing at all, a line break or NUL
(refused with any whitespace other than space and tab, which the reader may or may not
count as space), a double quote together with a space or tab (a quoted value cannot
contain `"`), and a leading double quote (the reader could take `"abc"` for the quoted
value abc).
"""

from __future__ import annotations

import re

# Spaces and tabs are written in double quotes. Any other whitespace (line breaks, \r, \v,
# \f, Unicode spaces, which a UTF-8 regex may count as space) and NUL are refused.
_QUOTED_WHITESPACE = re.compile(r"[ \t]")
_UNWRITABLE = re.compile(r"[^\S \t]|\x00")


def tacc_slurm_conf_value_problem(value: object) -> str:
    """Why `value` cannot be written as a Slurm configuration value; "" when it can.
    The reason never repeats the value (it may be a secret)."""
    text = str(value)
    if not text:
        return "is empty, which Slurm reads as no value at all"
    if _UNWRITABLE.search(text):
        return (
            "contains a line break, NUL or whitespace other than space and tab, which a "
            "Slurm configuration line cannot hold"
        )
    if text.startswith('"'):
        return "starts with a double quote, which Slurm would read as quoting"
    if '"' in text and _QUOTED_WHITESPACE.search(text):
        return (
            "contains both whitespace and a double quote: Slurm reads a value with "
            "whitespace only in double quotes, and a quoted value cannot contain one"
        )
    return ""


def tacc_slurm_conf_value(value: object) -> str:
    """`value` escaped (and quoted when it holds whitespace) for a Slurm config line."""
    text = str(value)
    problem = tacc_slurm_conf_value_problem(text)
    if problem:
        raise ValueError(f"a Slurm configuration value {problem}")
    escaped = text.replace("\\", "\\\\").replace("#", "\\#")
    return f'"{escaped}"' if _QUOTED_WHITESPACE.search(text) else escaped


class FilterModule:
    def filters(self) -> dict:
        return {
            "tacc_slurm_conf_value": tacc_slurm_conf_value,
            "tacc_slurm_conf_value_problem": tacc_slurm_conf_value_problem,
        }
