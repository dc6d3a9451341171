"""LoRA's fp32 copies of its layers' inputs, saved for backward, per token per decoder layer (CPU).

PEFT keeps adapters in fp32 (``autocast_adapter_dtype``) on a bf16 model and casts each wrapped layer's
input to fp32 for lora_A, which saves that copy. DeepSpeed casts adapters to bf16 too, except for a model
built inside zero.Init, so the plan adds ``4 × (5h + q + i + 7r)`` bytes per token per layer (``2h``
and ``4r`` for fused qkv / gate_up) for ZeRO-3 + zero.Init + LoRA (``memory/gpu.py lora_fp32_inputs``). This counts, with
``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters excluded), the bytes of saved
fp32 activations with LoRA minus without, between 4 and 2 layers, against that formula.
Writes ``results/lora_saved.json``. Usage: python bench/plan/lora_saved.py
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parent
MB, SEQ = 2, 256


def fp32_saved(model_type: str, lora: bool, layers: int, h: int, i: int) -> int:
    cfg = AutoConfig.for_model(model_type, hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    if lora:
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if t.dtype == torch.float32 and st.data_ptr() not in params:
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    x = torch.randint(0, 1000, (MB, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=x, labels=x)
    return sum(seen.values())


def main() -> None:
    rows = []
    for model_type, fused in (("llama", False), ("qwen2", False), ("phi3", True)):
        for h, i in ((256, 1024), (256, 2048), (512, 1024)):
            per = [(fp32_saved(model_type, lora, 4, h, i) - fp32_saved(model_type, lora, 2, h, i)) / 2 / (MB * SEQ)
                   for lora in (False, True)]
            formula = 4 * ((2 if fused else 5) * h + h + i + (4 if fused else 7) * 16)
            rows.append({"model_type": model_type, "hidden": h, "intermediate": i, "measured_B": per[1] - per[0],
                         "formula_B": formula})
    out = {"rows": rows, "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                                      "peft": __import__("peft").__version__}}
    (HERE / "results" / "lora_saved.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
