"""What a launch says about a plan, read once: every value ``zeropilot plan`` takes from the launch, with its source.

The one place that reads a launch for the estimator: training arguments, the DeepSpeed config (or the ZeRO section of
an accelerate YAML), the scripts' environment and model build, and the world size, as the launch facts
(:mod:`zeropilot.launch.facts`, :mod:`zeropilot.launch.settings`) read them. ``memory`` receives the frozen
:class:`PlanFacts` and never sees a document. LLaMA-Factory turns gradient checkpointing on unless
``disable_gradient_checkpointing`` is set, and sets ``expandable_segments:True`` itself (FACTS D); ``"auto"`` bucket
sizes are kept as ``"auto"`` for ``memory.from_launch`` to fill from the model's hidden size.

API::

    from zeropilot.launch.planfacts import plan_facts

    pf = plan_facts(launch)           # PlanFacts, read once per Launch and cached on it
    pf.values["stage"], pf.sources["stage"].line
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional

from zeropilot.launch.document import Document
from zeropilot.launch.facts import ds_facts, truthy
from zeropilot.launch.settings import Freeze
from zeropilot.launch.source import Source, at, implied
from zeropilot.launch.values import positive_int

__all__ = ["Freeze", "PlanFacts", "Source", "plan_facts"]

_SEQ_KEYS = ("cutoff_len", "max_seq_length", "model_max_length", "max_length", "sequence_len")
_MICRO_KEYS = ("per_device_train_batch_size", "micro_batch_size")
_ROCM_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "PYTORCH_HIP_ALLOC_CONF")
#: PlanInputs field -> key of the DeepSpeed config's ``zero_optimization`` section
_ZERO_KEYS = (("reduce_bucket_size", "reduce_bucket_size"), ("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
              ("param_persistence_threshold", "stage3_param_persistence_threshold"),
              ("max_live_parameters", "stage3_max_live_parameters"),
              ("max_reuse_distance", "stage3_max_reuse_distance"),
              ("sub_group_size", "sub_group_size"), ("hpz_partition_size", "zero_hpz_partition_size"))


@dataclass(frozen=True)
class PlanFacts:
    """What a launch says about a plan, before the model is resolved.

    Attributes:
        values: PlanInputs field -> value (``"auto"`` for bucket sizes the HF integration fills; ``not_modelled``:
            the settings the launch gives that the plan does not model, as (setting, what the figure assumes)).
        sources: PlanInputs field (and ``model``, ``world_size``) -> where it came from. A value the launch implies
            and no file says (full fine-tuning without PEFT) has none.
        model: ``model_name_or_path``, None when the training arguments name none (or there are none);
            ``model_base``: the directory it is relative to.
        world_size: processes, None when the launch does not say; ``world_reason`` says how it was worked out.
        output_dir: where checkpoints go (for free-space checks), None when unsaid.
        flavour: the training arguments' dialect: ``llamafactory``, ``hf``, ``axolotl``, or None without them.
    """

    values: Mapping[str, Any]
    sources: Mapping[str, Source]
    model: Optional[str] = None
    model_base: Optional[Path] = None
    world_size: Optional[int] = None
    world_reason: str = ""
    output_dir: Optional[str] = None
    flavour: Optional[str] = None


class _Reader:
    """Collects values and sources while the launch's documents are read (a document only here)."""

    def __init__(self) -> None:
        self.values: Dict[str, Any] = {}
        self.sources: Dict[str, Source] = {}
        self.model: Optional[str] = None
        self.model_base: Optional[Path] = None
        self.output_dir: Optional[str] = None
        self.flavour: Optional[str] = None

    def set(self, name: str, value: Any, source: Source) -> None:
        self.values[name] = value
        self.sources[name] = source

    def key(self, name: str, value: Any, doc: Document, key: str) -> None:
        """``name`` from ``doc``'s ``key``, unless the value is None."""
        if value is not None:
            self.set(name, value, _at(doc, key))


def _at(doc: Document, key: str, why: str = "") -> Source:
    node = doc.get(key)
    return at(doc.path, node.line if node is not None else None, key, why)


def _first_int(r: _Reader, name: str, doc: Document, keys) -> None:
    for key in keys:
        value = positive_int(doc.value(key))
        if value:
            r.key(name, value, doc, key)
            return


def _checkpointing(r: _Reader, doc: Document) -> None:
    gc_key = "activation_checkpointing" if doc.has("activation_checkpointing") else "gradient_checkpointing"
    gc = truthy(doc.value(gc_key))  # transformers 5.24 names it activation_checkpointing too
    if doc.flavour != "llamafactory" or gc is not None:
        r.key("gradient_checkpointing", gc, doc, gc_key)
        return
    disabled = truthy(doc.value("disable_gradient_checkpointing"))
    if disabled is not None:
        r.set("gradient_checkpointing", not disabled, _at(doc, "disable_gradient_checkpointing"))
    else:
        r.set("gradient_checkpointing", True, implied(doc.path, "LLaMA-Factory enables it by default"))


def _length(r: _Reader, doc: Document) -> None:
    """How long the run is: ``max_steps`` (positive: it wins over epochs, as in the Trainer), ``num_train_epochs`` and
    LLaMA-Factory's ``max_samples`` (the Trainer's default epochs are the time model's, ``steptime.run_time``)."""
    r.key("max_steps", positive_int(doc.value("max_steps")), doc, "max_steps")
    epochs = doc.value("num_train_epochs")
    if isinstance(epochs, str) and len(epochs) < 30:  # a flag's value: "2" or "2.0"
        try:
            epochs = float(epochs)
        except ValueError:
            epochs = "not a number"
    if isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and 0 < epochs < 1e6:
        r.key("epochs", float(epochs), doc, "num_train_epochs")
    r.key("max_samples", positive_int(doc.value("max_samples")), doc, "max_samples")


def _attention(r: _Reader, doc: Document) -> None:
    attn = doc.value("attn_implementation") or doc.value("flash_attn")
    key = "attn_implementation" if doc.has("attn_implementation") else "flash_attn"
    if isinstance(attn, str) and attn in ("sdpa", "eager"):
        r.key("attn", attn, doc, key)
    elif isinstance(attn, str) and attn in ("fa2", "flash_attention_2"):
        r.key("attn", "flash", doc, key)


def _train_args(r: _Reader, doc: Document) -> None:
    r.flavour = doc.flavour
    model = doc.value("model_name_or_path")
    if isinstance(model, str) and model.strip():
        r.model, r.model_base = model.strip(), doc.path.parent
        r.sources["model"] = _at(doc, "model_name_or_path")
    _first_int(r, "seq_len", doc, _SEQ_KEYS)
    _first_int(r, "micro_batch", doc, _MICRO_KEYS)
    r.key("grad_accum", positive_int(doc.value("gradient_accumulation_steps")), doc, "gradient_accumulation_steps")
    _checkpointing(r, doc)
    # transformers 5's Trainer sets the model's use_cache from TrainingArguments.use_cache (default False), after
    # LLaMA-Factory turned it off: only a launch that turns it on trains with the key/value cache
    r.key("kv_cache", truthy(doc.value("use_cache")), doc, "use_cache")
    r.key("save_total_limit", positive_int(doc.value("save_total_limit")), doc, "save_total_limit")
    _length(r, doc)
    r.key("save_steps", positive_int(doc.value("save_steps")), doc, "save_steps")
    r.key("save_only_model", truthy(doc.value("save_only_model")), doc, "save_only_model")
    _attention(r, doc)
    if doc.flavour == "llamafactory":
        r.set("expandable_segments", True, implied(doc.path, "LLaMA-Factory sets expandable_segments:True"))
    od = doc.value("output_dir")
    r.output_dir = od if isinstance(od, str) else None


def _settings(r: _Reader, launch, train: Optional[Document], ds: Optional[Document]) -> None:
    """The fine-tuning method, what it trains, quantization, the optimizer and a fused loss, as the launch facts
    read them (:mod:`zeropilot.launch.settings`), and every setting the plan does not model
    (:mod:`zeropilot.launch.coverage`)."""
    from zeropilot.launch.coverage import apply_settings

    f = launch.facts()
    ts = f.settings(train)
    if train is None and not ts.settings and ts.method == "full":
        return  # no training arguments, adapter config or script says anything
    not_modelled = apply_settings(ts, f.for_doc(ds) if ds is not None else None, r.values, r.sources)
    if not_modelled:
        r.values["not_modelled"] = not_modelled


def _offload(r: _Reader, ds, doc: Document) -> None:
    for name in ("offload_optimizer", "offload_param"):
        device = getattr(ds, name)
        if device in ("cpu", "nvme"):
            r.key(name, device, doc, f"zero_optimization.{name}.device")
        elif doc.get(f"zero_optimization.{name}") is not None:
            r.key(name, "none", doc, f"zero_optimization.{name}")


def _zero_section(r: _Reader, doc: Document, zero: Dict[str, Any]) -> None:
    z = "zero_optimization."
    r.key("overlap_comm", truthy(zero.get("overlap_comm")), doc, z + "overlap_comm")
    for name, key in _ZERO_KEYS:
        value = zero.get(key)
        if value == "auto":
            r.set(name, "auto", _at(doc, z + key, ' ("auto": filled from hidden_size)'))
        else:
            r.key(name, positive_int(value), doc, z + key)
    r.key("gather_16bit_on_save", truthy(zero.get("stage3_gather_16bit_weights_on_model_save")), doc,
          z + "stage3_gather_16bit_weights_on_model_save")


def _ds_config(r: _Reader, doc: Document, hf: Optional[bool]) -> None:
    """Stage and offload as the launch facts read them (one place); bucket and save keys from the section."""
    ds = ds_facts(doc, hf)
    if ds.stage is not None:
        r.set("stage", ds.stage, _at(doc, ds.stage_node.path) if ds.stage_node is not None
              else implied(doc.path, ds.stage_reason))
    _offload(r, ds, doc)
    if ds.torch_adam_key:
        r.key("torch_adam", ds.torch_adam, doc, ds.torch_adam_key)
    if hf and ds.optimizer is None:
        r.set("trainer_optimizer", True, implied(doc.path, "no optimizer section: the HF Trainer builds its own "
                                                           "(create_optimizer: two weight-decay groups)"))
    zero = doc.value("zero_optimization")
    if not isinstance(zero, dict):
        return
    _zero_section(r, doc, zero)
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        name = "micro_batch" if key.startswith("train_micro") else "grad_accum"
        if name not in r.values:
            r.key(name, positive_int(doc.value(key)), doc, key)


def _accelerate(r: _Reader, doc: Document) -> None:
    """ZeRO settings written in an accelerate YAML (``deepspeed_config:``) when no DeepSpeed JSON is used."""
    d = "deepspeed_config."
    stage = doc.value(d + "zero_stage")
    if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3:
        r.key("stage", stage, doc, d + "zero_stage")
    for name, key in (("offload_optimizer", "offload_optimizer_device"), ("offload_param", "offload_param_device")):
        value = doc.value(d + key)
        if value in ("none", "cpu", "nvme"):
            r.key(name, value, doc, d + key)
    r.key("grad_accum", positive_int(doc.value(d + "gradient_accumulation_steps")), doc,
          d + "gradient_accumulation_steps")


def _env(r: _Reader, launch) -> None:
    env = launch.env()
    rocm = next((env[v] for v in _ROCM_VARS if v in env), None)
    if rocm is not None:
        # FACTS E: expandable_segments was unsupported on ROCm for years and is unknown on Hygon DTK builds.
        r.set("expandable_segments", False, at(rocm.file, rocm.line, rocm.name, ": a ROCm/DCU launch, where "
                                               "expandable_segments is not known to work (planned without it)"))
        return
    for name, setting in env.items():
        if name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") and "expandable_segments:true" in str(
                setting.value).lower():
            r.set("expandable_segments", True, at(setting.file, setting.line, name))


def _build(r: _Reader, launch) -> None:
    """``zero_init`` from the training scripts: False for a raw ``deepspeed.initialize`` script."""
    from zeropilot.launch.build import model_build

    for py in launch.python_files:
        if py.tree is None:
            continue
        b = model_build(py.tree)
        if b.zero_init is not None:
            r.set("zero_init", b.zero_init, Source(f"{py.path}:{b.line} ({b.reason})", py.path, b.line))
            if b.zero_init is False:
                return


def _world(r: _Reader, launch) -> None:
    ws = launch.world_size
    if ws.value:
        where = f"{ws.file}:{ws.line}" if ws.file else "launch"
        r.sources["world_size"] = Source(f"{where} ({ws.reason})", ws.file, ws.line)


def _read(launch) -> PlanFacts:
    r = _Reader()
    _build(r, launch)
    pairs = launch.training_pairs()
    train: Optional[Document] = pairs[0][0] if pairs else (launch.train_args[0] if launch.train_args else None)
    ds: Optional[Document] = pairs[0][1] if pairs else (launch.ds_configs[0] if launch.ds_configs else None)
    if ds is not None:
        _ds_config(r, ds, launch.uses_hf_integration(ds))
    elif launch.accelerate_configs:
        _accelerate(r, launch.accelerate_configs[0])
    if train is not None:
        _train_args(r, train)
    _settings(r, launch, train, ds)
    _env(r, launch)
    _world(r, launch)
    ws = launch.world_size
    return PlanFacts(MappingProxyType(r.values), MappingProxyType(r.sources), r.model, r.model_base, ws.value,
                     ws.reason, r.output_dir, r.flavour)


def plan_facts(launch) -> PlanFacts:
    """What ``launch`` says about the plan (its first training arguments and their DeepSpeed config), read once and
    cached on the launch."""
    cached = getattr(launch, "_plan_facts", None)
    if cached is None:
        cached = launch._plan_facts = _read(launch)
    return cached
