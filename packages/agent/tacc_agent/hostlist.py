"""Slurm hostlist expressions (n[2-3,5], gpu[01-04]x, r[1-2]n[1-2]) as node names,
read here instead of asking `scontrol show hostnames` once per job."""

from __future__ import annotations

import re

BRACKET = re.compile(r"\[([^\[\]]*)\]")
MAX_RANGE = 100_000
MAX_NAMES = 100_000


def split_top_level(text: str, opening: str = "[", closing: str = "]") -> list[str]:
    """Comma-separated words, not splitting inside brackets ("n[1,3],a" -> 2 words)."""
    words, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += (char == opening) - (char == closing)
        if char == "," and depth == 0:
            words.append(text[start:at])
            start = at + 1
    return [*words, text[start:]]


def bracket_names(inner: str) -> list[str] | None:
    """A bracket's names ("01-03,7" -> 01 02 03 7, zero padding kept); None if malformed."""
    names = []
    for part in inner.split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            return None
        if int(high or low) - int(low) > MAX_RANGE:  # no node has that many names
            return None
        width = len(low) if low.startswith("0") else 0
        names += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return names


def expand_hostlist(hostlist: str, most: int = MAX_NAMES) -> list[str]:
    """Slurm's hostlist expression as names: n[2-3,5], n[01-03], a,b, gpu-[1-2]x,
    r[1-2]n[1-2]; a malformed word names nobody, and an expression of more than `most`
    names (no cluster has them: r[0-99999]n[0-99999] would be 10^10) names nobody."""
    words = split_top_level(hostlist.strip())
    if sum(name_count(word) for word in words) > most:
        return []
    return [name for word in words for name in expand_word(word)]


def name_count(word: str) -> int:
    """How many names a word expands to, counted without expanding it."""
    count = 1
    for inner in BRACKET.findall(word):
        names = 0
        for part in inner.split(","):
            low, dash, high = part.partition("-")
            ranged = low.isdigit() and (not dash or high.isdigit())
            names += max(int(high or low) - int(low) + 1, 1) if ranged else 1
        count *= names
    return count


def expand_word(word: str) -> list[str]:
    found = BRACKET.search(word)
    if not found:
        return [word] if word and "[" not in word and "]" not in word else []
    inner = bracket_names(found.group(1))
    head, tail = word[: found.start()], word[found.end() :]
    rests = expand_word(tail) if tail else [""]
    return [head + name + rest for name in inner or [] for rest in rests]
