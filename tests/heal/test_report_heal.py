"""``heal.json`` in the report: a heal run's timeline first, and a hostile heal record keeps the report's shape.

The run directories are the report tests' synthetic ones (``tests/report/synth.py``); the real heal runs' reports
are checked in ``test_heal_runs.py`` and ``test_heal_preempt.py``.
"""

from __future__ import annotations

import json

from tests.report.conftest import validate  # noqa: F401 - the report schema's validator, a fixture
from tests.report.synth import Spec, write_run
from zeropilot.cli import main

EVIL = "<script>x</script>\x1b[2J\x07"


def _attempt(n, **extra):
    base = {"attempt": n, "dir": "." if n == 1 else f"attempt-{n}", "command": ["torchrun", "train.py"],
            "env": {}, "started_at": 1.0, "ended_at": 2.0, "exit_code": 0, "failure": None}
    base.update(extra)
    return base


GOOD = {"schema": "zeropilot.heal/1", "command": ["torchrun", "train.py"], "restarts": 3, "allow": [], "backoff_s": 10,
        "attempts": [
            _attempt(1, exit_code=1, failure={"kind": "crash", "class": "killed", "step": 3, "ranks": [1],
                                              "reason": "rank 1 stopped", "restart": True, "why": "killed"}),
            _attempt(2, resume={"chosen": {"path": "/o/checkpoint-2", "tag": "checkpoint-2", "step": 2,
                                           "framework": "hf", "world_size": 2, "universal": False, "why_not": None},
                                "skipped": [{"path": "/o/checkpoint-3", "tag": "checkpoint-3", "step": 3,
                                             "why_not": "incomplete: missing"}], "folders": ["/o"], "give": "/o",
                                "how": "the guard passes it"},
                     resumed={"wanted_step": 2, "loaded_step": 2, "first_step": 3, "given_by": "zeropilot",
                              "really": True, "note": "resumed at step 2"},
                     failure={"kind": "ok", "class": None, "step": 6, "ranks": [], "reason": "", "restart": False,
                              "why": "every rank finished"}, steps_redone=1, backoff_s=10,
                     fix={"key": "micro_batch", "fix": "micro batch 2", "change": {"micro_batch": 2},
                          "settings": ["per_device_train_batch_size: 4 -> 2 (flag)"], "files": [], "diff": "-a\n+b\n",
                          "passed": [{"fix": "cap", "key": "seq_len", "why": "changes the data"}]})],
        "outcome": {"status": "healed", "why": "finished in attempt 2 after 1 restart(s)", "exit_code": 0}}


def test_the_report_of_a_heal_run_opens_with_its_attempts(tmp_path, capsys, validate):
    d = write_run(tmp_path / "run", Spec(ranks=2, steps=3))
    (d / "heal.json").write_text(json.dumps(GOOD))
    assert main(["report", str(d)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("heal: HEALED: finished in attempt 2 after 1 restart(s)\n"
                           "  attempt 1 (.): CRASH (killed) after step 3: rank 1 stopped\n")
    assert "    fix applied: micro batch 2 (per_device_train_batch_size: 4 -> 2 (flag))\n" in text
    assert ("    resumed from /o/checkpoint-2 (step 2), 1 step(s) redone; resumed at step 2\n"
            "    skipped /o/checkpoint-3 (checkpoint-3): incomplete: missing\n") in text
    assert main(["report", str(d), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert validate(doc) == [] and doc["heal"]["attempts"][1]["fix"]["passed"][0]["key"] == "seq_len"


def test_a_hostile_heal_record_keeps_the_shape_and_the_terminal_clean(tmp_path, capsys, validate):
    d = write_run(tmp_path / "run", Spec(ranks=1, steps=2))
    evil = dict(GOOD, outcome={"status": EVIL, "why": ["x"], "exit_code": "0", "passed": [EVIL, {"fix": 3}]},
                attempts=[_attempt(1, failure={"kind": EVIL, "step": "3", "ranks": ["a", 1]}, dir=None,
                                   fix={"files": [EVIL, {"copy": EVIL}], "settings": EVIL, "diff": 5},
                                   resume={"chosen": [1], "skipped": {"a": 1}}, resumed="yes", steps_redone=-1.5),
                          "not an attempt", 7] + [_attempt(2)] * 100)
    (d / "heal.json").write_text(json.dumps(evil))
    assert main(["report", str(d), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert validate(doc) == [] and len(doc["heal"]["attempts"]) == 64
    assert main(["report", str(d)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text and "?[2J" in text
    (d / "heal.json").write_text("[1, 2")
    assert main(["report", str(d), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["heal"] is None and any("heal.json" in p for p in doc["problems"])
