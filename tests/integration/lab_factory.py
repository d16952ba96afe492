"""Boots each lab shape (labs.py) once per pytest process and hands it to the modules
that ask for it, resetting it between them; removes them all at the end of the run.
What failed once (a boot, a provisioning, the hw lab's site.yml runs) fails every later
module of that lab at once, naming the first failure, instead of being tried again: a
CI run lost 5 minutes per module to a site.yml that failed the same way each time."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.integration.lab_helpers import lab_cli, lab_status, node_sh, playbook
from tests.integration.labs import Lab, Shape, write_vars

# For a developer re-running a few tests: TACC_TEST_REUSE_LAB=1 keeps a lab that is
# already up and provisioned (and leaves it up). CI never sets it.
REUSE = os.environ.get("TACC_TEST_REUSE_LAB") == "1"

T = TypeVar("T")
# What a fixture raises when it fails: an assertion, pytest.fail (the run's deadline).
FAILURES = (Exception, pytest.fail.Exception)


class LabFactory:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.labs: dict[str, Lab] = {}
        self.kept: set[str] = set()  # reused labs: left up
        self.user: dict[str, str] = {}  # lab name -> the module that has it now
        self.made: dict[tuple[str, str], Any] = {}  # (lab name, what) -> once()'s result
        self.failed: dict[tuple[str, str], str] = {}  # (lab name, what) -> its first error

    def lab(self, shape: Shape, module: str) -> Lab:
        """The lab of `shape` for `module`: booted and provisioned on first use, reset
        when it passes from one module to another."""
        lab = self.labs.get(shape.name)
        if lab is None:
            lab = self.labs[shape.name] = self._first((shape.name, "boot"), self._boot, shape)
        elif self.user[shape.name] != module and shape.reset:
            self._reset(lab)
        self.user[shape.name] = module
        return lab

    def once(self, lab: Lab, what: str, make: Callable[[], Any]) -> Any:
        """make()'s result, made the first time a module of `lab` asks for `what` (the
        hw lab's site.yml runs, which every module on that lab builds on)."""
        key = (lab.name, what)
        if key not in self.made:
            self.made[key] = self._first(key, make)
        return self.made[key]

    def _first(self, key: tuple[str, str], make: Callable[..., T], *args: Any) -> T:
        """make(*args), unless it failed before in this run: then that failure, at once."""
        if key in self.failed:
            pytest.fail(f"lab {key[0]}: {key[1]} failed earlier in this run: {self.failed[key]}")
        try:
            return make(*args)
        except FAILURES as exc:
            self.failed[key] = f"{type(exc).__name__}: {str(exc)[:500]}"
            raise

    def _boot(self, shape: Shape) -> Lab:
        inventory = self.workdir / shape.name / "hosts.yml"
        inventory.parent.mkdir(parents=True)
        write_vars(shape, inventory)
        reuse = REUSE and lab_status(shape.name)["up"]
        if not reuse:
            lab_cli(shape.name, "down")  # a crashed earlier run must not leak into this one
        argv = ["up", "--nodes", str(shape.nodes), "--subnet", shape.subnet]
        argv += [] if shape.login_node else ["--no-login-node"]
        argv += ["--container-image"] if shape.container_image else []
        argv += ["--directory"] if shape.directory else []
        argv += shape.os_argv()
        proc = lab_cli(shape.name, *argv, "--inventory", str(inventory))
        assert proc.returncode == 0, proc.stderr
        release = lab_status(shape.name)["os"]
        print(f"lab {shape.name} ({shape.flavor} image, {release}): {shape.proof}", file=sys.stderr)
        if reuse:
            self.kept.add(shape.name)
        else:
            for path in shape.provision:
                playbook(inventory, path)
        return Lab(shape, inventory)

    def _reset(self, lab: Lab) -> None:
        for node in (node["name"] for node in lab_status(lab.name)["nodes"]):
            proc = node_sh(lab.name, node, lab.shape.reset)
            assert proc.returncode == 0, f"reset of {lab.name} on {node}: {proc.stderr}"

    def close(self) -> None:
        half_booted = {name for name, what in self.failed if what == "boot"}
        for name in sorted(set(self.labs) | half_booted):
            if name not in self.kept:
                lab_cli(name, "down")
