"""Two ranks that JIT-build a C++ extension before training, as DeepSpeed's op builder does (knows nothing of
zeropilot).

    torchrun --nproc_per_node 2 build_op.py [SPIN]

Every rank calls ``torch.utils.cpp_extension.load`` on ``slow_op.cpp``: one takes the build lock
(``<TORCH_EXTENSIONS_DIR>/zp_slow_op/lock``) and compiles, the other waits on it (``FileBaton``). The source
makes the compiler evaluate a constexpr loop of SPIN iterations (default 1,000,000: a few seconds of compiler
CPU), so the build outlasts a short hang timeout while the compiler is visibly busy. Then one all-reduce.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.cpp_extension import load

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    spin = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    dist.init_process_group("gloo")
    flags = ["-O0", "-fconstexpr-loop-limit=2000000000", "-fconstexpr-ops-limit=100000000000",
             f"-DZP_SPIN={spin}UL"]
    mod = load(name="zp_slow_op", sources=[os.path.join(HERE, "slow_op.cpp")], extra_cflags=flags, verbose=False)
    t = torch.tensor([float(mod.value() % 1000)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}: built, {t.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
