"""Run HF Trainer + DeepSpeed cases on CPU (gloo) and report what each save wrote.

Run as ``python -m tests.witness.trainer_runs SPEC_JSON OUT_DIR`` (see :func:`run_trainer_cases`). SPEC is
``{"world": N, "cases": [CASE, ...], "pg_timeout": seconds}``. Each rank calls ``deepspeed.init_distributed``
before building TrainingArguments, which ZeRO-3's ``zero.Init`` needs on CPU. With ``pg_timeout`` it passes
that timeout, as accelerate does on GPUs with ``ddp_timeout`` (``PartialState`` ->
``deepspeed.comm.init_distributed(timeout=...)``); on CPU (``use_cpu``) accelerate passes no timeout at all,
so without this the run would not show what a GPU launch does. Each CASE is a dict:

    name             folder name under OUT_DIR
    stage            ZeRO stage
    gather           stage3_gather_16bit_weights_on_model_save (omitted: DeepSpeed's default, false)
    save_only_model  TrainingArguments.save_only_model
    lora             wrap the model in PEFT LoRA (frozen base)
    load_best        load_best_model_at_end (with eval each save)
    steps            optimizer steps (one save at the end)
    resume_from      a checkpoint folder to resume from (train() with resume_from_checkpoint)
    resume_after     after training, resume a fresh Trainer from this run's last checkpoint
    ddp_timeout      TrainingArguments.ddp_timeout; the result then has ``timeouts``: seconds of the world
                     group and of the ZeRO optimizer's data-parallel group

Each case writes nothing outside OUT_DIR/<name>; rank 0 records, per case: ``error`` (type and message of
what Trainer raised, or None), ``files`` (path -> size under the run's output dir) and ``frozen`` (path ->
number of frozen, i.e. requires_grad=False, parameter elements stored in that file), ``resume_error``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Dict, List

from tests.witness.common import exit_rank, files_under, free_port, run_module, set_rank_env, tiny_model, token_data


def run_trainer_cases(cases: List[Dict[str, Any]], out: Path, world: int = 2, timeout: float = 400.0,
                      pg_timeout: float = None, env: Dict[str, str] = None):
    """Run the cases with `world` ranks in a child process; returns name -> result dict."""
    spec = {"world": world, "cases": cases, "pg_timeout": pg_timeout}
    return run_module("tests.witness.trainer_runs", spec, out, timeout=timeout, env=env)


def _ds_config(case):
    zero = {"stage": case["stage"]}
    if "gather" in case:
        zero["stage3_gather_16bit_weights_on_model_save"] = bool(case["gather"])
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": zero,
            "zero_allow_untested_optimizer": True}


def _args(case, output_dir: Path):
    from transformers import TrainingArguments

    steps = int(case.get("steps", 2))
    extra = {}
    if case.get("load_best"):
        extra = dict(eval_strategy="steps", eval_steps=steps, load_best_model_at_end=True)
    return TrainingArguments(
        output_dir=str(output_dir), use_cpu=True, deepspeed=_ds_config(case), per_device_train_batch_size=2,
        max_steps=steps, save_steps=steps, save_strategy="steps", logging_steps=1000, report_to=[],
        learning_rate=1e-3, dataloader_num_workers=0, disable_tqdm=True,
        save_only_model=bool(case.get("save_only_model", False)), ddp_timeout=int(case.get("ddp_timeout", 1800)),
        **extra)


def _trainer(case, output_dir: Path):
    from accelerate.state import AcceleratorState, PartialState
    from transformers import Trainer

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    args = _args(case, output_dir)
    model = tiny_model(lora=bool(case.get("lora")))
    data = token_data()
    return Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4] if case.get("load_best")
                   else None)


def _err(exc: BaseException) -> Dict[str, str]:
    """Type, message and the library function that raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages" in f.filename or "dist-packages" in f.filename]
    where = f"{frames[-1].filename.rsplit('-packages/', 1)[-1]}:{frames[-1].name}" if frames else None
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "where": where}


def frozen_elements(path: Path, frozen: set) -> int:
    """Elements of frozen parameters stored in a saved file (torch pickle or safetensors)."""
    import torch

    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as fh:
            return sum(fh.get_slice(k).get_shape() and _numel(fh.get_slice(k).get_shape())
                       for k in fh.keys() if _is_frozen(k, frozen))
    obj = torch.load(str(path), map_location="cpu", weights_only=False)
    return _walk(obj, frozen)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _is_frozen(key: str, frozen: set) -> bool:
    return any(key == f or key.endswith("." + f) or f.endswith("." + key) for f in frozen)


def _walk(obj, frozen: set, key: str = "") -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() if key and _is_frozen(key, frozen) else 0
    if isinstance(obj, dict):
        return sum(_walk(v, frozen, k if isinstance(k, str) else "") for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return sum(_walk(v, frozen, "") for v in obj)
    return 0


def _frozen_report(folder: Path, frozen: set) -> Dict[str, int]:
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.suffix in (".pt", ".bin", ".safetensors", ".pth"):
            try:
                out[str(path.relative_to(folder))] = frozen_elements(path, frozen)
            except Exception as exc:  # a file that is not a tensor archive (rng state...) holds none
                out[str(path.relative_to(folder))] = -1 if "Weights only" in str(exc) else 0
    return out


def _group_timeout(group) -> float:
    import torch

    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def _timeouts(trainer) -> Dict[str, float]:
    """Timeouts of the world group and of the group ZeRO reduces/gathers over (gloo backends)."""
    import torch.distributed as dist

    engine = trainer.model_wrapped
    dp = getattr(engine.optimizer, "dp_process_group", None)
    return {"world": _group_timeout(dist.group.WORLD),
            "zero_dp": _group_timeout(dp) if dp is not None else None}


def _run_case(rank: int, case: Dict[str, Any], out: Path) -> Dict[str, Any]:
    import torch

    output_dir = out / case["name"]
    result: Dict[str, Any] = {"error": None, "resume_error": None}
    try:
        trainer = _trainer(case, output_dir)
        frozen = {n for n, p in trainer.model.named_parameters() if not p.requires_grad}
        result["frozen_params"] = sum(p.numel() for p in trainer.model.parameters() if not p.requires_grad)
        trainer.train(resume_from_checkpoint=case.get("resume_from"))
    except Exception as exc:
        result["error"] = _err(exc)
        if rank == 0:
            traceback.print_exc()
        return result
    torch.distributed.barrier()
    if "ddp_timeout" in case:
        result["timeouts"] = _timeouts(trainer)
    if rank == 0 and output_dir.is_dir():
        result["files"] = files_under(output_dir)
        result["frozen"] = _frozen_report(output_dir, frozen)
    if case.get("resume_after"):
        ckpts = sorted(output_dir.glob("checkpoint-*"))
        try:
            again = _trainer(dict(case, steps=int(case.get("steps", 2)) + 1), out / (case["name"] + "-resumed"))
            again.train(resume_from_checkpoint=str(ckpts[-1]))
        except Exception as exc:
            result["resume_error"] = _err(exc)
    torch.distributed.barrier()
    return result


def _worker(rank: int, spec: Dict[str, Any], out: str, port: int) -> None:
    set_rank_env(rank, spec["world"], port)
    import deepspeed
    import torch

    torch.set_num_threads(1)
    # Before TrainingArguments, so that ZeRO-3's zero.Init sees the whole world.
    if spec.get("pg_timeout"):
        import datetime

        deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=spec["pg_timeout"]))
    else:
        deepspeed.init_distributed(dist_backend="gloo")
    results = {c["name"]: _run_case(rank, c, Path(out)) for c in spec["cases"]}
    if rank == 0:
        (Path(out) / "result.json").write_text(json.dumps(results, indent=1))
    exit_rank()


def main(spec: Dict[str, Any], out: str) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(spec, out, free_port()), nprocs=int(spec["world"]), join=True)


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(json.loads(sys.argv[1]), sys.argv[2])
