"""PyTorch DistributedDataParallel on a synthetic regression task (`launcher: torchrun`).

torchrun starts one process per GPU and sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; `init_process_group(init_method="env://")` reads them. Rank 0 writes
$TACC_WORKDIR/outputs/ckpt.pt at the end of every epoch and when any rank gets SIGUSR1
(before the time limit, or `tcloud halt`); a restarted job resumes from it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES = 32
CHECKPOINT_REQUESTED = threading.Event()  # set by SIGUSR1, acted on at the next step
STOP_ON_SIGNAL = os.environ.get("STOP_ON_SIGNAL") == "1"  # else: checkpoint and go on


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256, help="per process")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--samples", type=int, default=1 << 18)
    return parser.parse_args()


def synthetic_dataset(samples: int, seed: int = 0) -> TensorDataset:
    """The same data on every rank (seeded); DistributedSampler gives each its part."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    y = torch.sin(x @ w) + 0.1 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)
    )


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, next_epoch: int
) -> None:
    tmp = path.with_name(path.name + ".tmp")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "epoch": next_epoch}, tmp)
    os.replace(tmp, path)  # a cut never leaves a half-written checkpoint behind
    print(f"checkpoint: next epoch {next_epoch} -> {path}", flush=True)


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when `flag` is true on at least one (one tiny all_reduce)."""
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: CHECKPOINT_REQUESTED.set())
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = dist.get_backend()
    print(
        f"rank {rank}/{world} (local {local_rank}) on {socket.gethostname()}: {device}, "
        f"backend {backend}",
        flush=True,
    )

    outputs = Path(os.environ.get("TACC_WORKDIR", ".")) / "outputs"
    checkpoint = outputs / "ckpt.pt"
    if rank == 0:
        outputs.mkdir(parents=True, exist_ok=True)

    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_epoch = 0
    if checkpoint.exists():  # every rank loads it: the optimizer state is per process
        saved = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch = int(saved["epoch"])
        print(f"rank {rank}: resumed from {checkpoint} at epoch {start_epoch}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)

    dataset = synthetic_dataset(args.samples)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, pin_memory=cuda)
    try:
        for epoch in range(start_epoch, args.epochs):
            sampler.set_epoch(epoch)  # a different shuffle each epoch, the same on all ranks
            loss = train_epoch(ddp, optimizer, loader, device, checkpoint, epoch)
            if loss is None:  # checkpointed on SIGUSR1 and asked to stop
                break
            if rank == 0:
                print(f"epoch {epoch + 1}/{args.epochs} loss {loss:.5f}", flush=True)
                save_checkpoint(checkpoint, model, optimizer, epoch + 1)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def train_epoch(
    ddp: DistributedDataParallel,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    device: torch.device,
    checkpoint: Path,
    epoch: int,
) -> float | None:
    """One pass over this rank's part; the mean loss over all ranks, None to stop."""
    totals = torch.zeros(2, device=device)  # summed loss, samples
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP averages the gradients over all ranks here
        optimizer.step()
        if step == 0 and dist.get_rank() == 0:
            print(f"epoch {epoch + 1} first step: loss {loss.item():.5f}", flush=True)
        totals[0] += loss.detach() * len(y)
        totals[1] += len(y)
        if any_rank(CHECKPOINT_REQUESTED.is_set(), device):
            CHECKPOINT_REQUESTED.clear()
            if dist.get_rank() == 0:  # mid-epoch: a resume runs this epoch again
                save_checkpoint(checkpoint, ddp.module, optimizer, epoch)
            dist.barrier()
            if STOP_ON_SIGNAL:
                return None
    dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def leave_without_finalizing() -> None:
    """Exit now, skipping Python's shutdown. PyTorch keeps the process group's worker
    threads (Gloo's, NCCL's) past destroy_process_group(), and one can still hold the last
    reference to a tensor of the last collective: if it lets go while Python shuts down,
    the thread dies taking the GIL and the process aborts after all the work is done
    ("terminate called without an active exception", pytorch/pytorch#190489). Everything
    is written and closed by now: flush what is printed and leave."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    leave_without_finalizing()
