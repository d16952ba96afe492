import ipaddress

import pytest

from tacc_lab.addressing import (
    bridge_address,
    max_nodes,
    node_address,
    node_name,
    overlapping,
)
from tacc_lab.config import LabConfig, parse_subnet
from tacc_lab.errors import LabError

NET = ipaddress.IPv4Network("10.77.0.0/24")


def test_bridge_takes_first_host_address():
    assert str(bridge_address(NET)) == "10.77.0.1"


def test_nodes_are_numbered_from_offset():
    assert [str(node_address(NET, i)) for i in (1, 2, 3)] == [
        "10.77.0.11",
        "10.77.0.12",
        "10.77.0.13",
    ]
    assert node_name(4) == "n4"


def test_small_subnet_overflows_with_clear_error():
    small = ipaddress.IPv4Network("10.77.0.0/28")
    assert max_nodes(small) == 4
    assert str(node_address(small, 4)) == "10.77.0.14"
    with pytest.raises(LabError, match="at most 4 nodes fit"):
        node_address(small, 5)


def test_index_zero_is_the_login_node_just_below_n1():
    assert (node_name(0), str(node_address(NET, 0))) == ("login1", "10.77.0.10")
    with pytest.raises(ValueError):
        node_address(NET, -1)


def test_overlap_ignores_the_labs_own_bridge():
    in_use = [
        ("eth0", ipaddress.IPv4Network("192.0.2.0/24")),
        ("tacc-lab", NET),
        ("docker0", ipaddress.IPv4Network("10.77.0.128/25")),
    ]
    assert overlapping(NET, in_use, "tacc-lab") == [in_use[2]]
    assert overlapping(ipaddress.IPv4Network("10.78.0.0/24"), in_use, "x") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.77.0.0/33", "not an IPv4 network"),
        ("10.77.0.5/24", "not an IPv4 network"),  # host bits set
        ("8.8.8.0/24", "not a private range"),
        ("10.77.0.0/29", "too small"),
    ],
)
def test_subnet_errors_name_the_option(text, message):
    with pytest.raises(LabError, match=message) as err:
        parse_subnet(text)
    assert "--subnet" in str(err.value)


@pytest.mark.parametrize("name", ["", "Lab", "1lab", "lab-one", "waytoolongname"])
def test_lab_name_must_fit_interface_names(name):
    with pytest.raises(LabError, match="lab name"):
        LabConfig.create(name, "10.77.0.0/24")


def test_derived_names_fit_linux_interface_limit():
    cfg = LabConfig.create("abcdefgh", "10.77.0.0/24")
    assert len(cfg.bridge) <= 15
    assert len("vb-" + cfg.machine_name("n99")) <= 15
