"""The oracle's subprocess: runs DeepSpeed's, transformers' and accelerate's own config code on each config.

``python -m zeropilot.oracle.worker`` reads one JSON request on stdin and writes one JSON answer on stdout (see
:mod:`zeropilot.oracle`). It is the only zeropilot module that imports the libraries, and only here, in a process
of its own: no GPU (``DS_ACCELERATOR=cpu``, ``CUDA_VISIBLE_DEVICES`` empty), no process group, no files written.

Per case, in the order the libraries run at start-up:

1. HF Trainer configs (``train_args`` given): ``TrainingArguments`` (``use_cpu``), then
   ``HfTrainerDeepSpeedConfig.trainer_config_process`` (fills ``"auto"``), accelerate's
   ``DeepSpeedPlugin(hf_ds_config=...)`` and ``trainer_config_finalize`` (the mismatch check) — as
   ``TrainingArguments.__post_init__`` and ``Trainer`` do, with the launch's world size.
2. accelerate configs (``accelerate`` true): ``DeepSpeedPlugin(hf_ds_config=...)`` and ``set_mixed_precision``.
3. DeepSpeed: ``DeepSpeedConfig(config)``, which runs its pydantic models and its checks. Without a process group
   DeepSpeed takes world size 1; ``deepspeed.comm.get_rank``/``get_world_size`` are answered with 0 / the launch's
   world size instead, so the batch assertion sees the real world size (the only patch, and only here).
   DeepSpeed stops at its first error: after a field refused by a pydantic model the field is dropped and the config
   built again (``MAX_ROUNDS``), so every such refusal is reported.
"""

from __future__ import annotations

import json
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional


# pydantic model (exc.title) -> the config section its field locations are relative to.
MODEL_SECTIONS = {
    "DeepSpeedZeroConfig": "zero_optimization", "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
    "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer", "DeepSpeedFP16Config": "fp16",
    "DeepSpeedBF16Config": "bf16", "CompileConfig": "compile", "TensorBoardConfig": "tensorboard",
    "WandbConfig": "wandb", "CSVConfig": "csv_monitor", "CometConfig": "comet", "CommsLoggerConfig": "comms_logger",
}
MAX_ROUNDS = 8  # refusals collected per config (DeepSpeed stops at its first; the field is dropped and it reruns)


def _error(library: str, stage: str, exc: BaseException) -> Dict[str, Any]:
    out: Dict[str, Any] = {"library": library, "stage": stage, "type": type(exc).__name__,
                           "message": str(exc)[:4000]}
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            out["errors"] = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))[:500]}
                             for e in errors()][:50]
            out["model"] = getattr(exc, "title", None)
        except Exception:  # a non-pydantic .errors attribute
            pass
    return out


def _coerced_args(train: Dict[str, Any], fields) -> Dict[str, Any]:
    """Training arguments as the dataclass takes them: YAML strings such as ``1e-4`` converted, unknown keys
    dropped (LLaMA-Factory and axolotl add their own)."""
    out = {}
    for name, value in train.items():
        field = fields.get(name)
        if field is None or name in ("deepspeed", "output_dir", "report_to", "use_cpu"):
            continue
        kind = str(field.type)
        try:
            if isinstance(value, str) and ("float" in kind or "int" in kind) and "str" not in kind:
                number = float(value)
                value = int(number) if "int" in kind and number.is_integer() else number
            elif isinstance(value, str) and "bool" in kind and "str" not in kind:
                value = value.strip().lower() in ("true", "1", "yes", "y", "t")
        except ValueError:
            continue
        out[name] = value
    return out


def _hf_fill(config: Dict[str, Any], train: Dict[str, Any], world: int, model_hidden: int) -> Dict[str, Any]:
    """Run the HF Trainer's DeepSpeed steps; returns the filled config (raises what they raise)."""
    import dataclasses

    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class Args(TrainingArguments):  # the launch's world size, without a process group
        @property
        def world_size(self):
            return world

    fields = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    args = Args(output_dir=os.devnull, use_cpu=True, report_to="none", **_coerced_args(train, fields))
    hf = HfTrainerDeepSpeedConfig(config)
    hf.trainer_config_process(args)
    DeepSpeedPlugin(hf_ds_config=hf)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=model_hidden))
    steps = args.max_steps if isinstance(args.max_steps, int) and args.max_steps > 0 else 1000
    hf.trainer_config_finalize(args, model, steps)
    return hf.config


def _accelerate(config: Dict[str, Any], mixed_precision: Optional[str]) -> None:
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config=config)
    if mixed_precision:
        plugin.set_mixed_precision(mixed_precision)


def _deepspeed(config: Dict[str, Any], world: int) -> None:
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig

    dist.get_rank = lambda *a, **k: 0
    dist.get_world_size = lambda *a, **k: world
    DeepSpeedConfig(config)


def _has_auto_batch(config: Dict[str, Any]) -> bool:
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    return any(config.get(k) == "auto" for k in keys)


def run_case(case: Dict[str, Any], have: Dict[str, bool]) -> List[Dict[str, Any]]:
    """Every refusal of one config, by the libraries that are installed."""
    config = json.loads(json.dumps(case["config"], default=str))
    world = case.get("world_size") or 1
    if case.get("train_args") is not None and have["transformers"] and have["accelerate"]:
        try:
            config = _hf_fill(config, case["train_args"], world, case.get("hidden_size") or 1024)
        except Exception as exc:  # a refusal, the answer we came for
            return [_error("transformers", "TrainingArguments / HfTrainerDeepSpeedConfig", exc)]
    elif case.get("accelerate") and have["accelerate"]:
        try:
            _accelerate(json.loads(json.dumps(config)), case.get("mixed_precision"))
        except Exception as exc:
            return [_error("accelerate", "DeepSpeedPlugin", exc)]
    if not have["deepspeed"] or _has_auto_batch(config):
        return []
    return _deepspeed_rounds(config, world)


def _deepspeed_rounds(config: Dict[str, Any], world: int) -> List[Dict[str, Any]]:
    """DeepSpeedConfig's refusals, one per round: after a field refused by a pydantic model, the field is dropped
    (its default is valid) and the config built again; any other refusal ends the rounds."""
    out: List[Dict[str, Any]] = []
    for _ in range(MAX_ROUNDS):
        try:
            _deepspeed(json.loads(json.dumps(config)), world)
            return out
        except Exception as exc:  # a refusal, the answer we came for
            error = _error("deepspeed", "DeepSpeedConfig", exc)
            out.append(error)
            if not _drop_refused(config, error):
                return out
    return out


def _drop_refused(config: Dict[str, Any], error: Dict[str, Any]) -> bool:
    """Remove the fields a pydantic error names; False when there is none to remove."""
    section = MODEL_SECTIONS.get(error.get("model") or "")
    dropped = False
    for e in error.get("errors") or ():
        loc = [p for p in e.get("loc", []) if not p.isdigit()]
        base = [p for p in (section or "").split(".") if p]
        parent = config
        for part in base + loc[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        # A model validator (no location) names its field in the message: drop that field, never the section.
        named = [k for k in parent if len(k) > 3 and k in e.get("msg", "")]
        key = loc[-1] if loc else (max(named, key=len) if named else None)
        if key in parent:
            del parent[key]
            dropped = True
    return dropped


def _installed() -> Dict[str, bool]:
    import importlib.util

    return {name: importlib.util.find_spec(name) is not None for name in ("deepspeed", "transformers", "accelerate")}


def main() -> int:
    started = time.perf_counter()
    request = json.load(sys.stdin)
    os.environ.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", TRANSFORMERS_VERBOSITY="error",
                      HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    have = _installed()
    import logging

    logging.disable(logging.WARNING)
    versions = {}
    for name, ok in have.items():
        if ok:
            versions[name] = __import__(name).__version__
    imported = time.perf_counter()
    results = {case["id"]: run_case(case, have) for case in request["cases"]}
    answer = {"versions": versions, "results": results, "import_s": round(imported - started, 3),
              "total_s": round(time.perf_counter() - started, 3)}
    sys.stdout.write("ORACLE-ANSWER " + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
