"""An unmodified HF Trainer + DeepSpeed job (no zeropilot code) whose one batch is far longer than the rest.

    torchrun --nproc_per_node 1 hf_long_batch.py SPEC_JSON

The issue's scenario: a Qwen2-shaped causal LM built from its config (``size`` as in ``train_lm.py``), LoRA
(``lora``: rank, all linear layers; 0: full fine-tuning), ZeRO ``stage`` (3: the model is built inside
``zero.Init`` as the Trainer does), bf16, short samples of ``seq`` tokens and, as the ``long_at``-th sample drawn,
one of ``long_seq`` tokens. ``cap_gib`` emulates a card of that size (the allocator gets ``cap_gib`` minus what
the process holds outside PyTorch, via ``torch.cuda.set_per_process_memory_fraction``). ``max_len`` truncates
every sample (the fix ``cap sequences at N tokens``); ``mb``/``ga``/``gc``/``offload_opt``/``offload_param``: the
Trainer's batch, accumulation, gradient checkpointing and ZeRO offloads. Prints ``RESULT {json}`` on rank 0.
Without CUDA it runs on the CPU (``use_cpu``, gloo): a smoke run of the same code (``DS_ACCELERATOR=cpu``).
"""

import json
import os
import sys
import time

import deepspeed
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_lm import SIZES, GiB


class Samples(torch.utils.data.Dataset):
    """``n`` random samples of ``seq`` tokens; the ``long_at``-th one drawn (1-based) has ``long_seq`` tokens."""

    def __init__(self, spec, vocab):
        self.spec, self.vocab, self.drawn = spec, vocab, 0
        self.gen = torch.Generator().manual_seed(0)

    def __len__(self):
        return self.spec.get("steps", 6) * self.spec.get("mb", 1) * self.spec.get("ga", 1)

    def __getitem__(self, i):
        self.drawn += 1
        n = self.spec["long_seq"] if self.drawn == self.spec.get("long_at") else self.spec.get("seq", 256)
        n = min(n, self.spec.get("max_len") or n)
        ids = torch.randint(0, self.vocab, (n,), generator=self.gen)
        return {"input_ids": ids, "labels": ids}


def collate(rows):
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for k, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[k, :n], labels[k, :n], mask[k, :n] = r["input_ids"], r["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


CUDA = torch.cuda.is_available()


def sync():
    if CUDA:
        torch.cuda.synchronize()


class StepTimes(TrainerCallback):
    def __init__(self):
        self.times, self.t = [], None

    def on_step_begin(self, args, state, control, **kw):
        sync()
        self.t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        sync()
        self.times.append(time.perf_counter() - self.t)


def main():
    spec = json.loads(sys.argv[1])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if CUDA:
        torch.cuda.set_device(local)
    deepspeed.init_distributed(dist_backend=None if CUDA else "gloo")  # before the model: ZeRO-3's zero.Init
    if spec.get("cap_gib") and CUDA:
        torch.zeros(1, device="cuda")
        free, total = torch.cuda.mem_get_info()
        outside = total - free - torch.cuda.memory_reserved()
        torch.cuda.set_per_process_memory_fraction((spec["cap_gib"] * GiB - outside) / total)
    zero = {"stage": spec.get("stage", 3)}
    for part, key in (("opt", "offload_optimizer"), ("param", "offload_param")):
        if spec.get(f"offload_{part}"):
            zero[key] = {"device": spec[f"offload_{part}"]}
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
          "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False}
    args = TrainingArguments(output_dir=spec.get("out_dir", "/tmp/hf_long_batch"), deepspeed=ds, bf16=True,
                             use_cpu=not CUDA,
                             per_device_train_batch_size=spec.get("mb", 1),
                             gradient_accumulation_steps=spec.get("ga", 1), max_steps=spec.get("steps", 6),
                             gradient_checkpointing=bool(spec.get("gc")), save_strategy="no", logging_steps=1000,
                             report_to=[], learning_rate=1e-4, dataloader_num_workers=0, disable_tqdm=True)
    longest = max(spec.get("long_seq", 0), spec.get("seq", 256), 4096)
    cfg = AutoConfig.for_model("qwen2", max_position_embeddings=longest, **SIZES[spec.get("size", "qwen0.5b")])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)  # inside zero.Init under ZeRO-3
    if spec.get("lora"):
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=spec["lora"], lora_alpha=2 * spec["lora"],
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    timer = StepTimes()
    Trainer(model=model, args=args, train_dataset=Samples(spec, cfg.vocab_size), data_collator=collate,
            callbacks=[timer]).train()
    if int(os.environ.get("RANK", "0")) == 0:
        warm = timer.times[spec.get("warmup", 2):]
        print("RESULT " + json.dumps({"spec": spec, "step_seconds": timer.times,
                                      "median_s": sorted(warm)[len(warm) // 2] if warm else None,
                                      "peak_reserved": torch.cuda.max_memory_reserved() if CUDA else None}), flush=True)


if __name__ == "__main__":
    main()
