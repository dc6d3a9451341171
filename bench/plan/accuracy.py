"""Accuracy of ``zeropilot plan`` against measured GPU memory, next to DeepSpeed's own estimator.

For every measured row (rows.py): predicted ``gpu_peak_bytes`` against measured ``peak_reserved +
non_torch_gb``, the error of each, and DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs``
(``ds_estimate_gpu_gb`` in the rows) on the same row; median and maximum absolute error per split
(tuning / holdout / new-arch); and for the memory-capped runs, the plan's verdict against what happened; issue 40's
rows on one H100 (``time/data/call*/rows.jsonl``) apart.
Writes ``results/accuracy.md`` and ``results/accuracy.json``.
Usage: python bench/plan/accuracy.py [--check]   (--check: exit 1 if the committed files differ)
"""
from __future__ import annotations

import json
import statistics
import sys

from rows import HERE, calibration_drift, h100_rows, load_rows

from zeropilot.memory.constants import DEFAULT
from zeropilot.memory.gpu import estimate_gpu, trainable_params, zero3_replay, zero12_replay
from zeropilot.memory.plan import make_plan, verdict_of
from zeropilot.memory.inputs import GIB
from zeropilot.models.params import count_params

RESULTS = HERE / "results"
SPLITS = ("tuning", "holdout", "new-arch", "x2-fit", "x2-holdout", "x2-repeat", "ws2-issue5")
NOT_TUNED = ("holdout", "new-arch", "x2-holdout")  # never fitted (x2-repeat: the same configurations again)


def _row_record(r) -> dict:
    est = estimate_gpu(r.inputs)
    rec = {"split": r.split, "config": r.label, "source": r.source, "status": r.raw.get("status"),
           "predicted_gib": round(est.peak_bytes / GIB, 2), "peak_phase": est.peak_phase}
    s = r.raw["spec"]
    if "ws" in s:
        build = (" zero.Init" if s.get("zero_init") else " raw-build") if s["stage"] == 3 else ""
        rec["config"] += f" ws{s['ws']}" + build + (
            f" sgs{s['sgs']:.0e}" if s.get("sgs") else "") + (f" mlp{s['mlp']:.0e}" if s.get("mlp") else "")
    if r.measured_bytes:
        meas = r.measured_bytes / GIB
        rec["measured_gib"] = round(meas, 2)
        rec["error_pct"] = round(100 * (est.peak_bytes / GIB / meas - 1), 1)
        ds = r.raw.get("ds_estimate_gpu_gb")
        if ds is not None:
            rec["deepspeed_gib"] = round(ds, 2)
            rec["deepspeed_error_pct"] = round(100 * (ds / meas - 1), 1)
    if r.cap_gib:
        v = verdict_of(est, r.inputs.hardware.gpu_bytes)
        rec["cap_gib"] = r.cap_gib
        rec["verdict"] = v.kind
        rec["outcome"] = "ran" if r.ok else f"oom ({r.raw.get('phase', 'step')})"
        rec["agrees"] = (v.kind == "fits") == r.ok if v.kind != "tight" else None
    return rec


def _host_records(rows) -> list:
    """Host memory of the runs with CPU offload: predicted per process against the probe's peak RSS."""
    out = []
    for r in rows:
        if r.ok and (r.inputs.offload_optimizer != "none" or r.inputs.offload_param != "none"):
            plan = make_plan(r.inputs)
            meas = r.raw["host_peak_rss_gb"]
            out.append({"config": r.label, "source": r.source, "measured_rss_gib": round(meas, 1),
                        "predicted_gib": round(plan.host.per_process_bytes / GIB, 1),
                        "error_pct": round(100 * (plan.host.per_process_bytes / GIB / meas - 1), 1)})
    return out


def _h100_records() -> list:
    """Issue 40's H100 rows: predicted against measured peak, and the pre-registered ``pred_gib`` where the spec has
    one (call 1's traced rows)."""
    out = []
    for r in h100_rows():
        s = r.raw["spec"]
        meas = r.measured_bytes / GIB
        pred = estimate_gpu(r.inputs).peak_bytes / GIB
        kind = ("fused loss" if r.inputs.fused_loss else "gradient accumulation" if r.inputs.grad_accum > 1
                else "replayed" if _replayed(r.inputs) else "fitted")
        rec = {"call": r.source, "row": s["row"], "split": r.split, "adam": s.get("adam", "torch"), "kind": kind,
               "measured_gib": round(meas, 2), "predicted_gib": round(pred, 2),
               "error_pct": round(100 * (pred / meas - 1), 1)}
        if "pred_gib" in s:
            rec["preregistered_gib"] = s["pred_gib"]
            rec["preregistered_error_pct"] = round(100 * (s["pred_gib"] / meas - 1), 1)
        out.append(rec)
    return out


def _replayed(inputs) -> bool:
    """Whether the allocator replay sets this plan's reserved memory."""
    counts = count_params(inputs.arch)
    if inputs.stage in (1, 2):
        return zero12_replay(inputs, counts, trainable_params(inputs, counts), DEFAULT) is not None
    return zero3_replay(inputs) is not None


def _h100_summary(recs) -> dict:
    kinds = {"all": recs}
    for kind in ("replayed", "fitted", "fused loss", "gradient accumulation"):
        kinds[kind] = [x for x in recs if x["kind"] == kind]
    return {k: _block(v) for k, v in kinds.items() if v}


def _block(recs) -> dict:
    if not recs:
        return {}
    errs = [abs(x["error_pct"]) for x in recs]
    ds = [abs(x["deepspeed_error_pct"]) for x in recs if "deepspeed_error_pct" in x]
    return {"rows": len(errs), "median_abs_error_pct": round(statistics.median(errs), 1),
            "max_abs_error_pct": round(max(errs), 1),
            "worst_under_prediction_pct": round(min(min(x["error_pct"] for x in recs), 0.0), 1),
            "deepspeed_median_abs_error_pct": round(statistics.median(ds), 1) if ds else None,
            "deepspeed_max_abs_error_pct": round(max(ds), 1) if ds else None}


def _summary(recs) -> dict:
    out = {}
    for split in SPLITS:
        block = _block([x for x in recs if x["split"] == split and "error_pct" in x])
        if block:
            out[split] = block
    block = _block([x for x in recs if x["split"] in NOT_TUNED and "error_pct" in x])
    if block:
        out["not tuned (" + " + ".join(NOT_TUNED) + ")"] = block
    capped = [x for x in recs if x["split"] == "capped"]
    out["capped"] = {"runs": len(capped), "verdict_agrees": sum(1 for x in capped if x["agrees"] is True),
                     "verdict_wrong": sum(1 for x in capped if x["agrees"] is False),
                     "verdict_tight": sum(1 for x in capped if x["agrees"] is None)}
    return out


def _h100_markdown(recs, summary) -> list:
    lines = ["", "Issue 40's runs on one H100 (`time/data/call1`, `call2`: torch 2.11, DeepSpeed 0.19.8; the HF "
             "Trainer's optimizer, `adam: client`, unless the row says `torch` or `cpu`), each row's peak against "
             "today's plan (`rows.timing_inputs`). Not held out: the ZeRO-1/2 gradient partition of LoRA with "
             "`modules_to_save` was read off `t_y9_mts_z2`'s history, the Trainer's second parameter group off "
             "`t_q3_freeze_z2_exp`'s, and the fused step (no foreach temporary) off both and these rows (HISTORY.md, "
             "thirteenth pass). "
             "Fused losses take the fitted components; gradient accumulation is replayed at ZeRO-1 full fine-tuning "
             "(the gradients held to the boundary) and at ZeRO-2 with the optimizer on the GPU (the first micro "
             "batch's gradient partition held to the boundary), elsewhere each step's last micro batch alone. "
             "`split` is the time matrix's (its `fit` rows fit the time model, not this one).", "",
             "| rows | count | median abs error | max abs error | worst under-prediction |", "|---|---|---|---|---|"]
    for kind, s in summary.items():
        lines.append(f"| {kind} | {s['rows']} | {s['median_abs_error_pct']}% | {s['max_abs_error_pct']}% | "
                     f"{_pct(s['worst_under_prediction_pct'])} |")
    lines += ["", "| call | row | split | optimizer | measured GiB | predicted GiB | error | pre-registered GiB | "
              "its error |", "|---|---|---|---|---|---|---|---|---|"]
    for x in recs:
        lines.append(f"| {x['call']} | {x['row']} | {x['split']} | {x['adam']} | {x['measured_gib']} | "
                     f"{x['predicted_gib']} | {_pct(x['error_pct'])} | {x.get('preregistered_gib', '-')} | "
                     f"{_pct(x.get('preregistered_error_pct'))} |")
    return lines


def _markdown(recs, summary, host, prereg, h100=(), h100_summary=None) -> str:
    lines = ["# zeropilot plan: accuracy on measured H200 runs", "",
             "Generated by `python bench/plan/accuracy.py`. Error = predicted / measured - 1, measured = "
             "`peak_reserved + non_torch_gb` (what nvidia-smi shows). DeepSpeed = "
             "`estimate_zero{2,3}_model_states_mem_needs` on the same row. x2 rows (issue 14, 2 x H200, "
             "sources `h200x2_call*` in `data/rows.jsonl`): measured = the larger of the init and the training "
             "phase; their split was fixed in the spec before the run; `python bench/plan/fit.py --x2` fits only on x2-fit. "
             "x2-repeat: four older rows measured again (call 5), never fitted. trace: rows measured again with "
             "the allocator's history recorded (calls 7, 10 and 11), not scored. Calls 8, 9 and 12 are x2-holdout "
             "rows whose predictions were committed before they ran (table below); the candidate patches named there "
             "left the tree (`git show 221f33b:bench/plan/NAME.patch`). ws2-issue5: issue 5's first runs at world "
             "size 2, never fitted, scored apart.", "",
             "| split | rows | median abs error | max abs error | worst under-prediction | DeepSpeed median | "
             "DeepSpeed max |", "|---|---|---|---|---|---|---|"]
    for split, s in summary.items():
        if split == "capped":
            continue
        lines.append(f"| {split} | {s['rows']} | {s['median_abs_error_pct']}% | {s['max_abs_error_pct']}% | "
                     f"{_pct(s['worst_under_prediction_pct'])} | {_pct(s.get('deepspeed_median_abs_error_pct'))} | {_pct(s.get('deepspeed_max_abs_error_pct'))} |")
    lines += ["", "Pre-registered held-out calls: the prediction written into each spec before the run, and the "
              "current model's on the same rows (for the candidate too: the plan does not use it).", "",
              "| call | rows | median abs error | max abs error | worst under-prediction | now: median | now: max | "
              "now: worst under |", "|---|---|---|---|---|---|---|---|"]
    for x in prereg:
        p, n = x["predicted"], x["now"]
        lines.append(f"| {x['call']} | {p['rows']} | {p['median_abs_error_pct']}% | {p['max_abs_error_pct']}% | "
                     f"{p['worst_under_prediction_pct']}% | {n['median_abs_error_pct']}% | {n['max_abs_error_pct']}% | "
                     f"{n['worst_under_prediction_pct']}% |")
    c = summary["capped"]
    lines += ["", f"Memory-capped runs (emulated cards): {c['runs']}; verdict right {c['verdict_agrees']}, "
              f"wrong {c['verdict_wrong']}, 'tight' (fits only if the allocator flushes its cache) {c['verdict_tight']}. "
              "An OOM at `init` happened while the probe built the whole bf16 model on the GPU, before "
              "`deepspeed.initialize` (a launch through the HF Trainer loads on the CPU or with zero.Init).",
              "", "| split | configuration | measured GiB | predicted GiB | error | DeepSpeed GiB | DeepSpeed error |",
              "|---|---|---|---|---|---|---|"]
    for x in recs:
        if x["split"] == "capped":
            continue
        lines.append(f"| {x['split']} | {x['config']} | {x.get('measured_gib', '-')} | {x['predicted_gib']} | "
                     f"{_pct(x.get('error_pct'))} | {x.get('deepspeed_gib', '-')} | {_pct(x.get('deepspeed_error_pct'))} |")
    lines += ["", "| capped run | cap GiB | predicted GiB | verdict | outcome | agrees |", "|---|---|---|---|---|---|"]
    for x in recs:
        if x["split"] == "capped":
            agree = {True: "yes", False: "NO", None: "tight"}[x["agrees"]]
            lines.append(f"| {x['config']} | {x['cap_gib']} | {x['predicted_gib']} | {x['verdict']} | "
                         f"{x['outcome']} | {agree} |")
    lines += ["", "Host memory of the offload runs (per process; measured = peak RSS of the probe; predicted buffer by "
              "buffer, memory/host.py, as calls 29-31's host logs show them):", "",
              "| configuration | source | measured GiB | predicted GiB | error |", "|---|---|---|---|---|"]
    for x in host:
        lines.append(f"| {x['config']} | {x['source']} | {x['measured_rss_gib']} | {x['predicted_gib']} | "
                     f"{_pct(x['error_pct'])} |")
    if h100:
        lines += _h100_markdown(h100, h100_summary)
    return "\n".join(lines) + "\n"


#: The calls whose predictions were written into their specs (``pred_gib``) and committed before they ran, after the
#: model change they test: the cleanest measure of rows the model was not tuned on.
PREREGISTERED = {("h200x2_call8", "pred_gib"): "call 8 (after the ZeRO-1/2 segment floor, commit 41d11ba)",
                 ("h200x2_call9", "pred_gib"): "call 9 (after the ZeRO-1/2 allocator replay, commit 7399e68)",
                 ("h200x2_call12", "pred_gib"): "call 12 (the same replay, commit 45e2c4b)",
                 ("h200x2_call12", "pred_gib_v5"): "call 12, the candidate not adopted (segments_v5_candidate.patch)",
                 ("h200x2_call14", "pred_gib_prev"): "call 14 (the replay as at commit 4c17d7d)",
                 ("h200x2_call14", "pred_gib"): "call 14, a candidate not adopted (segments_v6_candidate.patch)",
                 ("h200x2_call16", "pred_gib"): "call 16 (the per-layer replay, commit 726fe6e)",
                 ("h200x2_call16", "pred_gib_prev"): "call 16, the replay it replaced (commit 1d0ae99)",
                 ("h200x2_call18", "pred_gib"): "call 18 (confirmation, commit f6215c3)",
                 ("h200x2_call19", "pred_gib"): "call 19 (LoRA's frozen norms, commit f254e04)",
                 ("h200x2_call19", "pred_gib_prev"): "call 19, without that change (commit f6215c3)",
                 ("h200x2_call21", "pred_gib"): "call 21, a candidate not adopted (layers_v8_candidate.patch)",
                 ("h200x2_call21", "pred_gib_prev"): "call 21, the plan kept (commit 6a70b38)",
                 ("h200x2_call23", "pred_gib"): "call 23, a candidate not adopted (reserved_v9_candidate.patch)",
                 ("h200x2_call23", "pred_gib_prev"): "call 23, the plan kept (commit 31c1f40)",
                 ("h200x2_call24", "pred_gib_v9"): "call 24, the same candidate, adopted (reserved_v9_candidate.patch)",
                 ("h200x2_call24", "pred_gib"): "call 24, the plan it replaced (commit 2da6855)",
                 ("h200x2_call25", "pred_gib_v10"): "call 25, a candidate, adopted (replay_v10_candidate.patch)",
                 ("h200x2_call25", "pred_gib"): "call 25, the plan it replaced (commit d748b79)",
                 ("h200x2_call26", "pred_gib_v11"): "call 26, a candidate not adopted (layers_init_v11_candidate.patch)",
                 ("h200x2_call26", "pred_gib"): "call 26, the plan kept (commit c499297)",
                 ("h200x2_call28", "pred_gib_v12"): "call 28, a candidate, adopted (reduction_v12_candidate.patch)",
                 ("h200x2_call28", "pred_gib"): "call 28, the plan (commit c499297's memory code)",
                 ("h200x2_call32", "pred_gib_v13"): "call 32, a candidate, adopted (zero3_v13_candidate.patch)",
                 ("h200x2_call32", "pred_gib"): "call 32, the plan it replaced (commit 3d80e3c)",
                 ("h200x2_call33", "pred_gib"): "call 33, the plan on ZeRO-3 at world size 1 (commit ccbf582)",
                 ("h200x2_call36", "pred_gib_v14"): "call 36, a candidate, adopted (build_cache_v14_candidate.patch)",
                 ("h200x2_call36", "pred_gib"): "call 36, the plan it replaced (commit 3f727c0)",
                 ("h200x2_call37", "pred_gib_v12"): "call 37, candidate v12 at world size 1 (evidence only)",
                 ("h200x2_call37", "pred_gib"): "call 37, the plan (commit 3b20d63)",
                 ("h200x2_call38", "pred_gib"): "call 38, the plan on ZeRO-3 at world size 1 (commit 953081a)",
                 ("h200x2_call40", "pred_gib_v15"): "call 40, a candidate, adopted (zero3_gpu_v15_candidate.patch)",
                 ("h200x2_call40", "pred_gib"): "call 40, the plan it replaced (commit 6040197)",
                 ("h200x2_call40", "pred_gib_v15_v12"): "call 40, the candidate with v12 (evidence only)",
                 ("h200x2_call42", "pred_gib"): "call 42, the plan after v12 and v15 at world size 2 (commit 6c99236)",
                 ("h200x2_call44", "pred_gib_v16"): "call 44, a candidate, adopted (zero3_offload_v16_candidate.patch)",
                 ("h200x2_call44", "pred_gib"): "call 44, the plan it replaced (commit bc6794e)",
                 ("h200x2_call46", "pred_gib_v17"): "call 46, candidate v17 (zero3_v17_candidate.patch)",
                 ("h200x2_call46", "pred_gib"): "call 46, the plan (commit b9f5cc4)",
                 ("h200x2_call47", "pred_gib"): "call 47, the plan after v17 at world size 1 (commit 972ba27)",
                 ("h200x2_call48", "pred_gib"): "call 48, the plan on 7-8B LoRA with both offloads (commit c59e1cd)",
                 ("h200x2_call50", "pred_gib_v18"): "call 50, candidate v18, adopted (zero3_v18_candidate.patch)",
                 ("h200x2_call50", "pred_gib"): "call 50, the plan it replaced (commit 06a202d)",
                 ("h200x2_call51", "pred_gib"): "call 51, the plan on its zero3_states_in_logits kind (commit 76a3331)",
                 ("h200x2_call52", "pred_gib_v19"): "call 52, candidate v19, adopted (nograd_v19_candidate.patch)",
                 ("h200x2_call52", "pred_gib"): "call 52, the plan it replaced (commit 407490e)",
                 ("h200x2_call53", "pred_gib"): "call 53, the plan after v19 on checkpointed runs (commit 2a977ad)"}


def _preregistered(rows, recs) -> list:
    """Per pre-registered call: the spec's prediction against the measurement, and today's model (its records)."""
    out = []
    for (source, field), what in PREREGISTERED.items():
        pre = [{"error_pct": round(100 * (r.raw["spec"][field] * GIB / r.measured_bytes - 1), 1)}
               for r in rows if r.source == source and r.measured_bytes and field in r.raw["spec"] and not r.cap_gib]
        now = [x for x in recs if x["source"] == source and "error_pct" in x]
        if pre:
            out.append({"call": what, "predicted": _block(pre), "now": _block(now)})
    return out


def _pct(v) -> str:
    return "-" if v is None else f"{v}%"


def compute() -> dict:
    rows = load_rows()
    recs = [_row_record(r) for r in rows]
    h100 = _h100_records()
    return {"rows": recs, "summary": _summary(recs), "preregistered": _preregistered(rows, recs),
            "host": _host_records(rows), "h100": h100, "h100_summary": _h100_summary(h100)}


def main(argv) -> int:
    drift = calibration_drift()
    if drift:
        print(drift, file=sys.stderr)
    result = compute()
    text = json.dumps(result, indent=1) + "\n"
    md = _markdown(result["rows"], result["summary"], result["host"], result["preregistered"], result["h100"],
                   result["h100_summary"])
    if "--check" in argv:
        same = (RESULTS / "accuracy.json").read_text() == text and (RESULTS / "accuracy.md").read_text() == md
        print("accuracy results up to date" if same else "accuracy results differ: rerun bench/plan/accuracy.py")
        return 0 if same else 1
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "accuracy.json").write_text(text)
    (RESULTS / "accuracy.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
