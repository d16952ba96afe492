"""Clusters tcloud knows, in ~/.config/tcloud/config.yaml ($TCLOUD_CONFIG overrides):

    current: lab
    clusters:
      lab: {host: 10.77.0.11, user: alice, port: 22, key: ~/.ssh/id_ed25519,
            proxy_jump: null, known_hosts: null, userdir: null,
            multiplex: true, multiplex_idle: 300, fallback_hosts: [10.77.0.13]}

`host` may be an alias from ~/.ssh/config; HostName, User, Port, IdentityFile and
ProxyJump from there fill what the entry leaves out. `userdir` is the user's directory
on the cluster (default: ~/tcloud on the login node, which should be on shared storage).
`multiplex` (default true) shares one SSH connection between commands through a
connection master that exits after `multiplex_idle` seconds unused (tcloud.transport.mux).
`fallback_hosts` (default none) are other login hosts of the same cluster, tried in order
when `host` does not answer (its node is down: a site with a backup controller on a
second head node); each is verified against known_hosts like `host`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from tcloud.errors import TcloudError

FIELDS = (
    "host",
    "user",
    "port",
    "key",
    "proxy_jump",
    "known_hosts",
    "userdir",
    "multiplex",
    "multiplex_idle",
    "fallback_hosts",
)
NOT_TEXT = ("port", "multiplex", "multiplex_idle", "fallback_hosts")


@dataclass(frozen=True)
class Cluster:
    name: str
    host: str
    user: str | None = None
    port: int | None = None
    key: str | None = None
    proxy_jump: str | None = None
    known_hosts: str | None = None
    userdir: str | None = None
    multiplex: bool | None = None
    multiplex_idle: int | None = None
    fallback_hosts: tuple[str, ...] = ()


def config_path() -> Path:
    default = Path.home() / ".config" / "tcloud" / "config.yaml"
    return Path(os.environ.get("TCLOUD_CONFIG", default))


def load() -> dict:
    path = config_path()
    if not path.exists():
        return {"current": None, "clusters": {}}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise TcloudError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TcloudError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise TcloudError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("clusters", {}), dict):
        raise TcloudError(f"{path}: expected a mapping with 'clusters'")
    data["clusters"] = data.get("clusters") or {}
    data.setdefault("current", None)
    return data


def check_port(value: object, where: str) -> int:
    """A TCP port, 1-65535; TcloudError naming where it came from otherwise."""
    try:
        port = int(str(value))
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise TcloudError(f"{where}: port must be a number from 1 to 65535, got {value!r}")
    return port


def save(data: dict) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=True))
    tmp.chmod(0o600)
    tmp.replace(path)


def set_cluster(name: str, values: dict) -> Cluster:
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise TcloudError(f"unknown cluster settings: {', '.join(unknown)}")
    if values.get("port") is not None:
        check_port(values["port"], f"cluster {name!r}")
    if values.get("fallback_hosts") is not None:
        values = {**values, "fallback_hosts": list(values["fallback_hosts"])}
    data = load()
    old = data["clusters"].get(name)
    old = old if isinstance(old, dict) else {}
    entry = {**old, **{k: v for k, v in values.items() if v is not None}}
    if "host" not in entry:
        raise TcloudError(f"cluster {name!r} needs --host")
    data["clusters"][name] = entry
    data["current"] = data["current"] or name
    save(data)
    return cluster(name)


def use(name: str) -> None:
    data = load()
    if name not in data["clusters"]:
        known = ", ".join(sorted(data["clusters"])) or "none"
        raise TcloudError(f"no cluster {name!r}; known: {known} (`tcloud config add`)")
    data["current"] = name
    save(data)


def cluster(name: str | None = None) -> Cluster:
    data = load()
    name = name or os.environ.get("TCLOUD_CLUSTER") or data["current"]
    if not name:
        raise TcloudError("no cluster configured; `tcloud config add NAME --host HOST`")
    entry = data["clusters"].get(name)
    where = f"{config_path()}: cluster {name!r}"
    if entry is None:
        raise TcloudError(f"no cluster {name!r} in {config_path()}")
    if not isinstance(entry, dict):
        raise TcloudError(f"{where}: expected a mapping of settings ({', '.join(FIELDS)})")
    unknown = sorted(str(k) for k in set(entry) - set(FIELDS))
    if unknown:
        raise TcloudError(f"{where}: unknown settings {', '.join(unknown)}")
    values = {k: entry.get(k) for k in FIELDS}
    for key in FIELDS:
        if key not in NOT_TEXT and values[key] is not None and not isinstance(values[key], str):
            raise TcloudError(f"{where}: {key} must be text, got {values[key]!r}")
    if values["multiplex"] is not None and not isinstance(values["multiplex"], bool):
        raise TcloudError(f"{where}: multiplex must be true or false, got {values['multiplex']!r}")
    idle = values["multiplex_idle"]
    if idle is not None and (isinstance(idle, bool) or not isinstance(idle, int) or idle < 0):
        raise TcloudError(f"{where}: multiplex_idle must be whole seconds >= 0, got {idle!r}")
    if not values["host"]:
        raise TcloudError(f"{where}: needs a host (`tcloud config add {name} --host HOST`)")
    if values["port"] is not None:
        values["port"] = check_port(values["port"], where)
    values["fallback_hosts"] = check_fallback_hosts(values["fallback_hosts"], where)
    return Cluster(name=name, **values)


def check_fallback_hosts(value: object, where: str) -> tuple[str, ...]:
    """fallback_hosts: a list of host names (none when unset)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(h, str) and h for h in value):
        raise TcloudError(f"{where}: fallback_hosts must be a list of host names, got {value!r}")
    return tuple(value)


def listing() -> list[dict]:
    data = load()
    return [
        {**asdict(cluster(name)), "current": name == data["current"]}
        for name in sorted(data["clusters"])
    ]
