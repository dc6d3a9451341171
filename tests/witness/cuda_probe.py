"""What a CUDA build of torch (and the NCCL it ships) does with the launch settings the AL/TO/SH rules
judge. Needs a GPU: run it by hand on a CUDA machine (CI has none) and keep its JSON output beside it.

    python tests/witness/cuda_probe.py OUT.json

Each probe runs in a fresh Python process (allocator variables are read once per process) and records
what took effect, read back from ``torch.cuda.memory._snapshot()["allocator_settings"]`` and
``memory_stats()``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

SETTINGS = r'''
import json, torch
x = torch.zeros(1, device="cuda")
s = torch.cuda.memory._snapshot()["allocator_settings"]
print(json.dumps({k: s.get(k) for k in ("expandable_segments", "garbage_collection_threshold", "max_split_size")}))
'''

GC = r'''
import json, sys, torch
frac = float(sys.argv[1])
if frac > 0:
    torch.cuda.set_per_process_memory_fraction(frac)
gib = 1 << 30
blocks = [torch.empty(gib, dtype=torch.uint8, device="cuda") for _ in range(10)]
del blocks  # 10 GiB now cached, unused
before = torch.cuda.memory_reserved()
y = torch.empty(3 * gib, dtype=torch.uint8, device="cuda")  # does not fit a cached 1 GiB block
print(json.dumps({"fraction": frac, "reserved_before_gib": before / gib,
                  "reserved_after_gib": torch.cuda.memory_reserved() / gib}))
'''

RANK_DEVICE = r'''
import os, torch
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.zeros(1, device="cuda")
print("rank", os.environ["RANK"], "ok")
'''

GROUP_TIMEOUT = r'''
import datetime, json, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=5000))
dev = torch.device("cuda", 0)
clone = dist.new_group(ranks=range(dist.get_world_size()))  # what deepspeed.utils.groups._clone_world_group does
t = lambda g: g._get_backend(dev).options._timeout.total_seconds()
print(json.dumps({"world": t(dist.group.WORLD), "new_group": t(clone)}))
dist.destroy_process_group()
'''


def _py(code: str, env: dict, args=()) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ALLOC_VARS}
    out = subprocess.run([sys.executable, "-c", code, *args], env={**clean, **env}, capture_output=True,
                         text=True, timeout=300)
    last = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
    result = {"env": env, "returncode": out.returncode}
    try:
        result["result"] = json.loads(last[0]) if last else None
    except ValueError:
        result["result"] = last[0] if last else None
    if out.returncode != 0:
        result["stderr_tail"] = out.stderr[-600:]
    warnings = [line for line in out.stderr.splitlines() if "Warning" in line or "warn" in line.lower()]
    result["warnings"] = warnings[-3:]
    return result


def _allocator_probes() -> dict:
    cases = {
        "cuda_only": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "hip_only": {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"},
        "alloc_only": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
        "cuda_and_hip": {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
                         "PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"},
        "cuda_and_alloc": {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6",
                           "PYTORCH_ALLOC_CONF": "expandable_segments:True"},
        "typo_key": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"},
    }
    return {name: _py(SETTINGS, env) for name, env in cases.items()}


def _gc_probes() -> dict:
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.01"}
    return {"threshold_without_fraction": _py(GC, env, ["0"]),
            "threshold_with_fraction": _py(GC, env, ["0.5"])}


def _torchrun(code: str, nproc: int, env: dict) -> dict:
    script = Path("/tmp/zp_probe_script.py")
    script.write_text(code)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                          "--master_port", "29731", str(script)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=300)
    errors = sorted(set(re.findall(r"(?:RuntimeError|torch\.AcceleratorError|CUDA error)[^\n]*", out.stderr)))
    return {"returncode": out.returncode, "stdout": out.stdout.strip().splitlines()[-4:], "errors": errors[:4]}


def _nccl_strings() -> dict:
    import importlib.util

    spec = importlib.util.find_spec("nvidia.nccl")
    libs = []
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            libs += [str(p) for p in Path(loc).rglob("libnccl*.so*")]
    found = {}
    for name in ("NCCL_TIMEOUT", "NCCL_IB_TIMEOUT", "NCCL_DEBUG"):
        word = re.compile(rb"(?<![A-Z0-9_])" + name.encode() + rb"(?![A-Z0-9_])")
        found[name] = [lib for lib in libs if word.search(Path(lib).read_bytes())]
    return {"libraries": libs, "mentions": found}


def main(out: str) -> None:
    import torch

    result = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": torch.version.hip,
              "device": torch.cuda.get_device_name(0), "allocator": _allocator_probes(), "gc": _gc_probes(),
              "nproc_2_on_1_visible": _torchrun(RANK_DEVICE, 2, {"CUDA_VISIBLE_DEVICES": "0"}),
              "group_timeouts": _torchrun(GROUP_TIMEOUT, 1, {}), "nccl": _nccl_strings()}
    Path(out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
