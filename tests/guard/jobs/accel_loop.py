"""A plain accelerate loop (no Trainer, no DeepSpeed; knows nothing of zeropilot), run by tests under `zeropilot run`.

    python accel_loop.py OUT_DIR [--steps 3] [--accum 2]
    accelerate launch --multi_gpu --num_processes 2 accel_loop.py OUT_DIR   (2 CPU ranks, gloo)

``Accelerator(cpu=True, gradient_accumulation_steps=ACCUM)``: ACCUM micro-batches per optimizer step
under ``accelerator.accumulate``; the state is saved after the last step and loaded back.
"""

import argparse

import torch
from accelerate import Accelerator


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--accum", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=a.accum)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(torch.randn(4 * a.steps * a.accum, 16), batch_size=4)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    for x in data:
        with accelerator.accumulate(model):
            accelerator.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
    accelerator.save_state(a.out)
    accelerator.load_state(a.out)
    accelerator.print(f"saved and loaded {a.out}")


if __name__ == "__main__":
    main()
