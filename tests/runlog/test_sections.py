"""The watchdog's view of sections (``runlog.sections``): the recorded run's files read as a live run would be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from zeropilot.runlog import timeouts as tmo
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.sections import SectionWatch

FIXTURE = Path(__file__).parent / "fixtures" / "straggler-z3"


def _run(tmp_path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("rank-0.jsonl", "rank-1.jsonl", "run.json"):
        shutil.copy(FIXTURE / name, run / name)
    return run


def test_records_read_live_teach_the_step_deadline_and_are_written(tmp_path):
    run = _run(tmp_path)
    watch = SectionWatch(run, fixed_s=300.0)
    beats = {0: {"phase": "forward", "phase_since": 100.0}, 1: {"phase": "backward", "phase_since": 100.5}}
    watch.poll(beats, now=101.0)
    d = watch.deadline()
    assert (d.section, d.source, d.seconds) == ("step", "learned", tmo.STEP_FLOOR_S)
    watch.poll({0: {"phase": "forward", "phase_since": 100.0}, 1: {"phase": "idle", "phase_since": 101.2}}, now=101.5)
    assert watch.deadline() == tmo.Deadline("idle", 300.0, "fixed", "--hang-timeout")  # rank 1 loads its batch
    data = json.loads(RunDir(run).timeouts_file.read_text())
    assert data["sections"]["step"]["count"] == 13 and data["runs"] == [str(run)]
    assert watch.elapsed("step", now=104.0) == 4.0


def test_a_rank_in_a_save_sets_the_deadline_for_all_and_a_cut_lengthens_the_next(tmp_path):
    run = _run(tmp_path)
    watch = SectionWatch(run, fixed_s=8.0)
    watch.poll({0: {"phase": "save:model_states", "phase_since": 200.0}, 1: {"phase": "step"}}, now=200.5)
    watch.poll({0: {"phase": "save:write", "phase_since": 203.0}, 1: {"phase": "step"}}, now=203.5)
    d = watch.deadline()
    assert (d.section, d.seconds, d.source) == ("save", 8.0, "fixed")  # the saves seen took 0.03 s: 2 x is less
    assert watch.elapsed("save", now=209.0) == 9.0  # from the save's start, not its sub-phase's
    assert not watch.cut(d, "collective_mismatch", now=209.0)  # a broken job: no longer deadline helps
    assert watch.cut(d, "slow_storage", now=209.0)
    again = SectionWatch(run, fixed_s=8.0)  # the next attempt, on the same file
    again.poll({0: {"phase": "save", "phase_since": 300.0}}, now=300.0)
    d2 = again.deadline()
    assert (d2.section, d2.seconds, d2.source) == ("save", 36.0, "learned") and "watchdog stopped it" in d2.basis


def test_the_step_is_never_cut(tmp_path):
    run = _run(tmp_path)
    watch = SectionWatch(run, fixed_s=300.0)
    watch.poll({0: {"phase": "backward", "phase_since": 1.0}}, now=2.0)
    assert watch.deadline().section == "step" and not watch.cut(watch.deadline(), "straggler", now=20.0)


def test_before_any_rank_the_job_is_starting_up_and_exiting_ranks_do_not_count(tmp_path):
    watch = SectionWatch(tmp_path, fixed_s=60.0)
    assert watch.deadline().section == "startup"
    watch.poll({0: {"phase": "exit"}, 1: {"phase": "init", "phase_since": 5.0}}, now=6.0)
    assert set(watch.entered) == {1} and watch.deadline().section == "startup"


def test_a_broken_file_is_noted_and_replaced(tmp_path):
    RunDir(tmp_path).timeouts_file.write_text("{not json")
    watch = SectionWatch(tmp_path, fixed_s=60.0)
    assert watch.notes and "learning afresh" in watch.notes[0]
    watch.poll({}, now=1.0)
    assert tmo.read(RunDir(tmp_path).timeouts_file).runs == [str(tmp_path)]


def test_a_shared_file_outside_the_run_directory(tmp_path):
    """heal-core's attempts each run in their own folder and share the heal run's file (RunOptions)."""
    shared = tmp_path / "timeouts.json"
    tmo.write(shared, tmo.Learned(sections={"save": tmo.Seen(count=1, samples=[50.0], longest_s=50.0)}))
    attempt = tmp_path / "attempt-2"
    attempt.mkdir()
    watch = SectionWatch(attempt, fixed_s=30.0, timeouts_file=shared)
    watch.poll({0: {"phase": "save"}}, now=1.0)
    assert watch.deadline().seconds == 100.0
    assert tmo.read(shared).runs == [str(attempt)] and not RunDir(attempt).timeouts_file.exists()
