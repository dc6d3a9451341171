"""Stragglers from step records: the recorded run of a slow data loader, and step times built to test each rule."""

from __future__ import annotations

from pathlib import Path

from zeropilot.runlog import read_run, summarize
from zeropilot.runlog.stragglers import MIN_STEPS, StepTimes, describe, find, from_records, own_phases
from zeropilot.runlog.text import render

FIXTURE = Path(__file__).parent / "fixtures" / "straggler-z3"


def _steps(n, seconds=1.0, idle=0.05, forward=0.2, slow=(), slow_idle=None, slow_forward=None, start=1):
    """``n`` steps; those in ``slow`` get ``slow_idle`` / ``slow_forward`` instead."""
    return [StepTimes(s, seconds, slow_idle if s in slow and slow_idle is not None else idle,
                      slow_forward if s in slow and slow_forward is not None else forward)
            for s in range(start, start + n)]


def test_the_recorded_slow_loader_is_named_with_its_ratio_node_and_place():
    found = from_records(read_run(FIXTURE))
    assert [s["rank"] for s in found] == [1]
    s = found[0]
    assert 3.0 < s["ratio"] < 5.0  # 0.4 s against 0.1 s per batch
    assert s["phase"] == "idle" and s["phases"] == ["idle"]  # ZeRO-3: the forward gathers, only data is own
    assert s["steps"] >= 12 and s["last_step"] == 14
    assert 0.25 < s["excess_seconds"] < 0.35
    assert s["place"] == {"host": s["place"]["host"], "node_rank": 0, "local_rank": 1, "gpu": None}
    assert "rank 1" in describe(s) and "loading its data" in describe(s)


def test_the_report_names_the_straggler_in_text_and_json():
    summary = summarize(read_run(FIXTURE))
    assert summary["stragglers"][0]["rank"] == 1
    text = render(summary)
    assert "straggler: rank 1" in text and "its peers' median" in text


def test_balanced_ranks_have_no_straggler():
    assert find({0: _steps(20), 1: _steps(20), 2: _steps(20)}, 2) == []


def test_noise_on_a_near_zero_data_time_is_no_straggler():
    """3 ms against 1 ms is 3x, but 0.2% of a 1 s step: below MIN_EXCESS_FRACTION."""
    ranks = {0: _steps(20, idle=0.001, forward=0.0), 1: _steps(20, idle=0.003, forward=0.0)}
    assert find(ranks, 3) == []


def test_a_slow_spell_shorter_than_min_steps_is_not_named():
    slow = range(5, 5 + MIN_STEPS - 1)
    ranks = {0: _steps(30), 1: _steps(30, slow=slow, slow_idle=0.6)}
    assert find(ranks, 3) == []


def test_the_longest_run_of_slow_steps_counts():
    slow = set(range(3, 6)) | set(range(10, 10 + MIN_STEPS + 2))
    ranks = {0: _steps(30), 1: _steps(30), 2: _steps(30, slow=slow, slow_idle=0.6)}
    [s] = find(ranks, 3)
    assert (s["rank"], s["steps"], s["first_step"], s["last_step"]) == (2, MIN_STEPS + 2, 10, 10 + MIN_STEPS + 1)
    assert s["ratio"] == round(0.6 / 0.05, 3)


def test_the_forward_is_own_time_below_zero_3_only():
    """A rank slower in its forward: named under ZeRO-2 (no collective in the forward), not under ZeRO-3."""
    ranks = {0: _steps(20), 1: _steps(20, slow=range(1, 21), slow_forward=0.8)}
    [s] = find(ranks, 2)
    assert s["rank"] == 1 and s["phase"] == "forward" and own_phases(2) == ("idle", "forward")
    assert find(ranks, 3) == []


def test_peers_at_zero_give_no_ratio_but_a_finding():
    ranks = {0: _steps(10, idle=0.0, forward=0.0), 1: _steps(10, idle=0.5, forward=0.0)}
    [s] = find(ranks, 3)
    assert s["ratio"] is None and "far above" in describe(s)


def test_steps_without_phase_times_are_left_out():
    ranks = {0: [StepTimes(s, 1.0, None, None) for s in range(20)], 1: _steps(20, slow=range(20), slow_idle=0.9)}
    assert find(ranks, 3) == []


def test_many_ranks_one_straggler_among_them():
    ranks = {r: _steps(40) for r in range(256)}
    ranks[77] = _steps(40, slow=range(1, 41), slow_idle=0.4)
    [s] = find(ranks, 3)
    assert s["rank"] == 77 and s["steps"] == 40


def test_a_step_recorded_twice_and_steps_out_of_order_do_not_break_it():
    """A resume that goes back a few steps writes the same step numbers again (hostile files may do anything)."""
    again = _steps(10, start=1) + _steps(10, start=5)
    assert find({0: again, 1: list(reversed(_steps(10)))}, 3) == []
    slow = _steps(10, start=1, slow=range(1, 11), slow_idle=0.5) + _steps(10, start=5, slow=range(5, 15), slow_idle=0.5)
    [s] = find({0: again, 1: slow}, 3)
    assert s["rank"] == 1
