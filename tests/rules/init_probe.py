"""What ``deepspeed.initialize`` (and the engine after it) does with configs and script patterns the rules claim.

One fresh process, one rank (gloo), many engines: ``python -m tests.rules.init_probe OUT.json``. Each case
builds a tiny model, calls ``deepspeed.initialize`` with a config and an optional client optimizer, then runs an
optional action (``no_sync``, ``step_in_no_sync``, ``train``); its result is ``"ok"`` or
``"ExceptionType: message"``. Used by the ``init_probe`` fixture (``tests/rules/conftest.py``), once per session.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Dict, Optional

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 10**9}
ADAM = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}


def _cfg(**extra) -> Dict[str, Any]:
    out = dict(BASE)
    out.update(extra)
    return out


# name -> (config, client optimizer: None | "adamw" | "sgd", action: None | "no_sync" | "step_in_no_sync" | "train")
CASES = {
    # allgather_bucket_size must be even at ZeRO-1/2 (DeepSpeedZeroOptimizer asserts); stage 3 ignores it.
    "allgather_odd_z1": (_cfg(optimizer=ADAM, zero_optimization={"stage": 1, "allgather_bucket_size": 500000001}),
                         None, None),
    "allgather_odd_z2": (_cfg(optimizer=ADAM, zero_optimization={"stage": 2, "allgather_bucket_size": 3}), None, None),
    "allgather_even_z2": (_cfg(optimizer=ADAM, zero_optimization={"stage": 2, "allgather_bucket_size": 4}),
                          None, None),
    # grad_accum_dtype against the model dtype without ZeRO.
    "gad_fp32_bf16_z0": (_cfg(optimizer=ADAM, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
                         None, None),
    "gad_bf16_fp32_z0": (_cfg(optimizer=ADAM, data_types={"grad_accum_dtype": "bf16"}), None, None),
    "gad_fp32_bf16_z1": (_cfg(optimizer=ADAM, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"},
                              zero_optimization={"stage": 1}), None, None),
    "gad_same_z0": (_cfg(optimizer=ADAM, data_types={"grad_accum_dtype": "fp32"}), None, None),
    # scheduler warmup_num_steps must be a positive int (0.19.6+).
    "warmup_zero": (_cfg(optimizer=ADAM, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}),
                    None, None),
    "warmup_float": (_cfg(optimizer=ADAM, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10.0}}),
                     None, None),
    "warmup_decay_neg": (_cfg(optimizer=ADAM, scheduler={"type": "WarmupDecayLR",
                                                         "params": {"warmup_num_steps": -5, "total_num_steps": 100}}),
                         None, None),
    "warmup_ok": (_cfg(optimizer=ADAM, scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 10}}),
                  None, None),
    # a client optimizer ZeRO has not tested.
    "sgd_z2": (_cfg(zero_optimization={"stage": 2}), "sgd", None),
    "sgd_z2_allowed": (_cfg(zero_optimization={"stage": 2}, zero_allow_untested_optimizer=True), "sgd", None),
    "sgd_z0": (_cfg(), "sgd", None),
    # a client torch optimizer with optimizer offload.
    "adamw_offload_z2": (_cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}),
                         "adamw", None),
    "adamw_offload_z2_unforced": (_cfg(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}},
                                       zero_force_ds_cpu_optimizer=False), "adamw", None),
    # engine.no_sync() in user code; engine.step() inside it.
    "no_sync_z2": (_cfg(optimizer=ADAM, zero_optimization={"stage": 2}), None, "no_sync"),
    "no_sync_z3": (_cfg(optimizer=ADAM, zero_optimization={"stage": 3}), None, "no_sync"),
    "no_sync_z1": (_cfg(optimizer=ADAM, zero_optimization={"stage": 1}), None, "no_sync"),
    "step_in_no_sync_z1": (_cfg(optimizer=ADAM, zero_optimization={"stage": 1}), None, "step_in_no_sync"),
}


# name -> (batch values, data-parallel world size): DeepSpeedConfig with gloo up and the world size from an mpu.
BATCH_CASES = {
    "t30_m4_w4": ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 4),
    "t32_m4_w4": ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4),
    "t30_w4": ({"train_batch_size": 30}, 4),
    "t32_w4": ({"train_batch_size": 32}, 4),
    "t6_g4_w4": ({"train_batch_size": 6, "gradient_accumulation_steps": 4}, 4),
    "t64_g4_w4": ({"train_batch_size": 64, "gradient_accumulation_steps": 4}, 4),
    "g4_w1": ({"gradient_accumulation_steps": 4}, 1),
    "t30_m4_w1": ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 1),
    "t30_m4_w2": ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 2),
    "t30_m4_w3": ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4}, 3),
    "t2_m4_w1": ({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4}, 1),
    "m4_g2_w3": ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 3),
}


def run_batch(values: Dict[str, Any], world: int) -> str:
    from types import SimpleNamespace

    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        DeepSpeedConfig(dict(values), mpu=SimpleNamespace(get_data_parallel_world_size=lambda: world))
        return "ok"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))


def _optimizer(kind: Optional[str], model):
    import torch

    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    return None


def _act(engine, action: Optional[str]) -> None:
    import torch

    def micro():
        x = torch.randn(1, 8, dtype=next(engine.module.parameters()).dtype)
        engine.backward(engine(x).float().pow(2).sum())

    if action == "no_sync":
        with engine.no_sync():
            micro()
    elif action == "step_in_no_sync":
        with engine.no_sync():
            micro()
            engine.step()


def run_case(config: Dict[str, Any], optimizer: Optional[str], action: Optional[str]) -> str:
    import deepspeed

    model = _model()
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                          optimizer=_optimizer(optimizer, model), config=dict(config))
        _act(engine, action)
        return "ok"
    except Exception as exc:  # the outcome is the point: every exception type is recorded
        return f"{type(exc).__name__}: {exc}"


def main(out_path: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import deepspeed

    # DeepSpeed's CPU shm all-reduce op is a speed path compiled with gcc on first use; gloo does the same.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    results = {name: run_case(*case) for name, case in CASES.items()}
    results.update({f"batch:{name}": run_batch(*case) for name, case in BATCH_CASES.items()})
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
