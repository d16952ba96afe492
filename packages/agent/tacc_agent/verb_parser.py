"""The agent's command line, built from the declared verbs (tcloud's in
tacc_contract.verbs, the node's and ops' in tacc_agent/node_verbs.py): each Verb's words
are nested sub-commands, each of its fields an argument. A parsed command line carries
the Verb it asked for (`args.declared`) and each field under the field's name.

`option_problem` checks the options with the contract's own checks (the CLI answers a
bad `--rank` as a rejected request, one JSON error line); positional words (job ids,
directories) are checked by the verb itself, which answers the same way."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from tacc_agent.node_verbs import NODE_VERBS
from tacc_contract.verbs import VERBS, Field, Verb

DESCRIPTION = "tacc-agent: the cluster side of TACC (JSON in, JSON out)"
# Verbs that also take --config after their words (`tacc-agent serve --config FILE`).
CONFIG_AFTER_VERB = ("check", "serve", "accept")
ALL_VERBS: tuple[Verb, ...] = (*VERBS, *NODE_VERBS)


def whole_word(text: str) -> int | str:
    """A whole number's word as the number; any other word stays text, for the field's
    own check to name (`--port: expected a TCP port 1..65535, got 'http'`)."""
    if text.isascii() and text.lstrip("-").isdigit():
        return int(text)
    return text


def number_word(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


WORD_TYPES = {int: whole_word, float: number_word, str: str}
# A number field without a check of its own keeps argparse's strict types (a usage error).
STRICT_TYPES = {int: int, float: float, str: str}


def add_field(parser: argparse.ArgumentParser, item: Field) -> None:
    if item.kind is list:  # the words after `--` (parse_command_line)
        parser.set_defaults(**{item.name: list(item.default or ())})
        return
    if not item.flag:
        parser.add_argument(item.name, nargs="+" if item.many else None, help=item.help)
        return
    names = [item.short, item.flag] if item.short else [item.flag]
    if item.kind is bool:
        parser.add_argument(*names, dest=item.name, action="store_true", help=item.help)
        return
    parser.add_argument(
        *names,
        dest=item.name,
        type=(WORD_TYPES if item.problem is not None else STRICT_TYPES)[item.kind],
        default=item.default,
        choices=item.choices or None,
        help=item.help,
    )


def build_parser(
    parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser,
    verbs: Iterable[Verb] = ALL_VERBS,
) -> argparse.ArgumentParser:
    parser = parser_class(prog="tacc-agent", description=DESCRIPTION)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "--config", type=Path, help="settings file (default /etc/tacc-agent/config.yaml)"
    )
    parser.add_argument("--userdir", help="use this directory instead of <workspace>/<user>")
    parser.set_defaults(declared=None)
    verbs = tuple(verbs)
    names = {verb.words for verb in verbs}
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {(): parser}
    children: dict[tuple[str, ...], argparse._SubParsersAction] = {}
    for verb in verbs:
        for depth in range(1, len(verb.words) + 1):
            prefix = verb.words[:depth]
            if prefix in parsers:
                continue
            above = prefix[:-1]
            if above not in children:
                dest = "word" if not above else f"word{len(above) + 1}"
                children[above] = parsers[above].add_subparsers(
                    dest=dest, required=bool(above) and above not in names
                )
            help_text = verb.help if prefix == verb.words else None
            parsers[prefix] = children[above].add_parser(prefix[-1], help=help_text)
        leaf = parsers[verb.words]
        leaf.set_defaults(declared=verb)
        for item in verb.fields:
            add_field(leaf, item)
        if verb.name in CONFIG_AFTER_VERB:
            leaf.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="settings")
    return parser


def field_values(args: argparse.Namespace) -> dict[str, object]:
    """The asked verb's fields, by name, as parsed."""
    declared: Verb | None = args.declared
    return {item.name: getattr(args, item.name) for item in declared.fields} if declared else {}


def option_problem(args: argparse.Namespace) -> str:
    """What is wrong with the asked verb's options ("" when nothing): the contract's own
    checks of each option, and its check across fields."""
    declared: Verb | None = args.declared
    if declared is None:
        return ""
    values = field_values(args)
    for item in declared.fields:
        value = values[item.name]
        checked = item.flag and item.problem is not None and value is not None
        if checked and (problem := item.problem(value)):
            return f"{item.flag}: {problem}"
    if declared.across is not None:
        return declared.across(values)
    return ""
