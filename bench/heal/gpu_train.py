"""An HF Trainer + DeepSpeed script as users write them (knows nothing of zeropilot): the GPU heal run's workload.

    torchrun --nproc_per_node 1 gpu_train.py OUT_DIR --deepspeed ds.json --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 4 --gradient_checkpointing false [--steps 12 --save-steps 4 --short 1024
        --long 1536 --long-from 5]

A Qwen2-0.5B-shaped model from its config (bf16, no download), random tokens. The samples are taken in order (a
sequential sampler): those of optimizer steps before ``--long-from`` are ``--short`` tokens long, the later ones
``--long`` (a run whose batches grow longer later, as with data sorted by length or a curriculum). With
``CAP_BYTES`` set the process emulates a smaller card: ``torch.cuda.set_per_process_memory_fraction`` before
anything is allocated. The Trainer logs the loss of every step (``trainer_state.json``'s ``log_history``).
"""

import argparse
import os

import torch
from torch.utils.data import SequentialSampler
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

QWEN05 = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
              num_key_value_heads=2, vocab_size=151936)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256)  # --tiny: a dry run of this script on a CPU (gloo), before spending GPU time


class InOrder(Trainer):
    """Samples in dataset order: which step sees which samples does not depend on the batch split."""

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--deepspeed", required=True)
    p.add_argument("--per_device_train_batch_size", type=int, default=4)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--gradient_checkpointing", type=lambda v: v.lower() == "true", default=False)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--save-steps", type=int, default=4)
    p.add_argument("--short", type=int, default=1024)
    p.add_argument("--long", type=int, default=1536)
    p.add_argument("--long-from", type=int, default=5)
    p.add_argument("--tiny", action="store_true")
    a = p.parse_args()
    sizes = TINY if a.tiny else QWEN05
    if a.tiny:
        import deepspeed

        torch.set_num_threads(1)
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    cap = int(os.environ.get("CAP_BYTES") or 0)
    if cap:
        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
    world = int(os.environ.get("WORLD_SIZE", 1))
    per_step = a.per_device_train_batch_size * a.gradient_accumulation_steps * world
    gen = torch.Generator().manual_seed(7)
    data = []
    for i in range(per_step * a.steps):
        length = a.short if i < per_step * (a.long_from - 1) else a.long
        ids = torch.randint(0, sizes["vocab_size"], (length,), generator=gen)
        data.append({"input_ids": ids, "labels": ids})
    args = TrainingArguments(output_dir=a.out, deepspeed=a.deepspeed, bf16=not a.tiny, use_cpu=a.tiny,
                             per_device_train_batch_size=a.per_device_train_batch_size,
                             gradient_accumulation_steps=a.gradient_accumulation_steps, max_steps=a.steps,
                             gradient_checkpointing=a.gradient_checkpointing,
                             save_steps=a.save_steps, save_strategy="steps", logging_steps=1, learning_rate=1e-4,
                             lr_scheduler_type="constant", report_to=[], dataloader_num_workers=0,
                             disable_tqdm=True, seed=7, save_total_limit=2)
    torch.manual_seed(7)
    config = AutoConfig.for_model("qwen2", max_position_embeddings=max(4096, a.long), **sizes)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if a.tiny else torch.bfloat16)
    InOrder(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
