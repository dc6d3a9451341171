"""Faults under ``zeropilot run`` (CPU, gloo, 2 ranks, unmodified scripts): a rank killed in a save, hangs.

The jobs are in ``tests/runjobs.py``; each is run once per session.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import runjobs
from zeropilot.runlog.crash import first_failure, terminated_ranks
from zeropilot.runlog import read_run, summarize

pytestmark = [pytest.mark.slow]


def _records(job, rank):
    path = job.run_dir / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _hang(job):
    return json.loads((job.run_dir / "hang.json").read_text())


def test_rank_killed_during_save_is_named_and_checkpoint_is_incomplete():
    job = runjobs.killed_in_save()
    assert job.returncode != 0
    # rank 1 died inside the save: its last heartbeat says so, it wrote neither an error nor an end
    beat = json.loads((job.run_dir / "heartbeat-rank-1.json").read_text())
    assert beat["phase"].startswith("save")
    kinds1 = [r["event"] for r in _records(job, 1)]
    assert "end" not in kinds1 and "error" not in kinds1
    # rank 0 either noticed the dead peer (an error marked as a consequence) or was ended by the launcher's
    # SIGTERM first (faulthandler dumped its stacks): a race between gloo and torchrun, both are consequences
    errors0 = [r for r in _records(job, 0) if r["event"] == "error"]
    assert all(e["peer_failure"] for e in errors0)
    stacks = {r: (job.run_dir / f"stacks-rank-{r}.txt").read_text() for r in (0, 1)
              if (job.run_dir / f"stacks-rank-{r}.txt").exists()}
    terminated = terminated_ranks(stacks)
    assert errors0 or terminated == [0]
    records = read_run(job.run_dir)
    verdict = summarize(records)["verdict"]
    assert verdict["kind"] == "crash" and verdict["ranks"] == [1], verdict
    last_t = {r: max([e["t"] for e in rec.events] + list(rec.steps["t"])) for r, rec in records.ranks.items()}
    rank, why = first_failure({r: rec.events for r, rec in records.ranks.items()}, last_t, terminated)
    assert rank == 1 and "killed" in why
    inspect = subprocess.run([sys.executable, "-m", "zeropilot", "ckpt", "inspect", str(job.ckpt_dir)],
                             capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 1, inspect.stderr
    assert "DAMAGED" in inspect.stdout and "zero_pp_rank_1_mp_rank_00_optim_states.pt" in inspect.stdout


@pytest.mark.parametrize("make, odd, phase_of_odd, others_wait", [
    (runjobs.hang_save_rank0_only, 0, "save", "reduce_scatter_tensor"),
    (runjobs.hang_sleep_rank1, 1, "idle", "barrier"),
], ids=["save_on_rank0_only", "rank1_sleeps"])
def test_watchdog_names_the_odd_rank_with_stacks_and_stops(make, odd, phase_of_odd, others_wait):
    job = make()
    hang = _hang(job)
    assert hang["action"] == "stop" and hang["timeout_s"] == 10
    assert hang["verdict"]["ranks"] == [odd]
    by_rank = {r["rank"]: r for r in hang["ranks"]}
    assert by_rank[odd]["phase"] == phase_of_odd and by_rank[odd]["step"] == 2
    other = 1 - odd
    assert f"rank {other}" in hang["verdict"]["reason"] and others_wait in hang["verdict"]["reason"]
    assert (job.run_dir / by_rank[odd]["stack_file"]).read_text().count("File ") > 3
    assert any("ds_faults.py" in w for w in hang["verdict"]["where"]) or hang["verdict"]["where"]
    # --on-hang stop ended the job: the run has an end, no rank finished, the report says hang
    run = json.loads((job.run_dir / "run.json").read_text())
    assert run["stopped_on_hang"] is True and run["exit_code"] != 0
    assert summarize(read_run(job.run_dir))["verdict"]["kind"] == "hang"
    # within its limit: the watchdog fired at most a few seconds after the timeout since the last progress
    beats = [json.loads((job.run_dir / f"heartbeat-rank-{r}.json").read_text()) for r in (0, 1)]
    assert hang["t"] - max(b["t"] for b in beats) < 10 + 10


def test_save_on_rank0_only_cause_names_the_save():
    hang = _hang(runjobs.hang_save_rank0_only())
    assert "save" in hang["verdict"]["cause"] and "every rank" in hang["verdict"]["cause"]
    assert any(w.startswith("save_checkpoint") for w in hang["verdict"]["where"])


def test_stale_build_lock_before_the_first_step():
    job = runjobs.hang_stale_lock()
    hang = _hang(job)
    assert hang["verdict"]["ranks"] == [0, 1]
    assert "lock" in hang["verdict"]["cause"]
    assert [lock["path"].endswith("deepspeed_shm_comm/lock") for lock in hang["locks"]] == [True]
    assert all(r["phase"] == "startup" for r in hang["ranks"])
    assert "file_baton" in (job.run_dir / "stacks-rank-0.txt").read_text()
    assert hang["verdict"]["class"] == "stale_lock" and hang["locks"][0]["ours"] is False
    # the stop removes nothing that was not this job's: the lock was there before it
    run = json.loads((job.run_dir / "run.json").read_text())
    assert run["locks_removed"] == [] and (hang["locks"][0]["path"] and __import__("os").path.exists(hang["locks"][0]["path"]))


@pytest.mark.parametrize("make, cls, culprits, words", [
    (runjobs.hang_data_stall_rank1, "data_loading", [1], ["__getitem__ (", "ds_faults.py", "rank(s) 0 wait in"]),
    (runjobs.hang_storage_stall_rank1, "slow_storage", [1], ["writing the checkpoint", "rank(s) 0 wait"]),
    (runjobs.hang_sleep_rank1, "straggler", [1], ["outside any collective", "ds_faults.py", "rank(s) 0 wait in barrier"]),
    (runjobs.hang_save_rank0_only, "save_partial", [0], ["save", "every rank"]),
    (runjobs.hang_mismatch, "collective_mismatch", [0, 1], ["all_reduce on rank 0", "barrier on rank 1"]),
], ids=["data_loading", "slow_storage", "straggler", "save_partial", "collective_mismatch"])
def test_each_hang_class_with_its_cause_and_culprit_on_real_ranks(make, cls, culprits, words):
    job = make()
    v = _hang(job)["verdict"]
    assert (v["class"], v["ranks"]) == (cls, culprits), v
    text = v["cause"] + " " + v["reason"]
    assert all(w in text for w in words), text
    assert job.returncode != 0 and json.loads((job.run_dir / "run.json").read_text())["stopped_on_hang"]


def test_the_collective_mismatch_is_read_from_the_gloo_flight_recorder():
    hang = _hang(runjobs.hang_mismatch())
    assert sorted(hang["flight_recorder"]) == ["fr-trace-rank-0", "fr-trace-rank-1"]
    desync = hang["flight_recorder_summary"]["desync"]
    assert desync is not None and "allreduce" in " ".join(desync["ops"].values()).replace("_", "")
