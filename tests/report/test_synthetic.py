"""`zeropilot report` on synthetic run directories written with the real EventWriter.

They carry what CPU runs cannot (GPU memory fields, a classified OOM, a watchdog verdict); the
verdicts and figures asserted here follow from what synth.py wrote, step by step.
"""

from __future__ import annotations

import json

from tests.report.synth import GiB, Spec, write_run
from zeropilot.cli import main
from zeropilot.runlog import read_run, summarize
from zeropilot.runlog.summary import compare


def _json(capsys, *argv):
    assert main(["report", *map(str, argv), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_healthy_run_reports_peaks_against_the_plan_and_each_save(capsys, synth_dirs, validate):
    rep = _json(capsys, synth_dirs["ok"])
    assert validate(rep) == []
    assert rep["verdict"] == {"kind": "ok", "ranks": [], "where": [], "reason": "every rank finished"}
    assert rep["steps"] == 40 and rep["step_seconds"]["count"] == 80
    assert rep["step_seconds"]["first"] > 3 > rep["step_seconds"]["median"]  # the warm-up step stands apart
    r0 = rep["ranks"][0]
    # the peak counter's highest value (53 GiB) first shows at step 21: the first step after the save at 20
    assert r0["peak_reserved_bytes"] == 53 * GiB and r0["peak_reserved_at"]["event"] == "step"
    assert r0["peak_reserved_at"]["step"] == 21 and r0["plan_bytes"] == 48 * GiB
    # against the plan goes what it predicts: the reserved peak plus memory outside PyTorch (1.3 GiB on rank 0)
    assert r0["peak_device_bytes"] == 53 * GiB + int(1.3 * GiB)
    assert abs(r0["plan_ratio"] - r0["peak_device_bytes"] / (48 * GiB)) < 1e-12 and r0["device"]["name"] == "NVIDIA H200"
    saves = [s for s in rep["saves"] if s["rank"] == 0]
    assert [s["step"] for s in saves] == [20, 40]
    assert saves[0]["bytes"] == 7_600_000_000 and saves[0]["seconds"] == 8.0
    assert [p["name"] for p in saves[0]["phases"]] == ["gather_16bit", "model_states", "optimizer_states", "write"]
    assert saves[0]["start_t"] == saves[0]["t"] - 8.0
    assert saves[0]["mem_peak"]["allocated_bytes"] > saves[0]["mem_before"]["allocated_bytes"]
    assert saves[0]["first_step_after"]["step"] == 21
    assert saves[0]["first_step_after"]["window_peak_reserved_bytes"] == 53 * GiB
    assert rep["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert rep["versions"]["deepspeed"] == "0.19.8"


def test_text_shows_verdict_steps_peaks_saves_and_environment(capsys, synth_dirs):
    assert main(["report", str(synth_dirs["ok"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: OK: every rank finished\n")
    assert "steps: 40, step time median 0.50" in out
    assert "\n   0      40      53.00 GiB  step 21" in out and "48.00 GiB     113%" in out
    assert "save at step 20 (2 ranks): 15.20 GB in all, 8.00 s (slowest: rank 0) [global_step20]" in out
    assert "phases: gather_16bit 1.500 s, model_states 2.000 s, optimizer_states 4.000 s, write 0.500 s" in out
    assert "memory before 37.50 GiB, at peak 49.00 GiB, after 49.00 GiB (rank 0, the highest)" in out
    assert "the first step after it (step 21) set a new peak: 53.00 GiB on rank 1" in out
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out


def test_oom_verdict_names_the_rank_its_class_and_ranked_fixes(capsys, synth_dirs, validate):
    rep = _json(capsys, synth_dirs["oom"])
    assert validate(rep) == []
    v = rep["verdict"]
    assert (v["kind"], v["ranks"], v["class"], v["first_rank"]) == ("oom", [1], "save_spike", 1)
    assert v["where"][-1] == "torch/autograd/graph.py:829 in _engine_run_backward"
    (oom,) = rep["ooms"]
    assert oom["step"] == 21 and oom["phase"] == "backward" and oom["request_bytes"] == 2 * GiB
    assert [f["expected_bytes"] for f in oom["fixes"]] == [14 * GiB, 2 * GiB]
    assert rep["ranks"][1]["ended"] is False and rep["ranks"][0]["ended"] is True
    assert main(["report", str(synth_dirs["oom"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: OOM (rank 1): the save's gathered 16-bit weights stayed reserved")
    assert "OOM on rank 1 at step 21 (backward), asked for 2.00 GiB: save_spike" in out
    assert "    1. stage3_gather_16bit_weights_on_model_save: false (saves about 14.00 GiB)" in out
    assert "just before: first step after the save at step 20" in out


def test_hang_verdict_wins_and_shows_the_stuck_ranks_stack(capsys, synth_dirs, validate):
    rep = _json(capsys, synth_dirs["hang"])
    assert validate(rep) == []
    assert rep["verdict"]["kind"] == "hang" and rep["verdict"]["ranks"] == [2]
    assert rep["verdict"]["cause"] == "a save called on one rank only"
    assert [s["rank"] for s in rep["hang_stacks"]] == [0, 1, 2]
    assert "save_checkpoint" in rep["hang_stacks"][2]["text"]
    (fix,) = rep["hang"]["verdict"]["fixes"]
    assert {k: fix[k] for k in ("fix", "why", "expected_bytes")} == {
        "fix": "call save_checkpoint on every rank", "why": "it is a collective", "expected_bytes": None}
    assert fix["change"] == {} and fix["ranked"] is None and fix["predicted_peak_bytes"] is None
    assert main(["report", str(synth_dirs["hang"])]) == 0
    out = capsys.readouterr().out
    assert "rank 2: phase save:write at step 19, in save_checkpoint (engine.py:3300) <- stuck" in out
    assert "flight recorder: process group 0: ranks 0-1 wait in all_reduce #41; rank 2 never called it" in out
    assert rep["hang"]["flight_recorder_summary"]["desync"] == 41 and rep["hang"]["ranks"][0]["alive"] is True
    assert 'rank 2 stack: File "deepspeed/runtime/engine.py", line 3300 in save_checkpoint' in out


def test_verdict_order_hang_then_oom_then_crash(tmp_path):
    """A run with both an OOM and a watchdog verdict is a hang (docs/run-dir.md's order)."""
    d = write_run(tmp_path / "both", Spec(ranks=3, hang_rank=2, oom_rank=0, save_every=5))
    rep = summarize(read_run(d))
    assert rep["verdict"]["kind"] == "hang" and rep["ooms"][0]["rank"] == 0
    (d / "hang.json").unlink()
    assert summarize(read_run(d))["verdict"]["kind"] == "oom"


def test_compare_puts_peaks_step_time_and_save_cost_side_by_side(capsys, synth_dirs, tmp_path, validate):
    after = write_run(tmp_path / "after", Spec(save_every=0, plan_bytes=None))
    cmp = _json(capsys, synth_dirs["ok"], "--compare", after)
    assert validate(cmp) == [] and cmp["schema"] == "zeropilot.report-compare/1"
    m = {x["metric"]: x for x in cmp["metrics"]}
    assert m["peak_reserved_bytes"]["a"] == 53 * GiB and m["peak_reserved_bytes"]["b"] < 53 * GiB
    assert m["save_seconds_median"]["a"] == 8.0 and m["save_seconds_median"]["b"] is None
    assert [r["rank"] for r in cmp["ranks"]] == [0, 1]
    assert cmp.pop("tool")["name"] == "zeropilot" and compare(cmp["a"], cmp["b"]) == cmp  # the envelope's block
    assert main(["report", str(synth_dirs["ok"]), "--compare", str(after)]) == 0
    out = capsys.readouterr().out
    assert "peak reserved" in out and "save time median" in out and "8.000 s" in out


def test_a_long_run_lists_its_first_and_last_saves(capsys, tmp_path):
    d = write_run(tmp_path / "long", Spec(ranks=1, steps=300, save_every=10))
    assert main(["report", str(d)]) == 0
    out = capsys.readouterr().out
    shown = [ln.split()[3] for ln in out.splitlines() if ln.startswith("save at step")]
    assert shown == ["10", "20", "30", "40", "50", "60", "250", "260", "270", "280", "290", "300"]
    assert "... 18 more saves (all in --format json or html)" in out


def test_out_writes_the_file_atomically_and_a_bad_folder_is_exit_2(capsys, synth_dirs, tmp_path):
    out = tmp_path / "r.json"
    assert main(["report", str(synth_dirs["ok"]), "--format", "json", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["verdict"]["kind"] == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left
    assert main(["report", str(synth_dirs["ok"]), "--out", str(tmp_path / "no" / "r.txt")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2


def test_a_run_without_an_end_is_running(tmp_path):
    """run.json without `ended_at` and `exit_code`: the run goes on, or its supervisor was killed."""
    d = write_run(tmp_path / "live", Spec(ranks=2, steps=5, save_every=0))
    run = json.loads((d / "run.json").read_text())
    del run["ended_at"], run["exit_code"]
    (d / "run.json").write_text(json.dumps(run))
    for rank in (0, 1):  # the ranks have not ended either
        lines = (d / f"rank-{rank}.jsonl").read_text().splitlines()
        (d / f"rank-{rank}.jsonl").write_text("\n".join(ln for ln in lines if '"end"' not in ln) + "\n")
    assert summarize(read_run(d))["verdict"]["kind"] == "running"


def test_many_ranks_draw_a_band_a_bar_per_rank_the_outliers_and_sixteen_rank_charts(tmp_path):
    """Past 16 ranks the overview is the band from the lowest to the highest rank with the outliers' own lines, and
    a bar per rank (every rank is in the page); the OOM's rank is named and drawn."""
    import re

    d = write_run(tmp_path / "wide", Spec(ranks=40, steps=30, save_every=10, oom_rank=33))
    out = tmp_path / "wide.html"
    assert main(["report", str(d), "--format", "html", "--out", str(out)]) == 0  # the page is written
    page = out.read_text()
    overview = page[page.index('<svg id="overview"'):]
    overview = overview[:overview.index("</svg>")]
    assert '<polygon class="band"' in overview and "of 40 ranks" in overview
    assert "33" in re.findall(r'data-rank="(\d+)"', overview)  # the OOM's rank, on its own line
    bars = page[page.index('<svg id="ranks-memory"'):]
    bars = bars[:bars.index("</svg>")]
    assert sorted(map(int, re.findall(r'class="rbar[^"]*"[^>]*data-rank="(\d+)"', bars))) == list(range(40))
    assert "rank 33: out of memory" in bars
    charts = sorted(map(int, re.findall(r'<svg id="mem-rank-(\d+)"', page)))
    assert len(charts) == 16 and {0, 33, 39} <= set(charts)  # the first, the OOM's, the last


def test_a_killed_rank_is_named_when_the_launcher_ended_its_peer_before_it_noticed(tmp_path):
    """The race of the real killed-rank job, made deterministic: rank 1 is SIGKILLed, torchrun SIGTERMs rank 0
    (its faulthandler dump, not asked for by the watchdog) before rank 0 records the peer's failure. Rank 0's
    records may even end later or earlier than rank 1's: the terminated rank is a consequence, never the cause."""
    d = write_run(tmp_path / "killed", Spec(ranks=2, steps=5, save_every=0))
    run = json.loads((d / "run.json").read_text())
    run["exit_code"] = 1
    (d / "run.json").write_text(json.dumps(run))
    for rank in (0, 1):
        lines = (d / f"rank-{rank}.jsonl").read_text().splitlines()
        keep = [ln for ln in lines if '"end"' not in ln]
        (d / f"rank-{rank}.jsonl").write_text("\n".join(keep[:-2] if rank == 0 else keep) + "\n")
    (d / "stacks-rank-0.txt").write_text('Fatal Python error: Terminated\n\nCurrent thread 0x1 (most recent call first):\n'
                                          '  File "train.py", line 9 in <module>\n')
    v = summarize(read_run(d))["verdict"]
    assert v["kind"] == "crash" and v["ranks"] == [1], v
    assert v["reason"].startswith("exit status 1; rank 1 stopped recording without an error"), v
