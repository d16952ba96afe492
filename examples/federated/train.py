"""Federated learning, simulated on one CPU: N clients with non-IID data (Zipf-like shard
sizes, Dirichlet label skew) and heterogeneous devices (lognormal compute speed and
network latency) train one softmax-regression model with FedAvg. Each round picks
`per_round` participants; the round's time is SIMULATED as the slowest participant's
samples * epochs / speed + latency (nothing sleeps), so the figure of merit is simulated
seconds to the target accuracy.

Who picks the participants: `tacc_oort.selector_from_env`, which is Oort when the `oort`
plug-in is on (it installs the library and sets TACC_PARTICIPANT_SELECTION=oort), else a
seeded random selector; without the library at all, this file's own seeded random pick.
Settings come from TACC_FL_* (set by the plug-in from the task's `federated:` fields),
else from the defaults below, which equal examples/federated/tcloud.yaml. The seed is
$SEED (default 1: participant selection and local SGD order), the data's $DATA_SEED
(default 1: the clients, their shards and devices). Writes $TACC_JOB_DIR/outputs/fl.json
(./outputs/ outside a job), which the plug-in's finish hook reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

try:
    import tacc_oort
except ImportError:  # the plug-in is off and the library is not installed
    tacc_oort = None

DEFAULTS = {
    "clients": 200,
    "per_round": 10,
    "target_accuracy": 0.75,
    "round_deadline_s": 10.0,
    "max_rounds": 300,
}
FEATURES, CLASSES = 32, 10
LOCAL_EPOCHS, BATCH, LEARNING_RATE = 1, 20, 0.002


class OwnRandom:
    """Seeded random participants when tacc_oort cannot be imported."""

    name = "random"

    def __init__(self, clients: list[int], per_round: int, seed: int) -> None:
        self.clients, self.per_round, self.rng = clients, per_round, random.Random(seed)  # noqa: S311 (a simulation, not secrets)

    def select(self, round_number: int) -> list[int]:
        return self.rng.sample(self.clients, self.per_round)

    def update(self, client: int, loss_sq_sum: float, samples: int, duration_s: float) -> None:
        pass


def settings(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in DEFAULTS.items():
        value = env.get(f"TACC_FL_{name.upper()}", default)
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=value)
    parser.add_argument("--seed", type=int, default=int(env.get("SEED", "1")))
    parser.add_argument("--data-seed", type=int, default=int(env.get("DATA_SEED", "1")))
    job_dir = Path(env.get("TACC_JOB_DIR") or env.get("TACC_WORKDIR") or ".")
    parser.add_argument("--output", type=Path, default=job_dir / "outputs" / "fl.json")
    args = parser.parse_args(argv)
    for name, default in DEFAULTS.items():  # values from the environment are text
        setattr(args, name, type(default)(getattr(args, name)))
    return args


def make_population(clients: int, seed: int) -> dict:
    """Class centres, each client's shard (Zipf sizes, Dirichlet(0.3) labels), speed
    (samples/s, lognormal) and latency (s, lognormal), and a balanced test set."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 1.0, (CLASSES, FEATURES))

    def draw(labels: np.ndarray) -> np.ndarray:
        return centres[labels] + rng.normal(0, 2.0, (len(labels), FEATURES))

    sizes = np.clip((2000 / np.arange(1, clients + 1) ** 0.8).astype(int), 20, 2000)
    rng.shuffle(sizes)
    shards = []
    for size in sizes:
        mix = rng.dirichlet(np.full(CLASSES, 0.3))
        labels = rng.choice(CLASSES, size=int(size), p=mix)
        shards.append((draw(labels), labels))
    speed = rng.lognormal(np.log(50.0), 1.0, clients)  # samples per second
    latency = rng.lognormal(np.log(5.0), 0.8, clients)  # seconds per round trip
    test_labels = rng.integers(0, CLASSES, 2000)
    return {
        "shards": shards,
        "speed": speed,
        "latency": latency,
        "test": (draw(test_labels), test_labels),
    }


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def local_train(weights: np.ndarray, x: np.ndarray, y: np.ndarray, rng) -> tuple:
    """Local SGD; returns (new weights, sum of squared per-sample losses of the last epoch)."""
    w = weights.copy()
    xb = np.hstack([x, np.ones((len(x), 1))])
    loss_sq = 0.0
    for _ in range(LOCAL_EPOCHS):
        loss_sq = 0.0
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            batch = order[start : start + BATCH]
            probs = softmax(xb[batch] @ w)
            losses = -np.log(probs[np.arange(len(batch)), y[batch]] + 1e-12)
            loss_sq += float(np.sum(losses**2))
            probs[np.arange(len(batch)), y[batch]] -= 1
            w -= LEARNING_RATE * xb[batch].T @ probs / len(batch)
    return w, loss_sq


def accuracy(weights: np.ndarray, test: tuple) -> float:
    x, y = test
    logits = np.hstack([x, np.ones((len(x), 1))]) @ weights
    return float(np.mean(logits.argmax(axis=1) == y))


def selector_for(args: argparse.Namespace, hints: dict[int, float]):
    ids = list(range(args.clients))
    if tacc_oort is None:
        print("tacc_oort not found (the oort plug-in is off): seeded random selection", flush=True)
        return OwnRandom(ids, args.per_round, args.seed)
    return tacc_oort.selector_from_env(
        ids, args.per_round, args.round_deadline_s, args.seed, duration_hints=hints
    )


def run(args: argparse.Namespace, quiet: bool = False) -> dict:
    population = make_population(args.clients, args.data_seed)
    shards, speed, latency = population["shards"], population["speed"], population["latency"]
    duration = {
        i: len(shards[i][1]) * LOCAL_EPOCHS / speed[i] + latency[i] for i in range(args.clients)
    }
    selector = selector_for(args, duration)
    rng = np.random.default_rng(args.seed + 1000)
    weights = np.zeros((FEATURES + 1, CLASSES))
    clock, reached, curve, accuracy_now = 0.0, None, [], 0.0
    for round_number in range(1, args.max_rounds + 1):
        picked = selector.select(round_number)
        updates, sizes = [], []
        for client in picked:
            x, y = shards[client]
            new, loss_sq = local_train(weights, x, y, rng)
            updates.append(new)
            sizes.append(len(y))
            selector.update(client, loss_sq, len(y), duration[client])
        weights = np.average(np.stack(updates), axis=0, weights=np.array(sizes, float))
        clock += max(duration[c] for c in picked)
        accuracy_now = accuracy(weights, population["test"])
        curve.append([round_number, round(clock, 1), round(accuracy_now, 4)])
        if not quiet:
            print(
                f"round {round_number} time {clock:.1f}s accuracy {accuracy_now:.4f} "
                f"selector {selector.name}",
                flush=True,
            )
        if reached is None and accuracy_now >= args.target_accuracy:
            reached = {"round": round_number, "seconds": round(clock, 1)}
            break
    return {
        "selector": selector.name,
        "seed": args.seed,
        "data_seed": args.data_seed,
        "clients": args.clients,
        "per_round": args.per_round,
        "target_accuracy": args.target_accuracy,
        "rounds": len(curve),
        "simulated_seconds": round(clock, 1),
        "round_to_target": reached and reached["round"],
        "seconds_to_target": reached and reached["seconds"],
        "final_accuracy": round(accuracy_now, 4),
        "curve": curve,
    }


def main(argv: list[str] | None = None) -> int:
    args = settings(argv)
    started = time.monotonic()
    result = run(args)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result) + "\n")
    to_target = result["seconds_to_target"]
    print(
        f"{result['selector']}: target {args.target_accuracy} "
        + (
            f"reached at round {result['round_to_target']}, {to_target} s (simulated)"
            if to_target is not None
            else f"not reached in {result['rounds']} rounds"
        )
        + f"; final accuracy {result['final_accuracy']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
