"""Where a ZeRO-3 launch's host memory goes: run ``zero_mem_probe_plan.py`` with DeepSpeed's host-side steps logged.

Issue 14's host table under-predicts ZeRO-3 raw builds with ``offload_param`` and the optimizer on the GPU by about
half (``results/accuracy.md``, last table). This wrapper runs the same probe on the same spec, and prints one JSON
line per event to stderr: the resident set (``VmRSS``) and its peak (``VmHWM``) before and after each DeepSpeed step
that can hold host memory (the conversion of a raw-built model to ZeRO parameters, the flat 16-bit CPU buffer, the
fp32 partitions, ZeRO-1/2's optimizer states, ``deepspeed.initialize``, each backward and optimizer step, torch's AdamW
step), every ``pin_memory`` request of 256 MiB or more with its size, and
PyTorch's pinned-memory statistics where this build has them (``torch.cuda.host_memory_stats``).

Usage (one GPU): python bench/plan/host_rss_probe.py '<json spec>' 2> events.jsonl
"""
import json
import os
import runpy
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = time.time()


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")):
                key, value = line.split(":")
                out[key] = round(int(value.split()[0]) / 2**20, 3)  # GiB
    return out


def _log(event: str, **kw) -> None:
    rec = {"t": round(time.time() - T0, 2), "event": event, **_status(), **kw}
    try:
        import torch

        stats = getattr(torch.cuda, "host_memory_stats", None)
        if stats is not None:
            s = stats()
            rec["pinned_reserved_gib"] = round(s.get("reserved_bytes.current", 0) / 2**30, 3)
            rec["pinned_allocated_gib"] = round(s.get("allocated_bytes.current", 0) / 2**30, 3)
    except Exception as e:  # a build without the statistics: the RSS alone
        rec["stats_error"] = type(e).__name__
    print(json.dumps(rec), file=sys.stderr, flush=True)


def _wrap(owner, name: str) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        _log(f"before {owner.__name__}.{name}")
        result = original(*args, **kwargs)
        _log(f"after {owner.__name__}.{name}")
        return result

    setattr(owner, name, wrapped)


def main() -> None:
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.engine import DeepSpeedEngine
    import torch
    from deepspeed.runtime.zero import partition_parameters, stage3, stage_1_and_2

    _log("start")
    acc = get_accelerator()
    pin = acc.pin_memory
    pinned = {"n": 0, "bytes": 0}

    def pin_memory(tensor, *args, **kwargs):
        pinned["n"] += 1
        pinned["bytes"] += tensor.numel() * tensor.element_size()
        if tensor.numel() * tensor.element_size() >= 2**28:
            _log("pin_memory", gib=round(tensor.numel() * tensor.element_size() / 2**30, 3))
        return pin(tensor, *args, **kwargs)

    acc.pin_memory = pin_memory
    for owner, name in ((partition_parameters.Init, "_convert_to_zero_parameters"),
                        (stage3.DeepSpeedZeroOptimizer_Stage3, "_create_fp16_partitions_with_defragmentation"),
                        (stage3.DeepSpeedZeroOptimizer_Stage3, "_setup_for_real_optimizer"),
                        (stage3.DeepSpeedZeroOptimizer_Stage3, "_create_fp32_partitions"),
                        (stage_1_and_2.DeepSpeedZeroOptimizer, "initialize_optimizer_states"),
                        (stage_1_and_2.DeepSpeedZeroOptimizer, "step"),
                        (stage3.DeepSpeedZeroOptimizer_Stage3, "step"),
                        (torch.optim.AdamW, "step"),
                        (DeepSpeedEngine, "backward"),
                        (DeepSpeedEngine, "step")):
        if hasattr(owner, name):
            _wrap(owner, name)
    initialize = deepspeed.initialize

    def init(*args, **kwargs):
        _log("before deepspeed.initialize")
        result = initialize(*args, **kwargs)
        _log("after deepspeed.initialize", pin_requests=pinned["n"], pin_requested_gib=round(pinned["bytes"] / 2**30, 3))
        return result

    deepspeed.initialize = init
    sys.argv = [os.path.join(HERE, "zero_mem_probe_plan.py")] + sys.argv[1:]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        _log("end", pin_requests=pinned["n"], pin_requested_gib=round(pinned["bytes"] / 2**30, 3))


if __name__ == "__main__":
    main()
