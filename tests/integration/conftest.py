"""The integration modules' labs, from the factory (lab_factory.py, shapes in labs.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.lab_factory import LabFactory
from tests.integration.labs import HW, MODULES, Lab
from tests.integration.site_from_nothing import converge_from_nothing


@pytest.fixture(scope="session")
def lab_factory(tmp_path_factory) -> Iterator[LabFactory]:
    factory = LabFactory(tmp_path_factory.mktemp("labs"))
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def shaped_lab(lab_factory, request) -> Lab:
    """The calling module's lab, by the shape labs.MODULES gives it."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    assert module in MODULES, f"{module} has no lab shape in tests/integration/labs.py"
    return lab_factory.lab(MODULES[module], module)


@pytest.fixture(scope="module")
def site_from_nothing(shaped_lab, lab_factory) -> dict:
    """site.yml's install-from-nothing runs on the hw lab (site_from_nothing.py), made
    once for all of its modules."""
    assert shaped_lab.shape == HW, f"{shaped_lab.name}: only the hw lab converges from nothing"
    return lab_factory.once(shaped_lab, "site", lambda: converge_from_nothing(shaped_lab.inventory))
