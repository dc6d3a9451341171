"""A raw DeepSpeed loop that resumes from its own `latest` checkpoint, as users write them (knows nothing of zeropilot).

    deepspeed --num_gpus 2 ds_resume.py --save-dir DIR --deepspeed_config CFG [--steps 6] [--save-every 2]
        [--no-resume] [--fault kill|hang --fault-step K --fault-once FILE [--fault-rank 1]] [--step-sleep S]

At start the loop calls ``engine.load_checkpoint(DIR)`` (DeepSpeed reads the tag from ``DIR/latest``) unless
``--no-resume`` or DIR has no ``latest``, and goes on from the step it loaded. The batch of step S on rank R is drawn
from a generator seeded with (S, R): a resumed run sees the same data as one that never stopped. ``--fault`` makes
one rank (``--fault-rank``, 1) die (SIGKILL) or hang (sleep) after step K, once: FILE is created when it fires and no
fault fires while it exists. ``--step-sleep`` slows each step so that a signal lands mid-run. Every rank saves every
``--save-every`` steps and at the end (tag ``global_step<N>``).
"""

import argparse
import os
import signal
import time

import deepspeed
import torch
from transformers import AutoConfig, AutoModelForCausalLM

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64)


def batch(step, rank, size, length):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, TINY["vocab_size"], (size, length), generator=gen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--fault", choices=("none", "kill", "hang"), default="none")
    p.add_argument("--fault-step", type=int, default=3)
    p.add_argument("--fault-once", default="")
    p.add_argument("--fault-rank", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p = deepspeed.add_config_arguments(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **TINY))
    engine, _, _, _ = deepspeed.initialize(args=a, model=model, model_parameters=model.parameters())
    rank = engine.global_rank
    if not a.no_resume and os.path.exists(os.path.join(a.save_dir, "latest")):
        engine.load_checkpoint(a.save_dir)
    micro = engine.train_micro_batch_size_per_gpu()
    while engine.global_steps < a.steps:
        step = engine.global_steps + 1
        for i in range(engine.gradient_accumulation_steps()):
            ids = batch(step * 100 + i, rank, micro, a.seq)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if engine.global_steps % a.save_every == 0 or engine.global_steps == a.steps:
            engine.save_checkpoint(a.save_dir)
        if (a.fault != "none" and rank == a.fault_rank and engine.global_steps == a.fault_step
                and not os.path.exists(a.fault_once)):
            open(a.fault_once, "w").close()
            if a.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
    if rank == 0:
        print(f"trained to step {engine.global_steps}; checkpoints in {a.save_dir}")


if __name__ == "__main__":
    main()
