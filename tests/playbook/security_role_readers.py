"""Readers for files the roles write, following the programs that read them, so unit tests
can check what a rendered file *means* without a lab:

- `slurm_value`: one `Key=Value` line the way Slurm 22.05 reads it
  (src/common/parse_config.c: comments, continuation, escapes, the key=value regex with
  POSIX leftmost-longest matching);
- `pam_decision`: the verdict of a PAM account stack (Linux-PAM's control flags and
  [value=action] syntax, @include), with the modules sshd's stack uses simulated,
  pam_access reading its rules and pam_slurm_adopt following its 22.05 source.

security_files/ holds Debian 12's stock PAM files: /etc/pam.d/sshd of openssh-server
1:9.2p1-2+deb12u10 and the common-* files pam-auth-update writes with libpam-systemd.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

PAM_FILES = Path(__file__).parent / "security_files"

# --- Slurm ------------------------------------------------------------------------------

SPACE = " \t\n\v\f\r"  # POSIX [[:space:]]
KEY = re.compile(rf"^[{SPACE}]*([A-Za-z0-9_.]+)[{SPACE}]*([-*+/]?)=[{SPACE}]*")
QUOTED = re.compile(rf'"([^"]*)"(?=[{SPACE}]|$)')
UNQUOTED = re.compile(rf"([^{SPACE}]+)(?=[{SPACE}]|$)")


def _strip_comment(line: str) -> str:
    backslashes = 0
    for index, char in enumerate(line):
        if char == "#" and backslashes % 2 == 0:
            return line[:index]
        backslashes = backslashes + 1 if char == "\\" else 0
    return line


def _continues(line: str) -> bool:
    """An odd run of backslashes at the end (trailing whitespace skipped before it)."""
    run = len(line.rstrip(SPACE)) - len(line.rstrip(SPACE).rstrip("\\"))
    return run % 2 == 1


def _strip_escapes(line: str) -> str:
    out, index = [], 0
    while index < len(line):
        if line[index] == "\\":
            index += 1
        if index < len(line):
            out.append(line[index])
        index += 1
    return "".join(out)


def slurm_value(line: str) -> tuple[str, str]:
    """(key, value) of one configuration line; ValueError where Slurm would not read the
    value back unambiguously (a continuation, leftovers, or two equally long readings)."""
    line = _strip_comment(line)
    if _continues(line):
        raise ValueError("the line continues on the next one")
    text = _strip_escapes(line)
    key = KEY.match(text)
    if not key:
        raise ValueError("no key=value")
    rest = text[key.end() :]
    readings = {}
    if quoted := QUOTED.match(rest):
        readings[quoted.end()] = quoted.group(1)
    if unquoted := UNQUOTED.match(rest):
        if unquoted.end() in readings and readings[unquoted.end()] != unquoted.group(1):
            raise ValueError("quoted and unquoted readings are equally long")
        readings.setdefault(unquoted.end(), unquoted.group(1))
    if not readings:
        raise ValueError("no value")
    end = max(readings)
    if rest[end:].strip(SPACE):
        raise ValueError(f"parse error at {rest[end:]!r}")
    return key.group(1), readings[end]


# --- PAM --------------------------------------------------------------------------------

CONTROLS = {
    "required": {"success": "ok", "new_authtok_reqd": "ok", "ignore": "ignore", "default": "bad"},
    "requisite": {"success": "ok", "new_authtok_reqd": "ok", "ignore": "ignore", "default": "die"},
    "sufficient": {"success": "done", "new_authtok_reqd": "done", "default": "ignore"},
    "optional": {"success": "ok", "new_authtok_reqd": "ok", "default": "ignore"},
}


@dataclass(frozen=True)
class PamLine:
    control: dict[str, str]
    module: str
    args: tuple[str, ...]


def pam_stack(text: str, kind: str, includes: Path = PAM_FILES) -> list[PamLine]:
    """The `kind` (account, session, ...) lines of a PAM file, @include expanded from
    `includes` (files named debian12-pam.d-<name>)."""
    lines: list[PamLine] = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "@include":
            included = (includes / f"debian12-pam.d-{words[1]}").read_text()
            lines += pam_stack(included, kind, includes)
            continue
        if words[0].lstrip("-") != kind:
            continue
        control, rest = _control(raw.split("#", 1)[0].strip().split(None, 1)[1])
        module, *args = rest.split()
        lines.append(PamLine(control, module, tuple(args)))
    return lines


def _control(text: str) -> tuple[dict[str, str], str]:
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        return dict(pair.split("=", 1) for pair in inside.split()), rest.strip()
    word, rest = text.split(None, 1)
    return CONTROLS[word], rest.strip()


@dataclass
class Login:
    """Who logs in over SSH, and what pam_slurm_adopt would find on the node."""

    user: str
    groups: tuple[str, ...] = ()
    has_job_here: bool = False
    jobs_on_node: bool = True  # any user's job at all (else the module's "generic" path)
    messages: list[str] = field(default_factory=list)


def _access(rules_file: str, login: Login, nodefgroup: bool) -> str:
    """pam_access: the first rule whose users match decides ('+' grants)."""
    for raw in Path(rules_file).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        permission, users, _origins = line.split(":", 2)
        for token in users.split():
            group = token[1:-1] if token.startswith("(") and token.endswith(")") else None
            if (
                token == "ALL"  # noqa: S105 (a pam_access keyword)
                or (group is None and token == login.user)
                or (group is not None and group in login.groups)
                or (group is None and not nodefgroup and token in login.groups)
            ):
                return "success" if permission == "+" else "perm_denied"
    return "success"


def _slurm_adopt(options: dict[str, str], login: Login) -> str:
    """pam_slurm_adopt 22.05's pam_sm_acct_mgmt for the sshd service."""
    if login.user == "root":
        return "ignore"
    if not login.jobs_on_node:
        login.messages.append("No Slurm jobs found on node.")
        action = options.get("action_generic_failure", "ignore")
        return {"deny": "perm_denied", "allow": "success"}.get(action, "ignore")
    if not login.has_job_here:
        if options.get("action_no_jobs", "deny") == "deny":
            login.messages.append(
                "Access denied by pam_slurm_adopt: you have no active jobs on this node"
            )
            return "perm_denied"
        return "ignore"
    return "success"  # adopted into the user's job


def _module_result(line: PamLine, login: Login) -> str:
    options = dict(arg.split("=", 1) for arg in line.args if "=" in arg)
    match line.module:
        case "pam_nologin.so" | "pam_unix.so" | "pam_permit.so":
            return "success"
        case "pam_deny.so":
            return "auth_err"
        case "pam_access.so":
            return _access(options["accessfile"], login, "nodefgroup" in line.args)
        case "pam_slurm_adopt.so":
            return _slurm_adopt(options, login)
    raise AssertionError(f"no simulation of {line.module}")


def pam_decision(stack: list[PamLine], login: Login) -> bool:
    """Linux-PAM's _pam_dispatch_aux over the stack: True when the stack succeeds."""
    impression, status, skip = "undef", "perm_denied", 0
    for line in stack:
        if skip:
            skip -= 1
            continue
        result = _module_result(line, login)
        action = line.control.get(result, line.control.get("default", "bad"))
        if action in ("ok", "done"):
            undecided = impression == "undef" or (impression, status) == ("positive", "success")
            if undecided and result != "ignore":
                impression, status = "positive", result
            if impression == "positive" and action == "done":
                break
        elif action in ("bad", "die"):
            if impression != "negative":
                impression = "negative"
                status = result if result != "success" else "perm_denied"
            if action == "die":
                break
        elif action == "reset":
            impression, status = "undef", "perm_denied"
        elif action.isdigit():
            skip = int(action)
    return impression == "positive" and status == "success"
