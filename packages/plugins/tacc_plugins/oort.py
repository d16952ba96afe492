"""Oort (Lai et al., OSDI'21): guided participant selection for federated learning. A
task of the kind `federated:` (clients, per_round, target_accuracy, round_deadline_s,
max_rounds) runs a program that picks participants each round; with this plug-in on, the
program gets Oort's selector: the execution hook copies programlib/tacc_oort.py into the
job (`.tacc/lib`, first on PYTHONPATH), sets TACC_PARTICIPANT_SELECTION=oort and the
task's settings as TACC_FL_*. Off (`plugins: [-oort]`), the same program finds neither and
selects at random. After the run, the finish hook reports what the program wrote to
outputs/fl.json (time to the target accuracy, in the program's own, simulated or real,
seconds). Tasks without `federated:` are left alone.
"""

from __future__ import annotations

import os
from typing import ClassVar

from tacc_contract.fields import Field, at_least
from tacc_contract.plugins import Launch, Outcome, Plugin, Problem
from tacc_plugins import programlib
from tacc_plugins.job_files import read_json_object

RESULT_DIR, RESULT_FILE = "outputs", "fl.json"
MAX_RESULT_BYTES = 1 << 20  # the program's own record: a curve of a few thousand rounds


def fraction(value: float) -> str | None:
    return None if 0 < value < 1 else "a fraction between 0 and 1 (exclusive), e.g. 0.8"


def deadline(value: float) -> str | None:
    return None if value > 0 else "the preferred round duration T in seconds, > 0"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else "a number >= 0"


FEDERATED = {
    "clients": Field("int", required=True, check=at_least(2), expected="an integer >= 2"),
    "per_round": Field("int", required=True, check=at_least(1), expected="an integer >= 1"),
    "target_accuracy": Field("number", required=True, check=fraction),
    "round_deadline_s": Field(
        "number",
        required=True,
        check=deadline,
        expected="the preferred round duration T in seconds, > 0",
    ),
    "max_rounds": Field("int", required=True, check=at_least(1), expected="an integer >= 1"),
    # Oort's system-utility exponent alpha: (T / t)^alpha for a client slower than T.
    "round_penalty": Field("number", default=2.0, check=non_negative),
    # Leave out clients picked more than this many times (Oort's code: off).
    "blacklist_rounds": Field("int", check=at_least(1), expected="an integer >= 1"),
}
ENV = {
    "clients": "TACC_FL_CLIENTS",
    "per_round": "TACC_FL_PER_ROUND",
    "target_accuracy": "TACC_FL_TARGET_ACCURACY",
    "round_deadline_s": "TACC_FL_ROUND_DEADLINE_S",
    "max_rounds": "TACC_FL_MAX_ROUNDS",
    "round_penalty": "TACC_FL_ROUND_PENALTY",
    "blacklist_rounds": "TACC_FL_BLACKLIST_ROUNDS",
}


def env_text(value: float) -> str:
    """200 -> "200", 2.0 -> "2", 0.75 -> "0.75" (never "1e+06" for an int)."""
    return str(value) if isinstance(value, int) else f"{value:.15g}"


def federated_of(task: object) -> dict | None:
    found = (getattr(task, "extensions", None) or {}).get("federated")
    return found if isinstance(found, dict) else None


def read_result(job_dir: os.PathLike) -> dict | None:
    """outputs/fl.json of the job, or None: never through a link (neither the folder nor
    the file), only a regular file up to MAX_RESULT_BYTES, only a JSON object."""
    return read_json_object(os.path.join(job_dir, RESULT_DIR), RESULT_FILE, MAX_RESULT_BYTES)


def number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def summary_line(result: dict, target: float) -> str:
    """`oort: target 0.75 reached at round 41, 576 s (simulated); final accuracy 0.751
    (oort selection)`."""
    selector = str(result.get("selector", "?"))[:20]
    rounds, seconds = number(result.get("round_to_target")), number(result.get("seconds_to_target"))
    final = number(result.get("final_accuracy"))
    if rounds is not None and seconds is not None:
        reached = f"reached at round {rounds:.0f}, {seconds:.0f} s (simulated)"
    else:
        done = number(result.get("rounds"))
        reached = "not reached" + (f" in {done:.0f} rounds" if done is not None else "")
    tail = f"; final accuracy {final:.3f}" if final is not None else ""
    return f"oort: target {target:g} {reached}{tail} ({selector} selection)"


class Oort(Plugin):
    name = "oort"
    order = 65
    layers = ("schema", "execute")
    summary = "federated: tasks get Oort's participant selection (tacc_oort, fl.json summary)"
    fields: ClassVar[dict[str, Field]] = {"federated": Field("mapping", children=FEDERATED)}

    def check(self, task: dict, problem: Problem) -> None:
        federated = task.get("federated")
        if not federated:
            return
        clients, per_round = federated.get("clients"), federated.get("per_round")
        if isinstance(clients, int) and isinstance(per_round, int) and per_round > clients:
            problem("federated.per_round", f"at most federated.clients ({clients}) participants")

    def execute(self, launch: Launch) -> None:
        federated = federated_of(launch.task)
        if not federated:
            return
        programlib.install(launch, "tacc_oort")
        for key, variable in ENV.items():
            if federated.get(key) is not None:
                launch.env[variable] = env_text(federated[key])
        launch.env["TACC_PARTICIPANT_SELECTION"] = "oort"
        deadline = federated["round_deadline_s"]
        launch.note(
            self.name,
            f"tacc_oort: {federated['per_round']} of "
            f"{federated['clients']} clients per round, T {deadline:g} s",
        )

    def finish(self, outcome: Outcome) -> str | None:
        federated = federated_of(outcome.task)
        if not federated:
            return None
        result = read_result(outcome.job_dir)
        if result is None:
            return f"oort: no readable {RESULT_DIR}/{RESULT_FILE} (the program writes it)"
        return summary_line(result, float(federated.get("target_accuracy", 0)))
