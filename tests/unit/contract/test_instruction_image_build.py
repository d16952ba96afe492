"""The cluster's reading of an instruction's `task.image_build` (an image built from the
task's build file, tacc_contract.buildfile): the base pinned to a digest, a content key,
paths inside the task directory, the context the build file's directory, and never
together with `task.image`."""

from __future__ import annotations

import json

import pytest

from tacc_contract.instruction import FORMAT, InvalidInstruction, parse

DIGEST = "sha256:" + "ab" * 32
PINNED = f"n1:5000/tacc/base:bookworm@{DIGEST}"
KEY = "sha256:" + "cd" * 32
BUILD = {"file": "env/Containerfile", "context": "env", "base": PINNED, "key": KEY}


def instruction(image_build: object, **task_fields: object) -> str:
    task = {"name": "t", "run": ["true"], "image_build": image_build, **task_fields}
    return json.dumps({"format": FORMAT, "task": task, "manifest": {}})


def refused(text: str, pinned: bool = True) -> str:
    with pytest.raises(InvalidInstruction) as caught:
        parse(text, "instruction.json", pinned=pinned)
    return str(caught.value)


def test_a_build_is_read_into_the_spec() -> None:
    spec = parse(instruction(BUILD), "instruction.json", pinned=True)
    assert spec.image_build == BUILD
    assert spec.image is None
    assert "image_build" not in spec.extensions


def test_a_build_file_at_the_top_of_the_task_has_the_empty_context() -> None:
    build = {**BUILD, "file": "Containerfile", "context": ""}
    assert parse(instruction(build), "instruction.json", pinned=True).image_build == build


def test_an_instruction_without_a_build_has_none() -> None:
    text = json.dumps({"format": FORMAT, "task": {"name": "t", "run": ["x"]}, "manifest": {}})
    assert parse(text, "instruction.json", pinned=True).image_build is None


@pytest.mark.security
def test_the_cluster_refuses_a_base_not_pinned_to_a_digest() -> None:
    message = refused(instruction({**BUILD, "base": "n1:5000/tacc/base:bookworm"}))
    assert "task.image_build.base" in message and "pinned to a digest" in message, message
    # tcloud's own reading before it resolves takes the tag.
    build = {**BUILD, "base": "n1:5000/tacc/base:bookworm"}
    assert parse(instruction(build), "instruction.json").image_build == build


@pytest.mark.security
@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("file", "../Containerfile", "task.image_build.file: expected a path relative"),
        ("file", "/etc/Containerfile", "task.image_build.file: expected a path relative"),
        ("context", "..", "task.image_build.context: expected a path relative"),
        ("context", "/", "task.image_build.context: expected a path relative"),
    ],
)
def test_the_cluster_refuses_paths_outside_the_job_code(field, value, expected) -> None:
    assert expected in refused(instruction({**BUILD, field: value}))


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("build", "expected"),
    [
        ({**BUILD, "key": "sha256:abc"}, "task.image_build.key: expected sha256:<64 hex>"),
        ({**BUILD, "key": "md5:" + "0" * 32}, "task.image_build.key: expected sha256:<64 hex>"),
        ({**BUILD, "context": "other"}, "task.image_build.context: expected the build file's"),
        ({**BUILD, "base": "ubuntu"}, "task.image_build.base: expected an image reference"),
        ({k: v for k, v in BUILD.items() if k != "key"}, "task.image_build.key: missing"),
        ({**BUILD, "extra": 1}, "task.image_build.extra: unknown key"),
        ("Containerfile", "task.image_build: expected a mapping"),
    ],
)
def test_the_cluster_refuses_a_malformed_build(build, expected) -> None:
    assert expected in refused(instruction(build))


@pytest.mark.bad_input
def test_not_both_an_image_and_a_build() -> None:
    message = refused(instruction(BUILD, image=PINNED))
    assert "task.image_build: not with task.image" in message, message


@pytest.mark.bad_input
def test_the_instruction_image_is_never_a_build_mapping() -> None:
    text = json.dumps(
        {"format": FORMAT, "task": {"name": "t", "run": ["x"], "image": {"build": "."}}}
    )
    assert "task.image: expected an image reference" in refused(text, pinned=False)


@pytest.mark.bad_input
def test_a_build_excludes_modules() -> None:
    message = refused(instruction(BUILD, environment={"modules": ["gcc"]}))
    assert "task.environment.modules: not with 'image'" in message, message
