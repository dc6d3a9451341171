"""Issue 26's GPU check of the settings the plan now models, pre-registered: the probe specs and the plan's
prediction for each, written before the run.

One random-initialised Llama-like model (Llama 3.2 1B's shapes with an untied output layer, 1.50 B parameters),
DeepSpeed ZeRO at world size 1 on one H200, one setting per row beside controls the plan already knew (LoRA on all
linear layers; full fine-tuning with AdamW). One set of rows per GPU call (``CALL``): call 1 (``data/call1``, as
committed before it) had LoRA on q_proj,v_proj, ``modules_to_save``, freeze tuning, QLoRA, Liger and 8-bit AdamW;
call 2 (``ROWS``) measures QLoRA and 8-bit AdamW again after what call 1 showed, with new held-out shapes.

Call 3 (``ROWS["call3"]``, issue 35) moves to 7-8 B shapes, where a large trained part was under-predicted by 14-18%:
freeze tuning of 2, 4, 8 and 16 layers with and without checkpointing and ``modules_to_save`` embed_tokens,lm_head, on
a Llama 3.1 8B shape and a Qwen2 7B shape. Each spec names its ``split``, declared before the run: ``shape`` rows (the
Llama shape's 4 and 8 layers and its ``modules_to_save`` row, their allocator history recorded) are the ones a change
to the model may be read off; ``held_out`` rows only score it; ``explore`` rows ask whether a launch starts at all.

Writes ``data/CALL/specs.jsonl`` (the specs ``device.sh`` runs; ``pred_gib`` packs them onto the GPU) and
``data/CALL/predictions.jsonl`` (per row: the plan's allocated, reserved and nvidia-smi peaks, its phase, the
trainable parameters and what it lists as not modelled). ``compare.py CALL`` sets them against the measurement.
Usage: python bench/plan/settings/specs.py [--check] [--predictions NAME]
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
#: call 3's shapes: Llama 3.1 8B and Qwen2 7B (their Hugging Face configs' sizes, untied output layers)
LLAMA8 = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
          "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0}
QWEN7 = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
         "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
         "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0}
Z3 = {"stage": 3, "zero_init": True, "mb": 2, "seq": 2048}

#: the GPU call the next rows are for: its files are data/CALL/ (call1: the first twelve rows, measured; their specs and
#: predictions as committed before that call)
CALL = "call3"

#: (row, what it checks, spec without the model). Call 2 measures again what call 1 got wrong, after finding why:
#: the probe left the quantized models (from_pretrained) in eval mode, where checkpointing is off (it now calls
#: train(), as the HF Trainer does), and the plan counted LoRA's fp32 input copies for QLoRA under ZeRO-3, which
#: transformers builds outside zero.Init; the 8-bit AdamW rows now go through the allocator replay. New shapes are
#: held out of call 1 (which was read after the fixes, post hoc).
CALL2 = [
    ("lora_all", "control: LoRA r16 on all linear layers (call 1's row, as measured there)", {**Z3, "lora": 16}),
    ("full_adamw", "control: full fine-tuning, AdamW, ZeRO-2 (call 1's row)", {"stage": 2, "mb": 2, "seq": 1024,
                                                                               "gc": True}),
    ("qlora_z2", "QLoRA 4-bit (nf4, double quantization), ZeRO-2, checkpointing now in effect",
     {"stage": 2, "mb": 2, "seq": 2048, "lora": 16, "quant": 4, "double_quant": True, "gc": True}),
    ("qlora_z3", "QLoRA 4-bit, ZeRO-3 (bnb_4bit_quant_storage bf16), checkpointing now in effect",
     {**Z3, "lora": 16, "quant": 4, "double_quant": True, "gc": True}),
    ("qlora_z3_nogc", "QLoRA 4-bit, ZeRO-3, no checkpointing: adapters cast to bf16 outside zero.Init",
     {**Z3, "lora": 16, "quant": 4, "double_quant": True}),
    ("qlora_z2_long", "QLoRA 4-bit without double quantization, ZeRO-2, micro batch 2 x 4096, checkpointing",
     {"stage": 2, "mb": 2, "seq": 4096, "lora": 16, "quant": 4, "gc": True}),
    ("qlora_z3_uint8", "QLoRA 4-bit, ZeRO-3, bnb_4bit_quant_storage left at uint8 (a script's default): does it run?",
     {**Z3, "lora": 16, "quant": 4, "double_quant": True, "gc": True, "quant_storage": "uint8"}),
    ("full_adamw8", "full fine-tuning, bitsandbytes 8-bit AdamW, ZeRO-2 (call 1's row)",
     {"stage": 2, "mb": 2, "seq": 1024, "gc": True, "optim": "adamw_8bit"}),
    ("full_adamw8_z1", "full fine-tuning, bitsandbytes 8-bit AdamW, ZeRO-1, micro batch 2 x 2048",
     {"stage": 1, "mb": 2, "seq": 2048, "gc": True, "optim": "adamw_8bit"}),
    ("lora_mts", "LoRA + modules_to_save embed_tokens,lm_head, ZeRO-3 in zero.Init: does it run?",
     {**Z3, "lora": 16, "mts": ["embed_tokens", "lm_head"], "gc": True}),
]

MTS = {"lora": 16, "mts": ["embed_tokens", "lm_head"], "gc": True}
SHAPES = {"l8": ("llama-3.1-8b-shape", LLAMA8), "q7": ("qwen2-7b-shape", QWEN7)}
#: rows whose allocator history is recorded: the shaping rows (``trace_frames``: the frames of each allocation of
#: 32 MiB or more)
SHAPING = ("l8_f4", "l8_f4_gc", "l8_f8", "l8_f8_gc", "l8_mts_z2")


def _call3():
    """Issue 35's rows: ZeRO-2, micro batch 2 x 2048, AdamW, world size 1; per shape freeze tuning of the last 2, 4,
    8 and 16 layers with and without checkpointing and LoRA r16 with ``modules_to_save`` embed_tokens,lm_head, then
    ZeRO-3 rows: freeze tuning in zero.Init, ``modules_to_save`` in zero.Init with every trainable tensor cast to fp32
    (as LLaMA-Factory launches it, PEFT's fp32 adapters beside bf16 copies, DeepSpeed stops in ``defragment``), and
    the Qwen shape's ``modules_to_save`` built on the GPU without zero.Init (DeepSpeed casts it all to bf16). The
    Qwen shape's 16 layers run with checkpointing only: each 16-layer row has the GPU to itself, and one call
    has ten minutes."""
    rows = []
    for key, (name, model) in SHAPES.items():
        for layers in (2, 4, 8, 16):
            for gc in (False, True) if (key, layers) != ("q7", 16) else (True,):  # one GPU call's time: 3 of 4
                row = f"{key}_f{layers}" + ("_gc" if gc else "")
                what = (f"{name}: freeze tuning, the last {layers} layers trained, "
                        f"{'with' if gc else 'without'} checkpointing, ZeRO-2")
                rows.append((row, what, {"name": name, "model": model, "stage": 2, "mb": 2, "seq": 2048,
                                         "freeze": layers, "gc": gc}))
        rows.append((f"{key}_mts_z2", f"{name}: LoRA r16 + modules_to_save embed_tokens,lm_head, ZeRO-2",
                     {"name": name, "model": model, "stage": 2, "mb": 2, "seq": 2048, **MTS}))
    l8, q7 = SHAPES["l8"], SHAPES["q7"]
    rows += [
        ("l8_f8_z3", f"{l8[0]}: freeze tuning, 8 layers, checkpointing, ZeRO-3 in zero.Init",
         {"name": l8[0], "model": l8[1], **Z3, "freeze": 8, "gc": True}),
        ("q7_f4_z3", f"{q7[0]}: freeze tuning, 4 layers, ZeRO-3 in zero.Init",
         {"name": q7[0], "model": q7[1], **Z3, "freeze": 4}),
        ("q7_mts_z3_built", f"{q7[0]}: LoRA + modules_to_save, ZeRO-3, model built on the GPU (no zero.Init)",
         {"name": q7[0], "model": q7[1], "stage": 3, "mb": 2, "seq": 2048, **MTS}),
        ("l8_mts_z3_fp32", f"{l8[0]}: LoRA + modules_to_save, ZeRO-3 in zero.Init, every trainable tensor cast to "
                           "fp32 (one dtype for defragment; as LLaMA-Factory launches it, PEFT's fp32 adapters beside "
                           "bf16 copies, it stops there: call 1, call 2, tests/rules)",
         {"name": l8[0], "model": l8[1], **Z3, **MTS, "trainable_fp32": True}),
    ]
    out = []
    for row, what, body in rows:
        split = "shape" if row in SHAPING else "explore" if row == "l8_mts_z3_fp32" else "held_out"
        extra = {"trace": f"call3_{row}", "trace_frames": True} if row in SHAPING else {}
        out.append((row, what, {**body, "split": split, **extra}))
    return out


#: each call's rows (call 1's are in data/call1 only, as committed before it)
ROWS = {"call2": CALL2, "call3": _call3()}


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
    return {"name": NAME, "row": row, "model": MODEL, **body}  # call 3's rows name their own model


def prediction(row: str, what: str, spec: dict) -> dict:
    inputs = inputs_of(spec)
    est = estimate_gpu(inputs)
    return {"row": row, "what": what, "predicted_allocated_gib": round(est.allocated_peak_bytes / GIB, 3),
            "predicted_reserved_gib": round(est.reserved_peak_bytes / GIB, 3),
            "predicted_peak_gib": round(est.peak_bytes / GIB, 3), "peak_phase": est.peak_phase,
            "trainable": est.trainable, "not_modelled": [s for s, _ in unmodelled(inputs)],
            **({"split": spec["split"]} if "split" in spec else {})}


def build(call: str = CALL):
    specs, preds = [], []
    for row, what, body in ROWS[call]:
        spec = spec_of(row, body)
        pred = prediction(row, what, spec)
        spec["pred_gib"] = pred["predicted_peak_gib"]
        specs.append(json.dumps(spec))
        preds.append(json.dumps(pred))
    return "\n".join(specs) + "\n", "\n".join(preds) + "\n"


def main(argv) -> int:
    """``--check``: exit 1 if the committed files differ; ``--predictions NAME``: write only the predictions, as
    ``data/CALL/NAME`` (a candidate change's, committed beside the plan's before the call)."""
    (HERE / "data" / CALL).mkdir(parents=True, exist_ok=True)
    name = argv[argv.index("--predictions") + 1] if "--predictions" in argv else "predictions.jsonl"
    targets = (HERE / "data" / CALL / "specs.jsonl", HERE / "data" / CALL / name)
    texts = build()
    if name != "predictions.jsonl":  # the specs (with the plan's pred_gib, which packs them) stay as committed
        targets, texts = targets[1:], texts[1:]
    if "--check" in argv:
        stale = [str(p) for p, t in zip(targets, texts) if not p.is_file() or p.read_text() != t]
        print("differs: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    for p, t in zip(targets, texts):
        p.write_text(t)
    print(texts[-1], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
