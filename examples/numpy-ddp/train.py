"""Synchronous data-parallel logistic regression with numpy only.

Every rank trains on its own shard of a seeded synthetic dataset; after each step the
gradients are summed across ranks with a tiny allreduce over TCP (stdlib `socket`):
rank 0 listens on MASTER_ADDR:MASTER_PORT, sums what the others send and sends the sum
back. SIGUSR1 saves outputs/checkpoint.npz and training goes on; a restart resumes from it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np

SAMPLES, FEATURES, EPOCHS, STEPS, LR = 4096, 8, 20, 8, 0.5
CONNECT_TIMEOUT_S = 60.0
CHECKPOINT_REQUESTED = threading.Event()  # set by SIGUSR1, acted on at the next step


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_array(sock: socket.socket, array: np.ndarray) -> None:
    data = np.ascontiguousarray(array, dtype="<f8").tobytes()
    sock.sendall(struct.pack("!Q", len(data)) + data)


def recv_array(sock: socket.socket) -> np.ndarray:
    (size,) = struct.unpack("!Q", recv_exact(sock, 8))
    return np.frombuffer(recv_exact(sock, size), dtype="<f8").copy()


class AllReduce:
    """Sum a float64 vector over all ranks: a star around rank 0, in rank order."""

    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        self.rank, self.world = rank, world
        self.peers: list[socket.socket] = []  # rank 0: ranks 1..W-1; others: [rank 0]
        if world == 1:
            return
        if rank == 0:
            with socket.create_server((addr, port), backlog=world) as server:
                server.settimeout(CONNECT_TIMEOUT_S * 2)
                by_rank: dict[int, socket.socket] = {}
                while len(by_rank) < world - 1:
                    conn, _ = server.accept()
                    conn.settimeout(CONNECT_TIMEOUT_S)
                    (peer,) = struct.unpack("!I", recv_exact(conn, 4))
                    by_rank[peer] = conn
            self.peers = [by_rank[r] for r in sorted(by_rank)]
        else:
            self.peers = [self._connect(addr, port)]
            self.peers[0].sendall(struct.pack("!I", rank))
        for peer in self.peers:
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer.settimeout(300)

    @staticmethod
    def _connect(addr: str, port: int) -> socket.socket:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                return socket.create_connection((addr, port), timeout=5)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def sum(self, array: np.ndarray) -> np.ndarray:
        if self.world == 1:
            return array
        if self.rank != 0:
            send_array(self.peers[0], array)
            return recv_array(self.peers[0])
        total = array.copy()
        for peer in self.peers:
            total += recv_array(peer)
        for peer in self.peers:
            send_array(peer, total)
        return total

    def close(self) -> None:
        for peer in self.peers:
            peer.close()


def make_shard(rank: int, world: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)  # the same dataset on every rank
    x = rng.normal(size=(SAMPLES, FEATURES))
    true_w = rng.normal(size=FEATURES)
    y = (x @ true_w + 0.5 * rng.normal(size=SAMPLES) > 0).astype(np.float64)
    return x[rank::world], y[rank::world]


def loss_and_grad(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Summed (not averaged) log loss and gradient; weights are [features..., bias]."""
    p = 1.0 / (1.0 + np.exp(-(x @ w[:-1] + w[-1])))
    eps = 1e-12
    loss = -np.sum(y * np.log(p + eps) + (1 - y) * np.log(1 - p + eps))
    err = p - y
    return float(loss), np.append(x.T @ err, err.sum())


def save_checkpoint(path: Path, w: np.ndarray, epoch: int, step: int) -> None:
    if step == STEPS:  # the epoch is complete: resume at the start of the next one
        epoch, step = epoch + 1, 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        np.savez(handle, w=w, epoch=epoch, step=step)
    os.replace(tmp, path)  # never a half-written checkpoint
    print(f"checkpoint: epoch {epoch} step {step} -> {path}", flush=True)


def train(
    comm: AllReduce, x: np.ndarray, y: np.ndarray, checkpoint: Path
) -> tuple[np.ndarray, list[float]]:
    """Run the remaining epochs; returns the final weights and the per-epoch losses."""
    w, start_epoch, start_step = np.zeros(FEATURES + 1), 0, 0
    if checkpoint.exists():
        with np.load(checkpoint) as saved:
            w, start_epoch, start_step = saved["w"], int(saved["epoch"]), int(saved["step"])
        print(f"rank {comm.rank}: resumed at epoch {start_epoch} step {start_step}", flush=True)
    batches = list(zip(np.array_split(x, STEPS), np.array_split(y, STEPS), strict=True))
    losses: list[float] = []
    for epoch in range(start_epoch, EPOCHS):
        epoch_loss = epoch_n = 0.0
        for step in range(start_step if epoch == start_epoch else 0, STEPS):
            loss, grad = loss_and_grad(w, *batches[step])
            # One message per step: [gradient..., loss, samples, checkpoint requested].
            asked = float(CHECKPOINT_REQUESTED.is_set())
            total = comm.sum(np.concatenate([grad, [loss, len(batches[step][1]), asked]]))
            w = w - LR * total[: FEATURES + 1] / total[-2]
            epoch_loss, epoch_n = epoch_loss + total[-3], epoch_n + total[-2]
            if total[-1] > 0:  # some rank got SIGUSR1: rank 0 saves, everyone goes on
                CHECKPOINT_REQUESTED.clear()
                if comm.rank == 0:
                    save_checkpoint(checkpoint, w, epoch, step + 1)
        losses.append(epoch_loss / epoch_n)
        if comm.rank == 0:
            print(f"epoch {epoch + 1}/{EPOCHS} loss {losses[-1]:.4f}", flush=True)
    return w, losses


def main() -> None:
    rank = int(os.environ.get("RANK", os.environ.get("TACC_NODE_RANK", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("TACC_NUM_NODES", "1")))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    outputs = Path(os.environ.get("TACC_WORKDIR", ".")) / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: CHECKPOINT_REQUESTED.set())

    x, y = make_shard(rank, world)
    host, started = socket.gethostname(), time.monotonic()
    print(f"rank {rank}/{world} on {host}: shard of {len(y)} samples", flush=True)
    comm = AllReduce(rank, world, addr, port)
    try:
        w, losses = train(comm, x, y, outputs / "checkpoint.npz")
    finally:
        comm.close()

    final = losses[-1] if losses else None
    summary = dict(rank=rank, world_size=world, host=host, samples=len(y), final_loss=final)
    write_json(outputs / f"rank{rank}.json", {**summary, "seconds": time.monotonic() - started})
    if rank == 0:
        model = dict(weights=w[:-1].tolist(), bias=float(w[-1]), final_loss=final, losses=losses)
        write_json(outputs / "model.json", {**model, "world_size": world, "epochs": EPOCHS})
        print(f"done: final loss {final}, model in {outputs / 'model.json'}", flush=True)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
