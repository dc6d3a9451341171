"""Plan inputs read from a launch (``zeropilot.launch``): training arguments, DeepSpeed config, world size.

Every value keeps where it came from (``file:line key``) in :attr:`PlanInputs.sources`. ``"auto"`` bucket
sizes resolve as the HF integration resolves them (FACTS B: reduce_bucket_size h², prefetch 0.9·h²,
persistence threshold 10·h). LLaMA-Factory turns gradient checkpointing on unless
``disable_gradient_checkpointing`` is set, and sets ``expandable_segments:True`` itself (FACTS D).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from zeropilot.launch.document import Document
from zeropilot.launch.facts import ds_facts, truthy
from zeropilot.launch.model import Launch


@dataclass
class LaunchValues:
    """What a launch says about a plan, before the model is resolved.

    Attributes:
        model: ``model_name_or_path`` (None when absent), ``model_base``: directory it is relative to.
        values: PlanInputs field -> value.
        sources: PlanInputs field -> ``file:line key``.
        world_size: processes, with ``world_reason``.
        output_dir: where checkpoints go (for free-space checks).
        flavour: ``llamafactory``, ``hf``, ``axolotl`` or None.
        not_modelled: settings the launch gives that the plan does not model, as (setting, what the figure assumes).
    """

    model: Optional[str] = None
    model_base: Optional[Path] = None
    values: Dict[str, Any] = field(default_factory=dict)
    sources: Dict[str, str] = field(default_factory=dict)
    world_size: Optional[int] = None
    world_reason: str = ""
    output_dir: Optional[str] = None
    flavour: Optional[str] = None
    not_modelled: Tuple[Tuple[str, str], ...] = ()


def _where(doc: Document, key: str) -> str:
    node = doc.get(key)
    line = f":{node.line}" if node is not None and node.line else ""
    return f"{doc.path}{line} {key}"


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)) and value == int(value) and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _set(out: LaunchValues, name: str, value: Any, doc: Document, key: str) -> None:
    if value is not None:
        out.values[name] = value
        out.sources[name] = _where(doc, key)


def _train_args(out: LaunchValues, doc: Document) -> None:
    out.flavour = doc.flavour
    model = doc.value("model_name_or_path")
    if isinstance(model, str) and model.strip():
        out.model, out.model_base = model.strip(), doc.path.parent
        out.sources["model"] = _where(doc, "model_name_or_path")
    for key in ("cutoff_len", "max_seq_length", "model_max_length", "max_length", "sequence_len"):
        if _int(doc.value(key)):
            _set(out, "seq_len", _int(doc.value(key)), doc, key)
            break
    for key in ("per_device_train_batch_size", "micro_batch_size"):
        if _int(doc.value(key)):
            _set(out, "micro_batch", _int(doc.value(key)), doc, key)
            break
    _set(out, "grad_accum", _int(doc.value("gradient_accumulation_steps")), doc, "gradient_accumulation_steps")
    gc_key = "activation_checkpointing" if doc.has("activation_checkpointing") else "gradient_checkpointing"
    gc = truthy(doc.value(gc_key))  # transformers 5.24 names it activation_checkpointing too
    if doc.flavour == "llamafactory" and gc is None:
        disabled = truthy(doc.value("disable_gradient_checkpointing"))
        gc = not disabled if disabled is not None else True
        key = "disable_gradient_checkpointing" if disabled is not None else "finetuning_type"
        out.values["gradient_checkpointing"] = gc
        out.sources["gradient_checkpointing"] = (_where(doc, key) if disabled is not None
                                                 else f"{doc.path} (LLaMA-Factory enables it by default)")
    else:
        _set(out, "gradient_checkpointing", gc, doc, gc_key)
    _set(out, "save_total_limit", _int(doc.value("save_total_limit")), doc, "save_total_limit")
    _set(out, "save_steps", _int(doc.value("save_steps")), doc, "save_steps")
    _set(out, "save_only_model", truthy(doc.value("save_only_model")), doc, "save_only_model")
    attn = doc.value("attn_implementation") or doc.value("flash_attn")
    if isinstance(attn, str) and attn in ("sdpa", "eager"):
        _set(out, "attn", attn, doc, "attn_implementation" if doc.has("attn_implementation") else "flash_attn")
    elif isinstance(attn, str) and attn in ("fa2", "flash_attention_2"):
        _set(out, "attn", "flash", doc, "attn_implementation" if doc.has("attn_implementation") else "flash_attn")
    if doc.flavour == "llamafactory":
        out.values["expandable_segments"] = True
        out.sources["expandable_segments"] = f"{doc.path} (LLaMA-Factory sets expandable_segments:True)"
    od = doc.value("output_dir")
    out.output_dir = od if isinstance(od, str) else None


def _settings(out: LaunchValues, launch: Launch, train: Optional[Document], ds: Optional[Document]) -> None:
    """The fine-tuning method, what it trains, quantization, the optimizer and a fused loss, as the launch facts read
    them (:mod:`zeropilot.launch.settings`), and every setting the plan does not model (:mod:`memory.coverage`)."""
    from zeropilot.memory.coverage import apply_settings

    f = launch.facts()
    ts = f.settings(train)
    if train is None and not ts.settings and ts.method == "full":
        return  # no training arguments, adapter config or script says anything
    out.not_modelled = apply_settings(ts, f.for_doc(ds) if ds is not None else None, out.values, out.sources)
    if out.not_modelled:
        out.values["not_modelled"] = out.not_modelled


def _ds_config(out: LaunchValues, doc: Document, hf: Optional[bool]) -> None:
    """Stage and offload as the launch facts read them (one place); bucket and save keys from the section."""
    ds = ds_facts(doc, hf)
    z = "zero_optimization."
    if ds.stage is not None:
        out.values["stage"] = ds.stage
        out.sources["stage"] = (_where(doc, ds.stage_node.path) if ds.stage_node is not None
                                else f"{doc.path} ({ds.stage_reason})")
    for name in ("offload_optimizer", "offload_param"):
        device = getattr(ds, name)
        if device in ("cpu", "nvme"):
            _set(out, name, device, doc, f"{z}{name}.device")
        elif doc.get(f"{z}{name}") is not None:
            _set(out, name, "none", doc, f"{z}{name}")
    if ds.torch_adam_key:
        _set(out, "torch_adam", ds.torch_adam, doc, ds.torch_adam_key)
    zero = doc.value("zero_optimization")
    if not isinstance(zero, dict):
        return
    _set(out, "overlap_comm", truthy(zero.get("overlap_comm")), doc, z + "overlap_comm")
    for name, key in (("reduce_bucket_size", "reduce_bucket_size"),
                      ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
                      ("param_persistence_threshold", "stage3_param_persistence_threshold"),
                      ("max_live_parameters", "stage3_max_live_parameters"),
                      ("max_reuse_distance", "stage3_max_reuse_distance"),
                      ("sub_group_size", "sub_group_size"), ("hpz_partition_size", "zero_hpz_partition_size")):
        value = zero.get(key)
        if value == "auto":
            out.values[name] = "auto"
            out.sources[name] = _where(doc, z + key) + ' ("auto": filled from hidden_size)'
        else:
            _set(out, name, _int(value), doc, z + key)
    _set(out, "gather_16bit_on_save", truthy(zero.get("stage3_gather_16bit_weights_on_model_save")), doc,
         z + "stage3_gather_16bit_weights_on_model_save")
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        name = "micro_batch" if key.startswith("train_micro") else "grad_accum"
        if name not in out.values:
            _set(out, name, _int(doc.value(key)), doc, key)


_ROCM_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "PYTORCH_HIP_ALLOC_CONF")


def _accelerate(out: LaunchValues, doc: Document) -> None:
    """ZeRO settings written in an accelerate YAML (``deepspeed_config:``) when no DeepSpeed JSON is used."""
    d = "deepspeed_config."
    stage = doc.value(d + "zero_stage")
    if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3:
        _set(out, "stage", stage, doc, d + "zero_stage")
    for name, key in (("offload_optimizer", "offload_optimizer_device"), ("offload_param", "offload_param_device")):
        value = doc.value(d + key)
        if value in ("none", "cpu", "nvme"):
            _set(out, name, value, doc, d + key)
    _set(out, "grad_accum", _int(doc.value(d + "gradient_accumulation_steps")), doc, d + "gradient_accumulation_steps")


def _env(out: LaunchValues, launch: Launch) -> None:
    env = launch.env()
    rocm = next((env[v] for v in _ROCM_VARS if v in env), None)
    if rocm is not None:
        # FACTS E: expandable_segments was unsupported on ROCm for years and is unknown on Hygon DTK builds.
        out.values["expandable_segments"] = False
        out.sources["expandable_segments"] = (f"{rocm.file}:{rocm.line} {rocm.name}: a ROCm/DCU launch, where "
                                              "expandable_segments is not known to work (planned without it)")
        return
    for name, setting in env.items():
        if name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") and "expandable_segments:true" in str(
                setting.value).lower():
            out.values["expandable_segments"] = True
            out.sources["expandable_segments"] = f"{setting.file}:{setting.line} {name}"


def _build(out: LaunchValues, launch: Launch) -> None:
    """``zero_init`` from the training scripts: False for a raw ``deepspeed.initialize`` script."""
    from zeropilot.launch.build import model_build

    for py in launch.python_files:
        if py.tree is None:
            continue
        b = model_build(py.tree)
        if b.zero_init is not None:
            out.values["zero_init"] = b.zero_init
            out.sources["zero_init"] = f"{py.path}:{b.line} ({b.reason})"
            if b.zero_init is False:
                return


def values_from_launch(launch: Launch) -> LaunchValues:
    """What ``launch`` says about the plan (first training-args document and its DeepSpeed config)."""
    out = LaunchValues()
    _build(out, launch)
    pairs = launch.training_pairs()
    train: Optional[Document] = pairs[0][0] if pairs else (launch.train_args[0] if launch.train_args else None)
    ds: Optional[Document] = pairs[0][1] if pairs else (launch.ds_configs[0] if launch.ds_configs else None)
    if ds is not None:
        _ds_config(out, ds, launch.uses_hf_integration(ds))
    elif launch.accelerate_configs:
        _accelerate(out, launch.accelerate_configs[0])
    if train is not None:
        _train_args(out, train)
    _settings(out, launch, train, ds)
    _env(out, launch)
    ws = launch.world_size
    out.world_size, out.world_reason = ws.value, ws.reason
    if ws.value:
        where = f"{ws.file}:{ws.line}" if ws.file else "launch"
        out.sources["world_size"] = f"{where} ({ws.reason})"
    return out


def resolve_auto(values: Dict[str, Any], hidden: int) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """Replace ``"auto"`` bucket sizes with what the HF integration fills in for ``hidden``."""
    fill = {"reduce_bucket_size": hidden * hidden, "prefetch_bucket_size": int(0.9 * hidden * hidden),
            "param_persistence_threshold": 10 * hidden}
    out, notes = dict(values), {}
    for name, value in values.items():
        if value == "auto":
            if name in fill:
                out[name] = fill[name]
                notes[name] = f"auto -> {fill[name]}"
            else:
                del out[name]
    return out, notes
