"""make demo's last lines: how to submit the next example as alice, from the user's shell."""

from __future__ import annotations

from pathlib import Path

from tacc_lab.demo import NEXT_EXAMPLE, ROOT, next_steps


def test_the_demo_ends_with_how_to_submit_the_next_example():
    lines = next_steps("lab", ROOT, ROOT).splitlines()
    assert (ROOT / NEXT_EXAMPLE / "tcloud.yaml").is_file()
    assert lines[0] == "demo done: the lab stays up (make lab-down removes it)"
    assert 'source .venv/bin/activate; eval "$(tacc-lab user alice)"' in lines[1]
    assert lines[-1].startswith("  then: tcloud submit examples/pytorch-ddp ")


def test_another_lab_and_directory_are_named():
    text = next_steps("demo", ROOT, Path("/"))
    assert f"cd {ROOT}; " in text and 'eval "$(tacc-lab --name demo user alice)"' in text
    assert "make lab-down LAB_NAME=demo" in text


def test_without_a_torch_for_the_nodes_the_next_example_needs_none_and_says_why():
    why = "a CPU torch wheel for trixie's Python 3.13 in this machine's pip find-links"
    lines = next_steps("lab", ROOT, ROOT, why).splitlines()
    assert lines[2] == f"  (examples/pytorch-ddp needs {why})"
    assert lines[-1].startswith("  then: tcloud submit examples/mpi-allreduce ")
    assert (ROOT / "examples/mpi-allreduce/tcloud.yaml").is_file()
