"""Stragglers named from what is a rank's own, on real 2-rank CPU jobs (gloo) under ``zeropilot run``.

- HF Trainer + ZeRO-2 (``tests.runjobs.hf_slow_loader``): rank 1's dataset takes 0.4 s more per batch. The Trainer
  gathers each batch's token count across ranks before the forward (``num_items_in_batch``), so both ranks spend
  the same time before the forward: the phase times cannot tell, the DataLoader's time (``data_seconds``) does.
- A raw DeepSpeed ZeRO-3 loop (``tests.runjobs.learned_timeouts``, shared with the learned-timeout tests): rank 1
  loads its batches in 1.1 s, rank 0 in 0.5 s; the second run's rank 1 then hangs in its forward at step 9, and the
  watchdog's cause names the straggler of the steps before the stall.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.runjobs import hf_slow_loader, learned_timeouts
from zeropilot.runlog import read_run, summarize
from zeropilot.runlog.layout import RunDir
from zeropilot.runlog.text import render

pytestmark = pytest.mark.slow


def _steps(run_dir, rank):
    lines = (run_dir / f"rank-{rank}.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "step"]


def test_the_trainers_gather_hides_the_slow_loader_from_the_phase_times_not_from_its_data_time():
    job = hf_slow_loader()
    assert job.returncode == 0, job.stderr[-3000:]
    steps = {r: _steps(job.run_dir, r)[1:] for r in (0, 1)}  # the first step holds the start-up
    idle = {r: statistics.median(s["phase_seconds"]["idle"] for s in steps[r]) for r in steps}
    data = {r: statistics.median(s["data_seconds"] for s in steps[r]) for r in steps}
    # both ranks wait the slow loader out before their forward (the Trainer's gather): the old evidence is blind
    assert idle[0] > 0.35 and idle[1] > 0.35 and abs(idle[0] - idle[1]) < 0.1, idle
    assert data[1] > 0.39 and data[0] < 0.05, data  # each rank's own DataLoader time
    assert not any("gpu_probe_seconds" in s for r in steps for s in steps[r])  # the GPU probe is off on a CPU


def test_the_report_names_the_slow_loader_by_its_data_time():
    job = hf_slow_loader()
    summary = summarize(read_run(job.run_dir))
    [s] = summary["stragglers"]
    assert s["rank"] == 1 and s["evidence"] == "data" and s["phase"] == "idle" and s["steps"] >= 5, s
    assert 0.35 < s["excess_seconds"] < 0.5 and summary["gpu_stragglers"] == []
    line = next(ln for ln in render(summary).splitlines() if ln.startswith("straggler: "))
    assert "rank 1" in line and "its DataLoader takes" in line, line


def test_top_and_the_trackers_name_it_while_the_job_runs():
    pytest.importorskip("tensorboard")
    from tests.guard.test_metrics import _scalars

    job = hf_slow_loader()
    top = subprocess.run([sys.executable, "-m", "zeropilot", "top", str(job.run_dir), "--once", "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(top.stdout)
    assert [(x["rank"], x["evidence"]) for x in doc["stragglers"]] == [(1, "data")], top.stderr[-2000:]
    tb = _scalars(job.ckpt_dir / "runs")
    named = tb["train/zeropilot/straggler_rank"]
    assert named and set(named.values()) == {1.0}, named  # logged by rank 0's Trainer once 5 slow steps were seen
    assert max(tb["train/zeropilot/data_seconds"].values()) > 0.39  # the max over ranks: rank 1's loader


def test_a_raw_loop_names_its_slow_loader_by_its_data_time():
    first, _ = learned_timeouts()
    [s] = summarize(read_run(first.run_dir))["stragglers"]
    assert s["rank"] == 1 and s["evidence"] == "data" and 1.6 < s["ratio"] < 2.8, s
    data = {r: statistics.median(x["data_seconds"] for x in _steps(first.run_dir, r)) for r in (0, 1)}
    assert 0.45 < data[0] < 0.7 and 1.05 < data[1] < 1.4, data


def test_a_hang_after_straggling_names_the_straggler_in_its_cause():
    _, second = learned_timeouts()
    hang = json.loads(RunDir(second.run_dir).hang_file.read_text())
    v = hang["verdict"]
    assert [s["rank"] for s in v["stragglers_before"]] == [1] and v["stragglers_before"][0]["evidence"] == "data"
    assert "Before the stall, rank 1" in v["cause"] and "its DataLoader takes" in v["cause"], v["cause"]
    assert "its DataLoader takes" in render(summarize(read_run(second.run_dir)))
