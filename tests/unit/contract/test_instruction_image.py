"""The cluster's reading of an instruction's image (issue [13]): it must be pinned to a
digest (tcloud resolved it at submit), and it never goes with a venv or modules."""

from __future__ import annotations

import json

import pytest

from tacc_contract.instruction import FORMAT, InvalidInstruction, parse

DIGEST = "sha256:" + "ab" * 32


def instruction(image: str, **environment) -> str:
    task = {"name": "t", "run": ["true"], "image": image}
    if environment:
        task["environment"] = environment
    return json.dumps({"format": FORMAT, "task": task, "manifest": {}})


@pytest.mark.security
def test_the_cluster_refuses_an_image_that_is_not_pinned_to_a_digest():
    """A tag names whatever the registry holds when the job starts: only a digest pins the
    bits the task's digest promised."""
    with pytest.raises(InvalidInstruction) as caught:
        parse(instruction("n1:5000/tacc/base:bookworm"), "instruction.json", pinned=True)
    message = str(caught.value)
    assert "instruction.json:1:" in message and "task.image" in message, message
    assert "pinned to a digest" in message, message


def test_a_pinned_image_is_read_with_its_tag_and_digest():
    text = instruction(f"n1:5000/tacc/base:bookworm@{DIGEST}")
    spec = parse(text, "instruction.json", pinned=True)
    assert spec.image == f"n1:5000/tacc/base:bookworm@{DIGEST}"


def test_tcloud_reads_its_own_unpinned_instruction_before_it_resolves():
    spec = parse(instruction("n1:5000/tacc/base:bookworm"), "instruction.json")
    assert spec.image == "n1:5000/tacc/base:bookworm"


@pytest.mark.bad_input
def test_the_cluster_refuses_an_image_with_modules():
    text = instruction(f"n1:5000/tacc/base@{DIGEST}", modules=["cuda/12"])
    with pytest.raises(InvalidInstruction) as caught:
        parse(text, "instruction.json", pinned=True)
    assert "task.environment.modules" in str(caught.value) and "not with 'image'" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("key", "value"), [("requirements", ["numpy"]), ("lock", ["numpy==2.0.0"])]
)
def test_the_cluster_takes_an_image_with_a_venv_on_top(key, value):
    text = instruction(f"n1:5000/tacc/base@{DIGEST}", **{key: value})
    spec = parse(text, "instruction.json", pinned=True)
    assert spec.environment[key] == value


@pytest.mark.bad_input
def test_an_image_without_its_registry_is_refused_on_the_cluster_too():
    with pytest.raises(InvalidInstruction) as caught:
        parse(instruction(f"tacc/base@{DIGEST}"), "instruction.json", pinned=True)
    assert "task.image" in str(caught.value) and "with its registry" in str(caught.value)
