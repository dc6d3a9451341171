"""One rank of ``zeropilot calibrate``: measures this process's GPU memory outside PyTorch after each
phase and prints one ``CALIBRATE {json}`` line. Started by :mod:`zeropilot.calibrate.run`, never by the core.

Outside PyTorch = device memory in use (``torch.cuda.mem_get_info``, one rank per GPU, nothing else on it)
minus what the caching allocator reserved. Phases: ``context`` (first tensor), ``blas`` (bf16 and fp32
matmuls), ``comm`` (process group with NCCL/RCCL, all-reduce, all-gather, reduce-scatter) and
``deepspeed`` (a small causal LM built inside ``deepspeed.zero.Init``, three ZeRO-3 steps; skipped when
DeepSpeed or transformers is missing). On a machine without a GPU only a gloo group is set up and every
GPU figure is None with the reason. With several ranks and ``--network-mib N``, the ranks then time all-gather and
reduce-scatter among themselves (:mod:`zeropilot.calibrate.network`). ``--allocator`` instead reports what the
allocator did with the ``PYTORCH_CUDA_ALLOC_CONF`` it was started with; ``--speed`` measures the speed figures of
this process's GPU and host (:mod:`zeropilot.calibrate.speed`; ``--no-cpu-adam`` leaves DeepSpeed's CPUAdam out).
"""

from __future__ import annotations

import json
import os
import sys
import time


def _outside(torch) -> int:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return int(total - free - torch.cuda.memory_reserved())


def _deepspeed_phase(torch, rank: int) -> str:
    """Three ZeRO-3 steps of a small model built inside zero.Init; returns what was run."""
    import deepspeed

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}},
          "zero_optimization": {"stage": 3}, "steps_per_print": 10**9}
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.integrations import HfDeepSpeedConfig

        cfg = AutoConfig.for_model("llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=32000)
        keep = HfDeepSpeedConfig(ds)  # noqa: F841  (from_config builds inside zero.Init while it lives)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        what = "transformers Llama (2 layers) in zero.Init"
    except ImportError:
        with deepspeed.zero.Init(config_dict_or_path=ds):
            model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).to(torch.bfloat16)
        what = "4 linear layers in zero.Init"
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()], config=ds)
    for _ in range(3):
        if what.startswith("transformers"):
            x = torch.randint(0, 32000, (1, 256), device="cuda")
            loss = engine(input_ids=x, labels=x).loss
        else:
            loss = engine(torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    return what


def _gpu(torch, dist, rank: int, world: int, local: int, out: dict) -> None:
    torch.cuda.set_device(local)
    props = torch.cuda.get_device_properties(local)
    out.update(gpu_name=props.name, gpu_total_bytes=int(props.total_memory))
    torch.zeros(1, device="cuda")
    out["phases"]["context"] = _outside(torch)
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(2048, 2048, device="cuda", dtype=dtype)
        (a @ a).sum().item()
    out["phases"]["blas"] = _outside(torch)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    gathered = torch.empty(world << 20, device="cuda")
    dist.all_gather_into_tensor(gathered, t)
    dist.reduce_scatter_tensor(t, gathered)
    torch.cuda.synchronize()
    out["phases"]["comm"] = _outside(torch)
    try:
        out["deepspeed_model"] = _deepspeed_phase(torch, rank)
        out["phases"]["deepspeed"] = _outside(torch)
    except ImportError as exc:
        out["unmeasured"]["deepspeed"] = f"DeepSpeed not importable ({exc}): outside-PyTorch figure without it"


def _allocator(torch, out: dict) -> None:
    """Segments the allocator made, and whether expandable segments took effect."""
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 1 << 20, 3 << 20, 30 << 20)]
    snap = torch.cuda.memory._snapshot()
    segs = snap.get("segments", [])
    settings = snap.get("allocator_settings") or {}
    flags = [bool(s.get("is_expandable")) for s in segs if "is_expandable" in s]
    if "expandable_segments" in settings:
        out["expandable_segments"] = bool(settings["expandable_segments"])
        out["how"] = "torch.cuda.memory._snapshot()['allocator_settings']"
    elif flags:
        out["expandable_segments"] = any(flags)
        out["how"] = "segments' is_expandable in torch.cuda.memory._snapshot()"
    else:
        out["expandable_segments"] = None
        out["how"] = "this torch build reports neither allocator_settings nor is_expandable"
    small = [s["total_size"] for s in segs if s.get("segment_type") == "small"]
    large = [s["total_size"] for s in segs if s.get("segment_type") == "large"]
    out["segment_bytes"] = {"small": min(small) if small else 0, "large_min": min(large) if large else 0,
                            "reserved_for_35MiB": int(torch.cuda.memory_reserved())}
    del keep


def _network(torch, dist, rank: int, world: int, out: dict) -> None:
    """All-gather and reduce-scatter bus bandwidth among this node's ranks (after every memory phase: the groups it
    creates hold NCCL buffers of their own)."""
    from zeropilot.calibrate import network

    mib = int(sys.argv[sys.argv.index("--network-mib") + 1])
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    out["network"] = network.measure(torch, dist, rank, [0] * world, mib << 20, 5, device)


def _speed(torch, local: int, out: dict) -> None:
    from zeropilot.calibrate import speed

    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        props = torch.cuda.get_device_properties(local)
        out.update(gpu_name=props.name, gpu_total_bytes=int(props.total_memory))
    skip = "--no-cpu-adam: DeepSpeed's CPUAdam was not measured" if "--no-cpu-adam" in sys.argv else None
    elems = int(sys.argv[sys.argv.index("--adam-elems") + 1]) if "--adam-elems" in sys.argv else None
    out["speed"], why = speed.measure(torch, skip, elems)
    out["unmeasured"].update(why)


def main() -> int:
    t0 = time.time()
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    out = {"rank": rank, "world_size": world, "phases": {}, "unmeasured": {},
           "vendor": "rocm" if getattr(torch.version, "hip", None) else ("cuda" if torch.cuda.is_available() else "cpu"),
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                        "hip": getattr(torch.version, "hip", None)}}
    try:
        import deepspeed
        out["versions"]["deepspeed"] = deepspeed.__version__
    except ImportError:
        out["versions"]["deepspeed"] = None
    if "--speed" in sys.argv:
        _speed(torch, local, out)
    elif not torch.cuda.is_available():
        dist.init_process_group("gloo", rank=rank, world_size=world)
        t = torch.ones(4)
        dist.all_reduce(t)
        out["unmeasured"]["gpu"] = "no GPU visible to PyTorch: GPU fields are unmeasured (CPU run, gloo only)"
    elif "--allocator" in sys.argv:
        _allocator(torch, out)
    else:
        _gpu(torch, dist, rank, world, local, out)
    if dist.is_initialized() and world > 1 and "--network-mib" in sys.argv:
        _network(torch, dist, rank, world, out)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    out["wall_s"] = round(time.time() - t0, 1)
    print("CALIBRATE " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
