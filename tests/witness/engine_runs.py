"""Raw ``deepspeed.initialize`` scenarios on CPU (gloo) that the Python-script and checkpoint rules claim.

Run as ``python -m tests.witness.engine_runs SPEC_JSON OUT_DIR`` (see :func:`run_engine`). SPEC:
``{"scenario": NAME, "world": N, ...}``. Scenarios:

    frozen        LoRA model, ZeRO stages 2 and 3 one after the other (one launch); save_checkpoint with and
                  without exclude_frozen_parameters; result per stage (``z2``, ``z3``): file -> frozen parameter
                  elements stored in it, per variant
    rank0_save    every rank trains; only rank 0 calls save_checkpoint (pg timeout ``pg_timeout`` s);
                  result per rank: what happened (exception type/message or "returned"), seconds taken
    ga_skip       gradient_accumulation_steps ``ga``; 2*ga micro-batches; engine.step() every micro-batch
                  vs only when (i+1) % ga == 0; result: global_steps and boundaries seen per variant
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict

from tests.witness.common import TINY, exit_rank, free_port, run_module, set_rank_env, tiny_model


def run_engine(spec: Dict[str, Any], out: Path, timeout: float = 240.0) -> Dict[str, Any]:
    """Run a scenario in a child process; returns what rank 0 (or every rank) recorded."""
    return run_module("tests.witness.engine_runs", spec, out, timeout=timeout)


def _config(stage: int, ga: int = 1) -> Dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": ga,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9}


def _engine(stage: int, lora: bool = False, ga: int = 1):
    import deepspeed
    import torch

    model = tiny_model(lora=lora)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(params, lr=1e-3),
                                      config=_config(stage, ga))
    return engine


def _batch(rank: int, i: int):
    import torch

    gen = torch.Generator().manual_seed(100 * rank + i)
    return torch.randint(0, TINY["vocab_size"], (2, 16), generator=gen)


def _train_step(engine, rank: int, i: int) -> None:
    ids = _batch(rank, i)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()


def _frozen(rank: int, spec: Dict[str, Any], out: Path) -> Dict[str, Any]:
    from tests.witness.trainer_runs import frozen_elements

    result: Dict[str, Any] = {}
    for stage in (2, 3):
        engine = _engine(stage, lora=True)
        frozen = {n for n, p in engine.module.named_parameters() if not p.requires_grad}
        _train_step(engine, rank, 0)
        here = result[f"z{stage}"] = {}
        for variant, exclude in (("all", False), ("exclude_frozen", True)):
            engine.save_checkpoint(str(out / f"z{stage}" / variant), tag="t", exclude_frozen_parameters=exclude)
            if rank == 0:
                folder = out / f"z{stage}" / variant / "t"
                here[variant] = {p.name: frozen_elements(p, frozen) for p in sorted(folder.iterdir())}
        if rank == 0:
            here["frozen_params"] = len(frozen)
    return result


def _rank0_save(rank: int, spec: Dict[str, Any], out: Path) -> Dict[str, Any]:
    engine = _engine(spec.get("stage", 2))
    start = time.time()
    outcome = "returned"
    try:
        for i in range(3):
            _train_step(engine, rank, i)
            if rank == 0:
                engine.save_checkpoint(str(out / "ckpt"))
    except Exception as exc:  # the collective that never completes times out on gloo
        outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
    return {"outcome": outcome, "seconds": round(time.time() - start, 1)}


def _ga_skip(rank: int, spec: Dict[str, Any], out: Path) -> Dict[str, Any]:
    ga = int(spec.get("ga", 4))
    result = {}
    for variant in ("every_micro_batch", "only_at_boundary"):
        engine = _engine(spec.get("stage", 2), ga=ga)
        boundaries = 0
        for i in range(2 * ga):
            ids = _batch(rank, i)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            boundaries += int(engine.is_gradient_accumulation_boundary())
            if variant == "every_micro_batch" or (i + 1) % ga == 0:
                engine.step()
        result[variant] = {"global_steps": engine.global_steps, "micro_steps": engine.micro_steps,
                           "boundaries_seen": boundaries}
    return result


SCENARIOS = {"frozen": _frozen, "rank0_save": _rank0_save, "ga_skip": _ga_skip}


def _worker(rank: int, spec: Dict[str, Any], out: str, port: int) -> None:
    set_rank_env(rank, spec["world"], port)
    import deepspeed
    import torch

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=float(spec.get("pg_timeout", 120)))
    deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
    result = SCENARIOS[spec["scenario"]](rank, spec, Path(out))
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    if rank == 0 and spec["scenario"] != "rank0_save":
        (Path(out) / "result.json").write_text(json.dumps(result, indent=1))
    exit_rank()


def main(spec: Dict[str, Any], out: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(spec, out, free_port()), nprocs=int(spec["world"]), join=True)
    if spec["scenario"] == "rank0_save":
        ranks = {p.stem: json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))}
        (Path(out) / "result.json").write_text(json.dumps(ranks, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(json.loads(sys.argv[1]), sys.argv[2])
