"""The agent's settings: /etc/tacc-agent/config.yaml (or $TACC_AGENT_CONFIG), written by
the tacc_agent role from inventory. Every key has a default, so the agent also runs
without the file (a laptop, a test)."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from tacc_agent.accounts import mapping
from tacc_agent.errors import AGENT_CLUSTER, AgentError
from tacc_contract.images import is_registry
from tacc_contract.job_defaults import CHECKPOINT_SIGNAL_SECONDS, DEFAULT_TIME_LIMIT

DEFAULT_PATH = Path("/etc/tacc-agent/config.yaml")


@dataclass(frozen=True)
class AgentConfig:
    # Root of the per-user task directories on shared storage: <workspace>/<user>.
    workspace: str = "/shared/tcloud"
    # The interpreter researchers' environments are built from (an isolated venv, so its
    # lock names every package in it).
    python: str = "/usr/bin/python3"
    # The index environments are built from: the cluster's package cache (role
    # package_cache), e.g. http://ctl1:3141/tacc/cluster/+simple/; "" = PyPI.
    package_index: str = ""
    # uv, which builds environments; "" = the one beside the agent's Python, else PATH.
    uv: str = ""
    # Where /sys/class/infiniband lives (a fixture tree in tests, the FAKE tree in the lab).
    rdma_sysfs_root: str = "/sys"
    # The inventory gives this node RDMA (group rdma_nodes): a job that falls back to TCP
    # here says so loudly (tacc_plugins/transport.py).
    rdma_declared: bool = False
    # Node facts written by `tacc-agent serve`; the execution layer reads them when fresh.
    facts_file: str = "/run/tacc-agent/facts.json"
    facts_max_age_seconds: int = 120
    # The time limit of a task that sets none (and has no prediction).
    default_time_limit: str = DEFAULT_TIME_LIMIT
    # Plug-ins (tacc_plugins): words applied to the defaults, e.g. ["las", "-duration",
    # "mylab.plugins"]; ops' choice, so it may also turn off policy plug-ins.
    plugins: tuple = ()
    # duration plug-in: a limit is predicted from the last `duration_history` completed
    # runs (at least `duration_min_runs`): longest x margin + pad, capped at
    # default_time_limit.
    duration_history: int = 5
    duration_min_runs: int = 1
    duration_margin: float = 1.5
    duration_pad_seconds: int = 60
    # las plug-in (off unless `plugins` names it; runs in the daemon where
    # queue_tick_seconds > 0, i.e. the controller): a user's attained GPU-seconds (node-
    # seconds for jobs without GPUs) pick their queue by these thresholds; each queue
    # below the most attained one gives their pending jobs las_nice_step more priority, on
    # top of the job's own nice. Attained service halves every las_half_life_seconds
    # (0: it never decays).
    queue_tick_seconds: float = 0.0
    las_thresholds: tuple = (3600.0, 36000.0)
    las_nice_step: int = 10000
    las_half_life_seconds: float = 86400.0
    # Settings of plug-ins that keep no field here: plug-in name -> its mapping
    # (tacc_contract.plugins.settings_of; each plug-in checks its own keys), e.g.
    # {tiresias: {thresholds: [3600], promote_knob: 8}}.
    plugin_settings: dict | None = None
    # SIGUSR1 this many seconds before the time limit (sbatch --signal).
    checkpoint_signal_seconds: int = CHECKPOINT_SIGNAL_SECONDS
    # `halt`: how long the program gets to checkpoint before the job is requeued on hold.
    halt_grace_seconds: int = 10
    # Upper bound of every Slurm command the agent runs.
    slurm_timeout_seconds: int = 15
    # How long ranks wait for each other at start (facts exchange).
    rendezvous_timeout_seconds: int = 120
    # How long a job waits for another job building the same environment.
    env_lock_timeout_seconds: int = 1800
    # --- container images (task field `image`, docs/containers.md) ---
    # The node's container runtime: charliecloud (ch-run; tested), apptainer or enroot
    # (same interface, untested here). tasks/execute/containers.py.
    container_runtime: str = "charliecloud"
    # Host directories every container gets at the same path (the workspace root below
    # them is masked: a user sees only their own directory there).
    container_binds: tuple = ("/shared",)
    # Slurm's SlurmdSpoolDir (Debian's; the slurm role's slurm_spool_dir): the PMIx
    # server's sockets (srun --mpi=pmix) live there.
    slurm_spool_dir: str = "/var/lib/slurm/slurmd"
    # The registries a task's image may come from (host[:port] as references name them):
    # the cluster's own and the public ones the site caches (the inventory's
    # tacc_image_registry and tacc_image_upstreams; roles/tacc_agent). Empty: any registry
    # the node reaches.
    image_registries: tuple = ()
    # `image resolve` (at submit): upper bound of the registry's answer.
    image_resolve_timeout_seconds: float = 30.0
    # A pull (skopeo copy, umoci unpack), each step; and how long a job waits for another
    # job pulling the same image.
    image_pull_timeout_seconds: float = 1800.0
    image_lock_timeout_seconds: int = 3600
    # A build from the task's Containerfile (`image: {build: ...}`, tasks/images/build.py):
    # upper bound of each RUN step.
    image_build_timeout_seconds: float = 3600.0
    # The node's NVIDIA driver files for containers (the nvidia_gpu role assembles it;
    # nvidia_gpu_container_driver_dir): bound at /usr/local/nvidia for a job given GPUs
    # where it exists; "" = never.
    container_gpu_driver_dir: str = "/usr/local/lib/tacc-nvidia"
    # --- health checks (`tacc-agent check`, issue [6]) ---
    # Checks turned on or off on this node by name, e.g. {gpu: false}: a check turned off
    # neither runs nor drains, and its figures leave /metrics; one not named keeps its
    # default (every built-in check is on). The names: tacc_agent/health/catalog.py.
    checks: dict | None = None
    # Upper bound of each external probe (nvidia-smi, systemctl, statfs of a mount).
    check_timeout_seconds: float = 5.0
    proc_root: str = "/proc"
    state_dir: str = "/var/lib/tacc-agent"
    # The queue ticks' records (the scheduling plug-ins' state, node ranges) and their
    # lock; "" = state_dir. With a backup controller: a root-only folder on storage both
    # controllers mount, so the one in control goes on from the other's records.
    cluster_state_dir: str = ""
    nvidia_smi: str = "nvidia-smi"
    expected_gpus: int = 0  # 0: GPUs are optional (absent is fine)
    # Where Xid lines are read: the kernel ring buffer, or "journal" (journalctl -k, the
    # kernel transport). A syslog file such as kern.log is not trusted (any account can
    # write kern-facility lines into it) and is no longer read.
    kernel_log: str = "/dev/kmsg"
    expected_rdma_ports: int = 0
    min_rdma_rate_gbps: float = 0.0
    # [{path, fstype, options: [..]}]: must be mounted like this and answer statfs.
    mounts: tuple = ()
    services: tuple = ("munge", "slurmd")
    # local path -> minimum free percent; "/" and every job_tmp_dirs entry are watched at
    # 5% unless named here.
    disk_min_free_percent: dict | None = None
    # Where jobs write scratch files (add Slurm's TmpFS if it is elsewhere): watched by the
    # disk check, which removes what departed users left there when space runs low.
    job_tmp_dirs: tuple = ("/tmp", "/var/tmp")  # noqa: S108 (watched, never written)
    real_memory_mb: int = 0  # the node's RealMemory in slurm.conf; 0: do not compare
    # Drain the node in Slurm when a check fails (reason "tacc: <check>: <detail>").
    drain: bool = True
    # --- the daemon (`tacc-agent serve`) ---
    check_interval_seconds: float = 60.0
    # Prometheus scrapes http://<node>:<metrics_port>/metrics (all interfaces by default,
    # like node_exporter; firewall it like any exporter). The port is below 1024, so only
    # root can bind it (the role's tacc_agent_metrics_port declares it and says why).
    metrics_address: str = "0.0.0.0"  # noqa: S104 (an exporter is scraped from outside)
    metrics_port: int = 977
    # Who gets the per-job series of /metrics (labels job and user) besides root on this
    # node: the cluster's Prometheus, which presents the token in metrics_job_token_file
    # (Authorization: Bearer) from one of these addresses, networks (10.0.0.0/24) or host
    # names (resolved when the daemon starts); both are needed. Every other client gets
    # the node's own figures only (health/metrics_access.py). The role lists the
    # monitoring hosts.
    metrics_job_scrapers: tuple = ()
    # The file holding the scrapers' token (root's only; read when the daemon starts).
    # "": none, so only root on this node gets the per-job series.
    metrics_job_token_file: str = ""
    # Serve the per-job series to every client. Unsafe on a shared cluster: whoever
    # reaches the port reads every job's id and user here, which Slurm's PrivateData hides.
    metrics_jobs_public: bool = False
    # --- operating the cluster (issue [15], docs/monitoring.md) ---
    # The controller's daemon also exports cluster-wide Slurm figures (jobs per partition
    # and state, GPUs allocated and total, drained nodes with their reasons, daemons up).
    cluster_metrics: bool = False
    # The cluster's Prometheus (roles/monitoring), e.g. http://n1:9090: the ops usage
    # report reads the GPU time jobs really used from it; "" = none (that column is empty).
    prometheus_url: str = ""
    # --- the web dashboard (issue [25], docs/monitoring.md "The dashboard's broker") ---
    # This node's daemon answers POST /dashboard on metrics_port: the broker that asks
    # Prometheus (prometheus_url) for a researcher's own jobs' figures, the caller known
    # by a MUNGE credential. The role turns it on on the first monitoring host only.
    dashboard_broker: bool = False
    # Where a login node's dashboard asks, http://<monitoring host>:<metrics_port>/dashboard;
    # "" = no broker (the dashboard shows no plots).
    dashboard_broker_url: str = ""
    # The group whose members see the ops views (the whole queue, the cluster's use, the
    # alerts), by their passwd group or a supplementary one on the monitoring host.
    dashboard_admin_group: str = "tacc_admins"
    # A researcher's dashboard server exits after this long without a request.
    dashboard_idle_seconds: int = 900
    # Acceptance of a new or rebooted node (`tacc-agent accept`): the figures it must
    # reach; a key left out keeps its default (tacc_agent/health/acceptance.py).
    acceptance: dict | None = None
    # --- accounts that follow the site's directory (issue [21], docs/directory.md) ---
    # Directory group -> Slurm account (tacc_agent/accounts/mapping.py: GroupAccount, read
    # from [{group, account, fairshare, qos, default_qos}]), kept by `tacc-agent accounts
    # sync` (root, on the controller; roles/tacc_agent's timer runs it).
    directory_accounts: tuple = ()
    # The jobs of a user who left every group of an account: "finish" (no new ones,
    # pending ones cancelled, running ones run to their end) or "cancel" (all cancelled).
    directory_removed_jobs: str = "finish"
    # The directory's uids (roles/identity's identity_min_id..identity_max_id): a group
    # member outside them (root, a service account, nobody, a local user) gets nothing.
    directory_id_range: tuple = (10000, 59999)

    @property
    def queue_state_dir(self) -> str:
        """Where the queue ticks keep their records: cluster_state_dir, else state_dir."""
        return self.cluster_state_dir or self.state_dir


def load_config(path: Path | None = None) -> AgentConfig:
    path = path or Path(os.environ.get("TACC_AGENT_CONFIG", DEFAULT_PATH))
    if not path.exists():
        return AgentConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise AgentError(f"{path}: cannot read agent config: {exc}", AGENT_CLUSTER) from None
    if not isinstance(data, dict):
        raise AgentError(f"{path}: expected a mapping of settings", AGENT_CLUSTER)
    known = {f.name: f.type for f in fields(AgentConfig)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise AgentError(f"{path}: unknown setting(s): {', '.join(unknown)}", AGENT_CLUSTER)
    check_scrapers(path, data.get("metrics_job_scrapers"))
    check_token_file(path, data.get("metrics_job_token_file"))
    for key in (
        "mounts",
        "services",
        "plugins",
        "las_thresholds",
        "job_tmp_dirs",
        "container_binds",
        "metrics_job_scrapers",
        "image_registries",
    ):
        if key in data:
            data[key] = tuple(data[key] or ())
    check_plugin_settings(path, data.get("plugin_settings"))
    check_kernel_log(path, data.get("kernel_log"))
    check_switches(path, data.get("checks"))
    check_containers(path, data.get("container_runtime"), data.get("container_binds", ()))
    check_registries(path, data.get("image_registries", ()))
    check_dashboard(path, data)
    try:
        data["directory_accounts"] = mapping.group_accounts(data.get("directory_accounts"))
        data["directory_removed_jobs"] = mapping.removed_jobs(
            data.get("directory_removed_jobs", "finish")
        )
        data["directory_id_range"] = mapping.id_range(
            data.get("directory_id_range", (10000, 59999))
        )
    except ValueError as exc:
        raise AgentError(f"{path}: {exc}", AGENT_CLUSTER) from None
    return AgentConfig(**data)


HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def check_scrapers(path: Path, scrapers: object) -> None:
    """`metrics_job_scrapers`: a list of addresses, networks or host names."""
    if scrapers is None:
        return
    if not isinstance(scrapers, list | tuple) or not all(
        isinstance(entry, str) and (is_network(entry) or HOST_NAME.fullmatch(entry))
        for entry in scrapers
    ):
        raise AgentError(
            f"{path}: metrics_job_scrapers: expected a list of addresses, networks "
            f"(10.0.0.0/24) or host names, not {scrapers!r}",
            AGENT_CLUSTER,
        )


def check_token_file(path: Path, token_file: object) -> None:
    """`metrics_job_token_file`: "" or an absolute path (what is in it is read at start)."""
    if token_file is None or token_file == "":
        return
    if not isinstance(token_file, str) or not token_file.startswith("/"):
        raise AgentError(
            f'{path}: metrics_job_token_file: expected an absolute path or "", not {token_file!r}',
            AGENT_CLUSTER,
        )


def is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


CONTAINER_RUNTIMES = ("charliecloud", "apptainer", "enroot")


def check_containers(path: Path, runtime: object, binds: tuple) -> None:
    if runtime is not None and runtime not in CONTAINER_RUNTIMES:
        raise AgentError(
            f"{path}: container_runtime: expected one of {', '.join(CONTAINER_RUNTIMES)}, "
            f"not {runtime!r}",
            AGENT_CLUSTER,
        )
    for bind in binds:
        if not isinstance(bind, str) or not bind.startswith("/") or ":" in bind or ".." in bind:
            raise AgentError(
                f"{path}: container_binds: expected absolute host directories (no ':' or "
                f"'..'), not {bind!r}",
                AGENT_CLUSTER,
            )


def check_registries(path: Path, registries: tuple) -> None:
    """`image_registries`: registry hosts as image references name them (host[:port])."""
    for registry in registries:
        if not isinstance(registry, str) or not is_registry(registry):
            raise AgentError(
                f"{path}: image_registries: expected registries as image references name "
                f"them (host[:port], e.g. nvcr.io or n1:5000), not {registry!r}",
                AGENT_CLUSTER,
            )


GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\$?")


def check_dashboard(path: Path, data: dict) -> None:
    """The dashboard's settings: a switch, "" or an http(s) address, a group name and a
    positive number of seconds."""
    problems = []
    if not isinstance(data.get("dashboard_broker", False), bool):
        problems.append(
            f"dashboard_broker: expected true or false, not {data['dashboard_broker']!r}"
        )
    url = data.get("dashboard_broker_url", "")
    if not isinstance(url, str) or (url and not re.fullmatch(r"https?://[^\s/]+/\S*", url)):
        problems.append(
            f'dashboard_broker_url: expected "" or http://<host>:<port>/dashboard, not {url!r}'
        )
    group = data.get("dashboard_admin_group", "tacc_admins")
    if not isinstance(group, str) or not GROUP_NAME.fullmatch(group):
        problems.append(f"dashboard_admin_group: expected a group name, not {group!r}")
    idle = data.get("dashboard_idle_seconds", 900)
    if not isinstance(idle, int) or isinstance(idle, bool) or idle <= 0:
        problems.append(f"dashboard_idle_seconds: expected seconds above 0, not {idle!r}")
    if problems:
        raise AgentError(f"{path}: {'; '.join(problems)}", AGENT_CLUSTER)


def check_plugin_settings(path: Path, settings: object) -> None:
    """`plugin_settings`: plug-in name -> mapping (each plug-in checks what is in it)."""
    if settings is None:
        return
    if not isinstance(settings, dict) or not all(
        isinstance(name, str) and isinstance(value, dict) for name, value in settings.items()
    ):
        raise AgentError(
            f"{path}: plugin_settings: expected a mapping of plug-in name to a mapping of "
            f"its settings (e.g. {{tiresias: {{promote_knob: 8}}}}), not {settings!r}",
            AGENT_CLUSTER,
        )


def check_switches(path: Path, switches: object) -> None:
    """`checks`: check name -> true/false. The names are the health registry's, checked
    where the checks are chosen (tacc_agent.health), which this module does not import."""
    if switches is None:
        return
    if not isinstance(switches, dict) or not all(
        isinstance(name, str) and isinstance(on, bool) for name, on in switches.items()
    ):
        raise AgentError(
            f"{path}: checks: expected a mapping of check name to true or false "
            f"(e.g. {{gpu: false}}), not {switches!r}",
            AGENT_CLUSTER,
        )


def check_kernel_log(path: Path, kernel_log: object) -> None:
    """kernel_log was a syslog file once; one now would silently find no Xid at all."""
    if kernel_log is None or kernel_log == "journal":
        return
    if not isinstance(kernel_log, str) or Path(kernel_log).is_file():
        raise AgentError(
            f"{path}: kernel_log: expected /dev/kmsg (or another kernel ring buffer device) "
            f"or 'journal', not {kernel_log!r}: a log file holds lines any user can write, "
            "so Xid lines are no longer read from one",
            AGENT_CLUSTER,
        )
