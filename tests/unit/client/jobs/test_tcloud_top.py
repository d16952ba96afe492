"""tcloud top (tcloud.jobs.usage_view): CPU% is the rate of cpu_seconds between two answers
over their `sampled` times ("-" on the first frame); memory and GPUs as people read
them; a node with an error shows it; --once takes two answers; --json prints the raw
answers one per line; the frame is redrawn in place on a terminal only; it ends when
the job ends; another user's job is refused (exit 4)."""

from __future__ import annotations

import json

import pytest

from tcloud import cli
from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE
from tcloud.jobs import usage_view
from tests.unit.interactive_fakes import NOT_YOURS, FakeCluster, cli_run

GIB = 1 << 30


def answer(cpu: float, sampled: float, state: str = "RUNNING") -> dict:
    return {
        "job_id": "42",
        "state": state,
        "time": sampled,
        "nodes": [
            {
                "host": "n2",
                "rank": 0,
                "cpu_seconds": cpu,
                "sampled": sampled,
                "cpus": 4,
                "memory_bytes": 3 * GIB // 2,
                "gpus": [
                    {
                        "index": 0,
                        "utilization_ratio": 0.87,
                        "memory_used_bytes": 10 * GIB,
                        "memory_total_bytes": 80 * GIB,
                    }
                ],
            },
            {"host": "n3", "rank": 1, "error": "node daemon on n3 did not answer"},
        ],
    }


def test_cpu_percent_is_the_rate_between_two_answers():
    before, now = answer(100.0, 1000.0)["nodes"][0], answer(103.0, 1002.0)["nodes"][0]
    assert usage_view.cpu_percent(before, now) == pytest.approx(150.0)
    assert usage_view.cpu_percent(None, now) is None
    assert usage_view.cpu_percent(now, now) is None  # no time between: unknown
    assert usage_view.cpu_percent({**before, "cpu_seconds": None}, now) is None


def test_a_frame_has_a_row_per_node_and_the_error_of_a_node_that_did_not_answer():
    first = usage_view.frame(answer(100.0, 1000.0), None)
    lines = first.splitlines()
    assert lines[0] == "job 42 RUNNING"
    assert lines[1].split() == ["NODE", "CPU%", "CPUS", "MEMORY", "GPUS"]
    assert lines[2].split()[:2] == ["n2:0", "-"]  # the first frame knows no rate
    assert "gpu0 87% 10.0 GiB/80.0 GiB" in lines[2] and "1.5 GiB" in lines[2]
    assert lines[3].startswith("n3:1") and lines[3].endswith(
        "error: node daemon on n3 did not answer"
    )
    second = usage_view.frame(answer(102.0, 1002.0), answer(100.0, 1000.0))
    assert second.splitlines()[2].split()[:3] == ["n2:0", "100", "4"]


def test_sizes_read_as_people_read_them():
    assert usage_view.size(None) == "-"
    assert usage_view.size(512) == "512 B"
    assert usage_view.size(3 * GIB // 2) == "1.5 GiB"


def test_in_place_only_on_a_terminal():
    assert usage_view.drawn("x\n", True) == "\x1b[H\x1b[Jx\n"
    assert usage_view.drawn("x\n", False) == "x\n\n"


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    cluster = FakeCluster(tmp_path, monkeypatch)
    answers = iter(
        [answer(100.0, 1000.0), answer(101.0, 1001.0), answer(103.0, 1002.0, "COMPLETED")]
    )
    cluster.session.answers[("job", "top")] = lambda: (0, next(answers))
    monkeypatch.setattr(cli.time, "sleep", lambda _s: None)
    return cluster


def test_once_takes_two_answers_and_prints_one_frame_with_cpu(fake):
    code, out, _ = cli_run("top", "42", "--once")
    assert code == 0
    assert out.count("job 42 RUNNING") == 1 and "\x1b[" not in out
    assert out.splitlines()[2].split()[:2] == ["n2:0", "100"]
    assert [v[:2] for v in fake.session.verbs] == [["job", "top"]] * 2


def test_json_prints_the_raw_answers_until_the_job_ends(fake):
    code, out, _ = cli_run("top", "42", "--json")
    assert code == 0
    states = [json.loads(line)["state"] for line in out.splitlines()]
    assert states == ["RUNNING", "RUNNING", "COMPLETED"]


def test_appended_when_not_a_terminal_and_ends_with_the_job(fake):
    code, out, _ = cli_run("top", "42")
    assert code == 0 and out.count("job 42 ") == 3 and "\x1b[" not in out
    assert "job 42 COMPLETED" in out


def test_ctrl_c_exits_0(fake, monkeypatch):
    def interrupted(_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", interrupted)
    assert cli_run("top", "42")[0] == 0


@pytest.mark.security
def test_top_of_another_users_job_is_refused(fake):
    fake.answer(("job", "top"), 4, NOT_YOURS)
    code, out, err = cli_run("top", "42")
    assert (code, out) == (EXIT_CLUSTER, "")
    assert err.strip() == "tcloud: error: job 42 is not yours"


@pytest.mark.bad_input
@pytest.mark.parametrize("interval", ["0", "-1", "abc", "99999", "0.5", "0.99", "nan"])
def test_a_bad_interval_is_a_usage_error(fake, interval, capsys):
    """Under 1 s is refused: the node daemon keeps its figures 1 s (repeated frames, 0%)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["top", "42", "--interval", interval])
    assert exited.value.code == EXIT_USAGE
    assert "--interval: expected 1 to 3600 seconds" in capsys.readouterr().err
    assert fake.session.verbs == []


def test_sdk_usage_is_the_job_top_answer(fake):
    with fake.cluster() as cluster:
        assert cluster.job(42).usage()["nodes"][0]["cpus"] == 4


def ended(state: str) -> tuple[int, dict]:
    return 4, {"error": f"job 42 is {state}: it runs on no node any more (tcloud logs 42)"}


@pytest.mark.fault
@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED", "FAILED"])
def test_a_job_that_ends_between_two_frames_is_said_and_exits_0(fake, state):
    answers = iter([(0, answer(100.0, 1000.0)), ended(state)])
    fake.session.answers[("job", "top")] = lambda: next(answers)
    code, out, err = cli_run("top", "42")
    assert (code, err) == (0, "")
    assert "job 42 RUNNING" in out and out.endswith(f"job 42 ended ({state})\n")


@pytest.mark.fault
def test_a_job_that_ends_under_json_is_said_too(fake):
    answers = iter([(0, answer(100.0, 1000.0)), ended("CANCELLED")])
    fake.session.answers[("job", "top")] = lambda: next(answers)
    code, out, _ = cli_run("top", "42", "--json")
    assert code == 0 and out.splitlines()[-1] == "job 42 ended (CANCELLED)"


def test_a_job_not_running_before_any_frame_stays_an_error(fake):
    fake.session.answers[("job", "top")] = lambda: ended("COMPLETED")
    code, out, err = cli_run("top", "42")
    assert (code, out) == (EXIT_CLUSTER, "")
    assert err.startswith("tcloud: error: job 42 is COMPLETED:")


def test_another_refusal_after_a_frame_stays_an_error(fake):
    answers = iter([(0, answer(100.0, 1000.0)), (4, NOT_YOURS)])
    fake.session.answers[("job", "top")] = lambda: next(answers)
    code, _, err = cli_run("top", "42")
    assert code == EXIT_CLUSTER and err.strip() == "tcloud: error: job 42 is not yours"


def test_ended_state_reads_only_a_final_state_of_this_job():
    assert usage_view.ended_state("job 42 is FAILED: x", "42") == "FAILED"
    assert usage_view.ended_state("job 42 is PENDING: x", "42") is None
    assert usage_view.ended_state("job 421 is FAILED: x", "42") is None
    assert usage_view.ended_state("job 42 is not yours", "42") is None


@pytest.mark.bad_input
@pytest.mark.parametrize("delta", [0.0, -1.0])
def test_no_time_between_two_samples_shows_a_dash_not_a_rate(delta):
    """The daemon's cached figures twice (sampled equal) or a clock stepped back."""
    before = answer(100.0, 1000.0)
    now = answer(100.0, 1000.0 + delta)
    assert usage_view.cpu_percent(before["nodes"][0], now["nodes"][0]) is None
    moved = answer(101.0, 1000.0 + delta)  # CPU time moved, sampled did not: no division
    assert usage_view.cpu_percent(before["nodes"][0], moved["nodes"][0]) is None
    assert usage_view.frame(moved, before).splitlines()[2].split()[:2] == ["n2:0", "-"]


@pytest.mark.bad_input
def test_a_sample_that_is_not_a_number_shows_a_dash():
    before, now = answer(100.0, 1000.0)["nodes"][0], answer(101.0, 1001.0)["nodes"][0]
    assert usage_view.cpu_percent({**before, "sampled": "soon"}, now) is None
