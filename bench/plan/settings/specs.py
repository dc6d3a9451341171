"""Issue 26's GPU check of the settings the plan now models, pre-registered: the probe specs and the plan's
prediction for each, written before the run.

One random-initialised Llama-like model (Llama 3.2 1B's shapes with an untied output layer, 1.50 B parameters),
DeepSpeed ZeRO at world size 1 on one H200, one setting per row beside two controls the plan already knew (LoRA on
all linear layers; full fine-tuning with AdamW):

  LoRA on q_proj,v_proj only (with and without gradient checkpointing); ``modules_to_save`` embed_tokens,lm_head
  (ZeRO-3 and ZeRO-2);
  freeze tuning of the last 2 layers (no checkpointing) and the last 4 (checkpointing); QLoRA 4-bit under ZeRO-2
  and ZeRO-3 (and once more under ZeRO-3 with the storage dtype left at uint8: whether it runs); Liger's kernels
  with LoRA; bitsandbytes' 8-bit AdamW on a full fine-tuning.

Writes ``data/specs.jsonl`` (the specs ``device.sh`` runs; ``pred_gib`` packs them onto the GPU) and
``data/predictions.jsonl`` (per row: the plan's allocated, reserved and nvidia-smi peaks, its phase, the trainable
parameters and what it lists as not modelled). ``compare.py`` sets them against the measurement.
Usage: python bench/plan/settings/specs.py [--check]   (--check: exit 1 if the committed files differ)
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rows import spec_inputs  # noqa: E402

from zeropilot.memory.gpu import estimate_gpu  # noqa: E402
from zeropilot.memory.inputs import GIB, Freeze, PlanInputs  # noqa: E402
from zeropilot.memory.plan import unmodelled  # noqa: E402

MODEL = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
         "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
NAME = "llama-1.5b-untied"
H200_GIB = 139.8
Z3 = {"stage": 3, "zero_init": True, "mb": 2, "seq": 2048}

#: (row, what it checks, spec without the model)
ROWS = [
    ("lora_all", "control: LoRA r16 on all linear layers (as the rows the plan was fitted on)", {**Z3, "lora": 16}),
    ("lora_qv", "LoRA on q_proj,v_proj only, no checkpointing", {**Z3, "lora": 16, "targets": ["q_proj", "v_proj"]}),
    ("lora_qv_gc", "LoRA on q_proj,v_proj only, checkpointing",
     {**Z3, "lora": 16, "targets": ["q_proj", "v_proj"], "gc": True}),
    ("lora_mts", "LoRA + modules_to_save embed_tokens,lm_head",
     {**Z3, "lora": 16, "mts": ["embed_tokens", "lm_head"], "gc": True}),
    ("lora_mts_z2", "LoRA + modules_to_save embed_tokens,lm_head, ZeRO-2",
     {"stage": 2, "mb": 2, "seq": 2048, "lora": 16, "mts": ["embed_tokens", "lm_head"], "gc": True}),
    ("freeze2", "freeze tuning, last 2 layers, no checkpointing", {**Z3, "freeze": 2}),
    ("freeze4_gc", "freeze tuning, last 4 layers, checkpointing", {**Z3, "freeze": 4, "gc": True}),
    ("qlora_z2", "QLoRA 4-bit (nf4, double quantization), ZeRO-2",
     {"stage": 2, "mb": 2, "seq": 2048, "lora": 16, "quant": 4, "double_quant": True, "gc": True}),
    ("qlora_z3", "QLoRA 4-bit, ZeRO-3 (zero.Init, bnb_4bit_quant_storage bf16)",
     {**Z3, "lora": 16, "quant": 4, "double_quant": True, "gc": True}),
    ("qlora_z3_uint8", "QLoRA 4-bit, ZeRO-3, bnb_4bit_quant_storage left at uint8 (a script's default): does it run?",
     {**Z3, "lora": 16, "quant": 4, "double_quant": True, "gc": True, "quant_storage": "uint8"}),
    ("liger_lora", "Liger (LLaMA-Factory's enable_liger_kernel) with LoRA on all linear layers",
     {**Z3, "lora": 16, "liger": True, "gc": True}),
    ("full_adamw", "control: full fine-tuning, AdamW, ZeRO-2", {"stage": 2, "mb": 2, "seq": 1024, "gc": True}),
    ("full_adamw8", "full fine-tuning, bitsandbytes 8-bit AdamW, ZeRO-2",
     {"stage": 2, "mb": 2, "seq": 1024, "gc": True, "optim": "adamw_8bit"}),
]


def inputs_of(spec: dict) -> PlanInputs:
    """The plan inputs of a spec: ``rows.spec_inputs`` (ZeRO, batch, LoRA rank, checkpointing) and the settings of
    ``zero_mem_probe_plan.py``'s spec keys ``targets``, ``mts``, ``freeze``, ``quant``, ``double_quant``, ``liger``
    and ``optim``."""
    out: dict = {}
    if spec.get("targets"):
        out["lora_targets"] = tuple(spec["targets"])
    if spec.get("mts"):
        out["modules_to_save"] = tuple(spec["mts"])
    if spec.get("freeze"):
        out["freeze"] = Freeze(int(spec["freeze"]))
    if spec.get("quant"):
        out.update(quant_bits=int(spec["quant"]), double_quant=bool(spec.get("double_quant")))
    if spec.get("liger"):
        out["fused_loss"] = "liger"
    if spec.get("optim"):
        out["optimizer"] = spec["optim"]
    return replace(spec_inputs(spec, H200_GIB), **out)


def spec_of(row: str, body: dict) -> dict:
    return {"name": NAME, "row": row, "model": MODEL, **body}


def prediction(row: str, what: str, spec: dict) -> dict:
    inputs = inputs_of(spec)
    est = estimate_gpu(inputs)
    return {"row": row, "what": what, "predicted_allocated_gib": round(est.allocated_peak_bytes / GIB, 3),
            "predicted_reserved_gib": round(est.reserved_peak_bytes / GIB, 3),
            "predicted_peak_gib": round(est.peak_bytes / GIB, 3), "peak_phase": est.peak_phase,
            "trainable": est.trainable, "not_modelled": [s for s, _ in unmodelled(inputs)]}


def build():
    specs, preds = [], []
    for row, what, body in ROWS:
        spec = spec_of(row, body)
        pred = prediction(row, what, spec)
        spec["pred_gib"] = pred["predicted_peak_gib"]
        specs.append(json.dumps(spec))
        preds.append(json.dumps(pred))
    return "\n".join(specs) + "\n", "\n".join(preds) + "\n"


def main(argv) -> int:
    targets = (HERE / "data" / "specs.jsonl", HERE / "data" / "predictions.jsonl")
    texts = build()
    if "--check" in argv:
        stale = [str(p) for p, t in zip(targets, texts) if not p.is_file() or p.read_text() != t]
        print("differs: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    for p, t in zip(targets, texts):
        p.write_text(t)
    print(texts[1], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
