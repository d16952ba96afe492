"""Jinja filters: Slurm hostlist expressions for slurm.conf (NodeName, NodeAddr, Nodes=),
and the node lines of slurm.conf and gres.conf (Gres with GPU shares, Features).

How Slurm reads a hostlist (slurm.conf(5), "node range expression"): comma-separated
terms; a term is a plain name or PREFIX[RANGES], RANGES being comma-separated N or LO-HI.
Each range is printed with the width of its LO, leading zeros included, so gpu[0001-0010]
is gpu0001..gpu0010 and n[8-10] is n8, n9, n10. The range must end the name
("unit[0-31]rack" is invalid), so only a trailing run of digits is compressed: gpu1-ib or
login stay plain names. Slurm expands a list in the order written; NodeName and NodeAddr
on one line are paired by position, which is why `tacc_slurm_nodes` compresses the
addresses in exactly the order of the names.

Written conservatively (Slurm 22.05): one bracket holds only ascending ranges of one width
class (all unpadded, or all padded to the same width); anything else starts a new term.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
# Characters that separate or delimit hostlist terms: a name containing one cannot be
# written in a hostlist at all.
_RESERVED = re.compile(r"[\[\],\s]")


def _split(name: str) -> tuple[str, str]:
    """("gpu", "0001") for gpu0001; (name, "") when there is nothing to compress."""
    match = _TRAILING_DIGITS.match(name)
    if match is None or not match.group(1):
        return name, ""
    return match.group(1), match.group(2)


def _padded(digits: str) -> bool:
    return len(digits) > 1 and digits[0] == "0"


def natural_key(name: str) -> tuple[str, int, int, str]:
    """Sort key: by prefix, then number of digits, then number: n9 before n10, and
    gpu0999 next to gpu1000; gpu1 and gpu01 land in different runs."""
    prefix, digits = _split(name)
    return (prefix, len(digits), int(digits) if digits else -1, name)


class _Term:
    """One PREFIX[RANGES] term; each range is [LO as written, lo, hi]."""

    def __init__(self, prefix: str, digits: str) -> None:
        self.prefix = prefix
        self.width = len(digits) if _padded(digits) else 0  # 0: unpadded numbers
        self.ranges: list[list] = [[digits, int(digits), int(digits)]]

    def add(self, digits: str) -> bool:
        """Take the next number if the term can hold it in this position; else False."""
        value = int(digits)
        lo_text, _, hi = self.ranges[-1]
        if value <= hi:  # keep the order: Slurm expands left to right
            return False
        if self.width and len(digits) != self.width:
            return False
        if not self.width and _padded(digits):
            return False
        if value == hi + 1 and f"{value:0{len(lo_text)}d}" == digits:
            self.ranges[-1][2] = value
        else:
            self.ranges.append([digits, value, value])
        return True

    def __str__(self) -> str:
        if len(self.ranges) == 1 and self.ranges[0][1] == self.ranges[0][2]:
            return self.prefix + self.ranges[0][0]
        parts = [text if lo == hi else f"{text}-{hi:0{len(text)}d}" for text, lo, hi in self.ranges]
        return f"{self.prefix}[{','.join(parts)}]"


def _check(name: str) -> str:
    name = str(name)
    if not name or _RESERVED.search(name):
        raise ValueError(f"{name!r} cannot be written in a Slurm hostlist")
    return name


def compress(names: Iterable[str]) -> str:
    """The hostlist expression that expands to exactly `names`, in their order."""
    terms: list[_Term | str] = []
    for name in map(_check, names):
        prefix, digits = _split(name)
        if not digits:
            terms.append(name)
            continue
        last = terms[-1] if terms else None
        if not (isinstance(last, _Term) and last.prefix == prefix and last.add(digits)):
            terms.append(_Term(prefix, digits))
    return ",".join(map(str, terms))


def tacc_hostlist(nodes: str | Iterable[str]) -> str:
    """A set of hosts as a sorted hostlist: ["gpu02", "gpu01", "n3"] -> "gpu[01-02],n3".

    A string is taken as a comma-separated list ("ALL" stays "ALL"); a string that
    already holds a bracketed expression is returned unchanged.
    """
    if isinstance(nodes, str):
        if "[" in nodes:
            return nodes
        nodes = [n for n in re.split(r"[,\s]+", nodes) if n]
    return compress(sorted(set(map(_check, nodes)), key=natural_key))


def _top_level_terms(text: str) -> list[str]:
    """The terms of a hostlist, split at commas and spaces (as tacc_hostlist reads a
    list) outside brackets."""
    terms, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if (char == "," or char.isspace()) and depth == 0:
            terms.append(text[start:index])
            start = index + 1
    return [term.strip() for term in [*terms, text[start:]] if term.strip()]


def expand(hostlist: str) -> list[str]:
    """The names a hostlist stands for, in order: "gpu[01-02],n3" -> gpu01, gpu02, n3."""
    names: list[str] = []
    for term in _top_level_terms(hostlist):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", term)
        if match is None:
            names.append(_check(term))
            continue
        prefix, ranges, rest = match.groups()
        tails = expand(rest) if rest else [""]
        for part in ranges.split(","):
            low, _, high = part.strip().partition("-")
            if not low.isdigit() or not (high or low).isdigit() or int(high or low) < int(low):
                raise ValueError(f"{term!r}: {part!r} is not a number or a rising range")
            for number in range(int(low), int(high or low) + 1):
                names += [f"{prefix}{number:0{len(low)}d}{tail}" for tail in tails]
    return names


SHARING = ("none", "shard", "mps")


def _gres_list(gres: object) -> list[str]:
    """slurm_node_gres as a list: ["gpu:h100:4"] or the string "gpu:h100:4,nic:2"."""
    if isinstance(gres, str):
        return [g.strip() for g in gres.split(",") if g.strip()]
    return [str(g) for g in gres or []]


def _parse_gres(entry: str) -> tuple[str, str, str]:
    """("gpu", "h100", "4") for gpu:h100:4; ("gpu", "", "2") for gpu:2; count "1" for
    "gpu". A GPU count must be a number; other Gres may use Slurm's K/M/G suffixes."""
    parts = entry.split(":")
    count = parts[-1] if len(parts) > 1 else "1"
    if len(parts) > 3 or not parts[0] or not count or (parts[0] == "gpu" and not count.isdigit()):
        raise ValueError(f"{entry!r} is not a Gres of the form name[:type]:count")
    return parts[0], parts[1] if len(parts) == 3 else "", count


def _gpu_count(parsed: Iterable[tuple[str, str, str]]) -> int:
    return sum(int(count) for name, _, count in parsed if name == "gpu")


def node_gres(gres: object, sharing: str, shards_per_gpu: object, mps_per_gpu: object) -> list[str]:
    """A node's Gres with its GPUs' shares added: gpu:h100:4 and shard (4 per GPU) give
    ["gpu:h100:4", "shard:h100:16"], MPS (100 per GPU) ["gpu:h100:4", "mps:h100:400"].
    Nothing is added without GPUs, or when the inventory already lists a shard/mps Gres.

    Shares are typed like their GPUs, one entry per GPU type: slurmd reports each shard
    or MPS share with its GPU's type, a running slurmctld adds that type to the node and
    saves it, and a controller that starts from the saved state (a restart, or the
    backup taking over) with untyped shares in slurm.conf drains the node with
    "gres/shard type (h100) reported but not configured" (Slurm 24.11, seen in the hw
    lab's takeover; the same for gres/mps, seen with n3's MPS-shared L40S)."""
    entries = _gres_list(gres)
    if sharing not in SHARING:
        raise ValueError(f"slurm_gpu_sharing must be one of {', '.join(SHARING)}, got {sharing!r}")
    parsed = [_parse_gres(entry) for entry in entries]
    gpus = _gpu_count(parsed)
    if sharing == "none" or gpus == 0 or any(name == sharing for name, _, _ in parsed):
        return entries
    per_gpu = int(mps_per_gpu if sharing == "mps" else shards_per_gpu)
    by_type: dict[str, int] = {}
    for name, gres_type, count in parsed:
        if name == "gpu" and int(count):
            by_type[gres_type] = by_type.get(gres_type, 0) + int(count)
    shares = [
        f"{sharing}:{gres_type}:{n * per_gpu}" if gres_type else f"{sharing}:{n * per_gpu}"
        for gres_type, n in by_type.items()
    ]
    return [*entries, *shares]


def node_features(gres: list[str], features: object) -> list[str]:
    """Features= of a node: its GPU types (gpu:h100:4 -> h100), then the inventory's
    slurm_node_features, each once, in that order."""
    types = [gres_type for name, gres_type, _ in map(_parse_gres, gres) if name == "gpu"]
    extra = [features] if isinstance(features, str) else list(features or [])
    result: list[str] = []
    for feature in map(str, [*types, *extra]):
        if not feature:
            continue
        if _RESERVED.search(feature) or "|" in feature or "&" in feature:
            raise ValueError(f"{feature!r} cannot be a Slurm node feature")
        if feature not in result:
            result.append(feature)
    return result


# MIG devices (NVIDIA's /proc/driver/nvidia-caps/mig-minors): the capability minors start
# at 3 (1 and 2 are config and monitor); each GPU has 15 GPU instances of 9 minors each,
# the instance's access then its 8 compute instances'.
MIG_FIRST_MINOR, MIG_MINORS_PER_GPU, MIG_MINORS_PER_GI = 3, 135, 9
MIG_MAX_GI, MIG_MAX_CI = 14, 7
MigDevice = tuple[int, str, int, int]  # (GPU index, profile, GPU instance, compute instance)


def mig_files(device: MigDevice) -> str:
    """MultipleFiles= of a MIG device: its GPU and the two capability files a process
    needs (the GPU instance's and the compute instance's access), as Slurm's MIG
    documentation configures them by hand."""
    gpu, _, gi, ci = device
    gi_minor = MIG_FIRST_MINOR + MIG_MINORS_PER_GPU * gpu + MIG_MINORS_PER_GI * gi
    caps = "/dev/nvidia-caps/nvidia-cap"
    return f"/dev/nvidia{gpu},{caps}{gi_minor},{caps}{gi_minor + 1 + ci}"


def checked_mig_devices(devices: object, gres: list[str]) -> tuple[MigDevice, ...]:
    """slurm_node_mig_devices: each {gpu, type, gi, ci} as the nvidia_gpu role reads them
    from the driver (it prints the list to use); every MIG type declared in the node's
    Gres (gpu:3g.40gb:2) with as many devices, no GPU instance twice."""
    found: list[MigDevice] = []
    for entry in devices or []:
        try:
            device = (
                int(entry["gpu"]),
                str(entry["type"]),
                int(entry["gi"]),
                int(entry["ci"]),
            )
        except (TypeError, KeyError, ValueError):
            raise ValueError(
                f"slurm_node_mig_devices entry {entry!r} is not {{gpu: N, type: PROFILE, gi: N, "
                "ci: N}} (what the nvidia_gpu role prints)"
            ) from None
        gpu, profile, gi, ci = device
        if gpu < 0 or not 0 <= gi <= MIG_MAX_GI or not 0 <= ci <= MIG_MAX_CI or not profile:
            raise ValueError(
                f"slurm_node_mig_devices entry {entry!r}: gpu must be 0 or more, gi 0-"
                f"{MIG_MAX_GI}, ci 0-{MIG_MAX_CI}, type a MIG profile like 3g.40gb"
            )
        if any(other[0] == gpu and other[2:] == (gi, ci) for other in found):
            raise ValueError(f"slurm_node_mig_devices lists GPU {gpu} instance {gi}/{ci} twice")
        found.append(device)
    declared = {t: int(c) for n, t, c in map(_parse_gres, gres) if n == "gpu" and t}
    for profile in sorted({device[1] for device in found}):
        have = sum(device[1] == profile for device in found)
        if declared.get(profile) != have:
            raise ValueError(
                f"slurm_node_mig_devices has {have} {profile} device(s); slurm_node_gres must "
                f"declare gpu:{profile}:{have}"
            )
    return tuple(found)


def _physical_gpus(gres: list[str], mig: Sequence[MigDevice]) -> int:
    """The node's GPUs: the whole ones its Gres declares and the ones split by MIG."""
    mig_types = {device[1] for device in mig}
    whole = sum(int(c) for n, t, c in map(_parse_gres, gres) if n == "gpu" and t not in mig_types)
    return whole + len({device[0] for device in mig})


def gres_conf_lines(
    gres: list[str], gpu_cores: Sequence[str] = (), mig: Sequence[MigDevice] = ()
) -> list[str]:
    """gres.conf lines (without NodeName) for a node's Gres: GPUs by device file, each
    GPU entry after the previous one's files (/dev/nvidia0..N-1 in order, past the GPUs
    split by MIG), consecutive GPUs near the same cores (gpu_cores, one entry per
    physical GPU, may be empty) on one line with their Cores=; a MIG type's entry one
    line per device (mig: slurm_node_mig_devices) by its MultipleFiles, with its GPU's
    Cores=; shard, mps and any other Gres by Count (Slurm spreads shards and MPS evenly
    over the GPUs)."""
    mig_types = {device[1] for device in mig}
    split = {device[0] for device in mig}
    whole = [d for d in range(_physical_gpus(gres, mig)) if d not in split]
    lines, next_whole = [], 0
    for name, gres_type, count in map(_parse_gres, gres):
        type_field = f" Type={gres_type}" if gres_type else ""
        if name != "gpu":
            lines.append(f"Name={name}{type_field} Count={count}")
            continue
        if gres_type in mig_types:
            for device in (d for d in mig if d[1] == gres_type):
                cores = f" Cores={gpu_cores[device[0]]}" if gpu_cores else ""
                lines.append(f"Name=gpu{type_field} MultipleFiles={mig_files(device)}{cores}")
            continue
        devices = whole[next_whole : next_whole + int(count)]
        next_whole += int(count)
        runs: list[tuple[str, list[int]]] = []
        for device in devices:
            cores = gpu_cores[device] if gpu_cores else ""
            if runs and runs[-1][0] == cores:
                runs[-1][1].append(device)
            else:
                runs.append((cores, [device]))
        for cores, run in _consecutive(runs):
            files = f"{run[0]}" if len(run) == 1 else f"[{run[0]}-{run[-1]}]"
            cores_field = f" Cores={cores}" if cores else ""
            lines.append(f"Name=gpu{type_field} File=/dev/nvidia{files}{cores_field}")
    return lines


def _consecutive(runs: list[tuple[str, list[int]]]) -> list[tuple[str, list[int]]]:
    """Runs of GPUs near the same cores split where a device number is skipped (a GPU
    split by MIG between them), so each is one File=/dev/nvidia[A-B] range."""
    split: list[tuple[str, list[int]]] = []
    for cores, run in runs:
        for device in run:
            if split and split[-1][0] == cores and split[-1][1][-1] == device - 1:
                split[-1][1].append(device)
            else:
                split.append((cores, [device]))
    return split


def _id_list(text: str) -> list[int]:
    """ "0-7,16" -> [0, ..., 7, 16]; ValueError for anything else."""
    ids: list[int] = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()) or int(last or first) < int(first):
            raise ValueError(f"{text!r} is not a list of core numbers like 0-7 or 0-3,8-11")
        ids.extend(range(int(first), int(last or first) + 1))
    return ids


def _whole(values: Mapping, name: str, default: object = None) -> int:
    """A whole-number node variable (the host's, else `default`, else the role's)."""
    value = values.get(name, ROLE_DEFAULTS[name] if default is None else default)
    try:
        number = int(str(value))
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None
    if number < 0:
        raise ValueError(f"{name} must not be negative, got {value!r}")
    return number


def node_topology(cpus: int, sockets: int, cores_per_socket: int, threads: int) -> str:
    """Sockets=/CoresPerSocket=/ThreadsPerCore= of a NodeName line ("" when the inventory
    gives no sockets: Slurm then counts CPUs only). They must multiply to the CPUs."""
    if not sockets:
        return ""
    if sockets * cores_per_socket * threads != cpus or not threads:
        raise ValueError(
            f"slurm_node_sockets {sockets} x slurm_node_cores_per_socket {cores_per_socket} x "
            f"slurm_node_threads_per_core {threads} is not slurm_node_cpus {cpus}"
        )
    return f"Sockets={sockets} CoresPerSocket={cores_per_socket} ThreadsPerCore={threads}"


def checked_gpu_cores(
    gpu_cores: object, gres: list[str], cores: int, mig: Sequence[MigDevice] = ()
) -> tuple[str, ...]:
    """slurm_node_gpu_cores: one core list per physical GPU (Slurm's logical core numbers,
    below the node's cores), or none at all."""
    entries = [
        str(entry) for entry in ([gpu_cores] if isinstance(gpu_cores, str) else gpu_cores or [])
    ]
    if not entries:
        return ()
    gpus = _physical_gpus(gres, mig)
    if len(entries) != gpus:
        raise ValueError(
            f"slurm_node_gpu_cores has {len(entries)} entries for {gpus} GPUs: give one per GPU"
        )
    for entry in entries:
        beyond = [core for core in _id_list(entry) if core >= cores]
        if beyond:
            raise ValueError(
                f"slurm_node_gpu_cores {entry!r} names core {beyond[0]}; the node has {cores} cores"
            )
    return tuple(entry.replace(" ", "") for entry in entries)


def _host_key(
    values: Mapping, cpus: object, memory_mb: object, memory_factor: float, defaults: dict
) -> tuple:
    """(cpus, RealMemory, Gres, Features, CoreSpecCount, MemSpecLimit, socket layout,
    cores per GPU, MIG devices) of one host: what its NodeName and gres.conf lines say."""
    gres = node_gres(
        values.get("slurm_node_gres", defaults["gres"]),
        str(values.get("slurm_gpu_sharing", defaults["sharing"])),
        values.get("slurm_gpu_shards_per_gpu", defaults["shards_per_gpu"]),
        values.get("slurm_gpu_mps_per_gpu", defaults["mps_per_gpu"]),
    )
    features = node_features(gres, values.get("slurm_node_features", defaults["features"]))
    node_cpus = _whole(values, "slurm_node_cpus", cpus)
    threads = _whole(values, "slurm_node_threads_per_core")
    sockets = _whole(values, "slurm_node_sockets")
    topology = node_topology(
        node_cpus, sockets, _whole(values, "slurm_node_cores_per_socket"), threads
    )
    given_cores = values.get("slurm_node_gpu_cores", ROLE_DEFAULTS["slurm_node_gpu_cores"])
    if given_cores and not topology:
        raise ValueError(
            "slurm_node_gpu_cores needs the node's CPU layout: set slurm_node_sockets and "
            "slurm_node_cores_per_socket (and slurm_node_threads_per_core) too, or Slurm "
            "numbers the cores differently"
        )
    mig = checked_mig_devices(
        values.get("slurm_node_mig_devices", ROLE_DEFAULTS["slurm_node_mig_devices"]), gres
    )
    sharing = str(values.get("slurm_gpu_sharing", defaults["sharing"]))
    if mig and sharing != "none":
        # slurmd 24.11 stops: "_build_shared_list: bad configuration, multiple
        # configurations without File" (seen in a lab with shards over MIG devices).
        raise ValueError(
            f"slurm_gpu_sharing: {sharing} cannot share a node with MIG devices "
            "(slurm_node_mig_devices): MIG is its sharing; set slurm_gpu_sharing: none there"
        )
    gpu_cores = checked_gpu_cores(
        given_cores, gres, node_cpus // threads if topology else node_cpus, mig
    )
    return (
        str(node_cpus),
        int(float(values.get("slurm_node_memory_mb", memory_mb)) * float(memory_factor)),
        ",".join(gres),
        ",".join(features),
        int(values.get("slurm_node_core_spec_count", defaults["core_spec"])),
        int(values.get("slurm_node_mem_spec_limit_mb", defaults["mem_spec"])),
        topology,
        gpu_cores,
        mig,
    )


# The slurm role's defaults (defaults/main.yml) of the per-node variables: what a host
# that does not set one in inventory has. hostvars hold inventory variables only, never
# role defaults, and the rendering host's own value must not stand in for another
# host's (a GPU node would lend its Gres to a CPU node): so these, not the rendering
# host's values, are the fallback. tests/unit/roles/test_hostlist.py keeps them in step.
ROLE_DEFAULTS = {
    "slurm_node_cpus": 1,
    "slurm_node_memory_mb": 1024,
    "slurm_node_gres": [],
    "slurm_gpu_sharing": "none",
    "slurm_gpu_shards_per_gpu": 4,
    "slurm_gpu_mps_per_gpu": 100,
    "slurm_node_features": [],
    "slurm_node_core_spec_count": 0,
    "slurm_node_mem_spec_limit_mb": 0,
    "slurm_node_sockets": 0,
    "slurm_node_cores_per_socket": 0,
    "slurm_node_threads_per_core": 1,
    "slurm_node_gpu_cores": [],
    "slurm_node_mig_devices": [],
}


def tacc_slurm_nodes(
    hosts: Iterable[str],
    hostvars: Mapping,
    cpus: object = ROLE_DEFAULTS["slurm_node_cpus"],
    memory_mb: object = ROLE_DEFAULTS["slurm_node_memory_mb"],
    gres: object = (),
    memory_factor: float = 0.95,
    sharing: str = ROLE_DEFAULTS["slurm_gpu_sharing"],
    shards_per_gpu: object = ROLE_DEFAULTS["slurm_gpu_shards_per_gpu"],
    mps_per_gpu: object = ROLE_DEFAULTS["slurm_gpu_mps_per_gpu"],
    features: object = (),
    core_spec: object = ROLE_DEFAULTS["slurm_node_core_spec_count"],
    mem_spec: object = ROLE_DEFAULTS["slurm_node_mem_spec_limit_mb"],
) -> list[dict]:
    """slurm.conf's node lines for `hosts`: one dict per distinct hardware, {names, addrs,
    cpus, real_memory, gres, features, core_spec_count, mem_spec_limit, topology,
    gpu_cores, hosts}. names is a hostlist; addrs is the hostlist
    of the nodes' ansible_host in the order of the names ("" when every address is the
    node's name); hosts the node names in that order.

    Each host's ansible_host, slurm_node_cpus, slurm_node_memory_mb, slurm_node_gres,
    slurm_gpu_sharing, slurm_gpu_shards_per_gpu, slurm_gpu_mps_per_gpu and
    slurm_node_features come from hostvars, falling back to the arguments (by default the
    role's defaults, ROLE_DEFAULTS); RealMemory is memory * memory_factor,
    truncated; Gres gets shard:/mps: added for GPU sharing (node_gres) and Features the
    GPU types (node_features). Looked up here rather than in a template loop: at
    thousands of hosts the per-host template code costs as much as Ansible's own hostvars
    lookup. Groups come in the order of their first node, so the result does not depend
    on the order of `hosts`.
    """
    defaults = {
        "gres": gres,
        "sharing": sharing,
        "shards_per_gpu": shards_per_gpu,
        "mps_per_gpu": mps_per_gpu,
        "features": features,
        "core_spec": core_spec,
        "mem_spec": mem_spec,
    }
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for host in hosts:
        values = hostvars[host]  # the costly part: all of the host's variables
        key = _host_key(values, cpus, memory_mb, memory_factor, defaults)
        groups.setdefault(key, []).append((_check(host), _check(values.get("ansible_host", host))))
    result = []
    for key, pairs in groups.items():
        (node_cpus, real_memory, node_gres_text, node_feature_text) = key[:4]
        core_spec_count, mem_spec, topology, gpu_cores, mig = key[4:]
        pairs.sort(key=lambda pair: natural_key(pair[0]))
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"a node is listed twice in {names}")
        addrs = [addr for _, addr in pairs]
        group = {
            "names": compress(names),
            "addrs": "" if addrs == names else compress(addrs),
            "cpus": node_cpus,
            "real_memory": real_memory,
            "gres": node_gres_text,
            "features": node_feature_text,
            "core_spec_count": core_spec_count,
            "mem_spec_limit": mem_spec,
            "topology": topology,
            "gpu_cores": list(gpu_cores),
            "mig": [list(device) for device in mig],
            "hosts": names,
        }
        result.append((natural_key(names[0]), group))
    return [group for _, group in sorted(result, key=lambda item: item[0])]


def tacc_gres_types(groups: Iterable[Mapping]) -> str:
    """GresTypes= for slurm.conf: every Gres name on the node lines, gpu first, then in
    the order they first appear ("gpu,shard")."""
    names: list[str] = []
    for group in groups:
        for name, _, _ in map(_parse_gres, _gres_list(group["gres"])):
            if name not in names:
                names.append(name)
    return ",".join(sorted(names, key=lambda name: name != "gpu"))


def tacc_gres_conf(groups: Iterable[Mapping]) -> list[str]:
    """gres.conf's node lines from tacc_slurm_nodes' groups: nodes whose Gres and cores
    per GPU are the same share one hostlist line per Gres entry."""
    by_gres: dict[tuple[str, tuple[str, ...], tuple[MigDevice, ...]], list[str]] = {}
    for group in groups:
        if group["gres"]:
            mig = tuple((int(g), str(t), int(i), int(c)) for g, t, i, c in group.get("mig", ()))
            key = (group["gres"], tuple(group.get("gpu_cores", ())), mig)
            by_gres.setdefault(key, []).extend(group["hosts"])
    ordered = sorted(by_gres.items(), key=lambda item: natural_key(min(item[1], key=natural_key)))
    return [
        f"NodeName={tacc_hostlist(hosts)} {line}"
        for (gres, gpu_cores, mig), hosts in ordered
        for line in gres_conf_lines(_gres_list(gres), gpu_cores, mig)
    ]


def tacc_partition_gpu_defaults(groups: Iterable[Mapping], partition: Mapping) -> dict[str, int]:
    """DefCpuPerGPU and DefMemPerGPU (MB) of a partition (a slurm_partitions entry) from
    tacc_slurm_nodes' groups: over the partition's GPU nodes, the most CPUs and memory
    per GPU that every one of them can give (its CPUs less CoreSpecCount, its RealMemory
    less MemSpecLimit, divided by its GPUs), so a job of default size fits on any of
    them; none where some node has fewer than one per GPU. The entry's def_cpu_per_gpu /
    def_mem_per_gpu win (0 leaves one out); {} for a partition without GPU nodes. A GPU
    job that names no CPUs or memory gets these (cons_tres), not one CPU and
    DefMemPerCPU."""
    members = partition.get("nodes", "ALL")
    if isinstance(members, str):
        chosen = None if members.strip().upper() == "ALL" else set(expand(members))
    else:
        chosen = {_check(name) for name in members}
    cpus, memory = [], []
    for group in groups:
        gpus = _gpu_count(map(_parse_gres, _gres_list(group["gres"])))
        if not gpus or (chosen is not None and not chosen.intersection(group["hosts"])):
            continue
        cpus.append((int(group["cpus"]) - int(group.get("core_spec_count", 0))) // gpus)
        memory.append((int(group["real_memory"]) - int(group.get("mem_spec_limit", 0))) // gpus)
    # A node with fewer CPUs than GPUs cannot give each GPU one: no CPU default then.
    found = {"DefCpuPerGPU": min(cpus), "DefMemPerGPU": min(memory)} if cpus else {}
    for key, option in (("DefCpuPerGPU", "def_cpu_per_gpu"), ("DefMemPerGPU", "def_mem_per_gpu")):
        if partition.get(option) is not None:
            found[key] = int(partition[option])
    return {key: value for key, value in found.items() if value > 0}


class FilterModule:
    def filters(self) -> dict:
        return {
            "tacc_hostlist": tacc_hostlist,
            "tacc_slurm_nodes": tacc_slurm_nodes,
            "tacc_gres_types": tacc_gres_types,
            "tacc_gres_conf": tacc_gres_conf,
            "tacc_partition_gpu_defaults": tacc_partition_gpu_defaults,
        }
