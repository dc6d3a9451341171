"""A small raw DeepSpeed training loop (no HF Trainer): what `zeropilot run -- deepspeed ...` watches.

    deepspeed --num_gpus 2 examples/raw-deepspeed/train.py --deepspeed_config examples/raw-deepspeed/ds_config.json

Runs on GPUs, or on CPU with DS_ACCELERATOR=cpu (gloo). A tiny Qwen2-shaped model (transformers'
``from_config``, no download; ``--size small`` or ``qwen0.5b`` for larger ones, ``--gradient-checkpointing`` to
recompute each layer) is trained on random tokens for --steps optimizer steps and saved with
``engine.save_checkpoint`` every --save-every steps and at the end. Nothing here knows about zeropilot.
"""

import argparse
import os

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256),
    "small": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=32000),
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, vocab_size=151936),  # Qwen2.5-0.5B's shape: one GPU, a real step
}


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--save-dir", default="raw-deepspeed-out")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute each decoder layer in the backward")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p = deepspeed.add_config_arguments(p)
    return p.parse_args()


def main():
    args = parse()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    config = AutoConfig.for_model("qwen2", max_position_embeddings=max(args.seq, 64), **SIZES[args.size])
    model = AutoModelForCausalLM.from_config(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    gen = torch.Generator().manual_seed(1 + engine.global_rank)
    last = engine.global_steps
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        ids = torch.randint(0, config.vocab_size, (engine.train_micro_batch_size_per_gpu(), args.seq), generator=gen)
        ids = ids.to(engine.device)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if engine.global_steps != last and engine.global_steps % args.save_every == 0:
            engine.save_checkpoint(args.save_dir)
        last = engine.global_steps
    if engine.global_steps % args.save_every:
        engine.save_checkpoint(args.save_dir)
    if engine.global_rank == 0:
        print(f"trained {engine.global_steps} steps; checkpoints in {args.save_dir}")


if __name__ == "__main__":
    main()
