"""What a launch's training arguments set that changes memory, read once: the fine-tuning method and what it trains,
quantization, the optimizer, fused losses, packing, sequence parallelism, offloaded checkpointing, fp8 and the rest
of :data:`KEYS`. Part of the launch-facts layer (:func:`zeropilot.launch.facts.facts` caches it per training
document): ``plan``, ``check`` and ``repro`` read these values from here, never from the keys.

Where values come from, in order (a later source fills only what an earlier one left unsaid):

1. the training arguments: LLaMA-Factory YAML (v0.9.5 names and defaults), HF ``TrainingArguments`` and TRL/axolotl
   keys in YAML, JSON or on a command line;
2. PEFT adapter configs (``adapter_config.json``) given with the launch;
3. literal keyword arguments of ``LoraConfig(...)`` and ``BitsAndBytesConfig(...)`` calls in its Python scripts.

Every memory-relevant key the launch gives is kept, with where it was written (:class:`Setting`), whether or not the
plan models it: :mod:`zeropilot.launch.coverage` names each one it does not model, so nothing is ignored silently.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from zeropilot.launch.document import Document, Node
from zeropilot.launch.source import Source, at
from zeropilot.launch.values import truthy

#: Every key read here, by topic (``launch.coverage`` says which the plan models). LLaMA-Factory's own argument names
#: are checked against its v0.9.5 dataclasses by ``tests/launch/test_settings_coverage.py``.
KEYS: Dict[str, Tuple[str, ...]] = {
    "method": ("finetuning_type", "adapter", "use_peft", "peft_type", "stage", "adapter_name_or_path", "ref_model",
               "reward_model", "ref_model_quantization_bit", "reward_model_quantization_bit", "reward_model_type",
               "ppo_buffer_size", "ref_model_adapters", "reward_model_adapters"),
    "lora": ("lora_rank", "lora_r", "r", "lora_target", "lora_target_modules", "target_modules", "lora_target_linear",
             "additional_target", "modules_to_save", "lora_modules_to_save", "use_dora", "peft_use_dora",
             "rank_pattern", "lora_dropout", "pissa_init", "oft_rank", "oft_block_size", "oft_target",
             "module_dropout"),
    "freeze": ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules", "use_llama_pro"),
    "quantization": ("quantization_bit", "quantization_method", "quantization_type", "double_quantization",
                     "load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                     "use_bnb_nested_quant", "bnb_4bit_quant_storage"),
    "optimizer": ("optim", "optimizer", "optim_target_modules", "use_galore", "use_apollo", "use_badam",
                  "use_adam_mini", "use_muon", "galore_layerwise", "apollo_layerwise"),
    "loss": ("enable_liger_kernel", "use_liger_kernel", "liger_kernel_config", "liger_fused_linear_cross_entropy",
             "cut_cross_entropy", "use_dft_loss", "use_asft_loss", "use_eaft_loss", "upcast_lmhead_output",
             "label_smoothing_factor"),
    "packing": ("packing", "neat_packing", "sample_packing", "padding_free"),
    "parallelism": ("sequence_parallel_size", "sequence_parallel_degree", "context_parallel_size",
                    "parallelism_config"),
    "allocator": ("torch_empty_cache_steps", "auto_find_batch_size"),
    "backend": ("use_cpu", "fsdp", "fsdp_config"),
    "checkpointing": ("use_unsloth_gc", "use_unsloth"),
    "precision": ("fp8", "fp8_backend", "pure_bf16", "upcast_layernorm", "torch_compile"),
    "model": ("mixture_of_depths", "shift_attn", "resize_vocab", "add_tokens", "add_special_tokens",
              "new_special_tokens_config", "use_kt", "use_v1_kernels", "use_mca", "use_hyper_parallel",
              "freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model", "image_max_pixels",
              "video_max_pixels", "video_maxlen", "use_audio_in_video", "low_cpu_mem_usage", "image_min_pixels",
              "image_do_pan_and_scan", "crop_to_patches", "video_min_pixels", "video_fps", "audio_sampling_rate"),
}
_TOPIC = {key: topic for topic, keys in KEYS.items() for key in keys}
# HF optim names whose states bitsandbytes keeps in 8 bits (transformers' OptimizerNames; LLaMA-Factory passes
# ``optim`` through)
EIGHT_BIT_OPTIMS = frozenset({"adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit"})
ADAMW_OPTIMS = frozenset({"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw",
                          "adamw_torch_xla", "adamw_torch_npu_fused"})


@dataclass(frozen=True)
class Freeze:
    """LLaMA-Factory's freeze (partial-parameter) tuning: which decoder layers and modules train
    (:func:`zeropilot.models.trainable.freeze_trainable` applies its rules).

    Attributes:
        layers: ``freeze_trainable_layers``: the last N layers (N > 0) or the first ``|N|`` (N < 0).
        modules: ``freeze_trainable_modules`` (``all``, or names such as ``mlp``, ``self_attn``).
        extra: ``freeze_extra_modules`` outside the decoder layers (``embed_tokens``, ``lm_head``, ``norm``).
        llama_pro: ``use_llama_pro``: every ``num_layers / N``-th layer instead (the expanded blocks).
    """

    layers: int = 2
    modules: Tuple[str, ...] = ("all",)
    extra: Tuple[str, ...] = ()
    llama_pro: bool = False


@dataclass(frozen=True)
class Setting:
    """A memory-relevant key the launch gives.

    Attributes:
        key: as written (``lora_target``).
        value: its plain value.
        source: where it is (``file:line key``).
        topic: its :data:`KEYS` topic.
        doc, node: where it is, for findings (None for a script's keyword argument).
    """

    key: str
    value: Any
    source: Source
    topic: str
    doc: Optional[Document] = None
    node: Optional[Node] = None


@dataclass
class TrainSettings:
    """The memory-relevant training settings of one launch.

    Attributes:
        method: ``full``, ``lora``, ``freeze`` or ``oft`` (LLaMA-Factory's default is ``lora``; HF and TRL train
            every parameter unless PEFT is used).
        lora_rank: LoRA's ``r`` (LLaMA-Factory's default 8), None without LoRA.
        lora_targets: the modules LoRA wraps: None for all linear layers (LLaMA-Factory's ``all``, PEFT's
            ``all-linear``), a tuple of names, or one regular expression (PEFT's string form).
        rank_pattern: PEFT's per-module ranks (``rank_pattern``), key -> rank.
        dora: ``use_dora``.
        modules_to_save: modules PEFT copies as trainable (``additional_target``, ``modules_to_save``).
        freeze_layers / freeze_modules / freeze_extra / llama_pro: LLaMA-Factory's freeze tuning
            (``freeze_trainable_layers``, default 2; ``freeze_trainable_modules``, default ``all``;
            ``freeze_extra_modules``; ``use_llama_pro``).
        quant_bits: on-the-fly quantization of the base weights (4 or 8), None without.
        quant_method: ``bnb``, ``hqq``, ``eetq``.
        double_quant: bitsandbytes' nested quantization of the 4-bit scales (LLaMA-Factory's default on, HF's off).
        quant_storage: ``bnb_4bit_quant_storage`` as the launch gives it (``bfloat16``), None when unsaid;
            ``quant_storage_auto``: LLaMA-Factory sets it to the compute dtype itself (``quantization.py``).
        optimizer: HF ``optim`` (``adamw_torch`` ...) or LLaMA-Factory's own (``galore``, ``apollo``, ``badam``,
            ``adam_mini``, ``muon``); None when unsaid (HF's default AdamW).
        fused_loss: ``liger`` (its fused linear cross-entropy) or ``cce`` (cut cross-entropy), None without.
        settings: every memory-relevant key given, in reading order.
    """

    method: str = "full"
    lora_rank: Optional[int] = None
    lora_targets: Union[None, str, Tuple[str, ...]] = None
    rank_pattern: Dict[str, int] = field(default_factory=dict)
    dora: bool = False
    modules_to_save: Tuple[str, ...] = ()
    freeze_layers: int = 2
    freeze_modules: Tuple[str, ...] = ("all",)
    freeze_extra: Tuple[str, ...] = ()
    llama_pro: bool = False
    quant_bits: Optional[int] = None
    quant_method: str = "bnb"
    double_quant: bool = False
    quant_storage: Optional[str] = None
    quant_storage_auto: bool = False
    optimizer: Optional[str] = None
    fused_loss: Optional[str] = None
    settings: List[Setting] = field(default_factory=list)

    def given(self, *keys: str) -> Optional[Setting]:
        """The first setting read under one of ``keys``."""
        return next((s for s in self.settings if s.key in keys), None)


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def names(value: Any) -> Tuple[str, ...]:
    """A comma-separated string or a list of names as a tuple (LLaMA-Factory splits its module lists on commas)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(v).strip() for v in value if isinstance(v, (str, int)) and str(v).strip())
    return ()


def _source(doc: Document, node: Optional[Node], key: str) -> Source:
    return at(doc.path, (node.key_line or node.line) if node is not None else None, key)


def _dtype(value: Any) -> Optional[str]:
    """``torch.bfloat16``, ``"bfloat16"``, ``"bf16"`` -> ``bfloat16``."""
    if not isinstance(value, str):
        return None
    low = value.strip().lower().replace("torch.", "")
    return {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(
        low, low)


class _Reader:
    """Fills a :class:`TrainSettings` from keys, the first source that says a value winning."""

    def __init__(self) -> None:
        self.out = TrainSettings()
        self.said: Dict[str, Any] = {}  # TrainSettings field -> value, from the first source that gave it

    def set(self, name: str, value: Any) -> None:
        if value is not None and name not in self.said:
            self.said[name] = value
            setattr(self.out, name, value)

    def read_keys(self, doc: Document, items: Sequence[Tuple[str, Any, Optional[Node]]]) -> None:
        for key, value, node in items:
            if key in _TOPIC:
                self.out.settings.append(Setting(key, value, _source(doc, node, key), _TOPIC[key], doc, node))


def _method(r: _Reader, doc: Document, v: Dict[str, Any]) -> None:
    flavour = doc.flavour
    if flavour == "llamafactory":
        ftype = v.get("finetuning_type", "lora")
        method = ftype.strip().lower() if isinstance(ftype, str) else "lora"
        r.set("method", method)
        if method == "lora":
            r.set("lora_rank", _int(v.get("lora_rank")) or 8)
            target = names(v.get("lora_target", "all"))
            r.set("lora_targets", None if target in ((), ("all",)) else target)
        r.set("modules_to_save", names(v.get("additional_target")) or None)
        if method == "freeze":
            layers = _int(v.get("freeze_trainable_layers"))
            r.set("freeze_layers", 2 if layers is None else layers)
            r.set("freeze_modules", names(v.get("freeze_trainable_modules", "all")) or ("all",))
            r.set("freeze_extra", names(v.get("freeze_extra_modules")) or None)
        r.set("llama_pro", truthy(v.get("use_llama_pro")) or None)
        r.set("dora", truthy(v.get("use_dora")) or None)
        return
    adapter = v.get("adapter")
    rank = _int(v.get("lora_r")) or _int(v.get("lora_rank"))
    peft = (truthy(v.get("use_peft")) is True or (isinstance(adapter, str) and adapter.lower() in ("lora", "qlora"))
            or bool(rank))  # a LoRA rank among HF-style arguments: the script wraps the model in PEFT
    if peft:
        r.set("method", "lora")
        r.set("lora_rank", _int(v.get("lora_r")) or _int(v.get("lora_rank")) or (8 if flavour == "axolotl" else 16))
        if truthy(v.get("lora_target_linear")) is True:
            r.set("lora_targets", "all-linear")
        target = v.get("lora_target_modules", v.get("target_modules"))
        if isinstance(target, str) and target.strip() == "all-linear":
            r.set("lora_targets", "all-linear")
        elif target is not None:
            r.set("lora_targets", names(target) or None)
        r.set("modules_to_save", names(v.get("lora_modules_to_save", v.get("modules_to_save"))) or None)
        r.set("dora", (truthy(v.get("use_dora")) or truthy(v.get("peft_use_dora"))) or None)
        if isinstance(adapter, str) and adapter.lower() == "qlora":
            r.set("quant_bits", 4)


def _quantization(r: _Reader, doc: Document, v: Dict[str, Any]) -> None:
    if doc.flavour == "llamafactory":
        bits = _int(v.get("quantization_bit"))
        if bits is not None:
            r.set("quant_bits", bits)
            method = v.get("quantization_method", "bnb")
            r.set("quant_method", method.lower() if isinstance(method, str) else "bnb")
            r.set("double_quant", truthy(v.get("double_quantization", True)) is not False)
            r.set("quant_storage_auto", True)  # BitsAndBytesConfig(bnb_4bit_quant_storage=compute_dtype)
        return
    if truthy(v.get("load_in_4bit")) is True:
        r.set("quant_bits", 4)
    elif truthy(v.get("load_in_8bit")) is True:
        r.set("quant_bits", 8)
    nested = v.get("bnb_4bit_use_double_quant", v.get("use_bnb_nested_quant"))
    if nested is not None:
        r.set("double_quant", truthy(nested) is True)
    r.set("quant_storage", _dtype(v.get("bnb_4bit_quant_storage")))


def _optimizer_and_loss(r: _Reader, doc: Document, v: Dict[str, Any]) -> None:
    for key, name in (("use_galore", "galore"), ("use_apollo", "apollo"), ("use_badam", "badam"),
                      ("use_adam_mini", "adam_mini"), ("use_muon", "muon")):
        if truthy(v.get(key)) is True:
            r.set("optimizer", name)
    optim = v.get("optim", v.get("optimizer") if doc.flavour == "axolotl" else None)
    if isinstance(optim, str) and optim.strip():
        r.set("optimizer", optim.strip().lower())
    liger = truthy(v.get("enable_liger_kernel", v.get("use_liger_kernel")))
    if doc.flavour == "axolotl":
        liger = truthy(v.get("liger_fused_linear_cross_entropy"))
    config = v.get("liger_kernel_config")
    if liger and isinstance(config, dict) and truthy(config.get("fused_linear_cross_entropy")) is False:
        liger = False  # the HF Trainer passes the config to _apply_liger_kernel_to_instance
    stage = v.get("stage", "sft")
    if liger and doc.flavour == "llamafactory" and isinstance(stage, str) and stage not in ("sft", "pt"):
        liger = False  # liger_kernel.py: stages that need the logits get Liger's plain cross-entropy instead
    if liger:
        r.set("fused_loss", "liger")
    if truthy(v.get("cut_cross_entropy")) is True:
        r.set("fused_loss", "cce")


def read_train_args(r: _Reader, doc: Document) -> None:
    """One training-arguments document (YAML, JSON or flags)."""
    if not doc.root.is_mapping:
        return
    v = {k: n.plain() for k, n in doc.root.value.items()}
    r.read_keys(doc, [(k, v[k], n) for k, n in doc.root.value.items()])
    _method(r, doc, v)
    _quantization(r, doc, v)
    _optimizer_and_loss(r, doc, v)


def read_adapter_config(r: _Reader, doc: Document) -> None:
    """A PEFT ``adapter_config.json``: what LoRA it trains (``peft_type`` LORA)."""
    v = {k: n.plain() for k, n in doc.root.value.items()}
    if str(v.get("peft_type", "")).upper() != "LORA":
        return
    r.read_keys(doc, [(k, v[k], n) for k, n in doc.root.value.items() if k in (
        "peft_type", "r", "target_modules", "modules_to_save", "use_dora", "rank_pattern")])
    _set_lora(r, v, None)


def _set_lora(r: Any, v: Dict[str, Any], default_rank: Optional[int]) -> None:
    """The LoRA fields of a PEFT adapter config or a ``LoraConfig(...)`` call (``v``: its keys as plain values)."""
    r.set("method", "lora")
    r.set("lora_rank", _int(v.get("r")) or default_rank)
    target = v.get("target_modules")
    if isinstance(target, str):
        r.set("lora_targets", "all-linear" if target == "all-linear" else target)
    elif target is not None:
        r.set("lora_targets", names(target) or None)
    r.set("modules_to_save", names(v.get("modules_to_save")) or None)
    r.set("dora", truthy(v.get("use_dora")) or None)
    pattern = v.get("rank_pattern")
    if isinstance(pattern, dict):
        r.set("rank_pattern", {str(k): n for k, n in pattern.items() if _int(n)} or None)


def _literal(node: ast.AST) -> Any:
    """A keyword argument's value: a literal, or ``torch.bfloat16`` as ``"torch.bfloat16"``; else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def read_script(r: _Reader, path, tree: ast.AST) -> None:
    """Literal keyword arguments of ``LoraConfig(...)`` and ``BitsAndBytesConfig(...)`` in a training script."""
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        fn = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if fn not in ("LoraConfig", "BitsAndBytesConfig"):
            continue
        kw = {k.arg: _literal(k.value) for k in call.keywords if k.arg}
        for key in kw:
            if key in _TOPIC or key in ("r", "target_modules", "modules_to_save", "use_dora", "rank_pattern"):
                r.out.settings.append(Setting(key, kw[key], at(path, call.lineno, f"{fn}({key}=...)"),
                                              _TOPIC.get(key, "lora")))
        if fn == "LoraConfig":
            _set_lora(r, kw, 8)  # PEFT's default r
        else:
            if truthy(kw.get("load_in_4bit")) is True:
                r.set("quant_bits", 4)
            elif truthy(kw.get("load_in_8bit")) is True:
                r.set("quant_bits", 8)
            r.set("double_quant", truthy(kw.get("bnb_4bit_use_double_quant")) is True)
            r.set("quant_storage", _dtype(kw.get("bnb_4bit_quant_storage")) or "uint8")  # bitsandbytes' default


def train_settings(train: Optional[Document], adapters: Sequence[Document] = (), scripts: Sequence = ()) -> \
        TrainSettings:
    """The :class:`TrainSettings` of a launch: its training arguments ``train``, PEFT adapter configs ``adapters``
    and parsed Python ``scripts`` (objects with ``path`` and ``tree``), in that order of precedence."""
    r = _Reader()
    if train is not None:
        read_train_args(r, train)
    for doc in adapters:
        read_adapter_config(r, doc)
    for py in scripts:
        if getattr(py, "tree", None) is not None:
            read_script(r, py.path, py.tree)
    return r.out


def is_adapter_config(doc: Document) -> bool:
    """A PEFT ``adapter_config.json`` given with the launch (read as an ``other`` document)."""
    return doc.kind == "other" and doc.root.is_mapping and "peft_type" in doc.root.value
