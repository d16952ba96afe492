"""A sweep's trials best first, with the metric each reached (issue [24]), what
`tcloud status SWEEP` shows of them, `tcloud download SWEEP --best`, and a sweep's rerun
running the same trials."""

from __future__ import annotations

import io
import json
from pathlib import Path

import paramiko
import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.tasks.execute import envcache
from tacc_agent.tasks.jobs import records, rerun, sweep_progress, sweeps
from tacc_agent.tasks.store import workspace
from tacc_plugins import fluid
from tcloud.errors import UsageError
from tcloud.jobs.verbs import describe
from tcloud.transfer import files
from tests.unit.agent_jobs import make_job

ADAPTIVE = {"metric": "accuracy", "mode": "max", "min_steps": 1, "max_steps": 9, "eta": 3}


def reported(trial_dir: Path, rung: int, value: object, stopped: bool = False) -> None:
    own = trial_dir / fluid.TRIAL_DIR
    own.mkdir(parents=True, exist_ok=True)
    result = {"rung": rung, "rungs": 3, "step": 3**rung, "value": value, "stopped": stopped}
    (own / fluid.RESULT_FILE).write_text(json.dumps({**result, "best": value, "metric": "x"}))


def trial(index: int, **progress) -> dict:
    return {"trial": index, "job_id": f"12_{index}", "state": "COMPLETED", **progress}


def test_the_highest_rung_ranks_first_then_the_best_value_there(tmp_path):
    for index, (rung, value) in enumerate([(1, 0.9), (3, 0.7), (3, 0.8), (2, 0.99)]):
        reported(tmp_path / str(index), rung, value)
    (tmp_path / "4").mkdir()  # never reported
    trials = [trial(i, **sweep_progress.progress(tmp_path / str(i), ADAPTIVE)) for i in range(5)]
    ranked = sweep_progress.best_first(trials, "max")
    assert [t["trial"] for t in ranked] == [2, 1, 3, 0, 4]
    assert sweep_progress.best_of(ranked) == "12_2"
    assert ranked[0] == trial(2, metric="accuracy", value=0.8, rung=3, rungs=3, stopped=False)
    least = sweep_progress.best_first(trials, "min")
    assert [t["trial"] for t in least] == [1, 2, 3, 0, 4]


def test_a_sweep_without_asha_or_reports_has_no_best(tmp_path):
    reported(tmp_path / "0", 1, 0.5)
    assert sweep_progress.progress(tmp_path / "0", None) == {}
    assert sweep_progress.progress(tmp_path / "1", ADAPTIVE) == {}
    ranked = sweep_progress.best_first([trial(1), trial(0)], "max")
    assert [t["trial"] for t in ranked] == [0, 1] and sweep_progress.best_of(ranked) is None


@pytest.mark.security
@pytest.mark.parametrize("value", ["NaN", None, True, "0.9", 10**400])
def test_a_trial_cannot_rank_itself_first_with_a_value_that_is_no_number(tmp_path, value):
    # The result file is the trial program's own (the user's code): a NaN or text
    # is shown as no value and never ranks first.
    reported(tmp_path / "0", 3, float("nan") if value == "NaN" else value)
    reported(tmp_path / "1", 1, 0.1)
    trials = [trial(i, **sweep_progress.progress(tmp_path / str(i), ADAPTIVE)) for i in (0, 1)]
    assert sweep_progress.best_of(sweep_progress.best_first(trials, "max")) == "12_1"


SWEEP_INFO = {
    "job_id": "12",
    "name": "search",
    "state": "COMPLETED",
    "workdir": "/w/jobs/x-1",
    "sweep": True,
    "best": "12_2",
    "trials": [  # by index, as the cluster sends them; `ranking`: best first
        trial(0, metric="accuracy", value=0.5, rung=1, rungs=3, stopped=True),
        trial(1, parameters={"LR": "0.1"}),
        trial(2, metric="accuracy", value=0.8123, rung=3, rungs=3, parameters={"LR": "0.01"}),
    ],
    "ranking": ["12_2", "12_0", "12_1"],
}


def test_status_shows_each_trials_metric_and_rung_best_first():
    out = io.StringIO()
    describe(SWEEP_INFO, out)
    lines = [line for line in out.getvalue().splitlines() if "trial" in line]
    assert lines == [
        "best trial: 12_2 (trials best first)",
        "  trial 12_2 COMPLETED  accuracy 0.8123 at rung 3/3  LR=0.01",
        "  trial 12_0 COMPLETED  accuracy 0.5 at rung 1/3, stopped  ",
        "  trial 12_1 COMPLETED  LR=0.1",
    ]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"job_id": "7", "sweep": False}, "--best: job 7 is not a sweep"),
        (
            {**SWEEP_INFO, "best": None},
            "--best: no trial of sweep 12 has reported its metric at a rung yet",
        ),
    ],
)
def test_download_best_says_why_there_is_no_best_trial(info, message):
    with pytest.raises(UsageError, match=message):
        files.best_trial(info)


class FakeSftp:
    """The two SFTP calls a download makes, over a local directory tree."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def listdir_attr(self, path: str) -> list[paramiko.SFTPAttributes]:
        entries = sorted((self.root / path.lstrip("/")).iterdir())
        return [paramiko.SFTPAttributes.from_stat(e.lstat(), e.name) for e in entries]

    def get(self, remote: str, local: str) -> None:
        Path(local).write_bytes((self.root / remote.lstrip("/")).read_bytes())


def test_download_best_fetches_only_the_best_trials_outputs(tmp_path):
    remote = tmp_path / "remote"
    for index in (0, 1, 2):
        outputs = remote / "w/jobs/x-1/trials" / str(index) / "outputs"
        outputs.mkdir(parents=True)
        (outputs / "model.txt").write_text(f"trial {index}")
    dest = tmp_path / "best"
    count, best = files.download_best(FakeSftp(remote), SWEEP_INFO, dest)
    assert count == 1 and best["job_id"] == "12_2"
    assert (dest / "outputs" / "model.txt").read_text() == "trial 2"
    assert not (dest / "trials").exists()


def test_a_sweep_reruns_whole_with_the_same_trials_and_the_lock_of_its_trials(tmp_path):
    task = {
        "name": "search",
        "run": ["python train.py"],
        "environment": {"requirements": ["tacc-probe"]},
        "sweep": {"parameters": {"LR": {"loguniform": [1.0e-4, 1.0e-1]}}, "samples": 3},
    }
    _, job_dir = make_job(tmp_path, task, {"train.py": "print(1)\n"})
    sweeps.make_trials(job_dir, 3)
    past = records.read_json(job_dir / "instruction.json")
    with pytest.raises(Rejected, match="never built its environment"):
        rerun.rerun_document("12", job_dir)
    envcache.record_for_job(sweeps.trial_dir(job_dir, "1"), {"lock": ["tacc-probe==1.0"]})
    again = rerun.rerun_document("12", job_dir)
    assert again["task"]["sweep"]["trials"] == past["task"]["sweep"]["trials"]
    assert again["task"]["sweep"]["seed"] == past["task"]["sweep"]["seed"]
    assert again["task"]["environment"]["lock"] == ["tacc-probe==1.0"]


def test_one_trial_is_not_rerun_alone(tmp_path):
    task = {"name": "s", "run": ["true"], "sweep": {"parameters": {"A": [1, 2]}}}
    user_dir, job_dir = make_job(tmp_path, task, {"train.py": "print(1)\n"})
    sweeps.make_trials(job_dir, 2)
    workspace.register(user_dir, "12", job_dir)
    with pytest.raises(Rejected, match=r"job 12_1 is one trial of sweep 12; rerun the sweep"):
        rerun.rerun(user_dir, "12_1", AgentConfig())
