"""bench/report.py renders REPORT.md from results.json alone, with every row and note.

REPORT.md is the renderer's output: a row or paragraph added to REPORT.md by hand, and not
to results.json, would be lost at the next `bench/report.py --only ...` or `--from-json`
(as it was before the entries had `notes` and recorded sections). These cases keep the two
in step."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "bench"


@pytest.fixture(scope="module")
def report():
    sys.path.insert(0, str(BENCH))  # report.py imports its siblings (benchlib, submit_steps)
    try:
        spec = importlib.util.spec_from_file_location("bench_report", BENCH / "report.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_report", None)
        sys.path.remove(str(BENCH))


def results() -> dict:
    return json.loads((BENCH / "results.json").read_text())


def test_report_md_is_what_results_json_renders(report, tmp_path) -> None:
    shutil.copy(BENCH / "concurrency.png", tmp_path / "concurrency.png")
    rendered, _ = report.render(results(), tmp_path)
    assert rendered.read_text() == (BENCH / "REPORT.md").read_text(), (
        "bench/REPORT.md differs from what bench/results.json renders: put rows and notes "
        "in results.json (an entry's `notes`, or a recorded `section`), then "
        "`python3 bench/report.py --from-json bench/results.json`"
    )


def test_every_plugin_row_finds_its_numbers(report) -> None:
    result = results()["scripts"]["plugins"]["result"]
    for row in report.PLUGIN_ROWS:
        data = result.get(row.key or row.plugin)
        assert data, f"no result for {row.key or row.plugin}"
        for path in (row.off_path, row.on_path):
            assert isinstance(report.dig(data, path), int | float), (row.figure, path)


def test_notes_follow_their_section_and_survive_a_rerun(report, tmp_path) -> None:
    entry = {"script": "plugins.py", "command": "c", "ok": True, "result": {}}
    kept = report.keep_notes({**entry, "notes": ["What the old rows mean."]}, dict(entry))
    assert kept["notes"] == ["What the old rows mean."]
    assert "notes" not in report.keep_notes(None, dict(entry))
    assert "notes" not in report.keep_notes(dict(entry), dict(entry))
    base = results()
    base["scripts"] = {"plugins": kept}
    text, _ = report.render(base, tmp_path)
    lines = text.read_text().splitlines()
    assert lines.index("What the old rows mean.") > lines.index(
        "## Plug-ins on and off (bench/plugins.py)"
    )


def test_scripts_report_py_does_not_run_keep_their_recorded_section(report, tmp_path) -> None:
    base = results()
    base["scripts"] = {
        "interactive": {
            "script": "interactive.py",
            "command": "c",
            "ok": True,
            "section": ["## Into a running job", "", "| a | b |"],
            "notes": ["Why."],
        },
        "operations": {"script": "operations.py", "command": "c", "ok": True},
    }
    text = report.render(base, tmp_path)[0].read_text()
    assert "## Into a running job\n\n| a | b |\n\nWhy.\n" in text
    assert "_No section recorded for operations.py._" in text


def test_issue_23_paths_render_once_after_the_goals_with_each_rows_command(
    report, tmp_path
) -> None:
    row = {
        "measured": "exec on every node",
        "before": "2.23x",
        "after": "1.24x",
        "goal": "<= 1.20x",
        "meets": False,
        "load": "0.3",
        "command": "bench/interactive.py --only exec",
    }
    base = results()
    base["scripts"] = {
        report.PATHS: {
            "script": "several",
            "command": "each row's",
            "ok": True,
            "intro": "Before: the issue.",
            "rows": [row],
            "notes": ["Why exec misses."],
        }
    }
    text = report.render(base, tmp_path)[0].read_text()
    heading = "## Every path a user waits on (issue [23]): before and after"
    assert text.count(heading) == 1
    assert text.index(heading) > text.index("## At the cost of plain Slurm (issue [12])")
    assert (
        "| exec on every node | 2.23x | 1.24x | <= 1.20x | misses | 0.3 | "
        "`bench/interactive.py --only exec` |" in text
    )
    assert text.index("Why exec misses.") > text.index(heading)
    assert "## paths" not in text and "_No section recorded for several._" not in text
