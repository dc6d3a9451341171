"""Real DeepSpeed saves on CPU (gloo, 2 ranks) whose sizes test ``zeropilot.memory.disk``.

Usage: python ds_save_worker.py OUT_DIR  -> writes OUT_DIR/sizes.json: {case: {file: bytes}}.
Cases: full fine-tuning at ZeRO-2 and all-linear LoRA with frozen weights excluded at ZeRO-3, bf16.
"""
import json
import os
import socket
import sys
from pathlib import Path

MODEL = dict(model_type="qwen2", hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=4000, tie_word_embeddings=False)
CASES = [("z2_full", 2, None, False), ("z3_lora_excl", 3, 8, True)]


def _worker(rank, world, port, out):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), DS_ACCELERATOR="cpu")
    import deepspeed
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    sizes = {}
    for name, stage, lora, exclude in CASES:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**MODEL), dtype=torch.float32)
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=lora, target_modules="all-linear", task_type="CAUSAL_LM"))
        params = [p for p in model.parameters() if p.requires_grad]
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-3), config={
            "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9})
        ids = torch.randint(0, MODEL["vocab_size"], (1, 8))
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
        save = Path(out) / name
        engine.save_checkpoint(str(save), tag="t", exclude_frozen_parameters=exclude)
        torch.distributed.barrier()
        if rank == 0:
            sizes[name] = {f.name: f.stat().st_size for f in (save / "t").iterdir()}
        engine.destroy()
    if rank == 0:
        (Path(out) / "sizes.json").write_text(json.dumps(sizes))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown: it can abort a rank (see tests/witness/common.py: exit_rank)


if __name__ == "__main__":
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, sys.argv[1]), nprocs=2)
