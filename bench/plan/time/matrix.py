"""The pre-registered GPU matrix of issue 40: step-time rows, split into rows that fit the time model's constants and
held-out rows, each held-out row with its predicted step time written before it runs.

``python bench/plan/time/matrix.py fit OUT.jsonl`` writes call 1's fit rows; ``python bench/plan/time/matrix.py
holdout OUT.jsonl --profile PROFILE`` writes the held-out rows with ``pred_step_s`` (the model and constants as
committed, the speed figures of the profile ``calibrate`` measured in call 1). Each spec is a
``../zero_mem_probe_plan.py`` spec (``spec_check.py`` checks them) with ``row``, ``split``, ``est_wall_s``.

The protocol (issue 40): the median of 5 steps after 2 warm-up steps (``warmup`` 2, ``steps`` 7), one row at a time
on one GPU (``run_rows.py``). The optimizer is the one a launch gets: the HF Trainer's default (``adam: client``,
``torch.optim.AdamW(fused=True)``) on the GPU, DeepSpeed's CPUAdam with optimizer offload.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[2] / "src"))

MODELS = {
    "qwen2.5-0.5b": {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-1.5b": {"model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
                     "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-3b": {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768},
    "qwen2.5-7b": {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False, "max_position_embeddings": 32768},
    "llama-3.2-1b": {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072},
    "llama-3.2-3b": {"model_type": "llama", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                     "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": True, "max_position_embeddings": 131072},
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                   "tie_word_embeddings": False, "max_position_embeddings": 32768, "sliding_window": None},
    "qwen3-4b": {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "tie_word_embeddings": True, "max_position_embeddings": 40960},
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                     "tie_word_embeddings": False, "max_position_embeddings": 131072},
    "qwen3-8b": {"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                 "tie_word_embeddings": False, "max_position_embeddings": 40960},
    # the 9 B shape with a 64k vocabulary of issue 40's 6%-low memory row (Yi-1.5-9B's config.json)
    "yi-9b-shape": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 48,
                    "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 64000,
                    "tie_word_embeddings": False, "max_position_embeddings": 4096},
}

#: call 1: the rows the constants are fitted on, each chosen for the term it pins (``why``)
FIT = [
    ("f_q05_full_z2_s256", "qwen2.5-0.5b", dict(stage=2, mb=1, seq=256), "host-bound full fine-tuning: host_op"),
    ("f_q05_lora_z2_s256", "qwen2.5-0.5b", dict(stage=2, mb=1, seq=256, lora=16), "host-bound LoRA: host_op"),
    ("f_q15_full_z2_mb4", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=2048), "GPU-bound full: products, other kernels"),
    ("f_q15_full_z1_mb4", "qwen2.5-1.5b", dict(stage=1, mb=4, seq=2048), "ZeRO-1 against f_q15_full_z2_mb4"),
    ("f_q7_lora_z2_mb4_gc", "qwen2.5-7b", dict(stage=2, mb=4, seq=2048, lora=16, gc=True),
     "GPU-bound LoRA with recomputation"),
    ("f_q15_lora_z3_s512", "qwen2.5-1.5b", dict(stage=3, mb=1, seq=512, lora=16), "ZeRO-3 hooks: zero3_module_s"),
    ("f_q15_full_z3_mb2", "qwen2.5-1.5b", dict(stage=3, mb=2, seq=1024), "ZeRO-3 full fine-tuning"),
    ("f_q3_full_z2_off", "qwen2.5-3b", dict(stage=2, mb=2, seq=1024, offload=True, adam="cpu"),
     "optimizer offload: CPUAdam and the copies"),
    ("f_q3_lora_z3_offp_gc", "qwen2.5-3b", dict(stage=3, mb=2, seq=1024, lora=16, gc=True, offload=True,
                                                  offload_param=True, adam="cpu"), "parameter offload"),
    ("f_q15_lora_z2_liger", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=2048, lora=16, liger=True), "Liger"),
    ("f_q15_full_z2_ga4", "qwen2.5-1.5b", dict(stage=2, mb=1, seq=512, ga=4),
     "accumulation, ZeRO-2's hooks per micro batch: zero12_tensor_s"),
    ("f_l1_full_z3_mlp", "llama-3.2-1b", dict(stage=3, mb=2, seq=2048, mlp=10_000_000),
     "ZeRO-3 with stage3_max_live_parameters low"),
]
#: call 1 also: allocator histories (no timing claims), after the fit rows: issue 40's 6%-low memory row (LoRA with
#: embed_tokens/lm_head trained, ZeRO-2, a 9 B shape with a 64k vocabulary) and two expandable_segments runs of the
#: kinds the plan is low on with LLaMA-Factory's allocator setting (freeze tuning without checkpointing, LoRA with
#: modules_to_save), each with the plan's peak as committed (``pred_gib``)
TRACE = [
    ("t_y9_mts_z2", "yi-9b-shape", dict(stage=2, mb=2, seq=2048, gc=True, lora=16, mts=["embed_tokens", "lm_head"],
                                         trace="call1_y9_mts_z2", trace_frames=True), "the 6%-low row's kind"),
    ("t_q3_freeze_z2_exp", "qwen2.5-3b", dict(stage=2, mb=2, seq=2048, freeze=4, alloc_conf="expandable_segments:True",
                                               trace="call1_q3_freeze_z2_exp", trace_frames=True),
     "expandable segments, freeze tuning without checkpointing"),
    ("t_q15_mts_z2_exp", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=2048, gc=True, lora=16, mts=["embed_tokens", "lm_head"],
                                               alloc_conf="expandable_segments:True", trace="call1_q15_mts_z2_exp",
                                               trace_frames=True), "expandable segments, LoRA with modules_to_save"),
]
#: call 2's held-out search (issue 40: a model, a GPU memory cap, a global batch): Qwen2.5-1.5B full fine-tuning on
#: one whole H100 (the cap is the card: DeepSpeed's autotuner, run on the same case in the same call, cannot honour
#: another), 16 samples of 1024 tokens per optimizer step, the HF Trainer with Liger installed. ``plan --search``'s
#: first choice, its tie partner (ZeRO-1), its best with checkpointing, and the fixed order's first choice (the
#: search before issue 40, and what the autotuner can find: no Liger), each measured
SEARCH = [
    ("s1_z2_liger_mb16", "qwen2.5-1.5b", dict(stage=2, mb=16, seq=1024, ga=1, liger=True), "the search's first"),
    ("s1_z1_liger_mb16", "qwen2.5-1.5b", dict(stage=1, mb=16, seq=1024, ga=1, liger=True), "ZeRO-1 beside it"),
    ("s1_z2_gc_liger_mb16", "qwen2.5-1.5b", dict(stage=2, mb=16, seq=1024, ga=1, gc=True, liger=True),
     "the first with checkpointing"),
    ("s1_z2_mb8_ga2", "qwen2.5-1.5b", dict(stage=2, mb=8, seq=1024, ga=2),
     "the fixed order's first: no Liger, the largest micro batch that fits"),
    ("s1_z2_gc_mb16", "qwen2.5-1.5b", dict(stage=2, mb=16, seq=1024, ga=1, gc=True), "checkpointing without Liger"),
]
#: call 2's held-out rows: levers and shapes the fit rows did not have
HOLDOUT = [
    ("h_l8_lora_z3_gc", "llama-3.1-8b", dict(stage=3, mb=2, seq=2048, lora=16, gc=True), "8 B ZeRO-3 LoRA"),
    ("h_l1_full_z3_mlp_high", "llama-3.2-1b", dict(stage=3, mb=2, seq=2048),
     "stage3_max_live_parameters at its default, against fit row f_l1_full_z3_mlp"),
    ("h_l3_lora_z2_liger", "llama-3.2-3b", dict(stage=2, mb=8, seq=1024, lora=16, liger=True), "Liger on Llama"),
    ("h_q05_full_z2_off_torch", "qwen2.5-0.5b", dict(stage=2, mb=2, seq=1024, offload=True, adam="torch"),
     "optimizer offload with torch's AdamW on the host (torch_adam)"),
    ("h_q7_lora_z2_mb1", "qwen2.5-7b", dict(stage=2, mb=1, seq=2048, lora=16), "7 B LoRA without recomputation"),
]
#: seconds a row's process takes beyond its steps (start-up, imports, the model's build, deepspeed.initialize)
START_S = 25


def spec(row: str, model: str, settings: dict, split: str, why: str = "") -> dict:
    """A probe spec with the protocol's steps, the HF Trainer's optimizer unless told, and its wall-time estimate
    from the committed model on an H100's table figures."""
    out = {"name": model, "row": row, "split": split, "model": MODELS[model], "warmup": 2, "steps": 7}
    if "adam" not in settings:
        out["adam"] = "client"
    out.update(settings)
    if why:
        out["note"] = why
    from fit import inputs_of
    from zeropilot.memory.plan import make_plan
    from zeropilot.memory.speed import speed_for

    plan = make_plan(inputs_of(out, 79.1), speed=speed_for("H100"))
    out["est_wall_s"] = int(START_S + 7 * plan.time.step_s * 1.5 + (25 if out.get("trace") else 0))
    if split == "trace":
        out["pred_gib"] = round(plan.gpu_peak_bytes / 2**30, 2)
    return out


def holdout_rows(profile: str) -> list:
    """Call 2's rows, each with its predicted step time written before the run: on an H100 with the speed figures
    call 1's ``calibrate`` measured (``pred_step_s``), and on an H200 with the card table's estimate from them
    (``pred_step_s_h200``, in case the call gets an H200)."""
    from fit import inputs_of
    from zeropilot.memory.profile import load
    from zeropilot.memory.speed import speed_for, speed_of
    from zeropilot.memory.steptime import estimate_time

    h100 = speed_for(None, load(profile))
    h200 = speed_of("H200", None)
    rows = []
    for split, table in (("search", SEARCH), ("holdout", HOLDOUT)):
        for row, model, settings, why in table:
            s = spec(row, model, settings, split, why)
            s["pred_step_s"] = round(estimate_time(inputs_of(s, 79.1), h100).step_s, 4)
            s["pred_step_s_h200"] = round(estimate_time(inputs_of(s, 139.8), h200).step_s, 4)
            rows.append(s)
    order = {row: i for i, row in enumerate(PRIORITY)}
    return sorted(rows, key=lambda r: order.get(r["row"], len(order)))


#: call 3 (the next session's): held-out rows new to the model, after call 2's five host-bound rows again; predictions
#: are written twice before it runs: with call 1's profile (``pred_step_s``), and as a procedure, the committed model
#: with the profile ``calibrate`` measures at the start of the same call (``bench/plan/time/fit.py ROWS PROFILE``)
HOLDOUT3 = [
    ("h3_m7_lora_z2_gc", "mistral-7b", dict(stage=2, mb=4, seq=2048, lora=16, gc=True), "Mistral 7B LoRA"),
    ("h3_q4_lora_z3_gc", "qwen3-4b", dict(stage=3, mb=2, seq=2048, lora=16, gc=True), "Qwen3 4B LoRA, ZeRO-3"),
    ("h3_l3_full_z2_off", "llama-3.2-3b", dict(stage=2, mb=4, seq=1024, offload=True, adam="cpu"),
     "full fine-tuning with CPUAdam"),
    ("h3_q15_full_z3_offp", "qwen2.5-1.5b", dict(stage=3, mb=4, seq=1024, offload=True, offload_param=True,
                                                  adam="cpu"), "both offloads, full fine-tuning"),
    ("h3_l1_lora_z2_ga8", "llama-3.2-1b", dict(stage=2, mb=1, seq=1024, lora=16, ga=8), "LoRA, accumulation 8"),
    ("h3_q7_lora_z3_liger", "qwen2.5-7b", dict(stage=3, mb=4, seq=1024, lora=16, gc=True, liger=True),
     "ZeRO-3 LoRA with Liger"),
]
#: call 2 runs its rows in this order (the budget may not reach the last): the search's first, the fixed order's
#: first and the first with checkpointing, then the held-out rows, then the rest of the search's candidates
PRIORITY = ["s1_z2_liger_mb16", "s1_z2_mb8_ga2", "s1_z2_gc_liger_mb16", "h_q7_lora_z2_mb1", "h_l3_lora_z2_liger",
            "h_l1_full_z3_mlp_high", "h_l8_lora_z3_gc", "s1_z1_liger_mb16", "s1_z2_gc_mb16", "h_q05_full_z2_off_torch"]


def call3_rows(profile: str) -> list:
    """Call 3's rows: HOLDOUT3, then call 2's held-out rows (not the search's) again, with call 1's predictions."""
    from fit import inputs_of
    from zeropilot.memory.profile import load
    from zeropilot.memory.speed import speed_for
    from zeropilot.memory.steptime import estimate_time

    h100 = speed_for(None, load(profile))
    rows = []
    for row, model, settings, why in HOLDOUT3 + [h for h in HOLDOUT]:
        s = spec(row if row.startswith("h3_") else row + "_again", model, settings, "holdout", why)
        s["pred_step_s"] = round(estimate_time(inputs_of(s, 79.1), h100).step_s, 4)
        rows.append(s)
    return rows


#: call 5 (issue 40): held-out rows new to the model; predictions written before it runs with call 4's host
#: (``data/call4/profile_host.json``: call 3's card figures, call 4's launch and CPUAdam at 2^28 elements) and as a
#: procedure, the committed model with the host figures ``host_figures.py`` measures at the start of the same call
#: (``host_predict.py data/call5``)
HOLDOUT5 = [
    ("h5_q3_full_z3_gc", "qwen2.5-3b", dict(stage=3, mb=4, seq=2048, gc=True), "3 B full fine-tuning, ZeRO-3"),
    ("h5_l1_full_z1_mb8", "llama-3.2-1b", dict(stage=1, mb=8, seq=1024), "1 B full fine-tuning, ZeRO-1"),
    ("h5_l8_lora_z2_liger", "llama-3.1-8b", dict(stage=2, mb=2, seq=2048, lora=16, liger=True), "8 B LoRA, Liger"),
    ("h5_q15_lora_z3_mlp_low", "qwen2.5-1.5b", dict(stage=3, mb=4, seq=1024, lora=16, mlp=int(1e7)),
     "ZeRO-3 LoRA, stage3_max_live_parameters 1e7"),
    ("h5_q05_full_z2_off", "qwen2.5-0.5b", dict(stage=2, mb=8, seq=1024, offload=True, adam="cpu"),
     "optimizer offload with CPUAdam, a small model"),
    ("h5_m7_lora_z2_ga4", "mistral-7b", dict(stage=2, mb=1, seq=2048, lora=16, ga=4), "7 B LoRA, accumulation 4"),
]


#: call 7 (issue 40): held-out rows new to the model (shapes and settings calls 1-5 did not run), after the terms of
#: branch timeterms (ZeRO-3's forward-type hooks apart from the backward's, the step's float64 norm and copies, one
#: GPU's parameter offload waited for by the host); predictions written before it runs with call 5's host
#: (``data/call5/profile_host.json``: call 3's card figures, call 5's launch and CPUAdam past the cache) and as the
#: procedure with the call's own host figures (``host_predict.py data/call7``)
HOLDOUT7 = [
    ("h7_q8_lora_z3_gc", "qwen3-8b", dict(stage=3, mb=2, seq=2048, lora=16, gc=True), "Qwen3 8B LoRA, ZeRO-3"),
    ("h7_q15_full_z1_ga4", "qwen2.5-1.5b", dict(stage=1, mb=2, seq=1024, ga=4),
     "full fine-tuning, ZeRO-1, accumulation 4 (Llama-3.2-3B's states alone leave an 80 GB card no room at ZeRO-1)"),
    ("h7_q3_full_z3_mb2", "qwen2.5-3b", dict(stage=3, mb=2, seq=1024),
     "3 B full fine-tuning, ZeRO-3 without checkpointing"),
    ("h7_l1_full_z2_s4096", "llama-3.2-1b", dict(stage=2, mb=1, seq=4096), "micro batch 1 x 4096 tokens"),
    ("h7_q05_lora_z3_gc", "qwen2.5-0.5b", dict(stage=3, mb=4, seq=1024, lora=16, gc=True),
     "host-bound ZeRO-3 LoRA with recomputation"),
    ("h7_l3_full_z3_offp", "llama-3.2-3b", dict(stage=3, mb=2, seq=1024, offload=True, offload_param=True, adam="cpu"),
     "both offloads, a 3 B model"),
    ("h7_q7_lora_z2_off", "qwen2.5-7b", dict(stage=2, mb=2, seq=1024, lora=16, offload=True, adam="cpu"),
     "7 B LoRA with CPUAdam offload"),
]


#: call 9 (issue 40): held-out rows new to the model, after branch time9's terms (ZeRO-1's hooks reduce on the boundary
#: micro batch only; ZeRO-1/2 optimizer offload's per-tensor epilogue counted from the code, its step reading the
#: norms on the host; the gradient clipping's pass at the step), the constants refitted on call 1's fit rows;
#: predictions written before it runs with call 7's host (``data/call7/profile_host.json``, the newest) and as the
#: procedure with the call's own host figures (``host_predict.py data/call9``)
HOLDOUT9 = [
    ("h9_l3_lora_z2_off", "llama-3.2-3b", dict(stage=2, mb=4, seq=1024, lora=16, offload=True, adam="cpu"),
     "3 B LoRA with CPUAdam offload"),
    ("h9_q4_lora_z1_ga4", "qwen3-4b", dict(stage=1, mb=2, seq=1024, lora=16, ga=4), "LoRA, ZeRO-1, accumulation 4"),
    ("h9_l1_full_z2_ga4", "llama-3.2-1b", dict(stage=2, mb=2, seq=2048, ga=4),
     "full fine-tuning, ZeRO-2, accumulation 4"),
    ("h9_l3_full_z3_gc", "llama-3.2-3b", dict(stage=3, mb=2, seq=2048, gc=True),
     "3 B full fine-tuning, ZeRO-3 with recomputation"),
    ("h9_q8_freeze2_z2", "qwen3-8b", dict(stage=2, mb=2, seq=2048, freeze=2), "freeze tuning, the last 2 layers"),
    ("h9_q15_full_z1_off_ga2", "qwen2.5-1.5b", dict(stage=1, mb=4, seq=1024, ga=2, offload=True, adam="cpu"),
     "full fine-tuning, ZeRO-1 with CPUAdam offload, accumulation 2"),
    ("h9_m7_lora_z3", "mistral-7b", dict(stage=3, mb=2, seq=1024, lora=16), "7 B LoRA, ZeRO-3 without recomputation"),
]


def held_out_rows(table: list, profile: str) -> list:
    """A call's held-out rows (``HOLDOUT5``, ``HOLDOUT7``, ``HOLDOUT9``), each with its step time predicted from
    ``profile`` (an earlier call's host figures: ``data/callN/profile_host.json``) before the call."""
    from fit import inputs_of
    from zeropilot.memory.profile import load
    from zeropilot.memory.speed import speed_for
    from zeropilot.memory.steptime import estimate_time

    host = speed_for(None, load(profile))
    rows = []
    for row, model, settings, why in table:
        s = spec(row, model, settings, "holdout", why)
        s["pred_step_s"] = round(estimate_time(inputs_of(s, 79.1), host).step_s, 4)
        rows.append(s)
    return rows


def fit_rows() -> list:
    return ([spec(row, model, settings, "fit", why) for row, model, settings, why in FIT]
            + [spec(row, model, settings, "trace", why) for row, model, settings, why in TRACE])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["fit", "holdout", "call3", "call5", "call7", "call9"])
    ap.add_argument("out")
    ap.add_argument("--profile", help="holdout: the profile call 1's calibrate wrote")
    args = ap.parse_args(argv)
    tables = {"call5": HOLDOUT5, "call7": HOLDOUT7, "call9": HOLDOUT9}
    rows = (fit_rows() if args.which == "fit" else holdout_rows(args.profile) if args.which == "holdout"
            else call3_rows(args.profile) if args.which == "call3" else held_out_rows(tables[args.which], args.profile))
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
