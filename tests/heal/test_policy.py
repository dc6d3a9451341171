"""The heal policy as pure functions: which failure a restart helps, which fix is applied, the no-loop rule.

Inputs are the records a run directory holds (report verdicts, ``error`` records, OOM fixes as ``guard.whatif``
ranks them); the multi-process runs that produce them for real are in ``test_heal_runs.py`` and
``test_heal_preempt.py``.
"""

from __future__ import annotations

import pytest

from zeropilot.heal import causes, fixes, record
from zeropilot.guard import inject


def _summary(kind, steps=3, cls=None, ranks=(1,), reason="r"):
    return {"verdict": {"kind": kind, "class": cls, "ranks": list(ranks), "reason": reason}, "steps": steps}


def test_a_rank_killed_from_outside_is_restarted():
    f = causes.failure_of(_summary("crash"), {0: [{"event": "error", "type": "RuntimeError", "peer_failure": True}],
                                              1: [{"event": "start"}]})
    assert (f.kind, f.cls, f.step, f.restart) == ("crash", "killed", 3, True)


@pytest.mark.parametrize("error, restart", [
    ({"type": "ValueError", "message": "bad sample"}, False),
    ({"type": "KeyError", "message": "'labels'"}, False),
    ({"type": "DistBackendError", "message": "NCCL error"}, True),
    ({"type": "RuntimeError", "message": "NCCL communicator was aborted"}, True),
    ({"type": "RuntimeError", "message": "shape mismatch"}, False),
    ({"type": "OSError", "message": "Input/output error"}, True),
])
def test_a_python_error_of_the_job_is_not_restarted_a_fault_is(error, restart):
    events = {1: [{"event": "start"}, dict(error, event="error", peer_failure=False)]}
    f = causes.failure_of(_summary("crash"), events)
    assert f.restart is restart and f.cls == error["type"]
    assert ("again" in f.why) is not restart


def test_a_launch_that_failed_before_any_rank_is_not_restarted():
    f = causes.failure_of(_summary("crash", steps=0, ranks=()), {})
    assert (f.cls, f.restart) == ("before_training", False)


@pytest.mark.parametrize("cls, restart", [("rank_gone", True), ("straggler", True), ("collective", True),
                                          ("stale_lock", False), ("save_partial", False),
                                          ("collective_mismatch", False)])
def test_hang_classes(cls, restart):
    f = causes.failure_of(_summary("hang", cls=cls), {})
    assert f.restart is restart and f.cls == cls


def test_an_oom_restarts_only_with_a_fix_and_a_preemption_not_here():
    assert causes.failure_of(_summary("oom", cls="capacity"), {}).restart is True
    f = causes.failure_of(_summary("crash"), {}, preempted={"signal": "SIGTERM", "saved_step": 4})
    assert (f.kind, f.restart) == ("preempted", False) and "step 4" in f.why and "--heal" in f.why


# -- fixes --------------------------------------------------------------------------------------------------------

def _fix(key, fits=True, change=None):
    return {"key": key, "fix": f"the {key} fix", "fits": fits, "change": change or {key: 1}}


@pytest.mark.parametrize("key, neutral, allow", [
    ("micro_batch", True, []), ("gradient_checkpointing", True, []), ("offload_param", True, []),
    ("expandable_segments", True, []), ("stage", True, []), ("seq_len", False, ["seq_len"]),
    ("seq_len_outlier", False, ["seq_len"]), ("packing", False, ["packing"]),
    ("micro_batch+gradient_checkpointing", True, []), ("micro_batch+seq_len", False, ["seq_len"]),
])
def test_which_fix_keeps_the_training_the_same(key, neutral, allow):
    assert fixes.neutral(key) is neutral and fixes.needs_allow(key) == allow


def test_the_first_fitting_neutral_fix_is_applied_and_data_changes_ranked_above_it_are_said():
    ranked = [_fix("seq_len_outlier"), _fix("micro_batch"), _fix("gradient_checkpointing"), _fix("stage", False)]
    made = object()
    p = fixes.pick(ranked, [], lambda f: made)
    assert p.fix["key"] == "micro_batch" and p.applied is made and p.first_ranked["key"] == "seq_len_outlier"
    assert [x["key"] for x in p.passed] == ["seq_len_outlier"] and "--heal-allow seq_len" in p.passed[0]["why"]


def test_an_oom_whose_only_fix_changes_the_data_stops_unless_allowed():
    ranked = [_fix("seq_len"), _fix("stage", False), _fix("world_size", False)]
    stopped = fixes.pick(ranked, [], lambda f: object())
    assert stopped.fix is None and "'the seq_len fix'" in stopped.stop_reason
    assert "--heal-allow seq_len" in stopped.stop_reason
    allowed = fixes.pick(ranked, ["seq_len"], lambda f: object())
    assert allowed.fix["key"] == "seq_len"


def test_a_fix_the_launch_cannot_take_or_already_took_is_passed_over():
    ranked = [_fix("micro_batch", change={"micro_batch": 2}), _fix("gradient_checkpointing")]
    p = fixes.pick(ranked, [], lambda f: "not in a file" if f["key"] == "gradient_checkpointing" else object(),
                   in_force=[{"key": "micro_batch", "change": {"micro_batch": 2}}])
    assert p.fix is None
    assert [x["why"] for x in p.passed] == ["an earlier attempt applied it already",
                                            "cannot apply it to this launch: not in a file"]


def test_more_gpus_is_never_applied_and_no_fit_known_walks_cheapest_first():
    assert "same machines" in fixes.blocked("world_size")
    unknown = [_fix("offload_param", None), _fix("micro_batch", None)]
    assert fixes.pick(unknown, [], lambda f: object()).fix["key"] == "micro_batch"


# -- the no-loop rule and the back-off ----------------------------------------------------------------------------

def test_the_same_failure_at_the_same_step_with_the_same_fixes_ends_the_healing():
    crash = {"kind": "crash", "class": "killed", "step": 3}
    attempts = [{"attempt": 1, "failure": crash, "in_force": []}, {"attempt": 2, "failure": crash, "in_force": []}]
    why = record.repeated(attempts, crash)
    assert "attempt 1 and attempt 2" in why and "step 3" in why and "no fix" in why
    # after a fix, the same failure is a new situation (the next fix may help); at another step, progress
    attempts[1]["in_force"] = [{"key": "micro_batch", "change": {"micro_batch": 2}}]
    assert record.repeated(attempts, crash) is None
    attempts[1]["in_force"] = []
    assert record.repeated(attempts, dict(crash, step=5)) is None


def test_backoff_doubles_and_is_capped():
    assert [record.backoff(10, n) for n in (1, 2, 3)] == [10, 20, 40]
    assert record.backoff(10, 30) == 300


@pytest.mark.parametrize("text, spec", [("64", (64, 1)), ("64@3", (64, 3)), (" 8 @ 2 ", (8, 2)), ("", None),
                                        ("x", None), ("0", None), ("-1@2", None)])
def test_the_injected_oom_spec(text, spec):
    assert inject.parse(text) == spec


def test_a_restart_with_no_checkpoint_after_trained_steps_is_not_called_healed():
    """The outcome of a heal run that finished after restarts: a restart that had nothing to resume from after the
    failed attempt trained lost those steps (restarted from scratch); one whose failure came before any step lost
    nothing (healed); one that resumed is healed."""
    from zeropilot.heal.loop import finished_outcome

    none = {"wanted_step": None, "loaded_step": None, "first_step": 1, "really": None,
            "note": "no complete checkpoint to resume from: the attempt started from step 0"}
    first = {"attempt": 1, "resumed": None}
    status, why = finished_outcome([first, {"attempt": 2, "resumed": none, "steps_redone": 7}])
    assert status == "restarted_from_scratch" and "attempt 2 started from step 0" in why and "7 step(s)" in why
    assert finished_outcome([first, {"attempt": 2, "resumed": none, "steps_redone": 0}])[0] == "healed"
    assert finished_outcome([first, {"attempt": 2, "resumed": none, "steps_redone": None}])[0] == "healed"
    resumed = {"wanted_step": 4, "loaded_step": 4, "first_step": 5, "really": True, "note": "resumed at step 4"}
    assert finished_outcome([first, {"attempt": 2, "resumed": resumed, "steps_redone": 2}]) == \
        ("healed", "finished in attempt 2 after 1 restart(s)")
    cold = dict(resumed, really=False, note="did NOT resume: the script never called load_checkpoint")
    assert finished_outcome([first, {"attempt": 2, "resumed": cold, "steps_redone": 2}])[0] == "restarted_from_scratch"
