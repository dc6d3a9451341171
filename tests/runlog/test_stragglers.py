"""Stragglers from step records: the recorded run of a slow data loader, and step times built to test each rule."""

from __future__ import annotations

from pathlib import Path

from zeropilot.runlog import read_run, summarize
from zeropilot.runlog.stragglers import (MIN_STEPS, PROBE_WINDOW, StepTimes, describe, find, find_gpu, from_records,
                                         own_phases)
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


# -- a rank's own data time (data_seconds) ------------------------------------------------------------------


def _trainer_steps(n, data, wait=0.4):
    """Steps as the HF Trainer records them: every rank's ``idle`` holds the slowest rank's loading (the Trainer's
    token-count gather before the forward), only ``data`` (the DataLoader's own time) differs."""
    return [StepTimes(s, 1.0, wait + 0.01, 0.2, data) for s in range(1, n + 1)]


def test_the_data_time_names_the_slow_loader_the_trainers_gather_hides():
    ranks = {0: _trainer_steps(12, 0.001), 1: _trainer_steps(12, 0.4), 2: _trainer_steps(12, 0.002)}
    [s] = find(ranks, 2)
    assert (s["rank"], s["evidence"], s["phase"], s["steps"]) == (1, "data", "idle", 12)
    # the forward is own below ZeRO-3: 0.4 + 0.2 against the median of its peers' 0.201 and 0.202
    assert s["ratio"] == round(0.6 / 0.2015, 3)
    assert "its DataLoader takes 3.0× its peers' median" in describe(s)
    # the same steps without their data time: the phase times alone name nobody
    blind = {r: [StepTimes(x.step, x.seconds, x.idle, x.forward) for x in steps] for r, steps in ranks.items()}
    assert find(blind, 2) == []


def test_without_a_timed_dataloader_the_idle_phase_stands_in_and_says_so():
    ranks = {0: _steps(10), 1: _steps(10, slow=range(1, 11), slow_idle=0.5)}
    [s] = find(ranks, 3)
    assert s["evidence"] == "phases" and "time loading its data" in describe(s)


def test_a_slow_forward_below_zero_3_is_evidence_of_the_phases_even_with_data_times():
    ranks = {r: [StepTimes(s, 1.0, 0.05, 0.8 if r == 1 else 0.2, 0.01) for s in range(1, 11)] for r in (0, 1, 2)}
    [s] = find(ranks, 2)
    assert (s["rank"], s["phase"], s["evidence"]) == (1, "forward", "phases")


def test_a_huge_ratio_reads_as_such():
    ranks = {0: _trainer_steps(8, 0.0001), 1: _trainer_steps(8, 0.4)}
    [s] = find(ranks, 3)
    assert s["ratio"] > 1000 and "over 100× its peers' median" in describe(s)


# -- the GPU probe (gpu_probe_seconds) ----------------------------------------------------------------------


def _probes(n, seconds=0.0005, slow=(), slow_seconds=0.001, every=10):
    return [(every * (i + 2), slow_seconds if i in slow else seconds) for i in range(n)]


def test_a_slow_gpu_is_named_by_its_probe():
    ranks = {0: _probes(12), 1: _probes(12), 2: _probes(12, slow=range(12), slow_seconds=0.0011), 3: _probes(12)}
    [s] = find_gpu(ranks, {2: {"host": "n1", "gpu": 2}})
    assert (s["rank"], s["evidence"], s["windows"], s["probes"]) == (2, "gpu", 3, 12)
    assert s["ratio"] == 2.2 and (s["first_step"], s["last_step"]) == (20, 130)
    assert s["own_seconds"] == 0.0011 and s["peers_seconds"] == 0.0005
    text = describe(s)
    assert text.startswith("rank 2 (n1, GPU 2) has a slow GPU") and "2.2×" in text and "1.10 ms against 0.50 ms" in text


def test_a_card_shared_in_time_slices_is_named_from_the_windows_mean():
    """A card time-sliced with another process: some probes wait out the other's slice, others do not; no probe is
    slow in a row, the windows' mean is."""
    hit = [i for i in range(16) if i % 2 == 0]  # every other probe waits out a 1.5 ms slice
    ranks = {0: _probes(16), 1: _probes(16, slow=hit, slow_seconds=0.002)}
    [s] = find_gpu(ranks)
    assert s["rank"] == 1 and s["windows"] == 4 and 2.4 < s["ratio"] < 2.6


def test_probe_noise_a_short_spell_and_one_rank_alone_name_no_gpu():
    noisy = {r: [(10 * (i + 2), 0.0005 * (1 + 0.1 * ((i * 7 + r) % 3))) for i in range(16)] for r in range(4)}
    assert find_gpu(noisy) == []  # within 20% of each other
    spell = {0: _probes(16), 1: _probes(16, slow=range(4, 4 + PROBE_WINDOW))}  # one slow window, not MIN_WINDOWS
    assert find_gpu(spell) == []
    assert find_gpu({0: _probes(16, slow=range(16))}) == []  # no peer to compare with


def test_hostile_probe_readings_are_no_readings():
    bad = [(10 * (i + 2), x) for i, x in enumerate([0.0, -1.0, 1e9, float("inf")] * 4)]
    assert find_gpu({0: _probes(16), 1: bad, 2: _probes(16)}) == []


def test_the_report_has_no_gpu_straggler_on_a_cpu_run():
    assert summarize(read_run(FIXTURE))["gpu_stragglers"] == []


def test_a_slow_gpu_is_named_by_the_report_and_top_from_the_records(tmp_path, capsys):
    """Records as the guard writes them (the real writer): 3 ranks, the probe every 10 steps, rank 1's card at 2x."""
    import json

    from tests.cli.test_json_schemas import schema_errors
    from zeropilot.cli import main
    from zeropilot.runlog.events import EventWriter, event
    from zeropilot.runlog.report_html import render as render_html

    run = tmp_path / "run"
    for r in range(3):
        with EventWriter(run / f"rank-{r}.jsonl") as w:
            w.write(event("start", r, local_rank=r, host="node-a"))
            w.write(event("init", r, zero_stage=2, device={"name": "H100", "backend": "cuda", "index": r}))
            for s in range(1, 101):
                probe = {"gpu_probe_seconds": 0.00104 if r == 1 else 0.00052} if s % 10 == 0 and s >= 20 else {}
                w.write(event("step", r, step=s, seconds=0.3, phase_seconds={"idle": 0.01, "forward": 0.1},
                              data_seconds=0.005, **probe))
    records = read_run(run)
    summary = summarize(records)
    [s] = summary["gpu_stragglers"]
    assert (s["rank"], s["ratio"], s["windows"], s["place"]["gpu"]) == (1, 2.0, 2, 1) and summary["stragglers"] == []
    line = "straggler: rank 1 (node-a, GPU 1) has a slow GPU: the guard's fixed matrix product takes 2.0× its peers'"
    assert line in render(summary) and "has a slow GPU" in render_html(records, summary)
    assert main(["top", str(run), "--once"]) == 0
    assert line in capsys.readouterr().out
    assert main(["top", str(run), "--once", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [x["rank"] for x in doc["gpu_stragglers"]] == [1] and schema_errors(doc, "top.schema.json") == []


def test_a_strangers_data_times_that_are_no_times_are_left_out(tmp_path):
    """Negative, huge, textual or boolean data times read as none: those steps fall back to their phase times."""
    from zeropilot.runlog.events import EventWriter, event
    from zeropilot.runlog.live import LiveRun

    run = tmp_path / "run"
    bad = [-5.0, 1e30, "0.4", True, None, float("nan")]
    for r in range(2):
        with EventWriter(run / f"rank-{r}.jsonl") as w:
            for s in range(1, 13):
                w.write(event("step", r, step=s, seconds=1.0, phase_seconds={"idle": 0.5 if r else 0.05},
                              data_seconds=bad[s % len(bad)] if r else 0.01, gpu_probe_seconds=bad[s % len(bad)]))
    [s] = from_records(read_run(run))
    # rank 1's own time is its idle phase (0.5 s), rank 0's its DataLoader's (0.01 s): each rank's best evidence
    assert s["rank"] == 1 and s["evidence"] == "phases" and s["ratio"] == 50.0
    live = LiveRun.open(run)
    live.refresh()
    assert [x["evidence"] for x in live.stragglers()] == ["phases"] and live.gpu_stragglers() == []


def test_ranks_of_the_same_steps_are_read_by_index_to_the_same_stragglers(monkeypatch):
    """``find(..., aligned=True)`` (the i-th step of every rank together, what ``from_records`` uses when every rank
    holds the same steps) names what merging the ranks' streams names, and testing only the ranks that could be slow
    (``_maybe_slow``) what testing every rank names: slow ranks at the thresholds (1.5x the peers', and 0.1 s above
    them in a 1 s step), slow spells that start and stop, steps without phase times and a step time missing."""
    import random

    from zeropilot.runlog import stragglers

    def every_rank(names, *_):
        return names

    rnd = random.Random(5)
    for trial in range(40):
        n, world = rnd.randrange(5, 60), rnd.randrange(2, 40)
        ranks = {}
        for r in range(world):
            slow = set(rnd.sample(range(1, n + 1), rnd.randrange(0, n))) if r % 3 == 0 else set()
            ranks[r] = [StepTimes(s, None if rnd.random() < 0.05 else 1.0,
                                  None if rnd.random() < 0.05 else
                                  rnd.choice([0.05, 0.074, 0.076, 0.149, 0.15, 0.151, 0.6]) if s in slow
                                  else 0.05 + 0.001 * (r % 2),
                                  0.2, rnd.choice([None, 0.01, 0.5]) if s in slow else None)
                        for s in range(1, n + 1)]
        for stage in (2, 3):
            got = find(ranks, stage, aligned=True)
            assert got == find(ranks, stage), trial
            with monkeypatch.context() as m:
                m.setattr(stragglers, "_maybe_slow", every_rank)
                assert got == find(ranks, stage), trial


def test_from_records_reads_by_index_only_where_every_rank_holds_the_same_steps():
    from array import array

    from zeropilot.runlog.stragglers import _aligned

    class Rec:
        def __init__(self, steps):
            self.steps = {"step": array("d", steps)}

    class Run:
        def __init__(self, *cols):
            self.ranks = {r: Rec(c) for r, c in enumerate(cols)}

    assert _aligned(Run([1, 2, 128], [1, 2, 128]))
    assert not _aligned(Run([1, 2, 128], [1, 2]))  # a rank behind
    assert not _aligned(Run([1, 2, 2, 3], [1, 2, 2, 3]))  # a step recorded twice (a resume)
    assert not _aligned(Run([1, float("nan"), 3], [1, float("nan"), 3]))  # a record without a step number
    assert not _aligned(Run([1, 1.5, 2], [1, 1.5, 2]))  # the same step once truncated (as StepTimes holds it)
