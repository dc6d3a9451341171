"""Learned timeouts: section durations from records, deadlines from them, and the file that keeps them."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from zeropilot.errors import InputError
from zeropilot.runlog import read_run, summarize
from zeropilot.runlog import timeouts as tmo
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.text import render

FIXTURE = Path(__file__).parent / "fixtures" / "straggler-z3"


def _learned(**samples) -> tmo.Learned:
    learned = tmo.Learned()
    for section, values in samples.items():
        for v in values:
            learned.add(section, v)
    return learned


def test_the_recorded_run_gives_every_section_its_durations():
    learned = tmo.learn_from_records(read_run(FIXTURE))
    s = learned.sections
    assert set(s) == {"startup", "first_step", "step", "save"}  # idle is never learned
    assert s["startup"].count == 2 and s["first_step"].count == 2 and s["save"].count == 4
    assert s["step"].count == 13  # the 13 steps after the first, from rank 0 (each rank's step is the job's)
    assert 0.35 < s["step"].median_s < 0.6  # each step waits for rank 1's 0.4 s batch
    # the steps that held a save count without it: none is longer than its neighbours by the save
    assert s["step"].longest_s < 2 * s["step"].median_s


def test_a_step_that_held_a_save_counts_without_it():
    clock = tmo.RankClock()
    for rec in ({"event": "start", "t": 10.0, "live_since": 1.0}, {"event": "init", "t": 20.0},
                {"event": "step", "t": 22.0, "seconds": None}):
        tmo.observe(clock, rec)
    assert tmo.observe(clock, {"event": "save", "t": 32.0, "seconds": 9.0}) == [("save", 9.0)]
    got = tmo.observe(clock, {"event": "step", "t": 33.0, "seconds": 11.0, "phase_seconds": {"save": 9.0}})
    assert got == [("step", 2.0)]
    # a record without phase times that held a save is no sample at all
    tmo.observe(clock, {"event": "save", "t": 40.0, "seconds": 5.0})
    assert tmo.observe(clock, {"event": "step", "t": 41.0, "seconds": 6.5}) == []


def test_startup_first_step_and_a_load_restart_the_first_step():
    clock = tmo.RankClock()
    assert tmo.observe(clock, {"event": "start", "t": 5.0, "live_since": 1.0}) == []
    assert tmo.observe(clock, {"event": "init", "t": 21.0}) == [("startup", 20.0)]
    assert tmo.observe(clock, {"event": "load", "t": 31.0, "seconds": 10.0}) == [("load", 10.0)]
    assert tmo.observe(clock, {"event": "step", "t": 38.0, "seconds": None}) == [("first_step", 7.0)]
    assert tmo.observe(clock, {"event": "step", "t": 39.0, "seconds": 1.0}) == [("step", 1.0)]
    assert tmo.observe(clock, {"event": "save", "t": 50.0, "seconds": 3.0, "error": "disk full"}) == []


@pytest.mark.parametrize("phase,stepped,section", [
    ("startup", False, "startup"), ("init", False, "startup"), (None, False, "startup"),
    ("forward", False, "first_step"), ("idle", False, "first_step"), ("idle", True, "idle"),
    ("backward", True, "step"), ("step", True, "step"), ("collective", True, "idle"),
    ("save:write", True, "save"), ("load", False, "load"), ("exit", True, None)])
def test_section_of_a_heartbeat(phase, stepped, section):
    assert tmo.section_of(phase, stepped) == section


def test_a_step_far_past_its_median_is_past_its_deadline():
    learned = _learned(step=[2.0] * 20 + [3.0])
    d = tmo.deadline("step", learned, fixed_s=300.0)
    assert (d.seconds, d.source) == (10.0, "learned") and "5 × the median step 2.00 s" in d.basis
    assert tmo.deadline("step", _learned(step=[0.3] * 30), 300.0).seconds == tmo.STEP_FLOOR_S
    assert tmo.deadline("step", _learned(step=[1.0] * 30 + [9.0]), 300.0).seconds == 18.0  # 2 × longest
    few = tmo.deadline("step", _learned(step=[1.0] * (tmo.MIN_STEPS - 1)), 300.0)
    assert (few.seconds, few.source) == (300.0, "fixed")


def test_between_steps_the_fixed_timeout_holds_whatever_was_learned():
    """A final save_model of a large model, an evaluation: a script's own time, never judged by the step's."""
    learned = _learned(step=[0.3] * 100, idle=[0.1] * 100)
    assert tmo.deadline("idle", learned, 300.0) == tmo.Deadline("idle", 300.0, "fixed", "--hang-timeout")


def test_one_off_sections_only_lengthen():
    assert tmo.deadline("save", _learned(save=[3.0]), 300.0).seconds == 300.0
    long = tmo.deadline("save", _learned(save=[200.0, 180.0]), 300.0)
    assert (long.seconds, long.source) == (400.0, "learned") and "longest save" in long.basis
    planned = tmo.deadline("save", None, 120.0, {"checkpoint": {"save_seconds": 100.0}})
    assert (planned.seconds, planned.source) == (260.0, "plan")
    assert tmo.deadline("load", None, 120.0, {"checkpoint": {"save_seconds": 100.0}}).source == "plan"
    assert tmo.deadline("startup", None, 120.0, {"checkpoint": {"save_seconds": 100.0}}).source == "fixed"


def test_a_cut_save_gets_four_times_as_long_next_time_until_one_completes():
    learned = tmo.Learned()
    learned.cut("save", 8.0)
    d = tmo.deadline("save", learned, fixed_s=8.0)
    assert (d.seconds, d.source) == (32.0, "learned") and "watchdog stopped it" in d.basis
    learned.add("save", 5.0)  # shorter than the cut: the cut still stands
    assert learned.sections["save"].cut_s == 8.0
    learned.add("save", 15.0)  # it took that long: the cut is explained
    assert learned.sections["save"].cut_s is None
    assert tmo.deadline("save", learned, 8.0).seconds == 30.0


def test_the_file_round_trips(tmp_path):
    learned = _learned(step=[1.0, 2.0, 3.0], save=[10.0])
    learned.cut("startup", 99.0)
    learned.note_run("/runs/a")
    path = RunDir(tmp_path).timeouts_file
    tmo.write(path, learned)
    back = tmo.read(path)
    assert back.sections["step"].samples == [1.0, 2.0, 3.0] and back.sections["step"].median_s == 2.0
    assert back.sections["startup"].cut_s == 99.0 and back.runs == ["/runs/a"]
    data = json.loads(path.read_text())
    assert data["schema"] == tmo.TIMEOUTS_SCHEMA and data["policy"]["step_median_factor"] == 5.0
    from tests.cli.test_json_schemas import schema_errors

    assert schema_errors(data, "timeouts.schema.json") == []
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_samples_are_bounded():
    learned = _learned(step=[float(i) for i in range(1000)])
    s = learned.sections["step"]
    assert s.count == 1000 and len(s.samples) == tmo.MAX_SAMPLES and s.longest_s == 999.0


@pytest.mark.parametrize("payload", [[], {"schema": "zeropilot.run/1"}, "text", None])
def test_a_file_that_is_not_a_timeouts_file_is_an_input_error(payload):
    with pytest.raises(InputError, match="not a learned-timeouts file"):
        tmo.from_json(payload, "x.json")


def test_hostile_values_are_dropped_never_trusted():
    data = {"schema": tmo.TIMEOUTS_SCHEMA, "runs": ["a", 3, None],
            "sections": {"step": {"count": True, "samples": [1.0, -1, math.inf, "2", 1e300, 2.0] * 500,
                                  "longest_s": -5, "cut_s": float("nan")},
                         "save": {"count": 10 ** 30, "samples": "many", "longest_s": 4.0, "cut_s": 1e12},
                         "unknown": {"count": 1}, "load": []}}
    learned = tmo.from_json(json.loads(json.dumps(data, allow_nan=True)), "x.json")
    step = learned.sections["step"]
    assert set(step.samples) == {1.0, 2.0} and len(step.samples) <= tmo.MAX_SAMPLES
    assert step.longest_s == 2.0 and step.cut_s is None and step.count == len(step.samples)
    save = learned.sections["save"]
    assert (save.count, save.samples, save.longest_s, save.cut_s) == (0, [], 4.0, None)
    assert set(learned.sections) == {"step", "save"} and learned.runs == ["a"]


def test_a_fifo_or_a_huge_file_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "timeouts.json"
    os.mkfifo(fifo)
    with pytest.raises(InputError):
        tmo.read(fifo)
    big = tmp_path / "big.json"
    big.write_text(" " * (tmo.MAX_FILE + 1))
    with pytest.raises(InputError):
        tmo.read(big)
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        tmo.read(bad)


def test_timeouts_from_a_run_directory_its_file_or_its_records(tmp_path):
    from_records = tmo.load_source(FIXTURE)  # no timeouts.json there: learned from its records
    assert from_records.sections["step"].count == 13 and from_records.runs[-1] == str(FIXTURE.resolve())
    run = tmp_path / "run"
    run.mkdir()
    tmo.write(RunDir(run).timeouts_file, _learned(save=[50.0]))
    assert tmo.load_source(run).sections["save"].longest_s == 50.0
    assert tmo.load_source(RunDir(run).timeouts_file).sections["save"].count == 1
    with pytest.raises(InputError, match="no such file"):
        tmo.load_source(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        tmo.load_source(empty)


def test_the_report_shows_the_deadlines_in_force(tmp_path):
    summary = summarize(read_run(FIXTURE))
    t = summary["timeouts"]
    assert t["source"] == "records" and t["deadlines"]["step"]["source"] == "learned"
    assert t["deadlines"]["save"] == {"section": "save", "seconds": 300.0, "source": "fixed",
                                      "basis": "--hang-timeout"}
    assert "hang deadlines:" in render(summary)


def test_a_broken_timeouts_file_is_a_note_in_the_report(tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    RunDir(run).timeouts_file.write_text(json.dumps({"schema": "other"}))
    summary = summarize(read_run(run))
    assert summary["timeouts"]["source"] == "records"
    assert any("timeouts.json" in p for p in summary["problems"])
