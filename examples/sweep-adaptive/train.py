"""A stand-in for training: a synthetic learning curve whose final accuracy depends on
the learning rate (best at LR=0.05) and a little on the seed, ~1 s per step.

With the fluid plug-in on (`sweep.adaptive`), it reports every step to tacc_fluid and
stops when told to (exit 0: a stopped trial succeeded); without it, it runs every step
(the plain grid). Writes outputs/progress.jsonl (one line per step) in $TACC_WORKDIR,
the trial's own directory on the cluster (what `tcloud download` fetches), else here."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

try:
    import tacc_fluid  # put on PYTHONPATH by the fluid plug-in
except ImportError:
    tacc_fluid = None

STEPS = int(os.environ.get("STEPS", "9"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "1.0"))


def final_accuracy(lr: float, seed: int) -> float:
    """Best at LR=0.05; the seed moves it by -0.01, 0 or +0.01."""
    return 0.92 - 0.3 * abs(math.log10(lr / 0.05)) + 0.01 * ((seed * 7) % 3 - 1)


def accuracy(step: int, final: float) -> float:
    return final * (1 - math.exp(-step / 3))


def main() -> int:
    lr, seed = float(os.environ.get("LR", "0.05")), int(os.environ.get("SEED", "1"))
    final = final_accuracy(lr, seed)
    outputs = Path(os.environ.get("TACC_WORKDIR", ".")) / "outputs"
    outputs.mkdir(exist_ok=True)
    with (outputs / "progress.jsonl").open("a") as progress:
        for step in range(1, STEPS + 1):
            time.sleep(STEP_SECONDS)
            value = round(accuracy(step, final), 4)
            now = time.time()
            progress.write(json.dumps({"step": step, "accuracy": value, "time": now}) + "\n")
            progress.flush()
            print(
                f"step {step}/{STEPS} lr={lr} seed={seed} accuracy={value} time={now:.3f}",
                flush=True,
            )
            if tacc_fluid is not None and not tacc_fluid.report(step, value):
                print(f"stopped early at step {step} (not in the top of its rung)", flush=True)
                return 0
    print(f"done: accuracy={value}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
