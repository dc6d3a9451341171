"""A raw DeepSpeed loop on a Qwen2-shaped causal LM (no zeropilot code): the GPU benchmark's workload.

    torchrun --nproc_per_node N train_lm.py SPEC_JSON

SPEC keys: size (qwen0.5b | qwen7b | tiny), stage, lora (rank or 0), mb, seq, steps, save_at (list of steps;
engine.save_checkpoint into save_dir), gather (stage3_gather_16bit_weights_on_model_save), gc (gradient
checkpointing), zero_init (build inside deepspeed.zero.Init as the HF Trainer does), cap_gib (emulate a card of
this size: the allocator gets cap_gib minus what this process holds outside PyTorch, measured after CUDA
init, via torch.cuda.set_per_process_memory_fraction), ga (gradient accumulation steps; ``steps`` counts micro
steps), offload_opt / offload_param ("cpu": ZeRO offload; the optimizer stays torch's AdamW on the host),
max_len (truncate every batch to this many tokens), rbs / pbs (bucket sizes), unused_head (elements of a
frozen nn.Linear never used in forward: only a ZeRO-3 16-bit gather touches it), save16 (call
engine.save_16bit_model at the end), outside_grow_at (step at which a helper process takes all but
outside_leave_gib of the GPU), empty_cache (torch.cuda.empty_cache() after every step, as the HF Trainer's
torch_empty_cache_steps=1), cap_after_init_gib (cap the allocator only after deepspeed.initialize), warmup.
Prints one line ``RESULT {json}`` on rank 0.
"""

import json
import os
import subprocess
import sys
import time

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM

SIZES = {
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024),
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936),
    "qwen7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                   num_key_value_heads=4, vocab_size=152064),
}
GiB = 1 << 30
HOG = "import torch,sys,time; x=torch.empty(int(sys.argv[1]),dtype=torch.uint8,device='cuda'); print('hog',flush=True); time.sleep(600)"


def main():
    spec = json.loads(sys.argv[1])
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    deepspeed.init_distributed()
    if spec.get("cap_gib"):
        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        outside = total - free - torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction((spec["cap_gib"] * GiB - outside) / total)
    stage = spec.get("stage", 2)
    ds = {"train_micro_batch_size_per_gpu": spec.get("mb", 1), "gradient_accumulation_steps": spec.get("ga", 1),
          "bf16": {"enabled": True}, "steps_per_print": 10 ** 9,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
          "zero_optimization": {"stage": stage, "reduce_bucket_size": int(spec.get("rbs", 5e8)),
                                "stage3_prefetch_bucket_size": int(spec.get("pbs", 5e7)),
                                "stage3_gather_16bit_weights_on_model_save": bool(spec.get("gather", False))}}
    for part in ("opt", "param"):
        if spec.get(f"offload_{part}"):
            key = "offload_optimizer" if part == "opt" else "offload_param"
            ds["zero_optimization"][key] = {"device": spec[f"offload_{part}"]}
    cfg = AutoConfig.for_model("qwen2", max_position_embeddings=max(spec.get("seq", 512), 512), **SIZES[spec["size"]])
    if spec.get("zero_init") and stage == 3:
        from transformers.integrations import HfDeepSpeedConfig
        keep = HfDeepSpeedConfig(ds)  # noqa: F841 - from_config builds inside zero.Init while it lives
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    else:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if spec.get("unused_head"):
        n = int(spec["unused_head"])
        ctx = deepspeed.zero.Init(config_dict_or_path=ds) if stage == 3 else torch.device("cuda")
        with ctx:
            model.export_head = torch.nn.Linear(n // 65536, 65536, bias=False, dtype=torch.bfloat16)
        model.export_head.weight.requires_grad_(False)
    if spec.get("gc"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if spec.get("lora"):
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=spec["lora"], lora_alpha=2 * spec["lora"],
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds)
    if spec.get("cap_after_init_gib"):  # a smaller card from here on (the init's transient peak is not the point)
        total = torch.cuda.get_device_properties(local).total_memory
        torch.cuda.set_per_process_memory_fraction(spec["cap_after_init_gib"] * GiB / total)
    gen = torch.Generator(device="cuda").manual_seed(engine.global_rank)
    times, hog = [], None
    try:
        for step in range(1, spec.get("steps", 4) + 1):
            if spec.get("outside_grow_at") == step and engine.global_rank == 0:
                free, _ = torch.cuda.mem_get_info()
                take = free - int(spec.get("outside_leave_gib", 1) * GiB)
                hog = subprocess.Popen([sys.executable, "-c", HOG, str(take)], stdout=subprocess.PIPE, text=True,
                                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[local]))
                hog.stdout.readline()
            torch.cuda.synchronize()
            t = time.perf_counter()
            seq = min(spec.get("seq", 512), spec.get("max_len") or spec.get("seq", 512))
            ids = torch.randint(0, cfg.vocab_size, (spec.get("mb", 1), seq), device="cuda", generator=gen)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            if spec.get("empty_cache"):  # as the HF Trainer's torch_empty_cache_steps=1 does
                torch.cuda.empty_cache()
            if step in spec.get("save_at", []):
                engine.save_checkpoint(spec["save_dir"])
        if spec.get("save16"):
            engine.save_16bit_model(spec["save_dir"])
    finally:
        if hog is not None:
            hog.kill()
    if engine.global_rank == 0:
        warm = times[spec.get("warmup", 3):]
        print("RESULT " + json.dumps({"spec": spec, "step_seconds": times,
                                      "median_s": sorted(warm)[len(warm) // 2] if warm else None,
                                      "peak_reserved": torch.cuda.max_memory_reserved()}), flush=True)


if __name__ == "__main__":
    main()
