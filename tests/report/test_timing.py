"""The report's step time (``runlog.timing``): the measured split into the guard's phases, the plan's prediction
beside it, slower than predicted, a faster configuration that fits, and one line when nothing can be predicted.

Run directories written with the real writer (``runlog.EventWriter``) as the guard writes them; the prediction's
parts are passed in (``tests/report/timeparts.py``): the time model is a stand-in until it lands, the search for
configurations that fit is the real one. The real CPU runs are in ``test_real_runs.py``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.report import timeparts
from tests.report.synth import Spec, write_run
from zeropilot.cli import main
from zeropilot.runlog import EVENT_VERSION, EventWriter, RunDir, read_run, summarize
from zeropilot.runlog.report_html import render as render_html
from zeropilot.runlog.text import render
from zeropilot.runlog.timing import WARMUP_STEPS, Predictor

GiB = 1 << 30
T0 = 1_790_000_000.0
#: Qwen2.5-0.5B's sizes, as the guard records a model's config
QWEN_05B = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": False,
            "max_position_embeddings": 32768}
H100 = "NVIDIA H100 80GB HBM3"


def _phases(rank: int, step: int) -> dict:
    """Rank 3 loads its data slowly and the others wait for it in their backward: every step is 0.4 s."""
    wobble = 0.002 * ((step * 7 + rank) % 5)
    idle = (0.15 if rank == 3 else 0.02) + wobble
    return {"idle": idle, "forward": 0.06, "backward": 0.30 - idle + 0.02, "step": 0.02}


def _write_job(root: Path, ranks: int = 4, steps: int = 12, save_at: int = 6, gc: bool = True,
               device: str = H100, backend: str = "cuda") -> Path:
    """A ZeRO-2 job of Qwen2.5-0.5B's shape as the guard records it: micro batch 4 x 2 of 2048 tokens, a save after
    step ``save_at`` (held by the next step), phase times in every step."""
    d = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        t = T0
        mem = {"device_total_bytes": 80 * GiB, "outside_torch_bytes": int(1.3 * GiB), "reserved_bytes": 40 * GiB}
        with EventWriter(d.events(rank)) as w:
            w.write({"v": EVENT_VERSION, "event": "start", "t": t, "rank": rank, "world_size": ranks,
                     "device": {"name": device, "backend": backend, "total_bytes": 80 * GiB},
                     "framework": "deepspeed"})
            w.write({"v": EVENT_VERSION, "event": "setup", "t": t, "rank": rank,
                     "model": {"config": QWEN_05B, "attn": "sdpa", "dtype": "bfloat16", "gradient_checkpointing": gc},
                     "zero": {"stage": 2, "offload_optimizer": "none", "offload_param": "none"},
                     "train": {"micro_batch": 4, "grad_accum": 2, "world_size": ranks, "precision": "bf16"}})
            for step in range(1, steps + 1):
                phases = _phases(rank, step)
                if step == 1:
                    phases["init"] = 5.0
                if step == save_at + 1:
                    phases["save"] = 2.5
                secs = sum(phases.values())
                t += secs
                w.write({"v": EVENT_VERSION, "event": "step", "t": t, "rank": rank, "step": step,
                         "seconds": None if step == 1 else secs, "mem": mem, "phase_seconds": phases,
                         "batch": {"micro_batches": 2, "micro_batch_size": 4, "seq_len": 2048, "tokens": None}})
            w.write({"v": EVENT_VERSION, "event": "end", "t": t, "rank": rank, "steps": steps})
    return root


def _steady(ranks=range(4), steps=12, save_at=6):
    return [(r, s) for r in ranks for s in range(WARMUP_STEPS + 1, steps + 1) if s != save_at + 1]


def _gpu_predictor(**kw) -> Predictor:
    return Predictor(**{"speed": timeparts.speed(H100, 400e12), "estimate": timeparts.standin_estimate, **kw})


def test_measured_split_is_the_median_of_each_phase_over_the_steady_steps(tmp_path, validate):
    rep = summarize(read_run(_write_job(tmp_path / "run")))
    assert validate(rep) == []
    m = rep["time"]["measured"]
    steady = _steady()
    assert m["steps"] == m["phase_steps"] == len(steady) == 36
    assert m["left_out"] == {"warmup": 8, "save": 4, "load": 0, "other": 0, "unrecorded": 0}
    assert m["held"] == {"save": {"steps": 4, "median_s": pytest.approx(2.5)}}
    for phase in ("idle", "forward", "backward", "step"):
        want = statistics.median(_phases(r, s)[phase] for r, s in steady)
        assert m["phases"][phase] == pytest.approx(want, abs=1e-6)
    assert m["step_s"] == pytest.approx(statistics.median(sum(_phases(r, s).values()) for r, s in steady))
    assert sum(m["phases"].values()) == pytest.approx(m["step_s"], rel=0.02)
    # rank 3's own split differs from the job's (its data loading); the others' do not
    assert m["ranks_differ"] == [3]
    assert m["ranks"][3]["phases"]["idle"] == pytest.approx(statistics.median(
        _phases(3, s)["idle"] for r, s in steady if r == 3), abs=1e-6)
    assert m["batch"] == {"micro_batch_size": 4, "seq_len": 2048, "micro_batches": 2}
    assert m["tokens_per_step"] == 16384 and m["tokens_per_s"] == pytest.approx(16384 / m["step_s"])


def test_text_and_html_show_the_split_the_rank_that_differs_and_the_prediction(tmp_path, validate):
    records = read_run(_write_job(tmp_path / "run"))
    rep = summarize(records, _gpu_predictor())
    assert validate(rep) == []
    text = render(rep)
    assert ("time per optimizer step: median 0.400 s over 36 steady steps (left out: each rank's first 2, 4 holding "
            "a save)") in text
    assert "micro batch 4 x 2 of 2048 tokens (padded), 40,960 tokens/s per GPU" in text
    head = next(ln for ln in text.splitlines() if "measured" in ln and "predicted" in ln and "rank 3" in ln)
    assert head.split() == ["measured", "predicted", "rank", "3"]
    assert "  4 step(s) holding a save: 2.500 s of save each (median), left out above" in text
    pred = rep["time"]["predicted"]
    assert f"predicted for ZeRO-2 with checkpointing, micro batch 4 x 2, 2048 tokens, on {H100}" in text
    assert f"measured {rep['time']['ratio']:.2f}x the prediction" in text
    page = render_html(records, rep)
    section = page[page.index('<section id="time">'):]
    section = section[:section.index("</section>")]
    assert "<th>predicted</th><th>rank 3</th>" in section and "holding a save" in section
    assert f"measured {rep['time']['ratio']:.2f}×" in section and "<script" not in page
    assert pred["inputs"]["config"] in section


def test_slower_than_predicted_names_the_phase_and_a_faster_fitting_configuration(tmp_path, validate):
    rep = summarize(read_run(_write_job(tmp_path / "run")), _gpu_predictor())
    assert validate(rep) == []
    t = rep["time"]
    m, p = t["measured"], t["predicted"]
    want = timeparts.standin_estimate(_inputs(rep), timeparts.speed(H100, 400e12))
    assert p["step_s"] == pytest.approx(want.step_s) and p["card"] == H100
    assert sum(p["phases"].values()) == pytest.approx(p["step_s"])
    assert p["inputs"] == {"stage": 2, "micro_batch": 4, "grad_accum": 2, "seq_len": 2048,
                           "gradient_checkpointing": True, "offload_optimizer": "none", "offload_param": "none",
                           "lora_rank": None, "world_size": 4,
                           "config": "ZeRO-2 with checkpointing, micro batch 4 x 2"}
    assert t["ratio"] == pytest.approx(m["step_s"] / p["step_s"]) and t["ratio"] > 1.2
    slow = t["slower_than_predicted"]
    excess = {k: m["phases"][k] - p["phases"].get(k, 0.0) for k in m["phases"]}
    assert slow["phase"] == max(excess, key=excess.get) == "backward"
    assert slow["phase_excess_s"] == pytest.approx(excess["backward"])
    # the search's configurations that fit 80 GiB, by the stand-in's time: without recomputation is faster
    fast = t["faster"]
    assert fast["changes"]["gradient_checkpointing"] == [True, False] and "without checkpointing" in fast["config"]
    assert fast["gain"] == pytest.approx(m["step_s"] / fast["step_s"])
    assert fast["gain_predicted"] == pytest.approx(p["step_s"] / fast["step_s"]) and fast["gain_predicted"] > 1 / 0.9
    text = render(rep)
    assert (f"SLOWER than predicted: {slow['ratio']:.2f}x (0.400 s against {p['step_s']:.3f} s); most of the "
            "difference is in backward") in text
    assert (f"faster: {fast['config']}: predicted {fast['step_s']:.3f} s per step against 0.400 s measured, "
            f"{fast['gain']:.2f}x") in text


def _inputs(rep):
    from zeropilot.memory.from_run import plan_inputs

    records = read_run(Path(rep["run_dir"]))
    setup = records.ranks[0].of("setup")[-1]
    inputs, why, _ = plan_inputs({"setup": setup, "batch": rep["time"]["measured"]["batch"]}, 80 * GiB)
    assert why is None and inputs.grad_accum == 2
    return inputs


def test_a_configuration_already_fastest_is_not_named(tmp_path):
    """Without checkpointing the stand-in knows nothing faster (same global batch): no configuration is named."""
    rep = summarize(read_run(_write_job(tmp_path / "run", gc=False)), _gpu_predictor())
    assert rep["time"]["predicted"] is not None and rep["time"]["faster"] is None
    assert "faster:" not in render(rep)


@pytest.mark.parametrize("predictor,why", [
    (Predictor(), "the run trained on the CPU: the time model has speed figures for GPUs only"),
], ids=["no-speed-figures"])
def test_a_cpu_run_says_in_one_line_why_nothing_is_predicted(tmp_path, predictor, why):
    rep = summarize(read_run(_write_job(tmp_path / "run", device="cpu", backend="cpu")), predictor)
    t = rep["time"]
    assert t["predicted"] is None and t["reason"].startswith(why) and t["faster"] is None
    assert t["measured"]["step_s"] == pytest.approx(0.4, abs=0.01)
    lines = [ln for ln in render(rep).splitlines() if "no prediction" in ln]
    assert lines == [f"  no prediction: {t['reason']}"]


def test_an_unknown_card_without_a_profile_is_one_line(tmp_path):
    rep = summarize(read_run(_write_job(tmp_path / "run", device="Some Card 9000")),
                    Predictor(speed_for=lambda card, profile: None, estimate=timeparts.standin_estimate))
    assert rep["time"]["reason"] == ("no speed figures for the card Some Card 9000: not in the card table; measure it "
                                     "with `zeropilot calibrate` and pass the profile with --hardware FILE")


def test_a_time_model_that_gives_no_finite_time_is_a_reason_not_a_crash(tmp_path, validate):
    def infinite(inputs, sp):
        st = timeparts.standin_estimate(inputs, sp)
        return type(st)(**{**st.__dict__, "step_s": float("inf")})

    rep = summarize(read_run(_write_job(tmp_path / "run")), _gpu_predictor(estimate=infinite))
    assert validate(rep) == [] and rep["time"]["reason"].startswith("the time model cannot take this run")
    json.dumps(rep, allow_nan=False)


def test_a_setup_the_plan_cannot_take_is_one_line(tmp_path, validate):
    root = _write_job(tmp_path / "run", ranks=1)
    lines = (root / "rank-0.jsonl").read_text().splitlines()
    setup = json.loads(lines[1])
    setup["model"]["config"] = {"model_type": "qwen2", "hidden_size": "wide"}
    lines[1] = json.dumps(setup)
    (root / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    rep = summarize(read_run(root), _gpu_predictor())
    assert validate(rep) == [] and rep["time"]["predicted"] is None
    assert rep["time"]["reason"].startswith("the plan cannot size this model")


def test_a_model_larger_than_any_run_is_refused_not_planned(tmp_path, validate):
    """A stranger's setup record claiming a billion layers (the plan's work grows with them) gets one line, at once."""
    import time

    root = _write_job(tmp_path / "run", ranks=1)
    lines = (root / "rank-0.jsonl").read_text().splitlines()
    setup = json.loads(lines[1])
    setup["model"]["config"]["num_hidden_layers"] = 10**9
    lines[1] = json.dumps(setup)
    (root / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    rep = summarize(read_run(root), _gpu_predictor())
    assert time.monotonic() - t0 < 5 and validate(rep) == [] and rep["time"]["predicted"] is None
    assert rep["time"]["reason"] == ("the plan cannot take this run's settings: layers 1000000000 (at most 512): "
                                     "larger than any run the plan models")


def test_old_run_directories_give_the_step_time_without_its_split(tmp_path, validate):
    """Step records without phase times (a guard before they were recorded): the steps after a save's span are left
    out by the save record's time; the step time only; no prediction without the batch."""
    root = write_run(tmp_path / "old", Spec(ranks=2, steps=40, save_every=15))
    rep = summarize(read_run(root))
    assert validate(rep) == []
    m = rep["time"]["measured"]
    assert m["left_out"]["save"] == 2 * 2 and m["phases"] == {} and m["phase_steps"] == 0
    records = read_run(root)
    kept = [records.ranks[r].steps["seconds"][i] for r in (0, 1) for i in range(WARMUP_STEPS, 40) if i not in (15, 30)]
    assert m["steps"] == len(kept) and m["step_s"] == pytest.approx(statistics.median(kept))
    assert "carry no phase times" in m["reason"] and rep["time"]["reason"].startswith("no steady step recorded its batch")
    assert "time per optimizer step: median" in render(rep)


def test_hardware_profile_that_is_not_one_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    assert main(["report", str(_write_job(tmp_path / "run", ranks=1)), "--hardware", str(bad)]) == 2
    assert "not a zeropilot hardware profile" in capsys.readouterr().err


def test_the_docs_example_is_what_the_command_prints(capsys, monkeypatch):
    """docs/report.md quotes the first lines of the report of a committed real CPU run (bench/report/runs)."""
    import re

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "report.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ zeropilot report (bench/report/runs/hf-trainer-cpu-time)\n(.*?)```", doc, re.S)
    assert block, "docs/report.md quotes the step time of a real run"
    run, quoted = block.groups()
    monkeypatch.chdir(root)
    assert main(["report", run]) == 0
    out = capsys.readouterr().out
    assert out.startswith(quoted) and "time per optimizer step: median" in quoted
