"""Pre-registered memory rows for the next GPU call (issue 40, items 6 and 7), each with the plan's predicted peak
(``pred_gib``: what nvidia-smi shows, GiB) written before it runs.

``python bench/plan/time/memory_matrix.py memory OUT.jsonl`` writes the held-out rows of the 6%-low row's kind (LoRA
with ``modules_to_save`` embed_tokens and lm_head at ZeRO-1/2, other shapes and micro batches than call 1's traced
``t_y9_mts_z2``) and of the HF Trainer's optimizer (two weight-decay groups, fused AdamW), and two traced rows for the
next pass (gradient accumulation, which the replay does not model); ``expandable OUT.jsonl`` writes rows under
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (LLaMA-Factory's setting: freeze tuning with and without
checkpointing at ZeRO-2 and ZeRO-3, LoRA, full fine-tuning, ``modules_to_save``), some with their allocator history
(split ``trace``, as ``spec_check`` wants a traced row; their ``pred_gib`` is on record before the call too, as call
1's traced rows' was); ``expandable2 OUT.jsonl`` the next call's (``EXPANDABLE2``: new shapes of the two kinds call 6's
traces corrected).
``--baseline SRC`` adds ``pred_gib_baseline``: the prediction of the ``src/`` tree at SRC (e.g. main before this
pass, ``git archive 0f9ba05 src | tar -x -C DIR``), so both are on record before the call.

Each spec is a ``../zero_mem_probe_plan.py`` spec in call 1's format (``spec_check.py`` checks it: ``python3
bench/plan/time/run_rows.py OUT.jsonl --check``), run by ``device.sh`` one row at a time; the protocol's 2 warm-up and
5 timed steps are kept so the runner takes them, though only the peak is scored. ``spec()`` is ``matrix.py``'s, with
the plan inputs of ``../rows.py`` ``timing_inputs`` (``fit.inputs_of`` and the HF Trainer's optimizer where the probe
builds it, ``adam: client``).
The score (issue 40): every held-out row within 5% of its measured peak (``peak_reserved`` of the larger phase plus
``non_torch_gb``, as ``../rows.py`` measures).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[2] / "src"))

from matrix import MODELS, START_S  # noqa: E402
from rows import timing_inputs  # noqa: E402

#: shapes beyond matrix.py's: Mistral-7B v0.3 (untied, 32k vocabulary), Qwen3-1.7B (tied, q/k norms)
SHAPES = dict(MODELS, **{
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32768,
                   "tie_word_embeddings": False, "max_position_embeddings": 32768},
    "qwen3-1.7b": {"model_type": "qwen3", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 40960},
})
MTS = ["embed_tokens", "lm_head"]
EXP = "expandable_segments:True"

#: held out: the 6%-low row's kind at other shapes and micro batches, and the HF Trainer's optimizer (``client``)
#: against DeepSpeed's torch AdamW (``torch``: the committed rows' optimizer); in the order they run (the runner's
#: budget may stop before the last)
MEMORY = [
    ("m_l8_mts_z2_gc", "llama-3.1-8b", dict(stage=2, mb=1, seq=2048, gc=True, lora=16, mts=MTS), "6% kind, 128k vocab"),
    ("m_q7_mts_z2_gc_mb2", "qwen2.5-7b", dict(stage=2, mb=2, seq=1024, gc=True, lora=16, mts=MTS),
     "6% kind, 152k vocab"),
    ("m_y9_mts_z2_gc_mb4", "yi-9b-shape", dict(stage=2, mb=4, seq=2048, gc=True, lora=16, mts=MTS),
     "6% kind, call 1's shape at another micro batch"),
    ("m_m7_mts_z2_gc_mb2", "mistral-7b", dict(stage=2, mb=2, seq=2048, gc=True, lora=16, mts=MTS),
     "6% kind, 32k vocab"),
    ("m_q3_full_z2_gc_client", "qwen2.5-3b", dict(stage=2, mb=2, seq=2048, gc=True), "the Trainer's optimizer, 3 B"),
    ("m_q17_full_z1_client", "qwen3-1.7b", dict(stage=1, mb=4, seq=1024), "the Trainer's optimizer, ZeRO-1, Qwen3"),
    ("m_q15_full_z3_client", "qwen2.5-1.5b", dict(stage=3, mb=2, seq=2048, zero_init=True),
     "the Trainer's optimizer, ZeRO-3 (fused: no foreach temporary per sub-group)"),
    ("m_l1_full_z2_client", "llama-3.2-1b", dict(stage=2, mb=4, seq=2048), "the Trainer's optimizer, full"),
    ("m_l1_full_z2_torch", "llama-3.2-1b", dict(stage=2, mb=4, seq=2048, adam="torch"),
     "the same with DeepSpeed's torch AdamW (foreach)"),
    ("m_q3_freeze4_z2_client", "qwen2.5-3b", dict(stage=2, mb=2, seq=2048, freeze=4),
     "the Trainer's optimizer, freeze tuning, default allocator"),
    ("m_y9_mts_z1_gc_mb1", "yi-9b-shape", dict(stage=1, mb=1, seq=2048, gc=True, lora=16, mts=MTS), "6% kind, ZeRO-1"),
    ("m_y9_mts_z2_mb1", "yi-9b-shape", dict(stage=2, mb=1, seq=1024, lora=16, mts=MTS),
     "6% kind without checkpointing"),
]
#: not scored: histories for the next pass (gradient accumulation holds earlier micro batches' gradients)
TRACES = [
    ("t2_q15_full_z2_ga2", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=1024, ga=2, trace="next_q15_full_z2_ga2",
                                                 trace_frames=True), "gradient accumulation, full fine-tuning"),
    ("t2_q7_lora_z2_ga4", "qwen2.5-7b", dict(stage=2, mb=1, seq=2048, ga=4, lora=16, gc=True,
                                              trace="next_q7_lora_z2_ga4", trace_frames=True),
     "gradient accumulation, LoRA"),
]
#: held out under expandable segments (LLaMA-Factory's launches: the Trainer's optimizer, zero.Init at ZeRO-3), the
#: kinds the issue found low first, the traced rows last
EXPANDABLE = [
    ("x_q7_freeze4_z2", "qwen2.5-7b", dict(stage=2, mb=2, seq=2048, freeze=4), "freeze, ZeRO-2, no checkpointing"),
    ("x_q3_freeze4_z3_gc", "qwen2.5-3b", dict(stage=3, mb=4, seq=2048, freeze=4, gc=True, zero_init=True),
     "freeze, ZeRO-3 in zero.Init, checkpointing"),
    ("x_q15_mts_z2_mb2", "qwen2.5-1.5b", dict(stage=2, mb=2, seq=2048, gc=True, lora=16, mts=MTS),
     "modules_to_save, tied, another micro batch than call 1's"),
    ("x_l8_mts_z2_gc", "llama-3.1-8b", dict(stage=2, mb=1, seq=2048, gc=True, lora=16, mts=MTS),
     "modules_to_save, ZeRO-2"),
    ("x_q3_lora_z2_gc", "qwen2.5-3b", dict(stage=2, mb=4, seq=2048, lora=16, gc=True), "LoRA, ZeRO-2"),
    ("x_l3_full_z2_gc", "llama-3.2-3b", dict(stage=2, mb=2, seq=2048, gc=True), "full, ZeRO-2"),
    ("x_l1_full_z1", "llama-3.2-1b", dict(stage=1, mb=4, seq=2048), "full, ZeRO-1, no checkpointing"),
    ("x_q15_freeze2_z2", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=2048, freeze=2), "freeze, ZeRO-2, small"),
    ("x_q7_lora_z3_gc", "qwen2.5-7b", dict(stage=3, mb=2, seq=2048, lora=16, gc=True, zero_init=True),
     "LoRA, ZeRO-3 in zero.Init"),
    ("x_l8_freeze4_z2", "llama-3.1-8b", dict(stage=2, mb=2, seq=2048, freeze=4, trace="next_x_l8_freeze4_z2",
                                             trace_frames=True), "freeze, ZeRO-2, no checkpointing, traced"),
    ("x_q7_freeze4_z3_gc", "qwen2.5-7b", dict(stage=3, mb=2, seq=2048, freeze=4, gc=True, zero_init=True,
                                               trace="next_x_q7_freeze4_z3_gc", trace_frames=True),
     "freeze, ZeRO-3 in zero.Init, checkpointing, traced"),
    ("x_q15_full_z3", "qwen2.5-1.5b", dict(stage=3, mb=2, seq=2048, zero_init=True, trace="next_x_q15_full_z3",
                                           trace_frames=True), "full, ZeRO-3 in zero.Init, traced"),
]

#: held out for the call after call 6 (``expandable2``): new shapes of the two kinds call 6's traces corrected (the
#: final norm's release under LoRA with ``modules_to_save``; every layer keeping its input under checkpointing with
#: freeze tuning), ZeRO-2 freeze tuning under checkpointing among them (the ZeRO-3 rows' correction, not yet measured
#: at ZeRO-2), and one traced row of each kind
EXPANDABLE2 = [
    ("x2_q3_mts_z2_gc_mb2", "qwen2.5-3b", dict(stage=2, mb=2, seq=2048, gc=True, lora=16, mts=MTS),
     "modules_to_save, tied, 3 B"),
    ("x2_l1_mts_z2_gc_mb4", "llama-3.2-1b", dict(stage=2, mb=4, seq=2048, gc=True, lora=16, mts=MTS),
     "modules_to_save, tied, 128k vocabulary"),
    ("x2_q17_mts_z1_gc_mb2", "qwen3-1.7b", dict(stage=1, mb=2, seq=2048, gc=True, lora=16, mts=MTS),
     "modules_to_save, ZeRO-1, Qwen3"),
    ("x2_l3_freeze2_z3_gc", "llama-3.2-3b", dict(stage=3, mb=2, seq=2048, freeze=2, gc=True, zero_init=True),
     "freeze, ZeRO-3 in zero.Init, checkpointing, LLaMA"),
    ("x2_q15_freeze4_z2_gc", "qwen2.5-1.5b", dict(stage=2, mb=4, seq=2048, freeze=4, gc=True),
     "freeze, ZeRO-2, checkpointing"),
    ("x2_l8_freeze4_z2_gc", "llama-3.1-8b", dict(stage=2, mb=1, seq=2048, freeze=4, gc=True),
     "freeze, ZeRO-2, checkpointing, 8 B"),
    ("x2_q7_mts_z2_gc_mb2", "qwen2.5-7b", dict(stage=2, mb=2, seq=1024, gc=True, lora=16, mts=MTS,
                                               trace="next2_x_q7_mts_z2_gc_mb2"), "modules_to_save, untied, traced"),
    ("x2_m7_freeze4_z3_gc", "mistral-7b", dict(stage=3, mb=2, seq=2048, freeze=4, gc=True, zero_init=True,
                                               trace="next2_x_m7_freeze4_z3_gc"), "freeze, ZeRO-3, checkpointing, traced"),
]


#: held out for the next call (``zero1_ga``): ZeRO-1 full fine-tuning with gradient accumulation at other shapes than
#: calls 7 and 9's (the gradients held from the first micro batch to the boundary, ``memory/segments.py``
#: ``_accumulated``), and ga 1 as the control; no ``grad_accum_dtype`` row: its default is the model's (bf16, the term
#: stays), and fp32 makes ZeRO-1 ``BF16_Optimizer`` (tests/memory/test_zero1_accumulation.py), not replayed
ZERO1_GA = [
    ("g_l1_full_z1_ga4", "llama-3.2-1b", dict(stage=1, mb=2, seq=2048, ga=4), "ZeRO-1, accumulation 4, LLaMA"),
    ("g_q17_full_z1_gc_ga2", "qwen3-1.7b", dict(stage=1, mb=4, seq=2048, gc=True, ga=2),
     "ZeRO-1, accumulation 2, Qwen3, checkpointing"),
    ("g_q05_full_z1_ga8", "qwen2.5-0.5b", dict(stage=1, mb=4, seq=1024, ga=8), "ZeRO-1, accumulation 8"),
    ("g_l1_full_z1_ga1", "llama-3.2-1b", dict(stage=1, mb=2, seq=2048), "ZeRO-1, no accumulation: the control"),
]

#: held out for the next call (``zero2_ga``): ZeRO-2 full fine-tuning with gradient accumulation at other shapes than
#: calls 1, 2 and 9's (the first micro batch's flat gradient partition held to the boundary, each later one reducing
#: into a new one: ``memory/segments.py`` ``partition_gradients``), and the ga 1 control of the ga 8 row's shape
ZERO2_GA = [
    ("k_q17_full_z2_gc_ga2", "qwen3-1.7b", dict(stage=2, mb=4, seq=2048, gc=True, ga=2),
     "ZeRO-2, accumulation 2, Qwen3, checkpointing (call 10's g_q17_full_z1_gc_ga2 at ZeRO-2)"),
    ("k_l1_full_z2_ga8", "llama-3.2-1b", dict(stage=2, mb=1, seq=2048, ga=8), "ZeRO-2, accumulation 8, LLaMA"),
    ("k_q15_full_z2_gc_ga4", "qwen2.5-1.5b", dict(stage=2, mb=2, seq=2048, gc=True, ga=4),
     "ZeRO-2, accumulation 4, checkpointing"),
    ("k_l1_full_z2_ga1", "llama-3.2-1b", dict(stage=2, mb=1, seq=2048), "ZeRO-2, no accumulation: the control"),
]


def spec(row: str, model: str, settings: dict, split: str, why: str = "") -> dict:
    """A probe spec with the protocol's steps, the HF Trainer's optimizer unless told, its wall-time estimate (as
    ``matrix.spec``) and the predicted peak."""
    from zeropilot.memory.plan import make_plan
    from zeropilot.memory.speed import speed_for

    out = {"name": model, "row": row, "split": split, "model": SHAPES[model], "warmup": 2, "steps": 7}
    if "adam" not in settings:
        out["adam"] = "client"
    out.update(settings)
    if why:
        out["note"] = why
    plan = make_plan(timing_inputs(out), speed=speed_for("H100"))
    out["est_wall_s"] = int(START_S + 7 * plan.time.step_s * 1.5 + (25 if out.get("trace") else 0))
    out["pred_gib"] = round(plan.gpu_peak_bytes / 2**30, 2)
    return out


def rows(which: str) -> list:
    if which == "memory":
        return [spec(r, m, s, "holdout", w) for r, m, s, w in MEMORY] + [spec(r, m, s, "trace", w)
                                                                          for r, m, s, w in TRACES]
    if which in ("zero1_ga", "zero2_ga"):
        return [spec(r, m, s, "holdout", w) for r, m, s, w in (ZERO1_GA if which == "zero1_ga" else ZERO2_GA)]
    return [spec(r, m, dict(s, alloc_conf=EXP), "trace" if s.get("trace") else "holdout", w)
            for r, m, s, w in (EXPANDABLE2 if which == "expandable2" else EXPANDABLE)]


#: run with another tree's ``src/`` on the path: each spec's prediction there
_BASELINE = """
import json, sys
from dataclasses import fields, replace
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from zeropilot.memory.plan import make_plan  # the tree's, before fit.py puts this tree's src/ first
from zeropilot.memory.inputs import PlanInputs
from fit import inputs_of
for line in sys.stdin:
    s = json.loads(line)
    i = inputs_of(s, 79.1)
    if 'trainer_optimizer' in {f.name for f in fields(PlanInputs)}:
        i = replace(i, trainer_optimizer=s.get('adam') == 'client')
    print(round(make_plan(i).gpu_peak_bytes / 2**30, 2))
"""


def baseline(specs: list, src: str) -> list:
    """Each spec's predicted peak by the ``src/`` tree at ``src`` (this directory's ``fit.inputs_of``)."""
    text = "".join(json.dumps(s) + "\n" for s in specs)
    out = subprocess.run([sys.executable, "-c", _BASELINE, src, str(HERE)], input=text, capture_output=True,
                         text=True, check=True, env={"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"})
    return [float(x) for x in out.stdout.split()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["memory", "expandable", "expandable2", "zero1_ga", "zero2_ga"])
    ap.add_argument("out")
    ap.add_argument("--baseline", help="a src/ directory: add its predictions as pred_gib_baseline")
    ap.add_argument("--baseline-name", default="", help="what the baseline is (a commit), written as note_baseline")
    args = ap.parse_args(argv)
    specs = rows(args.which)
    if args.baseline:
        for s, gib in zip(specs, baseline(specs, args.baseline)):
            s["pred_gib_baseline"] = gib
            if args.baseline_name:
                s["meta"] = {"baseline": args.baseline_name}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(s) + "\n" for s in specs))
    print(f"{len(specs)} rows -> {args.out}")
    for s in specs:
        print(f"  {s['row']:24s} pred {s['pred_gib']:6.2f} GiB" + (f" (baseline {s['pred_gib_baseline']:6.2f})"
                                                                    if "pred_gib_baseline" in s else "")
              + f"  est {s['est_wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
