"""What the docs and examples teach: a notebook (Jupyter, TensorBoard, a plain HTTP
server) in a code block or an example file listens on loopback or a Unix socket, never
on every address of the node, where any other user of the cluster could reach it
(docs/interactive.md, `tcloud forward`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE_SUFFIXES = {".md", ".yaml", ".yml", ".py", ".sh", ".toml", ".txt", ".ipynb"}
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SERVER = re.compile(r"\b(jupyter|notebook|tensorboard|http\.server|streamlit|gradio)\b", re.I)
EVERY_ADDRESS = re.compile(
    r"(--ip[= ]?['\"]?(0\.0\.0\.0|\*|::)|--bind[= ]?['\"]?(0\.0\.0\.0|::)|--bind_all"
    r"|--host[= ]?['\"]?(0\.0\.0\.0|::)|server_address[= ]['\"]?0\.0\.0\.0)"
)


def taught() -> list[tuple[str, str]]:
    """(file, text) of every docs code block and every example file."""
    found = []
    for doc in sorted((ROOT / "docs").rglob("*.md")):
        found += [(str(doc.relative_to(ROOT)), block) for block in FENCE.findall(doc.read_text())]
    for example in sorted((ROOT / "examples").rglob("*")):
        if example.is_file() and example.suffix in EXAMPLE_SUFFIXES:
            found.append((str(example.relative_to(ROOT)), example.read_text(errors="replace")))
    return found


def exposed_lines(text: str) -> list[str]:
    return [
        line for line in text.splitlines() if SERVER.search(line) and EVERY_ADDRESS.search(line)
    ]


def test_the_check_sees_a_notebook_on_every_address():
    assert exposed_lines('run: ["jupyter lab --no-browser --ip=0.0.0.0 --port=8888"]')
    assert exposed_lines("tensorboard --logdir runs --bind_all")
    assert not exposed_lines('run: ["jupyter lab --no-browser --ip=127.0.0.1 --port=8888"]')
    assert not exposed_lines("jupyter lab --no-browser --sock /home/me/.run/jupyter.sock")


@pytest.mark.security
def test_docs_and_examples_bind_no_notebook_to_every_address():
    exposed = [f"{name}: {line.strip()}" for name, text in taught() for line in exposed_lines(text)]
    assert exposed == []
