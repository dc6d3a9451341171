"""Fragmentation under a memory cap, in plain PyTorch (no zeropilot code): free space split into holes.

A 3 GiB allocator cap; one 1 GiB segment is carved into ten 100 MiB tensors and every other one is
freed: five 100 MiB holes that cannot merge or be released (the segment is still partly used). The
rest of the cap is taken by one tensor, leaving 100 MiB. A 200 MiB request then fails although
500 MiB is reserved but unallocated.

Under torchrun (``WORLD_SIZE`` > 1) every rank first joins an NCCL process group and runs one
all-reduce, so NCCL's buffers sit outside PyTorch as they do in training, then does the same on its GPU.
"""

import os

import torch

GiB, MiB = 1 << 30, 1 << 20
local = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local)
if int(os.environ.get("WORLD_SIZE", 1)) > 1:
    import torch.distributed as dist

    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    del t
total = torch.cuda.get_device_properties(local).total_memory
torch.cuda.set_per_process_memory_fraction(3 * GiB / total)
big = torch.empty(GiB, dtype=torch.uint8, device="cuda")
del big  # the 1 GiB segment stays cached
parts = [torch.empty(100 * MiB, dtype=torch.uint8, device="cuda") for _ in range(10)]
for i in range(0, 10, 2):
    parts[i] = None
rest = 3 * GiB - torch.cuda.memory_reserved() - 100 * MiB
fill = torch.empty(rest, dtype=torch.uint8, device="cuda")
x = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
