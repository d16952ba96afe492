"""The lab factory (tests/integration/lab_factory.py) tries what failed once no more: the
modules after the first get its error at once (a CI run lost 5 minutes per module to a
site.yml that failed the same way each time)."""

from __future__ import annotations

import pytest

from tests.integration.lab_factory import LabFactory
from tests.integration.labs import HW, Lab


def test_a_failure_is_raised_again_without_a_second_try(tmp_path):
    factory = LabFactory(tmp_path)
    lab = Lab(HW, tmp_path / "hosts.yml")
    calls = []

    def site_runs():
        calls.append(1)
        raise AssertionError("rc=2 the NFS server never answered")

    with pytest.raises(AssertionError):
        factory.once(lab, "site", site_runs)
    with pytest.raises(pytest.fail.Exception, match=r"site failed earlier in this run: .*NFS"):
        factory.once(lab, "site", site_runs)
    assert calls == [1]


def test_a_success_is_made_once(tmp_path):
    factory = LabFactory(tmp_path)
    lab = Lab(HW, tmp_path / "hosts.yml")
    made = iter(range(10))
    assert factory.once(lab, "site", lambda: next(made)) == 0
    assert factory.once(lab, "site", lambda: next(made)) == 0
