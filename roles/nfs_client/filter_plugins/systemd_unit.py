"""Jinja filter: the systemd unit name of a mount point, as `systemd-escape --path`."""

from __future__ import annotations


def _escape_char(char: str) -> str:
    if char.isascii() and (char.isalnum() or char in ":_."):
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode())


def tacc_systemd_path_unit(path: str, suffix: str = "mount") -> str:
    """ "/shared/data-1" -> "shared-data\\x2d1.mount"; "/" -> "-.mount"."""
    parts = [p for p in str(path).split("/") if p]
    if not parts:
        return f"-.{suffix}"
    text = "-".join("".join(_escape_char(c) for c in part) for part in parts)
    if text.startswith("."):  # only a leading dot of the whole name is escaped
        text = "\\x2e" + text[1:]
    return f"{text}.{suffix}"


class FilterModule:
    def filters(self) -> dict:
        return {"tacc_systemd_path_unit": tacc_systemd_path_unit}
