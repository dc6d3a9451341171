"""A plain torch.distributed loop (gloo) for the cross-node watchdog tests: one all_reduce per step;
``--sleep-rank R --sleep-step S``: global rank R sleeps in its own code at step S (a straggler)."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--sleep-rank", type=int, default=-1)
parser.add_argument("--sleep-step", type=int, default=3)
parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
args = parser.parse_args()
dist.init_process_group(args.backend)
rank = dist.get_rank()
t = torch.ones(1024, device="cuda" if args.backend == "nccl" else "cpu")
for step in range(args.steps):
    if rank == args.sleep_rank and step == args.sleep_step:
        time.sleep(600)  # the straggler: in its own code while every other rank waits in all_reduce
    dist.all_reduce(t)
    time.sleep(0.3)
dist.destroy_process_group()
