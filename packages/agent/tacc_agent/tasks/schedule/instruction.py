"""The agent's side of the instruction (tacc_contract.instruction): every instruction it
receives is parsed with the plug-in words its operator configured (`plugins` in the
agent config, set once by the CLI at start), before anything is made from it, and with
its container image pinned to a digest (tcloud resolves it at submit: the task's digest
then covers the image's bits, and a rerun runs the same ones)."""

from __future__ import annotations

from pathlib import Path

from tacc_contract import instruction as contract
from tacc_contract.schema import TaskSpec

# Plug-in words ops named in the agent config (`plugins`), set by the CLI at start.
CONFIGURED: list[str] = []


def configure(words: tuple | list) -> None:
    CONFIGURED[:] = [str(w) for w in words]


def parse(text: str, source: str) -> TaskSpec:
    return contract.parse(text, source, CONFIGURED, pinned=True)


def load(job_dir: Path) -> TaskSpec:
    return contract.load(job_dir, CONFIGURED, pinned=True)
