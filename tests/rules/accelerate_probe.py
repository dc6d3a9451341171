"""What accelerate 1.15 does with the DeepSpeed configs and prepare() calls AC003-AC005 claim.

One fresh process, one rank: ``python -m tests.rules.accelerate_probe WORKDIR``; writes ``WORKDIR/probe.json``
(case -> ``"ok"`` or ``"ExceptionType: message"``). The --mixed_precision cases set the variables
``accelerate launch --mixed_precision X --deepspeed_config_file F`` sets (``accelerate/utils/launch.py``).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
ADAM = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
# name -> (DeepSpeed config, mixed precision flag or None, optimizer given to prepare: None | "real" | "dummy")
CASES = {
    "mp_fp16_vs_bf16": (dict(BASE, bf16={"enabled": True}), "fp16", None),
    "mp_bf16_vs_fp16": (dict(BASE, fp16={"enabled": True}), "bf16", None),
    "mp_bf16_vs_bf16": (dict(BASE, bf16={"enabled": True}), "bf16", None),
    "mp_fp16_vs_auto": (dict(BASE, bf16={"enabled": "auto"}), "fp16", None),
    "opt_both": (dict(BASE, optimizer=ADAM), None, "real"),
    "opt_real_only": (dict(BASE), None, "real"),
    "dummy_without": (dict(BASE), None, "dummy"),
    "dummy_with": (dict(BASE, optimizer=ADAM), None, "dummy"),
}


def run_case(work: Path, name: str, cfg, precision, optimizer) -> str:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DummyOptim

    path = work / f"{name}.json"
    path.write_text(json.dumps(cfg))
    os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=str(path))
    os.environ["ACCELERATE_MIXED_PRECISION"] = precision or "no"
    try:
        acc = Accelerator()
        if optimizer:
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.AdamW(model.parameters()) if optimizer == "real" else DummyOptim(model.parameters())
            acc.prepare(model, opt)
        return "ok"
    except Exception as exc:  # the outcome is the point: every exception type is recorded
        return f"{type(exc).__name__}: {exc}"
    finally:
        AcceleratorState._reset_state(True)


def main(work: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    # DeepSpeed's CPU shm all-reduce op is a speed path compiled with gcc on first use; gloo does the same.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    out = Path(work)
    results = {name: run_case(out, name, *case) for name, case in CASES.items()}
    (out / "probe.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
