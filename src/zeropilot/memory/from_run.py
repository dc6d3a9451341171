"""Plan inputs from what a rank recorded: its ``setup`` record (the model's config sizes, LoRA, the ZeRO and batch
settings in force) and a batch. The one hand-over from a run directory's records to ``memory``, used by the OOM
what-ifs (:mod:`zeropilot.guard.whatif`, at the failing batch) and by the report's predicted step time
(:mod:`zeropilot.runlog.timing`, at the batch the steady steps had).

Pure (no torch, no I/O); a record from a stranger is an expected input: a value of the wrong type is ignored, a
model or a setting the plan cannot take gives ``(None, why)``.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.memory.inputs import Hardware, PlanInputs
from zeropilot.models.arch import from_config


#: sizes beyond any model or batch a run trains (the largest models have about 130 layers, 256 experts, a 256k
#: vocabulary): a record claiming more is refused rather than planned, since the plan's work grows with layers,
#: experts and the samples per step (a stranger's record must not keep the report busy for hours)
LIMITS = {"layers": 512, "hidden": 1 << 17, "intermediate": 1 << 19, "vocab": 1 << 22, "heads": 1 << 12,
          "experts": 1 << 12, "samples_per_step": 1 << 14, "seq_len": 1 << 22, "world_size": 1 << 17}


def num(value: Any) -> Optional[int]:
    """A recorded number as an int, or None (absent, not a number, a boolean, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def _dict(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def expandable_in(record: Dict[str, Any]) -> bool:
    """Whether ``expandable_segments:True`` was in force, by the record's ``allocator_settings`` (the environment
    or what the allocator reported)."""
    settings = _dict(record.get("allocator_settings"))
    texts = [str(v) for v in _dict(settings.get("environment")).values()] + [str(settings.get("in_force") or "")]
    return any("expandable_segments:true" in t.lower().replace(" ", "") or "'expandable_segments': true"
               in t.lower() for t in texts)


def budget(total: Optional[int], limit: Optional[int], outside: Optional[int]) -> Optional[int]:
    """What the plan's peak (reserved + outside PyTorch) must stay under on a rank: the allocator's limit (an
    emulated smaller card) plus memory outside PyTorch, or the device's total, whichever is smaller."""
    if limit is None:
        return total
    return limit + (outside or 0) if total is None else min(limit + (outside or 0), total)


def plan_inputs(record: Dict[str, Any], budget: Optional[int]) -> Tuple[Optional[PlanInputs], Optional[str], List[str]]:
    """The plan's inputs of the run a record describes, or ``(None, why not, [])``.

    Args:
        record: ``setup`` (a rank's setup record), ``batch`` (``micro_batch_size``, ``seq_len``: the batch to plan
            at; ``micro_batches``: the micro batches of an optimizer step, else the setup's accumulation),
            ``allocator_settings`` (a start or OOM record's).
        budget: one GPU's memory for the plan's verdict (:func:`budget`), None when unknown.

    Returns:
        (inputs, None, notes: assumptions made), or (None, why not, []).
    """
    setup = _dict(record.get("setup"))
    model, zero, train = _dict(setup.get("model")), _dict(setup.get("zero")), _dict(setup.get("train"))
    cfg = model.get("config")
    notes: List[str] = []
    if not isinstance(cfg, dict):
        return None, ("the guard saw no model config in this rank (the job built neither a DeepSpeed engine nor a "
                      "Trainer around a Hugging Face model)"), []
    try:
        arch = from_config(cfg, name=str(cfg.get("_name_or_path") or cfg.get("model_type") or "model"),
                           source="the rank's model.config")
    except (InputError, KeyError, TypeError, ValueError, ArithmeticError) as exc:
        return None, f"the plan cannot size this model: {exc}", []
    big = _too_large(arch)
    if big:
        return None, f"the plan cannot take this run's settings: {big}", []
    batch = _dict(record.get("batch"))
    mb = num(batch.get("micro_batch_size")) or num(train.get("micro_batch")) or 1
    seq = num(batch.get("seq_len"))
    if seq is None:
        seq = 1
        notes.append("no batch reached the model before the failure: activations sized for 1 token")
    lora = model.get("lora") if isinstance(model.get("lora"), dict) else None
    lora_rank = num(lora.get("r")) if lora and str(lora.get("type", "LORA")).upper() == "LORA" else None
    if lora and lora.get("target_modules") not in ("all-linear", None) and lora_rank:
        notes.append(f"LoRA on {lora.get('target_modules')} planned as LoRA on every linear layer (a few MB more)")
    stage = num(zero.get("stage"))
    stage = 0 if stage is None else stage
    world = num(train.get("world_size")) or 1
    gc = model.get("gradient_checkpointing")
    if gc is None:
        gc = train.get("gradient_checkpointing_arg")
    values: Dict[str, Any] = dict(
        arch=arch, hardware=Hardware(world, budget) if budget else None, world=world, stage=stage, micro_batch=mb,
        seq_len=max(seq, 1), grad_accum=num(batch.get("micro_batches")) or num(train.get("grad_accum")) or 1,
        gradient_checkpointing=bool(gc),
        lora_rank=lora_rank, expandable_segments=expandable_in(record), attn=model.get("attn") or "sdpa",
        torch_adam="torch.optim" in str(train.get("optimizer") or ""),
        offload_optimizer=str(zero.get("offload_optimizer") or "none") if stage else "none",
        offload_param=str(zero.get("offload_param") or "none") if stage == 3 else "none",
        zero_init=bool(zero.get("zero_init", True)), gather_16bit_on_save=bool(zero.get("gather_16bit_on_save")))
    for key in ("reduce_bucket_size", "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters",
                "max_reuse_distance", "sub_group_size", "hpz_partition_size"):
        if num(zero.get(key)) is not None:
            values[key] = num(zero[key])
    if isinstance(zero.get("overlap_comm"), bool):
        values["overlap_comm"] = zero["overlap_comm"]
    if values.get("hpz_partition_size", 1) > 1 and world % values["hpz_partition_size"]:
        values["hpz_partition_size"] = 1
    big = _too_large(None, values["micro_batch"] * values["grad_accum"], values["seq_len"], world)
    if big:
        return None, f"the plan cannot take this run's settings: {big}", []
    try:
        inputs = PlanInputs(**values)
        inputs.validate()
    except (InputError, TypeError) as exc:
        return None, f"the plan cannot take this run's settings: {exc}", []
    return inputs, None, notes


def _too_large(arch: Any, samples: int = 1, seq_len: int = 1, world: int = 1) -> Optional[str]:
    """What exceeds :data:`LIMITS`, in words, or None."""
    sizes = {"samples_per_step": samples, "seq_len": seq_len, "world_size": world}
    if arch is not None:
        sizes.update(layers=arch.layers, hidden=arch.hidden, intermediate=arch.intermediate, vocab=arch.vocab,
                     heads=arch.heads, experts=arch.moe.experts if arch.moe else 0)
    over = [f"{k} {v} (at most {LIMITS[k]})" for k, v in sizes.items() if v > LIMITS[k]]
    return "; ".join(over) + ": larger than any run the plan models" if over else None
