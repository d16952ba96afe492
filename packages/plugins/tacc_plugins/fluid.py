"""Adaptive sweeps: asynchronous successive halving (ASHA) over a sweep's trials, in the
user's own processes (after Fluid, MLSys'21, which runs such searches and sizes trials
to the GPUs they free).

    sweep:
      parameters: {LR: [0.3, 0.05, 0.01], SEED: [1, 2, 3]}
      parallel: 3
      adaptive: {metric: accuracy, mode: max, min_steps: 1, max_steps: 9, eta: 3}
    plugins: [fluid]

The trials are compared at rungs min_steps x eta^k (1, 3, 9): the program calls
`tacc_fluid.report(step, value)` every step (the library is put on its PYTHONPATH) and
exits 0 when it returns False; its array slot then goes to the next trial. Trials that
ask for a fraction of a GPU get a higher array throttle (parallel x eta), so more of
them pack onto the shared GPUs while most stop early. Running trials are not resized:
Slurm cannot grow a running array task.

The shared rung records live in <sweep job dir>/fluid/rungs.json, a trial's own in
<trial dir>/fluid/: both derived from the job directory, never from the task.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from tacc_contract.fields import Field, at_least, one_of, pattern
from tacc_contract.plugins import Launch, Outcome, Plugin, Problem, Submission
from tacc_plugins import programlib
from tacc_plugins.job_files import read_json_object

LIBRARY = "tacc_fluid"
SHARED_DIR = "fluid"  # under the sweep's job directory
TRIAL_DIR = "fluid"  # under each trial's directory
RESULT_FILE = "result.json"  # what the library writes there (programlib/tacc_fluid.py)
MAX_RESULT_BYTES = 4096
METRIC = r"[A-Za-z_][A-Za-z0-9_.-]{0,63}"

ADAPTIVE = {
    "metric": Field(
        "str",
        required=True,
        check=pattern(METRIC, "a metric name (letters, digits, _ . -; at most 64)"),
        expected="the reported value's name",
    ),
    "mode": Field("str", default="max", check=one_of("max", "min")),
    "min_steps": Field(
        "int",
        default=1,
        check=at_least(1),
        expected="the first rung, in the program's steps (>= 1)",
    ),
    "max_steps": Field(
        "int",
        required=True,
        check=at_least(1),
        expected="the steps of a trial that runs to the end (>= 1)",
    ),
    "eta": Field("int", default=3, check=at_least(2), expected="keep the top 1/eta (>= 2)"),
    "pack": Field("bool", default=True),
}
DEFAULTS = {key: spec.default for key, spec in ADAPTIVE.items()}


def rungs_of(min_steps: int, max_steps: int, eta: int) -> list[int]:
    """min x eta^k below max, then max: the steps at which trials are compared."""
    rungs, step = [], min_steps
    while step < max_steps:
        rungs.append(step)
        step *= eta
    return [*rungs, max_steps]


def adaptive_of(task: object) -> dict | None:
    """The task's `sweep.adaptive` with defaults, None when it has none."""
    sweep = getattr(task, "extensions", {}).get("sweep") or {}
    adaptive = sweep.get("adaptive")
    if not isinstance(adaptive, dict) or not sweep.get("parameters"):
        return None
    return {**DEFAULTS, **{k: v for k, v in adaptive.items() if v is not None}}


def rungs_for(adaptive: dict) -> list[int]:
    return rungs_of(adaptive["min_steps"], adaptive["max_steps"], adaptive["eta"])


def sweep_dir_of(trial_dir: Path) -> Path | None:
    """The sweep's job directory of a trial's (<sweep>/trials/<i>), None for any other."""
    if trial_dir.parent.name != "trials" or not trial_dir.name.isdigit():
        return None
    return trial_dir.parent.parent


def raised_throttle(array: str, trials: int, eta: int) -> str | None:
    """`0-N%P` with P x eta (at most every trial), None when there is no throttle to raise."""
    span, sep, parallel = array.partition("%")
    if not sep or not parallel.isdigit():
        return None
    raised = min(int(parallel) * eta, trials)
    return f"{span}%{raised}" if raised > int(parallel) else None


def read_result(trial_dir: Path) -> dict | None:
    """The library's result file in the trial's own directory: a regular file, no link
    followed, at most MAX_RESULT_BYTES, JSON with the expected keys; None otherwise."""
    result = read_json_object(trial_dir / TRIAL_DIR, RESULT_FILE, MAX_RESULT_BYTES)
    numbers = ("rung", "rungs", "step")
    if result is None or not all(type(result.get(k)) is int for k in numbers):
        return None
    return result


def number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) and not isinstance(value, bool) else "?"


def result_line(result: dict) -> str:
    where = f"rung {result['rung']} of {result['rungs']} (step {result['step']})"
    value = f"value {number(result.get('value'))} (best {number(result.get('best'))})"
    if result.get("stopped") is True:
        return f"fluid: stopped at {where}, {value}"
    if result["rung"] == result["rungs"]:
        return f"fluid: ran to the last rung (step {result['step']}), {value}"
    return f"fluid: last reported at {where}, {value}; the program ended before the next rung"


class Fluid(Plugin):
    name = "fluid"
    order = 85  # after sweep (40): its `sweep` field and job array exist
    layers = ("schema", "compile", "schedule", "execute")
    summary = "sweep.adaptive: ASHA early stopping of a sweep's trials (after Fluid)"
    default_on = False
    fields: ClassVar[dict[str, Field]] = {"sweep.adaptive": Field("mapping", children=ADAPTIVE)}

    def check(self, task: dict, problem: Problem) -> None:
        sweep = task.get("sweep") or {}
        adaptive = sweep.get("adaptive")
        if not adaptive:
            return
        if not sweep.get("parameters"):
            problem("sweep.adaptive", "a sweep with parameters (sweep.parameters) to stop early")
        settings = {**DEFAULTS, **{k: v for k, v in adaptive.items() if v is not None}}
        if None in (settings["min_steps"], settings["max_steps"], settings["eta"]):
            return  # a problem was already named
        first_decision = settings["min_steps"] * settings["eta"]
        if settings["max_steps"] < first_decision:
            problem(
                "sweep.adaptive.max_steps",
                f"at least min_steps x eta ({first_decision}), "
                "so that trials are compared once before the last step",
            )

    def compile(self, document: dict) -> str | None:
        """A sweep without `adaptive` leaves no `adaptive: null` in the instruction: the
        cluster would read it as an empty mapping, missing its required keys."""
        sweep = document["task"].get("sweep")
        if isinstance(sweep, dict) and "adaptive" in sweep and sweep["adaptive"] is None:
            del sweep["adaptive"]
        return None

    def schedule(self, submission: Submission) -> None:
        adaptive = adaptive_of(submission.task)
        if not adaptive:
            return
        rungs = rungs_for(adaptive)
        eta = adaptive["eta"]
        submission.data["fluid"] = {
            "rungs": rungs,
            "eta": eta,
            "metric": adaptive["metric"],
            "mode": adaptive["mode"],
        }
        steps = ",".join(map(str, rungs))
        said = (
            f"ASHA on {adaptive['metric']} ({adaptive['mode']}) at steps {steps}: "
            f"a trial goes on when in the top 1/{eta}"
        )
        array = submission.options.get("array") or ""
        trials = len((submission.task.extensions.get("sweep") or {}).get("trials") or [])
        shared = submission.task.resources.get("gpu_share")
        raised = raised_throttle(array, trials, eta) if adaptive["pack"] and shared else None
        if raised:
            submission.options["array"] = raised
            said += f"; array {array} -> {raised} (GPU shares: more trials pack while most stop)"
        submission.note(self.name, said)

    def execute(self, launch: Launch) -> None:
        adaptive = adaptive_of(launch.task)
        trial = launch.env.get("SLURM_ARRAY_TASK_ID", "")
        sweep_dir = sweep_dir_of(launch.job_dir)
        if not adaptive or not trial.isdigit() or sweep_dir is None:
            return
        shared, own = sweep_dir / SHARED_DIR, launch.job_dir / TRIAL_DIR
        for directory in (shared, own):
            directory.mkdir(mode=0o700, exist_ok=True)
        programlib.install(launch, LIBRARY)
        rungs = rungs_for(adaptive)
        launch.env.update(
            TACC_FLUID_RUNGS=",".join(map(str, rungs)),
            TACC_FLUID_ETA=str(adaptive["eta"]),
            TACC_FLUID_METRIC=adaptive["metric"],
            TACC_FLUID_MODE=adaptive["mode"],
            TACC_FLUID_DIR=str(shared),
            TACC_FLUID_TRIAL=trial,
            TACC_FLUID_TRIAL_DIR=str(own),
        )
        launch.note(
            self.name,
            f"trial {trial}: rungs {','.join(map(str, rungs))}, top 1/{adaptive['eta']} goes on",
        )

    def finish(self, outcome: Outcome) -> str | None:
        if not adaptive_of(outcome.task) or sweep_dir_of(outcome.job_dir) is None:
            return None
        result = read_result(outcome.job_dir)
        if result is None:
            return "fluid: no decision recorded (the program did not call tacc_fluid.report)"
        return result_line(result)
