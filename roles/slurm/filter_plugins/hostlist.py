"""Jinja filters: Slurm hostlist expressions for slurm.conf (NodeName, NodeAddr, Nodes=).

How Slurm reads a hostlist (slurm.conf(5), "node range expression"): comma-separated
terms; a term is a plain name or PREFIX[RANGES], RANGES being comma-separated N or LO-HI.
Each range is printed with the width of its LO, leading zeros included, so gpu[0001-0010]
is gpu0001..gpu0010 and n[8-10] is n8, n9, n10. The range must end the name
("unit[0-31]rack" is invalid), so only a trailing run of digits is compressed: gpu1-ib or
login stay plain names. Slurm expands a list in the order written; NodeName and NodeAddr
on one line are paired by position, which is why `tacc_slurm_nodes` compresses the
addresses in exactly the order of the names.

Written conservatively (Slurm 22.05): one bracket holds only ascending ranges of one width
class (all unpadded, or all padded to the same width); anything else starts a new term.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
# Characters that separate or delimit hostlist terms: a name containing one cannot be
# written in a hostlist at all.
_RESERVED = re.compile(r"[\[\],\s]")


def _split(name: str) -> tuple[str, str]:
    """("gpu", "0001") for gpu0001; (name, "") when there is nothing to compress."""
    match = _TRAILING_DIGITS.match(name)
    if match is None or not match.group(1):
        return name, ""
    return match.group(1), match.group(2)


def _padded(digits: str) -> bool:
    return len(digits) > 1 and digits[0] == "0"


def natural_key(name: str) -> tuple[str, int, int, str]:
    """Sort key: by prefix, then number of digits, then number: n9 before n10, and
    gpu0999 next to gpu1000; gpu1 and gpu01 land in different runs."""
    prefix, digits = _split(name)
    return (prefix, len(digits), int(digits) if digits else -1, name)


class _Term:
    """One PREFIX[RANGES] term; each range is [LO as written, lo, hi]."""

    def __init__(self, prefix: str, digits: str) -> None:
        self.prefix = prefix
        self.width = len(digits) if _padded(digits) else 0  # 0: unpadded numbers
        self.ranges: list[list] = [[digits, int(digits), int(digits)]]

    def add(self, digits: str) -> bool:
        """Take the next number if the term can hold it in this position; else False."""
        value = int(digits)
        lo_text, _, hi = self.ranges[-1]
        if value <= hi:  # keep the order: Slurm expands left to right
            return False
        if self.width and len(digits) != self.width:
            return False
        if not self.width and _padded(digits):
            return False
        if value == hi + 1 and f"{value:0{len(lo_text)}d}" == digits:
            self.ranges[-1][2] = value
        else:
            self.ranges.append([digits, value, value])
        return True

    def __str__(self) -> str:
        if len(self.ranges) == 1 and self.ranges[0][1] == self.ranges[0][2]:
            return self.prefix + self.ranges[0][0]
        parts = [text if lo == hi else f"{text}-{hi:0{len(text)}d}" for text, lo, hi in self.ranges]
        return f"{self.prefix}[{','.join(parts)}]"


def _check(name: str) -> str:
    name = str(name)
    if not name or _RESERVED.search(name):
        raise ValueError(f"{name!r} cannot be written in a Slurm hostlist")
    return name


def compress(names: Iterable[str]) -> str:
    """The hostlist expression that expands to exactly `names`, in their order."""
    terms: list[_Term | str] = []
    for name in map(_check, names):
        prefix, digits = _split(name)
        if not digits:
            terms.append(name)
            continue
        last = terms[-1] if terms else None
        if not (isinstance(last, _Term) and last.prefix == prefix and last.add(digits)):
            terms.append(_Term(prefix, digits))
    return ",".join(map(str, terms))


def tacc_hostlist(nodes: str | Iterable[str]) -> str:
    """A set of hosts as a sorted hostlist: ["gpu02", "gpu01", "n3"] -> "gpu[01-02],n3".

    A string is taken as a comma-separated list ("ALL" stays "ALL"); a string that
    already holds a bracketed expression is returned unchanged.
    """
    if isinstance(nodes, str):
        if "[" in nodes:
            return nodes
        nodes = [n for n in re.split(r"[,\s]+", nodes) if n]
    return compress(sorted(set(map(_check, nodes)), key=natural_key))


def tacc_slurm_nodes(
    hosts: Iterable[str],
    hostvars: Mapping,
    cpus: object,
    memory_mb: object,
    gres: object,
    memory_factor: float,
) -> list[dict]:
    """slurm.conf's node lines for `hosts`: one dict per distinct hardware, {names, addrs,
    cpus, real_memory, gres}. names is a hostlist; addrs is the hostlist of the nodes'
    ansible_host in the order of the names ("" when every address is the node's name).

    Each host's ansible_host, slurm_node_cpus, slurm_node_memory_mb and slurm_node_gres
    come from hostvars, falling back to the arguments (the rendering host's values, as
    `| default(...)` would); RealMemory is memory * memory_factor, truncated. Looked up
    here rather than in a template loop: at thousands of hosts the per-host template
    code costs as much as Ansible's own hostvars lookup. Groups come in the order of
    their first node, so the result does not depend on the order of `hosts`.
    """
    groups: dict[tuple[str, int, str], list[tuple[str, str]]] = {}
    for host in hosts:
        values = hostvars[host]  # the costly part: all of the host's variables
        host_gres = values.get("slurm_node_gres", gres) or []
        key = (
            str(values.get("slurm_node_cpus", cpus)),
            int(float(values.get("slurm_node_memory_mb", memory_mb)) * float(memory_factor)),
            host_gres if isinstance(host_gres, str) else ",".join(map(str, host_gres)),
        )
        groups.setdefault(key, []).append((_check(host), _check(values.get("ansible_host", host))))
    result = []
    for (node_cpus, real_memory, node_gres), pairs in groups.items():
        pairs.sort(key=lambda pair: natural_key(pair[0]))
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"a node is listed twice in {names}")
        addrs = [addr for _, addr in pairs]
        group = {
            "names": compress(names),
            "addrs": "" if addrs == names else compress(addrs),
            "cpus": node_cpus,
            "real_memory": real_memory,
            "gres": node_gres,
        }
        result.append((natural_key(names[0]), group))
    return [group for _, group in sorted(result, key=lambda item: item[0])]


class FilterModule:
    def filters(self) -> dict:
        return {
            "tacc_hostlist": tacc_hostlist,
            "tacc_slurm_nodes": tacc_slurm_nodes,
        }
