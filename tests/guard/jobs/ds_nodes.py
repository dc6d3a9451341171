"""A raw DeepSpeed ZeRO-3 loop for jobs across nodes (knows nothing of zeropilot): --steps steps, a save every
--save-every steps (every rank calls save_checkpoint); ``--kill-rank R --kill-at S``: global rank R SIGKILLs
itself after step S's optimizer step (a rank killed on its node, the others left waiting in the next collective);
``--step-sleep T``: every rank sleeps T seconds after each step (a job slow enough for a node to be lost between
two saves).

    torchrun --nnodes 2 --nproc_per_node 2 --node_rank K --master_addr A --master_port P ds_nodes.py \\
        --save-dir DIR --deepspeed_config CFG
"""

import argparse
import os
import signal
import time

import deepspeed
import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--save-dir", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--kill-rank", type=int, default=None)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    p = deepspeed.add_config_arguments(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend=os.environ.get("NODES_BACKEND", "gloo"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    engine, _, _, _ = deepspeed.initialize(args=a, model=model, model_parameters=model.parameters())
    for step in range(1, a.steps + 1):
        x = torch.randn(4, 32).to(engine.device)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if a.kill_rank is not None and step == a.kill_at and int(os.environ.get("RANK", -1)) == a.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if step % a.save_every == 0:
            engine.save_checkpoint(a.save_dir)
        time.sleep(a.step_sleep)


if __name__ == "__main__":
    main()
