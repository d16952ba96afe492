import ipaddress

import pytest

from tacc_lab.apt_sources import debian_mirror, source_files, source_hosts, source_urls
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.proxy import filter_rules, render_config

DEB822 = """\
Types: deb
# a comment naming http://ignored.example/
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
"""
ONE_LINE = "deb [arch=amd64] https://apt.example/repo stable main\n# deb http://off.example x y\n"


def test_urls_from_both_formats():
    assert source_urls(DEB822) == [
        "http://mirror.example/debian",
        "http://security.example/debian-security",
    ]
    assert source_urls(ONE_LINE) == ["https://apt.example/repo"]


def test_disabled_files_are_skipped_and_mirror_is_not_security(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d/debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d/vendor.list.disabled").write_text(ONE_LINE)
    paths = (tmp_path / "sources.list", tmp_path / "sources.list.d")
    assert [p.name for p in source_files(paths)] == ["debian.sources"]
    assert source_hosts(paths) == {"mirror.example", "security.example"}
    assert debian_mirror(paths) == "http://mirror.example/debian"


def test_no_mirror_is_a_clear_error(tmp_path):
    with pytest.raises(LabError, match="no Debian mirror"):
        debian_mirror((tmp_path / "sources.list",))


def test_filter_rules_are_anchored_and_escaped():
    rules = filter_rules({"b.example.org", "a.example"}).splitlines()
    assert rules == [r"^a\.example$", r"^b\.example\.org$"]


def test_proxy_listens_only_on_bridge_and_allows_only_the_lab():
    cfg = LabConfig(name="lab", subnet=ipaddress.IPv4Network("10.77.0.0/24"))
    text = render_config(
        cfg, cfg.proxy_dir / "filter", cfg.proxy_dir / "log", cfg.proxy_dir / "pid"
    )
    lines = text.splitlines()
    assert "Listen 10.77.0.1" in lines
    assert "Allow 10.77.0.0/24" in lines
    assert "FilterDefaultDeny Yes" in lines
    assert "ConnectPort 443" in lines
