"""The program `tacc-agent accept` runs on the nodes it tests, as Slurm steps: the OS's
python3 runs this file by its path (it imports only the standard library, and mpi4py, the
OS's python3-mpi4py, for the allreduce), so it needs neither the agent's venv nor its
import path. Each mode prints one JSON line per task and exits 0; a failure prints
{"error": ...} and exits 1.

  facts [--python PATH]       this node's name, GPUs (/dev/nvidiaN), RDMA devices
                              (/sys/class/infiniband), where the tools are (PATH), and
                              why root must not run PATH (python_unsafe: a file of it,
                              of its venv or a directory above them that is not root's or
                              that others may write; "" when safe)
  allreduce --mib N --iterations K
                              MPI allreduce (SUM, float64) of N MiB between every rank;
                              rank 0 prints the algorithm bandwidth in MB/s (10^6 bytes/s:
                              the message size over the slowest rank's time per call)
  nccl --gpus N --binary PATH nccl-tests' all_reduce_perf on N GPUs; its average bus
                              bandwidth in GB/s
  rdma --server-node NODE --server-address ADDR
                              perftest's ib_write_bw between the two nodes of the step:
                              the task on NODE serves, the other connects and prints the
                              average bandwidth in Gb/s
  torch --backend B --mib N --iterations K --master-node NODE --master-address ADDR --port P
                              torch.distributed all_reduce (SUM, float32) of N MiB between
                              the step's two tasks (backend nccl: a GPU each; gloo: CPU),
                              rank 0 on NODE; each first shows the other HMAC(token, its
                              rank) of the step's token ($TACC_ACCEPT_TOKEN: a process of
                              another user that joins the rendezvous has it not); rank 0
                              prints the bus bandwidth in
                              GB/s (nccl-tests' busbw: size x 2(n-1)/n over the slowest
                              rank's time per call). Run by a python with torch (the
                              acceptance setting torch_python), not the OS's.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

try:  # the OS's python3-mpi4py: only `allreduce` needs it, and starts MPI itself (Init)
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    from mpi4py import MPI
except ImportError:
    MPI = None

try:  # only `torch` needs it, run by a python that has it (the OS's python3 has not)
    import torch
    import torch.distributed as torch_distributed
except ImportError:
    torch = None

MIB = 1 << 20
INFINIBAND = Path("/sys/class/infiniband")
DEV = Path("/dev")
TOOLS = ("all_reduce_perf", "ib_write_bw")
NCCL_AVERAGE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", re.MULTILINE)
NUMBER = re.compile(r"^[0-9]+(\.[0-9]+)?$")
RDMA_PORT = 18515
RDMA_SECONDS = 5
CONNECT_TRIES = 10


def say(data: dict) -> None:
    print(json.dumps(data, sort_keys=True), flush=True)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def rdma_devices(root: Path = INFINIBAND) -> list[str]:
    try:
        return sorted(entry.name for entry in root.iterdir())
    except OSError:
        return []


def gpu_count(dev: Path = DEV) -> int:
    try:
        return sum(1 for entry in dev.iterdir() if re.fullmatch(r"nvidia[0-9]+", entry.name))
    except OSError:
        return 0


def facts(tools: list[str], python: str = "") -> dict:
    found = {
        "node": node_name(),
        "gpus": gpu_count(),
        "rdma_devices": rdma_devices(),
        "tools": {tool: shutil.which(tool) for tool in tools},
    }
    return found | ({"python_unsafe": unsafe_python(python)} if python else {})


def not_roots(path: Path) -> str:
    """Why `path` (not followed) lets another user change what root runs: "" when it is
    root's and only root may write it."""
    info = path.lstat()
    if info.st_uid != 0:
        return f"{path} belongs to uid {info.st_uid}"
    if not path.is_symlink() and info.st_mode & 0o022:
        return f"{path} may be written by others (mode {info.st_mode & 0o7777:o})"
    return ""


def unsafe_python(program: str) -> str:
    """Why root must not run the python `program` (the acceptance's torch_python): it,
    its real file, the directories above them and, for a venv, every file in the venv
    must be root's and writable by root only. "" when safe."""
    path = Path(program)
    real = Path(os.path.realpath(program))
    if not path.is_absolute() or not real.is_file():
        return f"{program}: no such program"
    venv = path.parent.parent
    checked = [path, real, *path.parents, *real.parents]
    try:
        if (venv / "pyvenv.cfg").is_file():
            for folder, dirs, files in os.walk(venv):
                checked.extend(Path(folder, name) for name in dirs + files)
        for each in checked:
            if why := not_roots(each):
                return why
    except OSError as exc:
        return f"{program}: {exc}"
    return ""


def allreduce(mib: float, iterations: int) -> dict | None:
    """The allreduce figures on rank 0, None on the other ranks."""
    if MPI is None:
        raise ProbeError("mpi4py is not installed (the OS package python3-mpi4py)")
    MPI.Init()
    try:
        return allreduce_figures(MPI.COMM_WORLD, mib, iterations)
    finally:
        MPI.Finalize()


def allreduce_figures(comm, mib: float, iterations: int) -> dict | None:
    count = max(1, int(mib * MIB) // 8)
    send = bytearray(count * 8)
    receive = bytearray(count * 8)
    kind = MPI.DOUBLE
    comm.Allreduce([send, kind], [receive, kind], op=MPI.SUM)  # warm-up: connections
    comm.Barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        comm.Allreduce([send, kind], [receive, kind], op=MPI.SUM)
    seconds = comm.allreduce(time.perf_counter() - started, op=MPI.MAX)
    hosts = comm.gather(node_name(), root=0)
    if comm.Get_rank() != 0:
        return None
    per_call = seconds / iterations
    return {
        "ranks": comm.Get_size(),
        "nodes": sorted(set(hosts or [])),
        "bytes": count * 8,
        "iterations": iterations,
        "seconds_per_call": round(per_call, 6),
        "mbps": round(count * 8 / per_call / 1e6, 1),
    }


def nccl_bandwidth(output: str) -> float | None:
    found = NCCL_AVERAGE.search(output)
    return float(found.group(1)) if found else None


def nccl(gpus: int, binary: str, timeout: float) -> dict:
    argv = [binary, "-b", "256M", "-e", "256M", "-g", str(gpus), "-n", "20", "-w", "5", "-c", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    figure = nccl_bandwidth(proc.stdout)
    wrong = re.search(r"#\s*Out of bounds values\s*:\s*([1-9][0-9]*)", proc.stdout)
    if proc.returncode != 0 or figure is None or wrong:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ProbeError(f"all_reduce_perf exit {proc.returncode}: {' | '.join(tail)[:200]}")
    return {"gpus": gpus, "busbw_gbytes": figure}


def rdma_bandwidth(output: str) -> float | None:
    """BW average [Gb/s] of ib_write_bw's result line: bytes, iterations, peak, average,
    message rate (all numbers)."""
    figure = None
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 4 and all(NUMBER.match(word) for word in words):
            figure = float(words[3])
    return figure


def rdma(server_node: str, server_address: str) -> dict | None:
    devices = rdma_devices()
    if not devices:
        raise ProbeError(f"{node_name()}: no RDMA device")
    argv = [
        "ib_write_bw",
        "-d",
        devices[0],
        "-F",
        "--report_gbits",
        "-D",
        str(RDMA_SECONDS),
        "-p",
        str(RDMA_PORT),
    ]
    if node_name() == server_node:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise ProbeError(f"ib_write_bw server exit {proc.returncode}: {proc.stderr[-200:]}")
        return None
    for _ in range(CONNECT_TRIES):  # the server may not listen yet
        time.sleep(1)
        proc = subprocess.run(
            [*argv, server_address], capture_output=True, text=True, timeout=120, check=False
        )
        figure = rdma_bandwidth(proc.stdout)
        if proc.returncode == 0 and figure is not None:
            return {"device": devices[0], "gbits": figure}
    raise ProbeError(f"ib_write_bw client exit {proc.returncode}: {proc.stderr[-200:]}")


def token_words(token: str, rank: int) -> list[int]:
    """What rank `rank` shows of the step's token: HMAC(token, rank) as eight numbers
    below 2**32. A stranger in the rendezvous, who sees the other rank's, cannot make
    its own."""
    digest = hmac.new(token.encode(), f"rank {rank}".encode(), hashlib.sha256).digest()
    return [int.from_bytes(digest[i : i + 4], "big") for i in range(0, 32, 4)]


def torch_allreduce(
    backend: str,
    mib: float,
    iterations: int,
    master: tuple[str, str, int],
    timeout: float,
) -> dict | None:
    """The pair's all_reduce figures on rank 0 (the task on the master node), None on
    rank 1. master: (node, address, port) of rank 0's rendezvous."""
    if torch is None:
        raise ProbeError(f"{sys.executable} has no torch (the acceptance setting torch_python)")
    world = int(os.environ.get("SLURM_NTASKS", "0"))
    if world != 2:
        raise ProbeError(f"the torch test runs one task on each of two nodes, not {world}")
    token = os.environ.get("TACC_ACCEPT_TOKEN", "")
    if not token:
        raise ProbeError("no TACC_ACCEPT_TOKEN: the step's token is missing")
    master_node, master_address, port = master
    rank = 0 if node_name() == master_node else 1
    if backend == "nccl" and not torch.cuda.is_available():
        raise ProbeError(f"{node_name()}: backend nccl but torch sees no CUDA device")
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    torch_distributed.init_process_group(
        backend,
        init_method=f"tcp://{master_address}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout),
    )
    try:
        mine = torch.tensor(token_words(token, rank), dtype=torch.int64, device=device)
        shown = [torch.zeros_like(mine) for _ in range(world)]
        torch_distributed.all_gather(shown, mine)
        if shown[1 - rank].tolist() != token_words(token, 1 - rank):
            raise ProbeError(
                "the other rank did not hold this step's token: a process outside the "
                f"acceptance step joined the rendezvous on port {port}"
            )
        return torch_figures(mib, iterations, backend, device, rank, world)
    finally:
        torch_distributed.destroy_process_group()


def torch_figures(mib: float, iterations: int, backend: str, device, rank: int, world: int):
    count = max(1, int(mib * MIB) // 4)
    tensor = torch.ones(count, dtype=torch.float32, device=device)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch_distributed.all_reduce(tensor)  # warm-up: connections
    synchronize()
    torch_distributed.barrier()
    started = time.perf_counter()
    for _ in range(iterations):
        torch_distributed.all_reduce(tensor)
    synchronize()
    slowest = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
    torch_distributed.all_reduce(slowest, op=torch_distributed.ReduceOp.MAX)
    expected = float(world ** (iterations + 1))  # every call doubles the ones (2 ranks)
    if float(tensor[0]) != expected or float(tensor[-1]) != expected:
        raise ProbeError(f"all_reduce gave {float(tensor[0])}, not {expected}")
    if rank != 0:
        return None
    per_call = float(slowest[0]) / iterations
    size = count * 4
    return {
        "backend": backend,
        "ranks": world,
        "bytes": size,
        "iterations": iterations,
        "seconds_per_call": round(per_call, 6),
        "busbw_gbytes": round(size / per_call / 1e9 * 2 * (world - 1) / world, 3),
    }


class ProbeError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    p_facts = modes.add_parser("facts")
    p_facts.add_argument("--tool", action="append", default=[])
    p_facts.add_argument("--python", default="")
    p_allreduce = modes.add_parser("allreduce")
    p_allreduce.add_argument("--mib", type=float, default=32.0)
    p_allreduce.add_argument("--iterations", type=int, default=10)
    p_nccl = modes.add_parser("nccl")
    p_nccl.add_argument("--gpus", type=int, required=True)
    p_nccl.add_argument("--binary", default="all_reduce_perf")
    p_nccl.add_argument("--timeout", type=float, default=600.0)
    p_rdma = modes.add_parser("rdma")
    p_rdma.add_argument("--server-node", required=True)
    p_rdma.add_argument("--server-address", required=True)
    p_torch = modes.add_parser("torch")
    p_torch.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    p_torch.add_argument("--mib", type=float, default=32.0)
    p_torch.add_argument("--iterations", type=int, default=10)
    p_torch.add_argument("--master-node", required=True)
    p_torch.add_argument("--master-address", required=True)
    p_torch.add_argument("--port", type=int, required=True)
    p_torch.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.mode == "facts":
            found: dict | None = facts(args.tool or list(TOOLS), args.python)
        elif args.mode == "allreduce":
            found = allreduce(args.mib, args.iterations)
        elif args.mode == "nccl":
            found = nccl(args.gpus, args.binary, args.timeout)
        elif args.mode == "torch":
            master = (args.master_node, args.master_address, args.port)
            found = torch_allreduce(args.backend, args.mib, args.iterations, master, args.timeout)
        else:
            found = rdma(args.server_node, args.server_address)
    except (ProbeError, OSError, subprocess.SubprocessError, RuntimeError) as exc:
        say({"node": node_name(), "error": f"{type(exc).__name__}: {exc}"})
        return 1
    if found is not None:
        say({"node": node_name(), **found})
    return 0


def leave(code: int) -> None:
    """Exit with `code` without Python's shutdown. Once torch.distributed has run, PyTorch
    keeps the process group's worker threads past destroy_process_group(), and one can
    still hold the last reference to a tensor of the last all_reduce: if it lets go while
    Python shuts down, the thread dies taking the GIL and the process aborts after its
    line is printed ("terminate called without an active exception",
    pytorch/pytorch#190489), which would fail a node that passed. Nothing is left open."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main())
