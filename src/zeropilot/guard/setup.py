"""What a rank trains, read from the live objects once: the model's sizes, LoRA, the ZeRO config, the batch.

The ``setup`` record is what the OOM diagnosis plans from (:mod:`zeropilot.guard.whatif`): the model's
``config`` (only :data:`zeropilot.models.CONFIG_SIZE_KEYS`), LoRA's rank, whether gradient checkpointing is on,
the ZeRO settings in force (stage, offloads, buckets) and the batch settings, as DeepSpeed's engine or the
HF Trainer hold them. Everything is read with ``getattr`` and a guard against any exception: a value this
module cannot read is ``None``, never an error in the job. Nothing here touches a tensor's data (shapes and
``numel`` only), so nothing synchronises the device.
"""

from __future__ import annotations

import enum

from typing import Any, Dict, Iterator, Optional, Tuple

from zeropilot.models.arch import CONFIG_SIZE_KEYS

_ATTN = {"flash_attention_2": "flash", "flash_attention_3": "flash", "sdpa": "sdpa", "eager": "eager"}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    try:
        return getattr(obj, name, default)
    except Exception:  # noqa: BLE001 - a property that raises is an unknown value
        return default


def _call(obj: Any, name: str) -> Any:
    fn = _get(obj, name)
    try:
        return fn() if callable(fn) else None
    except Exception:  # noqa: BLE001
        return None


def _scalar(value: Any) -> Any:
    """A JSON scalar as the record will hold it, in the rank too: an enum is its value (PEFT's ``PeftType.LORA``
    is a ``str`` subclass that ``json`` writes as ``"LORA"`` but ``str()`` spells ``"PeftType.LORA"``, so the rank's
    own what-ifs saw another value than the written record)."""
    if isinstance(value, enum.Enum):
        value = value.value
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value if value is None else str(value)


def config_sizes(config: Any, depth: int = 0) -> Optional[Dict[str, Any]]:
    """The size fields of a transformers ``PretrainedConfig`` (or a dict), ``text_config`` included."""
    if config is None:
        return None
    get = config.get if isinstance(config, dict) else (lambda k, d=None: _get(config, k, d))
    out = {k: _scalar(get(k)) for k in CONFIG_SIZE_KEYS if get(k) is not None}
    text = get("text_config")
    if text is not None and depth == 0:
        inner = config_sizes(text, 1)
        if inner:
            out["text_config"] = inner
    return out or None


def _wrapped(obj: Any) -> Iterator[Any]:
    """``obj`` and what it wraps: a DeepSpeed engine's ``module``, PEFT's ``base_model`` and its ``model``."""
    seen = 0
    while obj is not None and seen < 6:
        yield obj
        seen += 1
        nxt = None
        for attr in ("module", "base_model", "model"):
            cand = _get(obj, attr)
            if cand is not None and cand is not obj and hasattr(cand, "parameters"):
                nxt = cand
                break
        obj = nxt


def _first(model: Any, attr: str) -> Any:
    for m in _wrapped(model):
        value = _get(m, attr)
        if value is not None:
            return value
    return None


def _lora(model: Any) -> Optional[Dict[str, Any]]:
    peft = _first(model, "peft_config")
    if not isinstance(peft, dict) or not peft:
        return None
    cfg = next(iter(peft.values()))
    targets = _get(cfg, "target_modules")
    if isinstance(targets, (set, list, tuple)):
        targets = sorted(str(t) for t in targets)
    return {"type": _scalar(_get(cfg, "peft_type")), "r": _scalar(_get(cfg, "r")), "target_modules": targets}


def param_counts(model: Any) -> Tuple[Optional[int], Optional[int]]:
    """(all, trainable) parameters; ZeRO-3 partitions count whole (``ds_numel``)."""
    total = trainable = 0
    try:
        for p in model.parameters():
            n = int(_get(p, "ds_numel", None) or p.numel())
            total += n
            if p.requires_grad:
                trainable += n
    except Exception:  # noqa: BLE001
        return None, None
    return total, trainable


def gradient_checkpointing(model: Any) -> Optional[bool]:
    value = _first(model, "is_gradient_checkpointing")
    return bool(value) if value is not None else None


def _model_config(model: Any) -> Any:
    """The first ``config`` that is a model's (has ``model_type``): not a DeepSpeed engine's own ``config``."""
    for m in _wrapped(model):
        config = _get(m, "config")
        if config is not None and (config.get("model_type") if isinstance(config, dict)
                                   else _get(config, "model_type")) is not None:
            return config
    return None


def model_facts(model: Any) -> Dict[str, Any]:
    """The model's sizes (``config``), LoRA, parameter counts, attention and gradient checkpointing."""
    config = _model_config(model)
    total, trainable = param_counts(model)
    attn = _get(config, "_attn_implementation") if config is not None else None
    dtype = None
    try:
        dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
    except Exception:  # noqa: BLE001
        pass
    return {"config": config_sizes(config), "lora": _lora(model), "params": total, "trainable": trainable,
            "attn": _ATTN.get(str(attn), None) if attn else None, "dtype": dtype,
            "gradient_checkpointing": gradient_checkpointing(model), "class": type(model).__name__}


def _offload(cfg: Any) -> Optional[str]:
    if cfg is None:
        return "none"
    device = _get(cfg, "device")
    return str(_get(device, "value", device)) if device is not None else None


def engine_facts(engine: Any) -> Dict[str, Any]:
    """The ZeRO settings in force and the batch settings of a ``DeepSpeedEngine``."""
    zero = {
        "stage": _call(engine, "zero_optimization_stage"),
        "offload_optimizer": _offload(_call(engine, "zero_offload_optimizer")),
        "offload_param": _offload(_call(engine, "zero_offload_param")),
        "reduce_bucket_size": _call(engine, "zero_reduce_bucket_size"),
        "prefetch_bucket_size": _call(engine, "zero_prefetch_bucket_size"),
        "param_persistence_threshold": _call(engine, "zero_param_persistence_threshold"),
        "max_live_parameters": _call(engine, "zero_max_live_parameters"),
        "max_reuse_distance": _call(engine, "zero_max_reuse_distance"),
        "sub_group_size": _call(engine, "zero_sub_group_size"),
        "overlap_comm": _call(engine, "zero_overlap_comm"),
        "contiguous_gradients": _call(engine, "zero_contiguous_gradients"),
        "gather_16bit_on_save": _call(engine, "zero_gather_16bit_weights_on_model_save"),
        "hpz_partition_size": _call(engine, "zero_hpz_partition_size"),
    }
    inner = _get(_get(engine, "optimizer"), "optimizer")
    precision = "bf16" if _call(engine, "bfloat16_enabled") else "fp16" if _call(engine, "fp16_enabled") else "fp32"
    train = {"micro_batch": _call(engine, "train_micro_batch_size_per_gpu"),
             "grad_accum": _call(engine, "gradient_accumulation_steps"),
             "world_size": _get(engine, "world_size"), "precision": precision,
             "optimizer": None if inner is None else f"{type(inner).__module__}.{type(inner).__name__}"}
    return {"zero": {k: _scalar(v) for k, v in zero.items()}, "train": {k: _scalar(v) for k, v in train.items()}}


def trainer_facts(args: Any) -> Dict[str, Any]:
    """The batch settings of an HF Trainer's ``TrainingArguments``; ZeRO stage 0 when it runs without DeepSpeed."""
    precision = "bf16" if _get(args, "bf16") else "fp16" if _get(args, "fp16") else "fp32"
    train = {"micro_batch": _get(args, "per_device_train_batch_size"),
             "grad_accum": _get(args, "gradient_accumulation_steps"),
             "world_size": _get(args, "world_size"), "precision": precision,
             "gradient_checkpointing_arg": _get(args, "gradient_checkpointing")}
    out: Dict[str, Any] = {"train": {k: _scalar(v) for k, v in train.items()}}
    if not _get(args, "deepspeed"):
        out["zero"] = {"stage": 0}
    return out


def zero_init_built(model: Any) -> Optional[bool]:
    """Whether the model's parameters were made inside ``deepspeed.zero.Init`` (partitioned before initialize)."""
    try:
        first = next(iter(model.parameters()))
    except Exception:  # noqa: BLE001
        return None
    return _get(first, "ds_id") is not None


# -- batches -------------------------------------------------------------------------------------------------

_INPUT_KEYS = ("input_ids", "inputs_embeds", "pixel_values")


def _tensor_shape(value: Any) -> Optional[Tuple[int, ...]]:
    shape = _get(value, "shape")
    try:
        return tuple(int(x) for x in shape) if shape is not None else None
    except (TypeError, ValueError):
        return None


def batch_shape(args: tuple, kwargs: dict) -> Optional[Tuple[int, int, Optional[int]]]:
    """(micro batch size, padded length, non-padding tokens or None) of what a forward is called with.

    The inputs are the first of ``input_ids`` / ``inputs_embeds`` in the keyword arguments (or a dict
    passed first, as a Trainer's ``inputs``), else the first positional tensor of two or more dimensions.
    Tokens are counted only when the attention mask is on the host: counting a mask on the GPU would make
    the host wait for the device at every micro batch.
    """
    src = kwargs
    if not any(k in kwargs for k in _INPUT_KEYS) and args and isinstance(args[0], dict):
        src = args[0]
    shape = None
    for key in _INPUT_KEYS:
        if src.get(key) is not None:
            shape = _tensor_shape(src[key])
            break
    if shape is None:
        for value in args:
            s = _tensor_shape(value)
            if s is not None and len(s) >= 2:
                shape = s
                break
    if shape is None or len(shape) < 2:
        return None
    tokens = None
    mask = src.get("attention_mask") if isinstance(src, dict) else None
    device = _get(_get(mask, "device"), "type")
    if mask is not None and device == "cpu" and _tensor_shape(mask) is not None:
        try:
            tokens = int(mask.sum())
        except Exception:  # noqa: BLE001
            tokens = None
    return shape[0], shape[1], tokens


def refresh(guard: Any) -> None:
    """Read gradient checkpointing again (a Trainer turns it on after ``deepspeed.initialize``): first step, OOM."""
    ref = getattr(guard, "model_ref", None)
    model = ref() if callable(ref) else None
    if model is not None:
        guard.update_setup(model={"gradient_checkpointing": gradient_checkpointing(model)})


def _at_first_step(guard: Any) -> None:
    if not getattr(guard, "_setup_refreshed", False):
        guard._setup_refreshed = True
        refresh(guard)


def listen() -> None:
    """Refresh the setup once, at the rank's first optimizer step."""
    from zeropilot.guard import rank

    rank.on_step(_at_first_step)
