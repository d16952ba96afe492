"""The slurm role's hostlist filters: the expressions they write expand (by Slurm's rules,
slurm.conf(5)) to exactly the names they were given, in order, and pair NodeAddr with
NodeName by position."""

from __future__ import annotations

import importlib.util
import random
import re

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.hostlist_reading import expand

_SPEC = importlib.util.spec_from_file_location(
    "hostlist", ROOT / "roles/slurm/filter_plugins/hostlist.py"
)
hostlist = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(hostlist)


def brackets_are_conservative(expr: str) -> bool:
    """Within one bracket: ascending, and every LO unpadded or all of one padded width."""
    for body in re.findall(r"\[([^\]]*)\]", expr):
        elements = [e.partition("-") for e in body.split(",")]
        los = [int(lo) for lo, _, _ in elements]
        highs = [int(hi or lo) for lo, _, hi in elements]
        if any(lo <= prev for lo, prev in zip(los[1:], highs, strict=False)):
            return False
        padded = {len(lo) for lo, _, _ in elements if len(lo) > 1 and lo[0] == "0"}
        if padded and {len(lo) for lo, _, _ in elements} != padded:
            return False
    return True


GPUS = [f"gpu{i:04d}" for i in range(1, 4097)]


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([*GPUS, "n2", "n3"], "gpu[0001-4096],n[2-3]"),
        (["n3", "n2"], "n[2-3]"),
        (["gpu01", "gpu02", "gpu03", "gpu05", "gpu10"], "gpu[01-03,05,10]"),
        (["n8", "n9", "n10", "n11"], "n[8-11]"),  # unpadded: the width may grow
        (["x0998", "x0999", "x1000", "x1001"], "x[0998-1001]"),  # 1000 fits width 4
        (["gpu1", "gpu01", "gpu2", "gpu02"], "gpu[1-2],gpu[01-02]"),  # widths never merge
        (["n9", "n09", "n10"], "n9,n[09-10]"),
        (["a1", "b1", "a2", "a"], "a,a[1-2],b1"),  # mixed prefixes, a name without digits
        (["login"], "login"),
        (["gpu07"], "gpu07"),
        (["gpu1-ib", "gpu2-ib"], "gpu1-ib,gpu2-ib"),  # no range in mid-name: kept as is
        (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
        (["1234", "1235"], "1234,1235"),  # no prefix: no brackets
        (["gpu01", "gpu01", "gpu02"], "gpu[01-02]"),  # a set: duplicates dropped
        (["10.10.1.2", "10.10.1.1", "10.10.2.1"], "10.10.1.[1-2],10.10.2.1"),
    ],
)
def test_hostlist_compresses_a_set_of_hosts(names, expected):
    assert hostlist.tacc_hostlist(names) == expected
    assert expand(expected) == sorted(set(names), key=hostlist.natural_key)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ("ALL", "ALL"),
        ("gpu03,gpu01, gpu02", "gpu[01-03]"),
        ("gpu[01-04],n5", "gpu[01-04],n5"),  # already an expression: left alone
        ([], ""),
    ],
)
def test_hostlist_takes_partition_node_strings(nodes, expected):
    assert hostlist.tacc_hostlist(nodes) == expected


@pytest.mark.parametrize("bad", ["a,b", "gpu[1]", "two words", ""])
def test_names_a_hostlist_cannot_hold_are_refused(bad):
    with pytest.raises(ValueError, match="cannot be written in a Slurm hostlist"):
        hostlist.tacc_hostlist([bad, "n1"])


@pytest.mark.parametrize(
    "names",
    [
        ["10.0.0.5", "10.0.0.3", "10.0.0.4", "10.0.0.4"],  # descending, duplicate
        ["n3", "n2", "n1"],
        ["n1", "login", "n2"],
        ["gpu9", "gpu10", "gpu010", "gpu011"],
    ],
)
def test_compress_keeps_order_and_duplicates(names):
    expr = hostlist.compress(names)
    assert expand(expr) == names
    assert brackets_are_conservative(expr)


def test_random_lists_round_trip():
    rng = random.Random(20240607)  # noqa: S311 - a fixed seed, repeatable lists
    prefixes = ["gpu", "n", "rack1-n", "10.10.1.", "10.10.2.", "x"]
    for _ in range(400):
        names = [
            rng.choice(prefixes)
            + f"{rng.randint(0, 1200):0{rng.choice([0, 0, 2, 3, 4])}d}"
            + rng.choice(["", "", "", "-ib"])
            for _ in range(rng.randint(1, 60))
        ]
        ordered = hostlist.compress(names)
        assert expand(ordered) == names, ordered
        as_set = hostlist.tacc_hostlist(names)
        assert expand(as_set) == sorted(set(names), key=hostlist.natural_key), as_set
        assert brackets_are_conservative(ordered) and brackets_are_conservative(as_set)


def nodes(hostvars: dict, hosts=None, **defaults) -> list[dict]:
    args = {"cpus": 1, "memory_mb": 1024, "gres": [], "memory_factor": 0.95, **defaults}
    return hostlist.tacc_slurm_nodes(list(hostvars) if hosts is None else hosts, hostvars, **args)


def pairs(groups: list[dict]) -> dict[str, str]:
    """host -> address, by expanding each line's NodeName and NodeAddr side by side."""
    result: dict[str, str] = {}
    for group in groups:
        names = expand(group["names"])
        addrs = expand(group["addrs"]) if group["addrs"] else names
        assert len(addrs) == len(names), group
        result.update(zip(names, addrs, strict=True))
    return result


def test_the_lab_compute_nodes_share_one_line():
    hostvars = {"n2": {"ansible_host": "10.77.10.12"}, "n3": {"ansible_host": "10.77.10.13"}}
    assert nodes(hostvars) == [
        {
            "names": "n[2-3]",
            "addrs": "10.77.10.[12-13]",
            "cpus": "1",
            "real_memory": 972,
            "gres": "",
            "features": "",
            "core_spec_count": 0,
            "mem_spec_limit": 0,
            "topology": "",
            "gpu_cores": [],
            "mig": [],
            "hosts": ["n2", "n3"],
        }
    ]


EIGHT_GPUS_TWO_SOCKETS = {
    "slurm_node_cpus": 16,
    "slurm_node_sockets": 2,
    "slurm_node_cores_per_socket": 8,
    "slurm_node_gres": ["gpu:h100:8"],
    "slurm_node_gpu_cores": ["0-7"] * 4 + ["8-15"] * 4,
}


def test_gpus_near_a_socket_get_its_cores_in_gres_conf():
    """Issue [22] point 2: each socket's GPUs share a gres.conf line with their Cores=,
    the node line says its sockets, and nodes alike share both."""
    hostvars = {"gpu1": dict(EIGHT_GPUS_TWO_SOCKETS), "gpu2": dict(EIGHT_GPUS_TWO_SOCKETS)}
    hostvars["gpu3"] = {**EIGHT_GPUS_TWO_SOCKETS, "slurm_node_gpu_cores": []}
    groups = nodes(hostvars)
    assert groups[0]["topology"] == "Sockets=2 CoresPerSocket=8 ThreadsPerCore=1"
    assert hostlist.tacc_gres_conf(groups) == [
        "NodeName=gpu[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-7",
        "NodeName=gpu[1-2] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=8-15",
        "NodeName=gpu3 Name=gpu Type=h100 File=/dev/nvidia[0-7]",
    ]


def test_gpu_cores_alternating_sockets_keep_one_line_per_run():
    gres = ["gpu:a100:2", "gpu:l40s:2"]
    assert hostlist.gres_conf_lines(gres, ["0-3", "4-7", "4-7", "0-3"]) == [
        "Name=gpu Type=a100 File=/dev/nvidia0 Cores=0-3",
        "Name=gpu Type=a100 File=/dev/nvidia1 Cores=4-7",
        "Name=gpu Type=l40s File=/dev/nvidia2 Cores=4-7",
        "Name=gpu Type=l40s File=/dev/nvidia3 Cores=0-3",
    ]


# GPU 0 split in two 3g.40gb instances (GPU instances 1 and 2), GPU 5 in two 1g.10gb
# (instances 9 and 10), as the nvidia_gpu role reads them from the driver.
MIG_DEVICES = [
    {"gpu": 0, "type": "3g.40gb", "gi": 1, "ci": 0},
    {"gpu": 0, "type": "3g.40gb", "gi": 2, "ci": 0},
    {"gpu": 5, "type": "1g.10gb", "gi": 9, "ci": 0},
    {"gpu": 5, "type": "1g.10gb", "gi": 10, "ci": 0},
]
MIG_NODE = {
    **EIGHT_GPUS_TWO_SOCKETS,
    "slurm_node_gres": ["gpu:h100:6", "gpu:3g.40gb:2", "gpu:1g.10gb:2"],
    "slurm_node_mig_devices": MIG_DEVICES,
}


def test_a_mig_layout_is_rendered_into_gres_conf_by_its_device_files():
    """Issue [22] point 6: each MIG device is a gres.conf line of its type with the GPU
    and its two capability files (NVIDIA's mig-minors numbering: gpu0/gi1/access is
    nvidia-cap12, gpu0/gi1/ci0/access nvidia-cap13, 135 minors per GPU) and its GPU's
    cores; the whole GPUs keep their device numbers around the split ones."""
    groups = nodes({"gpu1": dict(MIG_NODE)})
    assert groups[0]["gres"] == "gpu:h100:6,gpu:3g.40gb:2,gpu:1g.10gb:2"
    caps = "/dev/nvidia-caps/nvidia-cap"
    assert hostlist.tacc_gres_conf(groups) == [
        "NodeName=gpu1 Name=gpu Type=h100 File=/dev/nvidia[1-3] Cores=0-7",
        "NodeName=gpu1 Name=gpu Type=h100 File=/dev/nvidia4 Cores=8-15",
        "NodeName=gpu1 Name=gpu Type=h100 File=/dev/nvidia[6-7] Cores=8-15",
        f"NodeName=gpu1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,{caps}12,{caps}13"
        " Cores=0-7",
        f"NodeName=gpu1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,{caps}21,{caps}22"
        " Cores=0-7",
        f"NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia5,{caps}759,{caps}760"
        " Cores=8-15",
        f"NodeName=gpu1 Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia5,{caps}768,{caps}769"
        " Cores=8-15",
    ]
    # A node without MIG keeps its plain lines; the MIG types are features like GPU types.
    assert "3g.40gb" in groups[0]["features"].split(",")


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"slurm_node_gres": ["gpu:h100:6", "gpu:3g.40gb:1", "gpu:1g.10gb:2"]},
            "has 2 3g.40gb device(s); slurm_node_gres must declare gpu:3g.40gb:2",
        ),
        (
            {"slurm_node_mig_devices": [*MIG_DEVICES, {"gpu": 0, "type": "3g.40gb"}]},
            "is not {gpu: N, type: PROFILE, gi: N, ci: N}",
        ),
        (
            {"slurm_node_mig_devices": [{**MIG_DEVICES[0], "gi": 15}, *MIG_DEVICES[1:]]},
            "gi 0-14, ci 0-7",
        ),
        (
            {"slurm_node_mig_devices": [*MIG_DEVICES, MIG_DEVICES[0]]},
            "lists GPU 0 instance 1/0 twice",
        ),
        (
            {"slurm_node_gres": ["gpu:h100:7", "gpu:3g.40gb:2", "gpu:1g.10gb:2"]},
            "has 8 entries for 9 GPUs",
        ),
        (
            {"slurm_gpu_sharing": "shard"},
            "slurm_gpu_sharing: shard cannot share a node with MIG devices",
        ),
    ],
)
def test_a_mig_layout_unlike_its_gres_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        nodes({"gpu1": {**MIG_NODE, **change}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slurm_node_cores_per_socket": 4}, "is not slurm_node_cpus 16"),
        ({"slurm_node_gpu_cores": ["0-7"] * 7}, "has 7 entries for 8 GPUs"),
        ({"slurm_node_gpu_cores": ["0-7"] * 7 + ["8-16"]}, "names core 16; the node has 16 cores"),
        ({"slurm_node_gpu_cores": ["0-7"] * 7 + ["socket1"]}, "is not a list of core numbers"),
        ({"slurm_node_gpu_cores": ["0-7"] * 7 + ["7-0"]}, "is not a list of core numbers"),
        ({"slurm_node_sockets": 0}, "slurm_node_gpu_cores needs the node's CPU layout"),
        ({"slurm_node_sockets": "two"}, "slurm_node_sockets must be a whole number, got 'two'"),
        ({"slurm_node_cores_per_socket": -8}, "must not be negative, got -8"),
    ],
)
def test_bad_node_layout_or_gpu_cores_are_refused_by_name(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        nodes({"gpu1": {**EIGHT_GPUS_TWO_SOCKETS, **change}})


def test_nodes_group_by_hardware_and_pair_addresses():
    hostvars = {f"gpu{i:02d}": {"ansible_host": f"10.10.1.{i}"} for i in range(1, 9)}
    hostvars["gpu03"]["slurm_node_gres"] = ["gpu:h100:4"]
    hostvars["gpu06"]["slurm_node_memory_mb"] = 2048
    hostvars["gpu07"]["slurm_node_gres"] = ["gpu:h100:4"]
    groups = nodes(hostvars, cpus=64, gres=["gpu:h100:8"])
    spec = ("hosts", "core_spec_count", "mem_spec_limit", "topology", "gpu_cores", "mig")
    assert [{k: v for k, v in g.items() if k not in spec} for g in groups] == [
        {
            "names": "gpu[01-02,04-05,08]",
            "addrs": "10.10.1.[1-2,4-5,8]",
            "cpus": "64",
            "real_memory": 972,
            "gres": "gpu:h100:8",
            "features": "h100",
        },
        {
            "names": "gpu[03,07]",
            "addrs": "10.10.1.[3,7]",
            "cpus": "64",
            "real_memory": 972,
            "gres": "gpu:h100:4",
            "features": "h100",
        },
        {
            "names": "gpu06",
            "addrs": "10.10.1.6",
            "cpus": "64",
            "real_memory": 1945,
            "gres": "gpu:h100:8",
            "features": "h100",
        },
    ]
    assert groups[1]["hosts"] == ["gpu03", "gpu07"]
    assert pairs(groups) == {host: v["ansible_host"] for host, v in hostvars.items()}


def test_addresses_out_of_step_with_names_still_pair():
    """Names sort one way, addresses another: NodeAddr follows the names' order."""
    hostvars = {f"n{i}": {"ansible_host": f"10.0.{i % 3}.{100 - i}"} for i in range(1, 13)}
    hostvars["n5"]["ansible_host"] = "n5-ib.cluster"
    hostvars["n6"]["ansible_host"] = "n6"
    (group,) = nodes(hostvars)
    assert expand(group["names"]) == [f"n{i}" for i in range(1, 13)]
    assert pairs([group]) == {host: v["ansible_host"] for host, v in hostvars.items()}
    assert brackets_are_conservative(group["addrs"])


def test_no_nodeaddr_when_every_address_is_the_name():
    assert nodes({"n1": {}, "n2": {"ansible_host": "n2"}})[0]["addrs"] == ""


def test_order_of_hosts_does_not_change_the_lines():
    hostvars = {
        f"gpu{i:04d}": {"ansible_host": f"10.10.{i // 250}.{i % 250}"} for i in range(1, 600)
    }
    for i in range(1, 600, 7):
        hostvars[f"gpu{i:04d}"]["slurm_node_cpus"] = 32
    shuffled = list(hostvars)
    random.Random(1).shuffle(shuffled)  # noqa: S311
    assert nodes(hostvars, hosts=shuffled) == nodes(hostvars)
    assert pairs(nodes(hostvars)) == {host: v["ansible_host"] for host, v in hostvars.items()}


def test_4096_gpu_nodes_are_one_line():
    hostvars = {
        name: {"ansible_host": f"10.10.{1 + i // 250}.{1 + i % 250}"} for i, name in enumerate(GPUS)
    }
    (group,) = nodes(hostvars, gres=["gpu:h100:8"])
    assert group["names"] == "gpu[0001-4096]"
    assert group["addrs"].startswith("10.10.1.[1-250],10.10.2.[1-250],")
    assert group["addrs"].endswith(",10.10.17.[1-96]")
    assert pairs([group]) == {host: v["ansible_host"] for host, v in hostvars.items()}


def test_role_defaults_are_the_fallback_of_a_host_without_the_variable():
    """hostvars never hold role defaults: the filter's fallback must be the role's."""
    defaults = yaml.safe_load((ROOT / "roles/slurm/defaults/main.yml").read_text())
    for name, value in hostlist.ROLE_DEFAULTS.items():
        assert defaults[name] == value, name


@pytest.mark.parametrize(
    ("gres", "sharing", "expected"),
    [
        (["gpu:h100:4"], "shard", ["gpu:h100:4", "shard:h100:16"]),
        # MPS typed like its GPUs too: a backup taking over drained n3 for untyped MPS.
        (["gpu:h100:4"], "mps", ["gpu:h100:4", "mps:h100:400"]),
        (["gpu:2"], "mps", ["gpu:2", "mps:200"]),
        (["gpu:h100:4"], "none", ["gpu:h100:4"]),
        (
            ["gpu:a100:2", "gpu:l40s:2"],
            "shard",
            ["gpu:a100:2", "gpu:l40s:2", "shard:a100:8", "shard:l40s:8"],
        ),
        (["gpu:a100:2", "gpu:a100:2"], "shard", ["gpu:a100:2", "gpu:a100:2", "shard:a100:16"]),
        ("gpu:2,nic:1", "shard", ["gpu:2", "nic:1", "shard:8"]),  # a string, untyped GPUs
        ([], "shard", []),  # no GPU: nothing to share
        (["nic:2"], "mps", ["nic:2"]),
        (["gpu:h100:4", "shard:8"], "shard", ["gpu:h100:4", "shard:8"]),  # set by hand: kept
    ],
)
def test_node_gres_adds_the_gpus_shares(gres, sharing, expected):
    assert hostlist.node_gres(gres, sharing, 4, 100) == expected


@pytest.mark.parametrize(
    ("gres", "sharing"),
    [(["gpu:h100:4"], "mig"), (["gpu:h100:x"], "none"), (["gpu:a:b:4"], "none")],
)
def test_node_gres_refuses_what_slurm_would_not_read(gres, sharing):
    with pytest.raises(ValueError, match=r"slurm_gpu_sharing|not a Gres"):
        hostlist.node_gres(gres, sharing, 4, 100)


def test_node_features_are_gpu_types_then_inventory_features_once():
    assert hostlist.node_features(["gpu:h100:4", "shard:16"], ["ib", "h100"]) == ["h100", "ib"]
    assert hostlist.node_features(["gpu:a100:2", "gpu:l40s:2"], []) == ["a100", "l40s"]
    assert hostlist.node_features(["gpu:2"], "nvme") == ["nvme"]
    with pytest.raises(ValueError, match="cannot be a Slurm node feature"):
        hostlist.node_features([], ["a|b"])


def test_features_split_nodes_that_differ_only_in_features():
    hostvars = {f"g{i}": {"slurm_node_gres": ["gpu:h100:4"]} for i in range(1, 5)}
    hostvars["g3"]["slurm_node_features"] = ["ib"]
    hostvars["g4"]["slurm_gpu_sharing"] = "shard"
    groups = nodes(hostvars)
    assert [(g["names"], g["gres"], g["features"]) for g in groups] == [
        ("g[1-2]", "gpu:h100:4", "h100"),
        ("g3", "gpu:h100:4", "h100,ib"),
        ("g4", "gpu:h100:4,shard:h100:16", "h100"),
    ]
    assert hostlist.tacc_gres_types(groups) == "gpu,shard"
    # gres.conf only cares about the Gres: g1-g3 share their lines.
    assert hostlist.tacc_gres_conf(groups) == [
        "NodeName=g[1-3] Name=gpu Type=h100 File=/dev/nvidia[0-3]",
        "NodeName=g4 Name=gpu Type=h100 File=/dev/nvidia[0-3]",
        "NodeName=g4 Name=shard Type=h100 Count=16",
    ]


def test_gres_conf_lines_number_devices_across_entries():
    assert hostlist.gres_conf_lines(["gpu:a100:1", "gpu:l40s:2", "mps:300", "nic:ib:1"]) == [
        "Name=gpu Type=a100 File=/dev/nvidia0",
        "Name=gpu Type=l40s File=/dev/nvidia[1-2]",
        "Name=mps Count=300",
        "Name=nic Type=ib Count=1",
    ]
    assert hostlist.tacc_gres_types([{"gres": ""}, {"gres": "nic:1,gpu:2"}]) == "gpu,nic"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu[01-03],n7", ["gpu01", "gpu02", "gpu03", "n7"]),
        ("n[1,3-4]", ["n1", "n3", "n4"]),
        ("rack[1-2]-gpu[1-2]", ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]),
        ("login1", ["login1"]),
    ],
)
def test_expand_is_the_inverse_of_compress(text, names):
    assert hostlist.expand(text) == names
    assert hostlist.expand(hostlist.compress(names)) == names


def test_expand_names_a_range_that_is_not_one():
    for text, part in (("n[a-b]", "a-b"), ("n[10-8]", "10-8")):
        with pytest.raises(ValueError, match=f"'{part}' is not a number or a rising range"):
            hostlist.expand(text)
    assert hostlist.expand("gpu01 gpu02, n[1-2]") == ["gpu01", "gpu02", "n1", "n2"]


def gpu_shapes() -> dict[str, dict]:
    """Two kinds of GPU node and a CPU node: 64 CPUs / 8 GPUs and 48 CPUs / 4 GPUs."""
    return {
        "big1": {
            "slurm_node_cpus": 64,
            "slurm_node_memory_mb": 1_000_000,
            "slurm_node_gres": ["gpu:h100:8"],
        },
        "small1": {
            "slurm_node_cpus": 48,
            "slurm_node_memory_mb": 200_000,
            "slurm_node_gres": ["gpu:l40s:4"],
        },
        "cpu1": {"slurm_node_cpus": 128, "slurm_node_memory_mb": 512_000},
    }


def test_a_gpu_partition_gets_the_cpus_and_memory_per_gpu_every_node_can_give():
    groups = hostlist.tacc_slurm_nodes(gpu_shapes(), gpu_shapes(), memory_factor=1.0)
    defaults = hostlist.tacc_partition_gpu_defaults
    # big: 64/8 = 8 CPUs, 125000 MB; small: 48/4 = 12 CPUs, 50000 MB: the least of each.
    assert defaults(groups, {"name": "all", "nodes": "ALL"}) == {
        "DefCpuPerGPU": 8,
        "DefMemPerGPU": 50000,
    }
    assert defaults(groups, {"name": "s", "nodes": "small[1-2]"}) == {
        "DefCpuPerGPU": 12,
        "DefMemPerGPU": 50000,
    }
    assert defaults(groups, {"name": "b", "nodes": ["big1", "cpu1"]}) == {
        "DefCpuPerGPU": 8,
        "DefMemPerGPU": 125000,
    }
    assert defaults(groups, {"name": "cpu", "nodes": "cpu1"}) == {}  # no GPU node
    # The entry's own values win; 0 leaves one out.
    own = {"name": "all", "def_cpu_per_gpu": 4, "def_mem_per_gpu": 0}
    assert defaults(groups, own) == {"DefCpuPerGPU": 4}


def test_cores_and_memory_kept_for_the_system_are_not_shared_out():
    shapes = gpu_shapes()
    shapes["big1"] |= {"slurm_node_core_spec_count": 8, "slurm_node_mem_spec_limit_mb": 40000}
    groups = hostlist.tacc_slurm_nodes(["big1"], shapes, memory_factor=1.0)
    assert (groups[0]["core_spec_count"], groups[0]["mem_spec_limit"]) == (8, 40000)
    assert hostlist.tacc_partition_gpu_defaults(groups, {"name": "b"}) == {
        "DefCpuPerGPU": 7,  # (64 - 8) / 8
        "DefMemPerGPU": 120000,  # (1000000 - 40000) / 8
    }


def test_no_cpu_default_where_a_node_has_fewer_cpus_than_gpus():
    """The lab's n2: 2 CPUs, 4 GPUs. One CPU per GPU would leave --gres=gpu:4 pending."""
    shapes = {
        "n2": {
            "slurm_node_cpus": 2,
            "slurm_node_memory_mb": 24000,
            "slurm_node_gres": ["gpu:h100:4"],
        }
    }
    groups = hostlist.tacc_slurm_nodes(["n2"], shapes, memory_factor=1.0)
    assert hostlist.tacc_partition_gpu_defaults(groups, {"name": "batch"}) == {"DefMemPerGPU": 6000}
