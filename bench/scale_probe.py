"""Runs on a lab node in the agent's venv (bench/scale.py copies it there): the queue
tick's cost against the Slurm that SLURM_CONF names, split into each Slurm command and
each plug-in's own work.

    /opt/tacc-agent/venv/bin/python3 scale_probe.py CONFIG.yaml TICKS

Prints one JSON object: per tick, its wall seconds, the seconds and count of each Slurm
command (by its first two words), and each plug-in's tick seconds (its Slurm commands
included); the daemon's `allowed` cache is kept from one tick to the next, as the daemon
keeps it, so tick 1 is a cold daemon and the rest warm ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from tacc_agent.config import load_config
from tacc_agent.tasks.schedule import queue_ticks
from tacc_contract.registry import in_layer, select

REAL_RUN = subprocess.run
SPENT: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])


def timed_run(argv, *args, **kwargs):
    start = time.perf_counter()
    try:
        return REAL_RUN(argv, *args, **kwargs)
    finally:
        words = argv if isinstance(argv, list | tuple) else str(argv).split()
        entry = SPENT[" ".join(str(word) for word in words[:2])]
        entry[0] += time.perf_counter() - start
        entry[1] += 1


class TimedPlugin:
    """A plug-in whose tick is timed; everything else is the plug-in's own."""

    def __init__(self, plugin, spent: dict[str, float]) -> None:
        self.plugin, self.spent = plugin, spent

    def __getattr__(self, name: str):
        return getattr(self.plugin, name)

    def tick(self, queue) -> None:
        start = time.perf_counter()
        try:
            self.plugin.tick(queue)
        finally:
            self.spent[self.plugin.name] = time.perf_counter() - start


def main(config_path: str, ticks: int) -> int:
    subprocess.run = timed_run
    config = load_config(Path(config_path))
    allowed: queue_ticks.Allowed = {}
    rounds = []
    for _ in range(ticks):
        SPENT.clear()
        plugin_spent: dict[str, float] = {}
        plugins = [
            TimedPlugin(plugin, plugin_spent)
            for plugin in in_layer(select(config.plugins, policy_from=config.plugins), "schedule")
        ]
        start = time.perf_counter()
        notes = queue_ticks.tick_locked(config, plugins, allowed)
        wall = time.perf_counter() - start
        rounds.append(
            {
                "wall_s": round(wall, 4),
                "commands": {key: [round(v[0], 4), v[1]] for key, v in SPENT.items()},
                "plugins_s": {key: round(value, 4) for key, value in plugin_spent.items()},
                "notes": len(notes),
                "note_sample": notes[:3],
            }
        )
    print(json.dumps(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
