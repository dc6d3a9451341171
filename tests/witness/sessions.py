"""Witness runs shared by several test modules, each run once per test session (cached).

Every function returns the JSON results of real HF Trainer / DeepSpeed runs on CPU (see
``trainer_runs`` and ``engine_runs``); the output folders live under one temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from tests.once import once, shared_dir
from tests.witness.engine_runs import run_engine
from tests.witness.trainer_runs import run_trainer_cases


def root() -> Path:
    """The runs' folder, one for the whole test run (all pytest-xdist workers: tests/once.py)."""
    return shared_dir("witness")


# One 2-rank Trainer session: every save case the checkpoint rules make a claim about.
SAVE_CASES = (
    dict(name="z3_som_gather", stage=3, gather=True, save_only_model=True, resume_after=True),
    dict(name="z3_som_nogather", stage=3, gather=False, save_only_model=True),
    dict(name="z3_full", stage=3),
    dict(name="z2_full", stage=2),
    dict(name="z3_lora_nogather", stage=3, gather=False, lora=True),
    dict(name="z3_lora_gather", stage=3, gather=True, lora=True),
    dict(name="z3_lora_som_nogather", stage=3, gather=False, lora=True, save_only_model=True),
    dict(name="z2_lora", stage=2, lora=True),
    dict(name="load_best", stage=3, gather=True, save_only_model=True, load_best=True),
)


@once
def trainer_saves() -> Dict[str, Any]:
    """Results of SAVE_CASES on 2 ranks; folders under ``root()/saves/<name>``."""
    return run_trainer_cases([dict(c) for c in SAVE_CASES], root() / "saves", world=2)


@once
def trainer_resume_other_world() -> Dict[str, Any]:
    """Resume the 2-rank ZeRO-2 and ZeRO-3 checkpoints with 1 rank."""
    trainer_saves()
    saves = root() / "saves"
    cases = [dict(name="z2_on_1", stage=2, steps=3, resume_from=str(saves / "z2_full" / "checkpoint-2")),
             dict(name="z3_on_1", stage=3, steps=3, resume_from=str(saves / "z3_full" / "checkpoint-2"))]
    return run_trainer_cases(cases, root() / "resume", world=1)


@once
def trainer_timeouts() -> Dict[str, Any]:
    """2 ranks, ZeRO-2, ddp_timeout 5000 s, DEEPSPEED_TIMEOUT=1 (minute). The world group is initialised with
    the ddp_timeout as accelerate does on GPUs (see trainer_runs: on CPU it passes none)."""
    return run_trainer_cases([dict(name="timeouts", stage=2, ddp_timeout=5000)], root() / "timeouts", world=2,
                             pg_timeout=5000, env={"DEEPSPEED_TIMEOUT": "1"})


@once
def engine(scenario: str, world: int, **kw) -> Dict[str, Any]:
    name = "-".join([scenario, str(world)] + [f"{k}{v}" for k, v in sorted(kw.items())])
    return run_engine(dict(scenario=scenario, world=world, **kw), root() / "engine" / name)
