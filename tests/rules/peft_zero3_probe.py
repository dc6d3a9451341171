"""What ``deepspeed.initialize`` does with a PEFT LoRA model with ``modules_to_save`` copies, built as LLaMA-Factory
0.9.5 builds it (LF002's witness).

One fresh process, one rank (gloo): ``python -m tests.rules.peft_zero3_probe OUT.json``. Each case builds a tiny
bf16 Llama the way the HF Trainer loads a model (``HfDeepSpeedConfig`` alive, so ZeRO-3 builds it inside
``zero.Init``), adds LoRA with ``modules_to_save`` through ``get_peft_model`` as LLaMA-Factory's
``model/adapter.py`` ``_setup_lora_tuning`` calls it (PEFT's default ``autocast_adapter_dtype``: the adapters in
fp32), casts every trainable tensor to fp32 where LLaMA-Factory does (``cast_trainable_params_to_fp32``: not under
ZeRO-3 without quantization, ``init_adapter``), then calls ``deepspeed.initialize`` and runs one step. Its result:
``"ok"`` or ``"ExceptionType at file:line: code"``, and the dtypes of the trainable tensors DeepSpeed partitions.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from typing import Any, Dict

#: name -> (ZeRO stage, offload_param device or None, LLaMA-Factory casts the trainable tensors to fp32,
#: modules_to_save)
CASES = {
    "z3_copies": (3, None, False, ["embed_tokens", "lm_head"]),  # LLaMA-Factory: lora + additional_target, ZeRO-3
    "z3_copies_offload_param": (3, "cpu", False, ["embed_tokens", "lm_head"]),
    "z3_no_copies": (3, None, False, None),  # plain LoRA under ZeRO-3: adapters alone, all fp32
    "z2_copies": (2, None, True, ["embed_tokens", "lm_head"]),  # ZeRO-2: LLaMA-Factory casts them all to fp32
}


def run_case(stage: int, offload_param, cast_fp32: bool, modules_to_save) -> Dict[str, Any]:
    import deepspeed
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
          "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
    if offload_param:
        ds["zero_optimization"]["offload_param"] = {"device": offload_param}
    keep = HfDeepSpeedConfig(ds)  # noqa: F841 - alive while the model is built: zero.Init under ZeRO-3
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # LLaMA-Factory loads in the compute dtype
    model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", modules_to_save=modules_to_save,
                                             task_type="CAUSAL_LM"))
    trained = [p for p in model.parameters() if p.requires_grad]
    if cast_fp32:
        for p in trained:
            p.data = p.data.to(torch.float32)
    out: Dict[str, Any] = {"dtypes": sorted({str(p.dtype).replace("torch.", "") for p in trained})}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=ds)
        x = torch.randint(0, 256, (1, 16))
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
        out["result"] = "ok"
    except Exception as exc:  # the outcome is the point: every exception type is recorded
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        out["result"] = (f"{type(exc).__name__} at {frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno}: "
                         f"{frame.line}")
    del keep
    return out


def main(out_path: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import deepspeed

    # DeepSpeed's CPU shm all-reduce op is a speed path compiled with gcc on first use; gloo does the same.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    results = {name: run_case(*case) for name, case in CASES.items()}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
