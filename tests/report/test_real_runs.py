"""`zeropilot report` on real run directories written by `zeropilot run` (CPU, gloo, 2 ranks).

The jobs come from ``tests/runjobs.py`` (run once per session, shared with the guard tests): an HF
Trainer job and a raw DeepSpeed job that save twice, a rank SIGKILLed in a save, and a save called
on rank 0 only (a hang the watchdog stops). Text and JSON content are asserted, the JSON validated
against docs/report.schema.json, and the pages opened in Chromium.
"""

from __future__ import annotations

import json

import pytest

from tests import runjobs
from tests.report.test_html_browser import _open, _page, chromium_browser  # noqa: F401 (fixture)
from zeropilot.cli import main



def _report(capsys, run_dir, fmt="json", *extra):
    assert main(["report", str(run_dir), "--format", fmt, *map(str, extra)]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else out


@pytest.mark.slow
@pytest.mark.parametrize("make,steps,saved_at", [(runjobs.hf_trainer, 8, [4, 8]), (runjobs.raw_deepspeed, 6, [3, 6])],
                         ids=["hf_trainer", "raw_deepspeed"])
def test_healthy_real_runs(capsys, validate, make, steps, saved_at):
    job = make()
    assert job.returncode == 0, job.stderr[-2000:]
    rep = _report(capsys, job.run_dir)
    assert validate(rep) == []
    assert rep["verdict"]["kind"] == "ok" and rep["steps"] == steps and rep["exit_code"] == 0
    assert [r["rank"] for r in rep["ranks"]] == [0, 1] and all(r["ended"] for r in rep["ranks"])
    for r in rep["ranks"]:  # a CPU run: no device memory, the host's RSS instead
        assert r["peak_reserved_bytes"] is None and r["host_rss_peak_bytes"] > 50 << 20
        assert r["device"]["backend"] == "cpu" and r["step_records"] == steps
    assert sorted({s["step"] for s in rep["saves"]}) == saved_at
    for s in rep["saves"]:
        assert s["bytes"] > 0 and s["seconds"] > 0 and s["phases"] and s["error"] is None
        assert s["mem_before"]["host_rss_bytes"] > 0 and s["mem_after"]["host_rss_bytes"] > 0
    # the first step has no previous step's end to count from: its seconds are null
    assert rep["step_seconds"]["count"] == 2 * (steps - 1) and rep["step_seconds"]["median"] > 0
    text = _report(capsys, job.run_dir, "text")
    assert text.startswith("verdict: OK: every rank finished\n") and f"steps: {steps}, step time median" in text
    assert f"save at step {saved_at[0]} (2 ranks): " in text and "memory before " in text


@pytest.mark.slow
@pytest.mark.parametrize("make", [runjobs.hf_trainer, runjobs.raw_deepspeed], ids=["hf_trainer", "raw_deepspeed"])
def test_real_runs_split_the_step_into_phases_and_predict_it(capsys, validate, make):
    """The guard's phase times add up to each step; their medians to the median step; on the CPU the report says
    why nothing is predicted, and with speed figures passed in (this CPU's matmul rate, measured now, and the time
    model's stand-in: tests/report/timeparts.py) the prediction for the launch the setup record describes is there."""
    from tests.report import timeparts
    from zeropilot.runlog import read_run, summarize
    from zeropilot.runlog.read import OTHER_PHASES
    from zeropilot.runlog.text import render
    from zeropilot.runlog.timing import SPLIT, Predictor

    job = make()
    records = read_run(job.run_dir)
    for rec in records.ranks.values():  # every step after the first: its phases add up to its seconds
        cols = rec.steps
        for i in range(1, rec.n_steps):
            parts = sum(cols[c][i] for _, c in SPLIT) + cols["save_seconds"][i] + cols["load_seconds"][i] \
                + cols[OTHER_PHASES][i]
            assert parts == pytest.approx(cols["seconds"][i], abs=2e-3), (rec.rank, i)
    rep = _report(capsys, job.run_dir)
    assert validate(rep) == []
    m, t = rep["time"]["measured"], rep["time"]
    assert m["steps"] >= 6 and m["phase_steps"] == m["steps"] and m["left_out"]["save"] >= 2
    assert sum(m["phases"].values()) == pytest.approx(m["step_s"], rel=0.2)
    assert t["predicted"] is None and t["reason"].startswith("the run trained on the CPU")
    assert f"no prediction: {t['reason']}" in _report(capsys, job.run_dir, "text")
    rep = summarize(records, Predictor(speed=timeparts.cpu_speed(), estimate=timeparts.standin_estimate))
    assert validate(rep) == []
    p = rep["time"]["predicted"]
    assert p["card"] == "cpu" and p["estimated"] == [] and p["inputs"]["world_size"] == 2
    assert p["inputs"]["micro_batch"] == m["batch"]["micro_batch_size"] and p["inputs"]["seq_len"] == m["batch"]["seq_len"]
    assert rep["time"]["ratio"] == pytest.approx(m["step_s"] / p["step_s"])
    text = render(rep)
    assert f"predicted for {p['inputs']['config']}, {p['inputs']['seq_len']} tokens, on cpu (measured figures)" in text
    assert "note: the run trains in fp32: the time model counts bf16 matrix products" in text


@pytest.mark.slow
def test_killed_rank_is_named_not_the_rank_that_noticed(capsys, validate):
    job = runjobs.killed_in_save()
    rep = _report(capsys, job.run_dir)
    assert validate(rep) == []
    v = rep["verdict"]
    assert v["kind"] == "crash" and v["ranks"] == [1], v
    assert "rank 1 stopped recording without an error" in v["reason"], v
    # Rank 0 either notices the dead peer (gloo) before torchrun ends it, or is ended first: both name rank 1.
    assert "saw its peer fail" in v["reason"] or "exit status 1" in v["reason"], v
    assert not rep["ranks"][1]["ended"]


@pytest.mark.slow
def test_hang_shows_the_stuck_ranks_own_thread(capsys, validate):
    job = runjobs.hang_save_rank0_only()
    rep = _report(capsys, job.run_dir)
    assert validate(rep) == []
    assert rep["verdict"]["kind"] == "hang" and rep["verdict"]["ranks"] == [0]
    frames = {s["rank"]: s["main_frames"] for s in rep["hang_stacks"]}
    assert any("save_checkpoint" in f for f in frames[0]) and "barrier" in frames[0][0]
    text = _report(capsys, job.run_dir, "text")
    assert "rank 0: phase save" in text and "<- stuck" in text and "in barrier" in text


@pytest.mark.slow
def test_real_pages_in_chromium(chromium_browser, tmp_path, validate, capsys):  # noqa: F811
    ok, hang = runjobs.hf_trainer(), runjobs.hang_save_rank0_only()
    f = _open(chromium_browser, _page(tmp_path, ok.run_dir))
    # spans: the saves at steps 4 and 8 and the load of the best one (load_best_model_at_end), on each rank
    assert f["overview"] == ["0", "1"] and f["steps"] == ["0", "1"] and f["spans"] == 6
    assert [c[1] for c in f["memCharts"]] == [["host_rss_bytes"], ["host_rss_bytes"]]
    f = _open(chromium_browser, _page(tmp_path, hang.run_dir))
    assert "hang" in f["sections"] and ["0", True] in f["stacks"]
    cmp = _report(capsys, ok.run_dir, "json", "--compare", runjobs.raw_deepspeed().run_dir)
    assert validate(cmp) == [] and {m["metric"] for m in cmp["metrics"]} >= {"save_seconds_median", "steps"}


RUNS = runjobs.REPO / "bench" / "report" / "runs"


@pytest.mark.parametrize("name,kind,ranks", [("hf-trainer-cpu", "ok", []), ("killed-in-save-cpu", "crash", [1]),
                                             ("hang-save-rank0-cpu", "hang", [0])])
def test_committed_real_runs(capsys, validate, name, kind, ranks):
    """The real run directories kept under bench/report/runs (written by `zeropilot run`; bench/report/README.md)."""
    rep = _report(capsys, RUNS / name)
    assert validate(rep) == [] and rep["verdict"]["kind"] == kind and rep["verdict"]["ranks"] == ranks
    text = _report(capsys, RUNS / name, "text")
    assert text.startswith(f"verdict: {kind.upper()}") and "rank   steps   host RSS\n" in text
    assert "time per optimizer step" in text  # written before the guard recorded phase times: the step time only



GPU_RUNS = runjobs.REPO / "bench" / "guard" / "results" / "runs"


@pytest.mark.parametrize("name,kind,klass", [
    ("seed", "ok", None), ("oom-capacity", "oom", "capacity"), ("oom-fragmentation", "oom", "fragmentation"),
    ("oom-save-spike", "oom", "save_spike"), ("oom-outside-torch", "oom", "outside_torch"), ("hang-nccl", "hang", None)])
def test_real_h200_runs(capsys, validate, tmp_path, name, kind, klass):
    """Run directories `zeropilot run` wrote on 2 x H200 (bench/guard/gpu_bench.sh, committed by the guard's bench)."""
    rep = _report(capsys, GPU_RUNS / name)
    assert validate(rep) == [] and rep["verdict"]["kind"] == kind and rep["verdict"].get("class") == klass
    for r in rep["ranks"]:  # device memory is there, and the device peak is reserved + outside PyTorch
        assert r["device"]["backend"] == "cuda" and r["peak_reserved_bytes"] > 0
        assert r["peak_device_bytes"] == r["peak_reserved_bytes"] + r["outside_torch_bytes"]
    out = tmp_path / "page.html"
    assert main(["report", str(GPU_RUNS / name), "--format", "html", "--out", str(out)]) == 0
    page = out.read_text()
    assert ('<section id="oom">' in page) == (kind == "oom") and ('<section id="hang">' in page) == (kind == "hang")
