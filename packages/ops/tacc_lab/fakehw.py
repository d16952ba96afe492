"""Give a lab node FAKE hardware: NVIDIA GPUs/NVSwitches, ConnectX NICs, RDMA devices.

The lab has none of these, so roles are tested against fakes at the tool boundary
(tacc_lab/fakes): `lspci`, `mstflint`, `mlxconfig`, `mlxfwmanager` wrappers in
/usr/local/bin, a device state file, an RDMA sysfs tree under /opt/tacc-fake-hw/sys, a
CPU topology sysfs tree under /opt/tacc-fake-hw/sys/devices/system/cpu (the sockets and
cores the fake GPUs sit next to, as `nvidia-smi topo -m` reports them), and a local apt
repository whose "driver" package ships the fake `nvidia-smi` and stub persistenced/fabric
manager daemons, so the nvidia_gpu role really installs a driver package from a
repository given in variables. Everything is written into the node's
root filesystem from the host.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from tacc_lab.errors import LabError
from tacc_lab.fakes.nvidia_mig import mig_minors

FAKES_SRC = Path(__file__).resolve().parent / "fakes"
OPT = Path("opt/tacc-fake-hw")
REPO = OPT / "repo"
SYSFS = OPT / "sys/class/infiniband"
CPU_SYSFS = OPT / "sys/devices/system/cpu"
TOOLS = ("lspci", "mstflint", "mlxconfig", "mlxfwmanager")
# Node-side locations the lab inventory points the roles at.
NODE_REPO_URI = f"file:/{REPO}"
NODE_RDMA_SYSFS = f"/{SYSFS}"
NODE_RDMA_CONFIGFS = f"/{OPT}/config/rdma_cm"
NODE_CPU_SYSFS = f"/{CPU_SYSFS}"
MIG_MINORS = OPT / "proc/driver/nvidia-caps/mig-minors"
NODE_MIG_MINORS = f"/{MIG_MINORS}"

GPU_MODELS = {
    "h100": ("2330", "NVIDIA H100 80GB HBM3", 81559),
    "h200": ("2335", "NVIDIA H200", 143771),
    "a100": ("20b2", "NVIDIA A100-SXM4-80GB", 81920),
    "l40s": ("26b9", "NVIDIA L40S", 46068),
}
NIC_PSID = "MT_0000000359"
# The FAKE repository's driver versions (the lab installs the first; the second is an
# upgrade that needs a reboot), DCGM's and the kernel headers package's name.
DRIVER_VERSIONS = ("550.54.15", "550.163.01")
DCGM_VERSION = "1:3.3.9"
FAKE_HEADERS_PACKAGE = "tacc-fake-linux-headers"
# The real driver creates /dev/nvidiaN; slurmd stat()s the gres.conf File= paths. nspawn
# nodes cannot mknod GPU devices, so empty placeholder files stand in (lab only).
DEV_NODES_SCRIPT = """\
import json
from pathlib import Path

state = json.loads(Path("/etc/tacc-fake-hw/state.json").read_text())
names = [f"nvidia{i}" for i in range(len(state.get("gpus", [])))]
for name in names + ["nvidiactl", "nvidia-uvm"] if names else []:
    Path("/dev", name).touch(mode=0o666)
"""


@dataclass(frozen=True)
class FakeHardware:
    gpus: int = 0
    gpu_model: str = "h100"
    nvswitches: int = 0
    nics: int = 0
    nic_fw: str = "22.36.1010"
    ib_devices: int = 0
    link_layer: str = "InfiniBand"
    # The CPU topology the GPUs sit in (0: one socket of the host's CPUs): GPUs are
    # spread evenly over the sockets, in PCI order.
    sockets: int = 1
    cores_per_socket: int = 0


def cpu_layout(hw: FakeHardware) -> dict:
    """{"sockets", "cores_per_socket", "threads_per_core"} of the fake node."""
    if hw.sockets < 1 or hw.cores_per_socket < 0:
        raise LabError("a fake node needs at least one socket and no negative core count")
    cores = hw.cores_per_socket or max(1, (os.cpu_count() or 1) // hw.sockets)
    return {"sockets": hw.sockets, "cores_per_socket": cores, "threads_per_core": 1}


def device_state(hw: FakeHardware, node: str) -> dict:
    if hw.gpu_model not in GPU_MODELS:
        raise LabError(f"unknown GPU model {hw.gpu_model!r}; known: {', '.join(GPU_MODELS)}")
    device_id, name, memory = GPU_MODELS[hw.gpu_model]
    seed = hashlib.sha256(node.encode()).hexdigest()
    gpus = [
        {
            "pci": f"0000:{0x17 + 0x10 * i:02x}:00.0",
            "device_id": device_id,
            "name": name,
            "uuid": f"GPU-{seed[:8]}-{seed[8:12]}-{seed[12:16]}-{i:04x}-{seed[16:28]}",
            "memory_mib": memory,
            "socket": i * hw.sockets // hw.gpus,
        }
        for i in range(hw.gpus)
    ]
    switches = [{"pci": f"0000:0{5 + i}:00.0", "device_id": "22a3"} for i in range(hw.nvswitches)]
    nics = [
        {
            "pci": f"0000:{0x3B + 0x10 * i:02x}:00.0",
            "device_type": "ConnectX6DX",
            "part_number": "MCX623106AN-CDA_Ax",
            "description": "ConnectX-6 Dx EN adapter card; 100GbE; Dual-port QSFP56; PCIe 4.0 x16",
            "psid": NIC_PSID,
            "fw_version": hw.nic_fw,
            "base_guid": f"b8cef603{seed[:6]}{i:02x}",
            "base_mac": f"b8cef6{seed[:4]}{i:02x}",
            "config": {
                "LINK_TYPE_P1": "ETH(2)",
                "LINK_TYPE_P2": "ETH(2)",
                "SRIOV_EN": "False(0)",
                "NUM_OF_VFS": "0",
            },
            "next_boot": {},
            "pending_fw": None,
        }
        for i in range(hw.nics)
    ]
    return {
        "gpus": gpus,
        "nvswitches": switches,
        "cuda_version": "12.4",
        "nics": nics,
        "cpu": cpu_layout(hw),
    }


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _wrapper(tool: str) -> str:
    module = tool.replace("-", "_")
    return (
        "#!/bin/sh\n# FAKE (lab only): see /opt/tacc-fake-hw/fakes/README\n"
        f'exec /usr/bin/python3 /{OPT}/fakes/{module}.py "$@"\n'
    )


@dataclass(frozen=True)
class FakePackage:
    """One binary package of the FAKE driver repository."""

    name: str
    version: str
    files: dict[str, tuple[str, int]]
    depends: str = ""


def _build_deb(workdir: Path, package: FakePackage, out: Path) -> Path:
    """A minimal binary package (dpkg-deb) holding its files {path: (text, mode)}."""
    root = workdir / f"{package.name}_{package.version}"
    for rel, (text, mode) in package.files.items():
        _write(root / rel, text, mode)
    control = (
        f"Package: {package.name}\nVersion: {package.version}\nArchitecture: all\n"
        "Maintainer: tacc-lab <root@localhost>\n"
        + (f"Depends: {package.depends}\n" if package.depends else "")
        + f"Description: FAKE (lab only) {package.name}: emulates a vendor package for tests\n"
    )
    _write(root / "DEBIAN/control", control)
    deb = out / f"{package.name}_{package.version.split(':')[-1]}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _daemon_unit(description: str, binary: str) -> str:
    return (
        f"[Unit]\nDescription=FAKE (lab only) {description}\n\n"
        f"[Service]\nExecStart={binary}\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def _oneshot_unit(description: str, command: str, before: str) -> str:
    return (
        f"[Unit]\nDescription=FAKE (lab only) {description}\nBefore={before}\n\n"
        f"[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={command}\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


STUB_DAEMON = "#!/bin/sh\n# FAKE (lab only) NVIDIA daemon: does nothing\nexec sleep infinity\n"
HWSTATE = f"/usr/bin/python3 /{OPT}/fakes/hwstate.py"
# What DKMS says when it cannot build (no headers for the running kernel): the package is
# installed, no module is.
DKMS_POSTINST = """\
#!/bin/sh
set -e
systemctl enable tacc-fake-nvidia-module.service
if [ ! -d "/usr/src/linux-headers-$(uname -r)" ]; then
    echo "Module build for kernel $(uname -r) was skipped since the kernel headers" \\
        "for this kernel do not seem to be installed."
    exit 0
fi
mkdir -p "/lib/modules/$(uname -r)/updates/dkms"
echo "FAKE (lab only) nvidia {version}" > "/lib/modules/$(uname -r)/updates/dkms/nvidia.ko"
{hwstate} module-built {version}
"""


def driver_packages(version: str) -> list[FakePackage]:
    """One driver version in both repository shapes: Debian's (nvidia-driver,
    nvidia-kernel-dkms) and NVIDIA's CUDA repository's (cuda-drivers, cuda-drivers-BRANCH,
    nvidia-fabricmanager-BRANCH), all at `version`-1 as both number them."""
    deb_version, branch = f"{version}-1", version.split(".")[0]
    exact = f"(= {deb_version})"
    smi = (
        "#!/bin/sh\n# FAKE (lab only): see /opt/tacc-fake-hw/fakes/README\n"
        f"export TACC_FAKE_NVML_VERSION={version}\n"
        f'exec /usr/bin/python3 /{OPT}/fakes/nvidia_smi.py "$@"\n'
    )
    devnodes = _oneshot_unit(
        "/dev/nvidia* placeholders for the fake GPUs",
        "/usr/bin/python3 /usr/lib/tacc-fake-hw/make-dev-nodes",
        "slurmd.service nvidia-persistenced.service",
    )
    module = _oneshot_unit(
        "load the NVIDIA kernel module DKMS built last",
        f"{HWSTATE} load-driver",
        "tacc-fake-nvidia-devnodes.service nvidia-persistenced.service slurmd.service",
    )
    return [
        FakePackage(
            "nvidia-kernel-dkms",
            deb_version,
            {
                "lib/systemd/system/tacc-fake-nvidia-module.service": (module, 0o644),
                "DEBIAN/postinst": (DKMS_POSTINST.format(hwstate=HWSTATE, version=version), 0o755),
            },
        ),
        FakePackage(
            "nvidia-driver",
            deb_version,
            {
                "usr/bin/nvidia-smi": (smi, 0o755),
                "usr/lib/tacc-fake-hw/make-dev-nodes": (DEV_NODES_SCRIPT, 0o755),
                "lib/systemd/system/tacc-fake-nvidia-devnodes.service": (devnodes, 0o644),
                "DEBIAN/postinst": (
                    "#!/bin/sh\nset -e\nsystemctl enable tacc-fake-nvidia-devnodes.service\n"
                    "systemctl start tacc-fake-nvidia-devnodes.service\n",
                    0o755,
                ),
                "usr/bin/nvidia-persistenced": (STUB_DAEMON, 0o755),
                "lib/systemd/system/nvidia-persistenced.service": (
                    _daemon_unit("NVIDIA persistence daemon", "/usr/bin/nvidia-persistenced"),
                    0o644,
                ),
            },
            depends=f"nvidia-kernel-dkms {exact}",
        ),
        FakePackage(f"cuda-drivers-{branch}", deb_version, {}, f"nvidia-driver {exact}"),
        FakePackage("cuda-drivers", deb_version, {}, f"cuda-drivers-{branch} {exact}"),
        FakePackage(
            f"nvidia-fabricmanager-{branch}",
            deb_version,
            {
                "usr/bin/nv-fabricmanager": (STUB_DAEMON, 0o755),
                "lib/systemd/system/nvidia-fabricmanager.service": (
                    _daemon_unit("NVIDIA fabric manager", "/usr/bin/nv-fabricmanager"),
                    0o644,
                ),
            },
        ),
    ]


def other_packages() -> list[FakePackage]:
    """DCGM (its own numbering) and the kernel headers DKMS builds against."""
    headers = f"usr/src/linux-headers-{os.uname().release}/Makefile"
    return [
        FakePackage(
            "datacenter-gpu-manager",
            DCGM_VERSION,
            {
                "usr/bin/nv-hostengine": (STUB_DAEMON, 0o755),
                "lib/systemd/system/nvidia-dcgm.service": (
                    _daemon_unit("NVIDIA DCGM host engine", "/usr/bin/nv-hostengine"),
                    0o644,
                ),
            },
        ),
        FakePackage(
            FAKE_HEADERS_PACKAGE,
            "1.0",
            {headers: ("# FAKE (lab only) kernel headers for DKMS\n", 0o644)},
        ),
    ]


def build_driver_repo(repo: Path) -> None:
    """A flat apt repository with every FAKE driver version in both shapes, DCGM and the
    kernel headers."""
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    packages = [p for v in DRIVER_VERSIONS for p in driver_packages(v)] + other_packages()
    stanzas = []
    with tempfile.TemporaryDirectory() as tmp:
        for package in packages:
            deb = _build_deb(Path(tmp), package, repo)
            data = deb.read_bytes()
            control = subprocess.run(
                ["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True
            ).stdout
            stanzas.append(
                control.rstrip("\n")
                + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
            )
    packages_text = "\n".join(stanzas)
    _write(repo / "Packages", packages_text)
    digest = hashlib.sha256(packages_text.encode()).hexdigest()
    _write(
        repo / "Release",
        "Origin: tacc-lab\nLabel: FAKE NVIDIA driver (lab only)\nSuite: ./\n"
        f"Date: {formatdate(usegmt=True)}\n"
        f"SHA256:\n {digest} {len(packages_text.encode())} Packages\n",
    )


def build_rdma_tree(root: Path, hw: FakeHardware) -> None:
    """/sys/class/infiniband look-alike: mlx5_N/ports/1/{state,link_layer,rate}."""
    if root.exists():
        shutil.rmtree(root)
    for i in range(hw.ib_devices):
        port = root / f"mlx5_{i}" / "ports" / "1"
        _write(port / "state", "4: ACTIVE\n")
        _write(port / "phys_state", "5: LinkUp\n")
        _write(port / "link_layer", f"{hw.link_layer}\n")
        _write(port / "rate", "200 Gb/sec (4X HDR)\n")
    root.mkdir(parents=True, exist_ok=True)


def build_cpu_tree(root: Path, layout: dict) -> None:
    """/sys/devices/system/cpu look-alike: cpuN/topology/{physical_package_id,core_id},
    CPUs numbered socket by socket as Linux numbers them on most two-socket servers."""
    if root.exists():
        shutil.rmtree(root)
    cores = layout["cores_per_socket"]
    for socket in range(layout["sockets"]):
        for core in range(cores):
            topology = root / f"cpu{socket * cores + core}" / "topology"
            _write(topology / "physical_package_id", f"{socket}\n")
            _write(topology / "core_id", f"{core}\n")
    root.mkdir(parents=True, exist_ok=True)


def install(rootfs: Path, node: str, hw: FakeHardware) -> list[str]:
    """Install the fakes into a node's root filesystem; return what was installed."""
    if not (rootfs / "etc").is_dir():
        raise LabError(f"{rootfs} is not a mounted node root filesystem")
    fakes = rootfs / OPT / "fakes"
    if fakes.exists():
        shutil.rmtree(fakes)
    shutil.copytree(FAKES_SRC, fakes, ignore=shutil.ignore_patterns("__pycache__"))
    _write(
        fakes / "README",
        "FAKE hardware tools for tacc-lab nodes: not NVIDIA/Mellanox software.\n",
    )
    for tool in TOOLS:
        _write(rootfs / "usr/local/bin" / tool, _wrapper(tool), 0o755)
    state = device_state(hw, node)
    state_file = rootfs / "etc/tacc-fake-hw/state.json"
    if state_file.exists():  # new cards, same kernel: its NVIDIA module stays as it was
        old = json.loads(state_file.read_text())
        state.update({k: old[k] for k in ("driver_version", "driver_built") if k in old})
    _write(state_file, json.dumps(state, indent=2) + "\n")
    (rootfs / "var/log/tacc-fake-hw").mkdir(parents=True, exist_ok=True)
    build_driver_repo(rootfs / REPO)
    build_rdma_tree(rootfs / SYSFS, hw)
    build_cpu_tree(rootfs / CPU_SYSFS, state["cpu"])
    _write(rootfs / MIG_MINORS, mig_minors(len(state["gpus"])))
    (rootfs / OPT / "config/rdma_cm").mkdir(parents=True, exist_ok=True)
    return [
        f"{len(state['gpus'])} x {hw.gpu_model} GPU",
        f"{len(state['nvswitches'])} NVSwitch",
        f"{len(state['nics'])} ConnectX-6 Dx (fw {hw.nic_fw})",
        f"{hw.ib_devices} RDMA device ({hw.link_layer})",
        "{sockets} socket x {cores_per_socket} core CPU".format(**state["cpu"]),
    ]
