"""An MPI allreduce across every rank of the job, with mpi4py (the OS's python3-mpi4py).

Each rank contributes rank + 1; the SUM over n ranks must be n(n+1)/2. Every rank prints
one line, rank 0 also how many ranks ran on each node and writes outputs/allreduce.json.
The exit status is non-zero when the sum, the number of nodes or the ranks per node is
not what was asked for (--nodes, --ranks-per-node), so a job that started one rank per
node instead of two fails.

    sbatch -N2 --ntasks-per-node=2 --wrap 'srun python3 allreduce.py --ranks-per-node 2'
    sbatch -N2 --ntasks-per-node=2 --wrap 'mpirun python3 allreduce.py --ranks-per-node 2'
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections import Counter
from pathlib import Path


def expected_sum(size: int) -> int:
    """The allreduce SUM of rank + 1 over `size` ranks: 1 + 2 + ... + size."""
    return size * (size + 1) // 2


def ranks_per_node(hosts: list[str]) -> dict[str, int]:
    """Host name -> how many ranks ran there (hosts[r] is rank r's host), sorted by name."""
    return dict(sorted(Counter(hosts).items()))


def problems(
    size: int,
    total: int,
    hosts: list[str],
    nodes: int | None = None,
    per_node: int | None = None,
) -> list[str]:
    """What is wrong with a run ([] when it is right): the sum, and when asked for, the
    number of nodes and the ranks on each node."""
    found = []
    if total != expected_sum(size):
        found.append(f"allreduce sum {total}, expected {expected_sum(size)} for {size} ranks")
    counts = ranks_per_node(hosts)
    if nodes is not None and len(counts) != nodes:
        found.append(f"ranks ran on {len(counts)} node(s), expected {nodes}: {counts}")
    if per_node is not None:
        wrong = {host: count for host, count in counts.items() if count != per_node}
        if wrong:
            found.append(f"expected {per_node} ranks on every node, got {wrong}")
    return found


def rank_line(rank: int, size: int, host: str, total: int) -> str:
    verdict = "OK" if total == expected_sum(size) else "WRONG"
    return (
        f"rank {rank}/{size} on {host}: allreduce sum {total} "
        f"(expected {expected_sum(size)}) {verdict}"
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, help="fail unless the ranks ran on this many nodes")
    parser.add_argument("--ranks-per-node", type=int, help="fail unless every node ran this many")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI  # imported here: the checks above are testable without MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    host = socket.gethostname()
    total = comm.allreduce(rank + 1, op=MPI.SUM)
    hosts = comm.allgather(host)
    print(rank_line(rank, size, host, total), flush=True)
    found = problems(size, total, hosts, args.nodes, args.ranks_per_node)
    comm.Barrier()  # rank lines first, then rank 0's summary
    if rank == 0:
        counts = ranks_per_node(hosts)
        print(f"ranks per node: {counts}", flush=True)
        outputs = Path(os.environ.get("TACC_WORKDIR", ".")) / "outputs"
        outputs.mkdir(parents=True, exist_ok=True)
        result = {"size": size, "sum": total, "expected": expected_sum(size), "per_node": counts}
        (outputs / "allreduce.json").write_text(json.dumps(result, indent=2) + "\n")
        for problem in found:
            print(f"FAILED: {problem}", file=sys.stderr, flush=True)
        if not found:
            print(f"allreduce OK: {size} ranks on {len(counts)} node(s)", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
