"""Learned timeouts and stragglers on real 2-rank CPU jobs (gloo, DeepSpeed ZeRO-3 under torchrun).

One pair of runs (``tests.runjobs.learned_timeouts``), shared by every test here: the first run's save outlasts the
fixed ``--hang-timeout 8`` and is stopped as a hang; the second run, pointed at the first with ``--timeouts-from``,
lets the same 16 s save finish and stops a hung step at the deadline learned from the first run's steps. Rank 1
loads its batches in 1.1 s, rank 0 in 0.5 s: rank 1 is the straggler, named with its ratio.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tests.runjobs import learned_timeouts
from zeropilot.runlog import read_run, summarize
from zeropilot.runlog import timeouts as tmo
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.text import render

pytestmark = pytest.mark.slow


def _hang(job) -> dict:
    return json.loads(RunDir(job.run_dir).hang_file.read_text())


def test_a_save_past_the_fixed_timeout_is_stopped_the_first_time_and_kept_as_cut():
    first, _ = learned_timeouts()
    hang = _hang(first)
    assert hang["deadline"]["section"] == "save" and hang["deadline"]["source"] == "fixed", hang["deadline"]
    assert hang["deadline"]["seconds"] == 8.0 and hang["verdict"]["class"] in ("slow_storage", "straggler")
    learned = tmo.read(RunDir(first.run_dir).timeouts_file)
    assert learned.sections["save"].cut_s >= 8.0 and learned.sections["save"].count == 0  # stopped, never ended
    assert learned.sections["step"].count >= tmo.MIN_STEPS  # steps 2-7 (rank 0's: each rank's step is the job's)


def test_the_later_run_lets_the_same_save_finish_and_stops_a_step_far_past_its_median():
    first, second = learned_timeouts()
    summary = summarize(read_run(second.run_dir))
    saves = [s for s in summary["saves"] if s["step"] == 7]
    assert saves and max(s["seconds"] for s in saves) > 8.0 and not any(s["error"] for s in saves), saves
    assert "watchdog stopped it" in summary["timeouts"]["deadlines"]["save"]["basis"] or \
        summary["timeouts"]["deadlines"]["save"]["source"] == "learned"
    hang = _hang(second)
    d = hang["deadline"]
    assert d["section"] == "step" and d["source"] == "learned" and d["seconds"] < 8.0, d
    assert "5 × the median step" in d["basis"]
    assert summary["verdict"]["kind"] == "hang" and 1 in summary["verdict"]["ranks"]
    assert "the step deadline" in render(summary)
    learned = tmo.read(RunDir(second.run_dir).timeouts_file)
    assert learned.sections["save"].cut_s is None and learned.sections["save"].longest_s > 8.0
    assert learned.runs[0] == str(first.run_dir.resolve())  # what it started from


def test_both_timeouts_files_keep_their_schema():
    from tests.cli.test_json_schemas import schema_errors

    for job in learned_timeouts():
        data = json.loads(RunDir(job.run_dir).timeouts_file.read_text())
        assert schema_errors(data, "timeouts.schema.json") == []


def test_the_slow_rank_is_named_with_its_ratio_in_the_report_and_the_trackers():
    first, _ = learned_timeouts()
    summary = summarize(read_run(first.run_dir))
    [s] = summary["stragglers"]
    assert s["rank"] == 1 and 1.6 < s["ratio"] < 2.8 and s["phase"] == "idle" and s["steps"] >= 5, s
    assert s["place"]["local_rank"] == 1 and s["place"]["node_rank"] == 0
    assert "straggler: rank 1" in render(summary)
    top = subprocess.run([sys.executable, "-m", "zeropilot", "top", str(first.run_dir), "--once", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert [x["rank"] for x in json.loads(top.stdout)["stragglers"]] == [1], top.stderr[-2000:]
    # rank 0's figures reached DeepSpeed's CSV monitor (the job's own tracker) through its engine monitor
    with open(first.run_dir.parent / "monitor" / "csv" / "zeropilot_straggler_rank.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "straggler_rank"] and {float(r[1]) for r in rows[1:]} == {1.0}
