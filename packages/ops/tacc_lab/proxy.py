"""The egress proxy nodes use to reach package registries, and nothing else.

The allow-list is read from this host's own apt sources and pip configuration, so the
lab reaches exactly the registries the host itself uses (a cluster behind an egress
proxy or a local mirror is fed the same way).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from tacc_lab.addressing import bridge_address
from tacc_lab.apt_sources import source_hosts
from tacc_lab.config import PROXY_PORT, LabConfig
from tacc_lab.errors import LabError
from tacc_lab.processes import process_alive, stop_process
from tacc_lab.runner import run


def pip_index_hosts(python: str = sys.executable) -> set[str]:
    """Hosts pip would contact: configured http(s) index URLs, else pip's built-in index."""
    out = run([python, "-m", "pip", "config", "list"], check=False)
    hosts: set[str] = set()
    has_index_url = False
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(("index-url", "extra-index-url")):
            has_index_url = has_index_url or key.endswith(".index-url")
            for url in value.strip().strip("'\"").split():
                parts = urlsplit(url)
                if parts.scheme in ("http", "https") and parts.hostname:
                    hosts.add(parts.hostname)
    env_index = os.environ.get("PIP_INDEX_URL")
    if env_index:
        has_index_url = True
        if urlsplit(env_index).hostname:
            hosts.add(urlsplit(env_index).hostname or "")
    if not has_index_url:
        hosts |= default_pip_index_hosts(python)
    return hosts


def default_pip_index_hosts(python: str) -> set[str]:
    """pip's own default index and file host, asked of pip rather than written here."""
    code = (
        "from pip._internal.models.index import PyPI;"
        "print(PyPI.netloc);print(PyPI.file_storage_domain)"
    )
    return {h for h in run([python, "-c", code], check=False).split() if h}


def filter_rules(hosts: set[str]) -> str:
    """tinyproxy `FilterType ere` rules that match exactly these host names."""
    return "".join(f"^{re.escape(host)}$\n" for host in sorted(hosts))


def render_config(cfg: LabConfig, filter_file: Path, log_file: Path, pid_file: Path) -> str:
    return "\n".join(
        [
            f"Port {PROXY_PORT}",
            f"Listen {bridge_address(cfg.subnet)}",
            "Timeout 600",
            "MaxClients 64",
            f"Allow {cfg.subnet}",
            f'Filter "{filter_file}"',
            "FilterType ere",
            "FilterDefaultDeny Yes",
            "ConnectPort 443",
            f'LogFile "{log_file}"',
            "LogLevel Connect",
            f'PidFile "{pid_file}"',
            "User nobody",
            "Group nogroup",
            "",
        ]
    )


def proxy_url(cfg: LabConfig) -> str:
    return f"http://{bridge_address(cfg.subnet)}:{PROXY_PORT}"


def start_proxy(cfg: LabConfig) -> int:
    """Start tinyproxy in the foreground of its own session; return its pid."""
    cfg.proxy_dir.mkdir(parents=True, exist_ok=True)
    filter_file = cfg.proxy_dir / "filter"
    log_file = cfg.proxy_dir / "tinyproxy.log"
    pid_file = cfg.proxy_dir / "tinyproxy.pid"
    hosts = source_hosts() | pip_index_hosts()
    if not hosts:
        raise LabError("found no package registry hosts in apt sources or pip config")
    filter_file.write_text(filter_rules(hosts))
    log_file.touch()
    os.chown(log_file, *_nobody_ids())
    conf = cfg.proxy_dir / "tinyproxy.conf"
    conf.write_text(render_config(cfg, filter_file, log_file, pid_file))
    proc = subprocess.Popen(
        ["tinyproxy", "-d", "-c", str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(cfg.proxy_dir / "stderr.log", "ab"),  # noqa: SIM115 - child owns it
        start_new_session=True,
    )
    _wait_listening(cfg, proc)
    return proc.pid


def _nobody_ids() -> tuple[int, int]:
    import grp
    import pwd

    return pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid


def _wait_listening(cfg: LabConfig, proc: subprocess.Popen) -> None:
    import socket

    address = (str(bridge_address(cfg.subnet)), PROXY_PORT)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (cfg.proxy_dir / "stderr.log").read_text(errors="replace").strip()
            raise LabError(f"tinyproxy exited at start (exit {proc.returncode}): {err[-400:]}")
        try:
            with socket.create_connection(address, timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise LabError(f"tinyproxy did not listen on {address[0]}:{address[1]} within 10 s")


def proxy_alive(cfg: LabConfig, pid: int | None) -> bool:
    return process_alive(pid, str(cfg.proxy_dir))


def stop_proxy(cfg: LabConfig, pid: int | None) -> None:
    stop_process(pid, str(cfg.proxy_dir))
