"""``zeropilot run --heal``'s options and run directories as input: one clear line and exit 2, never a traceback."""

from __future__ import annotations

import json
import os

import pytest

from tests.heal.test_report_heal import GOOD
from tests.report.synth import Spec, write_run
from tests.zp import run_zeropilot

CMD = ["torchrun", "train.py"]


@pytest.mark.parametrize("flags, words", [
    (["--heal", "--heal-allow", "lora_rank"], "--heal-allow 'lora_rank': not a kind of change zeropilot knows"),
    (["--restarts", "2"], "--restarts, --heal-allow and --heal-backoff go with --heal"),
    (["--heal", "--restarts", "-1"], "must be 0 or more"),
    (["--preempt-grace", "-5"], "must be 0 or more"),
])
def test_bad_heal_options(tmp_path, flags, words):
    r = run_zeropilot(["run", "--out", str(tmp_path / "r"), *flags, "--", *CMD])
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _heal_dir(tmp_path, doc):
    d = write_run(tmp_path / "run", Spec(ranks=1, steps=2))
    run = json.loads((d / "run.json").read_text())
    run["command"] = CMD
    (d / "run.json").write_text(json.dumps(run))
    if doc is not None:
        (d / "heal.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("doc, cmd, words", [
    (dict(GOOD, command=CMD), CMD, "this run already finished (healed): nothing to heal"),
    (dict(GOOD, command=CMD), ["torchrun", "other.py"], "this run directory heals another command"),
    (None, ["torchrun", "other.py"], "this run directory holds a run of another command"),
    ({"schema": "zeropilot.heal/9"}, CMD, "not a heal record (schema zeropilot.heal/1 with attempts expected)"),
    (dict(GOOD, command=CMD, attempts=[dict(GOOD["attempts"][0], dir="/etc")], outcome={"status": "stopped"}), CMD,
     "not a heal record: attempt 1 is not attempt 1 of this directory"),
    (dict(GOOD, command=CMD, attempts=[GOOD["attempts"][0], dict(GOOD["attempts"][1], dir="../elsewhere")]), CMD,
     "not a heal record: attempt 2 is not attempt 2 of this directory"),
])
def test_going_on_with_a_run_directory_that_is_not_this_launch_s(tmp_path, doc, cmd, words):
    """A heal record is never followed outside its directory, and the command run is the one given (the fixes in
    force are made again on it), never one read from the directory."""
    d = _heal_dir(tmp_path, doc)
    r = run_zeropilot(["run", "--heal", "--out", str(d), "--", *cmd])
    assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_fifo_as_heal_record_is_refused_without_hanging(tmp_path):
    d = _heal_dir(tmp_path, None)
    os.mkfifo(d / "heal.json")
    r = run_zeropilot(["run", "--heal", "--out", str(d), "--", *CMD], timeout=60)
    assert r.returncode == 2 and "heal.json" in r.stderr and "Traceback" not in r.stderr, r.stderr
