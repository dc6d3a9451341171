"""A raw DeepSpeed loop that resumes (knows nothing of zeropilot): it loads its checkpoint folder when it holds
one (``engine.load_checkpoint(save_dir)``: ``latest``, or ``latest_universal`` under ``load_universal``), then trains
until --steps optimizer steps, with the micro batch and gradient accumulation of its DeepSpeed config, saving every
--save-every steps; ``--step-sleep T``: every rank sleeps T seconds after each optimizer step.

    torchrun --nnodes 2 --nproc_per_node 2 --node_rank K --master_addr A --master_port P ds_shrink.py \\
        --save-dir DIR --deepspeed_config CFG
"""

import argparse
import os
import time

import deepspeed
import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p = deepspeed.add_config_arguments(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    engine, _, _, _ = deepspeed.initialize(args=a, model=model, model_parameters=model.parameters())
    if os.path.isdir(a.save_dir) and os.listdir(a.save_dir):
        engine.load_checkpoint(a.save_dir)
    micro = engine.train_micro_batch_size_per_gpu()
    while engine.global_steps < a.steps:
        before = engine.global_steps
        x = torch.randn(micro, 32)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if engine.global_steps != before:
            if engine.global_steps % a.save_every == 0:
                engine.save_checkpoint(a.save_dir)
            time.sleep(a.step_sleep)


if __name__ == "__main__":
    main()
