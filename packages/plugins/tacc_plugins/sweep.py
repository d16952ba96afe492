"""Sweeps: a parameter grid in the task file becomes one Slurm job array.

    sweep:
      parameters: {LR: [0.1, 0.01], BATCH: [32, 64]}   # 4 trials
      parallel: 2                                      # at most 2 at once (optional)

The compile pass expands the grid into the explicit trial list (so the instruction says
exactly what each array index runs); the scheduling layer asks for `--array=0-3%2`;
each trial runs in <workdir>/trials/<index>/ with its parameters as environment
variables plus TACC_TRIAL and TACC_TRIALS. `tcloud ps/status/logs/cancel JOB` address
the whole sweep, `JOB_INDEX` (e.g. 12_3) one trial. Small trials pack onto shared GPUs
when they ask for a fraction of one (gpu_share).

With `samples: N` (and ranges among the parameters: tacc_plugins/sampling.py) the sweep
draws N trials instead of taking every combination.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tacc_contract.errors import Rejected
from tacc_contract.fields import Field, at_least, between, one_of
from tacc_contract.plugins import Launch, Plugin, Problem, Submission
from tacc_contract.trials import expand, is_sampled, trial_count, trials_of
from tacc_plugins import sampling

# trials_of, expand and trial_count live in the contract (tcloud and the agent read a
# task's trials too); this module uses them, and code importing them from here still can.

MAX_TRIALS = 1000  # under Slurm's default MaxArraySize (1001)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SCALAR = (str, int, float, bool)
RESERVED_PREFIX = ("TACC_", "SLURM_")


def grid_problem(value: object) -> str | None:
    expected = "a mapping of variable names to non-empty lists of values (or ranges)"
    if not isinstance(value, dict) or not value:
        return expected
    for name, values in value.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return f"{expected}; {name!r} is not a shell variable name"
        if name.startswith(RESERVED_PREFIX):
            return f"{expected}; {name} is reserved (TACC_*, SLURM_*)"
        if isinstance(values, dict):
            wrong = sampling.range_problem(name, values)
            if wrong:
                return f"{expected}; {wrong}"
            continue
        if not isinstance(values, list) or not values:
            return f"{expected}; {name} has no list of values"
        if not all(isinstance(v, SCALAR) for v in values):
            return f"{expected}; the values of {name} must be numbers or strings"
    return None


def trials_problem(value: object) -> str | None:
    if isinstance(value, list) and all(isinstance(t, dict) for t in value):
        return None
    return "the list of trials the compiler wrote"


def trials_fit(trials: list[dict], parameters: dict[str, list]) -> bool:
    """Whether `trials` has the shape of the grid's: one trial per combination, each
    giving every parameter, and nothing else, a text value."""
    names = set(parameters)
    return len(trials) == trial_count(parameters) and all(
        set(trial) == names and all(isinstance(value, str) for value in trial.values())
        for trial in trials
    )


def samples_fit(trials: list[dict], parameters: dict, samples: int) -> bool:
    """Whether `trials` can be what the compiler drew: `samples` of them, each giving
    every parameter, and nothing else, a value its range allows."""
    names = set(parameters)
    return len(trials) == samples and all(
        set(trial) == names and all(sampling.fits(parameters[n], trial[n]) for n in names)
        for trial in trials
    )


SWEEP = {
    "parameters": Field(
        "any",
        required=True,
        check=grid_problem,
        expected="a mapping of variable names to lists of values",
    ),
    "parallel": Field("int", check=at_least(1), expected="trials at once (>= 1)"),
    "samples": Field(
        "int", check=between(1, MAX_TRIALS), expected="how many trials to draw (1 to 1000)"
    ),
    "sampler": Field("str", check=one_of(*sampling.SAMPLERS), expected="random or sobol"),
    "seed": Field("int", check=at_least(0), expected="the draw's seed (>= 0)"),
    "trials": Field("any", check=trials_problem),
}


class Sweep(Plugin):
    name = "sweep"
    order = 40
    layers = ("schema", "compile", "schedule", "execute")
    summary = "sweep.parameters grid -> one Slurm job array, one trial per combination"
    fields: ClassVar[dict[str, Field]] = {"sweep": Field("mapping", children=SWEEP)}

    def check(self, task: dict, problem: Problem) -> None:
        sweep = task.get("sweep")
        if not sweep or not sweep.get("parameters"):
            return
        if is_sampled(sweep):
            self.check_sampled(sweep, problem)
        else:
            self.check_grid(sweep, problem)
        clash = sorted(set(sweep["parameters"]) & set(task["environment"]["env"]))
        if clash:
            problem("sweep.parameters", f"{', '.join(clash)} also set in environment.env")

    def check_grid(self, sweep: dict, problem: Problem) -> None:
        for field in ("sampler", "seed"):
            if sweep.get(field) is not None:
                problem(f"sweep.{field}", "only with sweep.samples (how many trials to draw)")
        count = trial_count(sweep["parameters"])
        if count > MAX_TRIALS:
            problem("sweep.parameters", f"{count} trials; at most {MAX_TRIALS} in one sweep")
        # The compiler writes the trials; the cluster re-checks them, as it trusts no client.
        trials = sweep.get("trials")
        if trials is not None and not trials_fit(trials, sweep["parameters"]):
            problem(
                "sweep.trials",
                f"the {count} trial(s) of sweep.parameters, as tcloud "
                "writes them: each names every parameter once, with a text value",
            )

    def check_sampled(self, sweep: dict, problem: Problem) -> None:
        samples = sweep.get("samples")
        if samples is None:
            ranges = [n for n, v in sweep["parameters"].items() if isinstance(v, dict)]
            problem(
                "sweep.samples",
                f"how many trials to draw: {', '.join(ranges)} "
                f"{'is a range' if len(ranges) == 1 else 'are ranges'} (1 to {MAX_TRIALS})",
            )
            return
        trials = sweep.get("trials")
        if trials is not None and not samples_fit(trials, sweep["parameters"], samples):
            problem(
                "sweep.trials",
                f"the {samples} trial(s) tcloud drew from sweep.parameters: each names "
                "every parameter once, with a value its range allows",
            )

    def compile(self, document: dict) -> str | None:
        sweep = document["task"].get("sweep")
        if not sweep or not sweep.get("parameters"):
            return None
        # Fields left out stay out of the instruction (its digest, and an agent that
        # predates a field, see only what the task file says).
        for field in [name for name, value in sweep.items() if value is None]:
            del sweep[field]
        if not is_sampled(sweep):
            sweep["trials"] = expand(sweep["parameters"])
            return f"{len(sweep['trials'])} trials"
        # Drawn once, here: the seed and the trials go into the instruction, so the
        # cluster and a rerun take them as they are.
        sweep["sampler"] = sweep.get("sampler") or "random"
        if sweep.get("seed") is None:
            sweep["seed"] = sampling.new_seed()
        try:
            sweep["trials"] = sampling.sample(
                sweep["parameters"], sweep["samples"], sweep["sampler"], sweep["seed"]
            )
        except ImportError:  # a tcloud installed without its dependencies
            raise Rejected(
                "sobol needs scipy where tcloud runs (pip install 'tacc-plugins[sobol]'; "
                "tcloud's own install has it), or use sampler: random",
                field="sweep.sampler",
            ) from None
        return f"{len(sweep['trials'])} trials drawn ({sweep['sampler']}, seed {sweep['seed']})"

    def schedule(self, submission: Submission) -> None:
        trials = trials_of(submission.task)
        if not trials:
            if is_sampled(submission.task.extensions.get("sweep") or {}):
                raise Rejected(
                    "a sampled sweep without its trials: tcloud draws them when it "
                    "compiles the task (submit it with tcloud)",
                    field="sweep.trials",
                )
            return
        parallel = (submission.task.extensions.get("sweep") or {}).get("parallel")
        array = f"0-{len(trials) - 1}" + (f"%{parallel}" if parallel else "")
        workdir = submission.options["chdir"]
        submission.options["array"] = array
        # Each trial's batch step writes its own log (%a: the array index).
        submission.options["output"] = f"{workdir}/trials/%a/logs/job.log"
        submission.data["sweep"] = {"trials": len(trials)}
        submission.note(self.name, f"job array {array} ({len(trials)} trials)")

    def execute(self, launch: Launch) -> None:
        trials = trials_of(launch.task)
        index = launch.env.get("SLURM_ARRAY_TASK_ID", "")
        if not trials or not index.isdigit() or int(index) >= len(trials):
            return
        launch.env.update(trials[int(index)], TACC_TRIAL=index, TACC_TRIALS=str(len(trials)))
        launch.note(
            self.name,
            f"trial {index}: " + " ".join(f"{k}={v}" for k, v in trials[int(index)].items()),
        )
