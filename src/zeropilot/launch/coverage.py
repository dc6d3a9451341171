"""Which of a launch's memory-relevant settings the plan models, and what its figure assumes for each one it does not.

Part of reading a launch for the plan (:mod:`zeropilot.launch.planfacts`): :func:`apply_settings` turns the launch
facts' :class:`~zeropilot.launch.settings.TrainSettings` into plan inputs (the fine-tuning method and what it trains,
quantization, the optimizer, a fused loss) and lists every other setting
the launch gives as *not modelled*, with what the figure assumes instead (:data:`NOT_MODELLED`). The plan prints that
list and calls its verdict approximate; nothing the launch says is dropped silently. :data:`MODELLED` names what each
modelled key sets. ``tests/launch/test_settings_coverage.py`` walks LLaMA-Factory's arguments (v0.9.5) and fails on
any memory-relevant one that is in neither table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from zeropilot.launch.settings import ADAMW_OPTIMS, EIGHT_BIT_OPTIMS, Freeze, Setting, TrainSettings
from zeropilot.launch.source import Source
from zeropilot.launch.values import truthy

#: Keys the plan models, and what they set (``PlanInputs`` fields).
MODELLED: Dict[str, str] = {
    **{k: "lora_rank" for k in ("lora_rank", "lora_r", "r")},
    **{k: "lora_targets" for k in ("lora_target", "lora_target_modules", "target_modules", "lora_target_linear")},
    **{k: "modules_to_save" for k in ("additional_target", "modules_to_save", "lora_modules_to_save")},
    **{k: "dora" for k in ("use_dora", "peft_use_dora")},
    "rank_pattern": "lora_rank_pattern",
    **{k: "lora_rank / freeze (the fine-tuning method)" for k in ("finetuning_type", "adapter", "use_peft",
                                                                   "peft_type")},
    **{k: "freeze" for k in ("freeze_trainable_layers", "freeze_trainable_modules", "freeze_extra_modules",
                             "use_llama_pro")},
    **{k: "quant_bits" for k in ("quantization_bit", "load_in_4bit", "load_in_8bit", "quantization_method")},
    **{k: "double_quant" for k in ("double_quantization", "bnb_4bit_use_double_quant", "use_bnb_nested_quant")},
    **{k: "quant_bits (nf4 and fp4 pack alike)" for k in ("quantization_type", "bnb_4bit_quant_type")},
    "bnb_4bit_quant_storage": "quant_bits (the storage dtype holds the same packed bytes)",
    **{k: "optimizer" for k in ("optim", "optimizer")},
    **{k: "fused_loss" for k in ("enable_liger_kernel", "use_liger_kernel", "liger_kernel_config",
                                 "liger_fused_linear_cross_entropy", "cut_cross_entropy")},
    **{k: "seq_len (every sample is taken at the full length, which packing makes true)"
       for k in ("packing", "neat_packing", "sample_packing", "padding_free")},
    "stage": "sft and pt: one model, one sequence per sample",
}

_RLHF = ("supervised fine-tuning of one model with one sequence per sample (preference and RL stages add a reference "
         "or reward model and paired sequences)")
_GALORE = ("AdamW's fp32 states for every trainable element (GaLore/APOLLO keep projected states; LLaMA-Factory "
           "refuses them with DeepSpeed: check's LF001)")
_MULTIMODAL = "a text-only model: no vision tower, no image, video or audio tokens"
NOT_MODELLED_OFT = "LoRA-sized adapters on the same modules (OFT's orthogonal blocks are not sized)"

#: Keys the plan reads but does not model, and what its figure assumes instead.
NOT_MODELLED: Dict[str, str] = {
    **{k: _GALORE for k in ("use_galore", "use_apollo", "optim_target_modules", "galore_layerwise",
                            "apollo_layerwise")},
    "use_badam": "every trainable element updated at every step (BAdam trains one block at a time)",
    "use_adam_mini": "AdamW's two fp32 states per element (Adam-mini keeps one second moment per block)",
    "use_muon": "AdamW's two fp32 states per element (Muon keeps one momentum for its matrices)",
    "oft_rank": NOT_MODELLED_OFT,
    "pissa_init": "LoRA's training memory (PiSSA's SVD of every wrapped weight at start-up is not sized)",
    "lora_dropout": "lora_dropout 0 (with dropout each wrapped layer keeps a dropped copy of its input and its mask)",
    "adapter_name_or_path": ("lora_target and lora_rank of this launch (a resumed adapter trains its own "
                             "target_modules and r: give its adapter_config.json with the launch)"),
    **{k: _RLHF for k in ("ref_model", "reward_model", "ref_model_quantization_bit", "reward_model_quantization_bit",
                          "reward_model_type", "ppo_buffer_size")},
    "use_dft_loss": "the causal-LM loss's logits buffers (custom losses add vocabulary-sized tensors)",
    "use_asft_loss": "the causal-LM loss's logits buffers (custom losses add vocabulary-sized tensors)",
    "use_eaft_loss": "the causal-LM loss's logits buffers (custom losses add vocabulary-sized tensors)",
    "upcast_lmhead_output": "16-bit logits out of the output layer (the upcast adds an fp32 copy of them)",
    **{k: ("every GPU holds the whole sequence's activations and logits (sequence parallelism splits them)")
       for k in ("sequence_parallel_size", "sequence_parallel_degree", "context_parallel_size")},
    "use_unsloth_gc": ("every checkpointed layer input kept on the GPU (Unsloth's offloaded checkpointing moves them "
                       "to the CPU)"),
    "use_unsloth": "transformers' own kernels and checkpointing (Unsloth's are not sized; no ZeRO-3 with it)",
    **{k: "bf16 mixed precision with DeepSpeed's fp32 master weights (fp8 matmuls keep fp8 copies and scales)"
       for k in ("fp8", "fp8_backend")},
    "pure_bf16": "bf16 mixed precision with DeepSpeed's fp32 master weights",
    "upcast_layernorm": "16-bit norm weights and outputs (upcast, the norms keep fp32 copies)",
    "torch_compile": "eager execution's saved tensors (a compiled graph keeps other ones)",
    "mixture_of_depths": "every token through every layer",
    "shift_attn": "plain attention (LongLoRA's shifted sparse attention)",
    **{k: "the config's vocab_size (added tokens grow the embedding and the output layer)"
       for k in ("resize_vocab", "add_tokens", "add_special_tokens", "new_special_tokens_config")},
    "use_kt": "GPU experts (KTransformers runs them on the CPU)",
    "use_v1_kernels": "transformers' own kernels",
    "use_mca": "DeepSpeed ZeRO (Megatron-Core training is another backend)",
    "use_hyper_parallel": "DeepSpeed ZeRO (HyperParallel FSDP/TP is another backend)",
    **{k: _MULTIMODAL for k in ("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model",
                                "image_max_pixels", "video_max_pixels", "video_maxlen", "use_audio_in_video")},
    "low_cpu_mem_usage": "the host loads one copy of the weights per process (without it, a second one)",
    **{k: NOT_MODELLED_OFT for k in ("oft_block_size", "oft_target", "module_dropout")},
    **{k: _RLHF for k in ("ref_model_adapters", "reward_model_adapters")},
    **{k: _MULTIMODAL for k in ("image_min_pixels", "image_do_pan_and_scan", "crop_to_patches", "video_min_pixels",
                                "video_fps", "audio_sampling_rate")},
    "label_smoothing_factor": ("the causal-LM loss's logits buffers (label smoothing adds a log-softmax of the whole "
                               "logits)"),
    "torch_empty_cache_steps": ("the allocator's cache kept between steps (emptying it every N steps changes what "
                                "stays reserved)"),
    "auto_find_batch_size": "the micro batch as given (auto_find_batch_size halves it after each out-of-memory error)",
    "use_cpu": "training on GPUs (use_cpu trains on the CPU)",
    "parallelism_config": ("every GPU holds the whole sequence's activations and logits (accelerate's parallelism "
                           "config splits them)"),
    **{k: "DeepSpeed ZeRO (FSDP is another backend)" for k in ("fsdp", "fsdp_config")},
}

#: Keys the plan reads as its own inputs (``launch/planfacts.py``), and the input each sets.
READ_AS_INPUT: Dict[str, str] = {
    "model_name_or_path": "the model",
    **{k: "seq_len" for k in ("cutoff_len", "max_seq_length", "model_max_length", "max_length", "sequence_len")},
    **{k: "micro_batch" for k in ("per_device_train_batch_size", "micro_batch_size")},
    "gradient_accumulation_steps": "grad_accum",
    **{k: "gradient_checkpointing" for k in ("gradient_checkpointing", "activation_checkpointing",
                                             "disable_gradient_checkpointing")},
    **{k: "attn" for k in ("attn_implementation", "flash_attn")},
    "use_cache": "kv_cache (without checkpointing, frozen layers keep the key/value cache's copies)",
    "save_total_limit": "save_total_limit", "save_steps": "save_steps", "save_only_model": "save_only_model",
    "output_dir": "where checkpoints go (free space)",
    "deepspeed": "the DeepSpeed config (stage, offload, buckets)",
    **{k: "16-bit mixed precision: bf16 and fp16 are sized alike" for k in ("bf16", "fp16")},
}


#: Flags whose library default is on: they change something when turned off.
_ON_BY_DEFAULT = frozenset({"freeze_vision_tower", "freeze_multi_modal_projector", "low_cpu_mem_usage"})


def _active(s: Setting) -> bool:
    """Whether a setting changes anything: a flag that is on (off, for :data:`_ON_BY_DEFAULT`), a number that is not
    0, a name or a list that is not empty."""
    value = s.value
    if s.key in _ON_BY_DEFAULT:
        return truthy(value) is False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        on = truthy(value)
        return on if on is not None else bool(value.strip())
    return bool(value)


def _name(s: Setting) -> str:
    value = s.value if not isinstance(s.value, (dict, list)) else (",".join(map(str, s.value)) if isinstance(
        s.value, list) else "{...}")
    return f"{s.key}: {value} ({s.source.text})"


def _method(ts: TrainSettings, values: Dict[str, Any], sources: Dict[str, Source], skip: set) -> Dict[str, str]:
    """The fine-tuning method's plan inputs; returns not-modelled entries for method values it cannot size."""
    out: Dict[str, str] = {}
    where = {s.key: s.source for s in ts.settings}
    src = next((where[k] for k in ("finetuning_type", "adapter", "use_peft", "peft_type") if k in where), None)
    if ts.method in ("lora", "oft"):
        values["lora_rank"] = ts.lora_rank or 8
        sources["lora_rank"] = next((where[k] for k in ("lora_rank", "lora_r", "r") if k in where),
                                    src or Source("LLaMA-Factory's default: LoRA r8"))
        if ts.lora_targets not in (None, "all-linear"):
            values["lora_targets"] = ts.lora_targets
            sources["lora_targets"] = next(where[k] for k in ("lora_target", "lora_target_modules", "target_modules")
                                           if k in where)
        if ts.rank_pattern:
            values["lora_rank_pattern"] = tuple(sorted(ts.rank_pattern.items()))
            sources["lora_rank_pattern"] = where.get("rank_pattern", Source("adapter config"))
        if ts.dora:
            values["dora"] = True
            sources["dora"] = next(where[k] for k in ("use_dora", "peft_use_dora") if k in where)
            out["use_dora"] = ("LoRA's activations and transients (DoRA's magnitude vectors are counted; its 16-bit "
                               "copy of each wrapped weight per forward and extra saved outputs are not)")
        if ts.modules_to_save:
            values["modules_to_save"] = ts.modules_to_save
            sources["modules_to_save"] = next(where[k] for k in ("additional_target", "modules_to_save",
                                                                 "lora_modules_to_save") if k in where)
        if ts.method == "oft":
            out["finetuning_type"] = NOT_MODELLED["oft_rank"]
        skip.update({"oft_rank", "oft_block_size", "oft_target"} if ts.method == "oft" else set())
    elif ts.method == "freeze":
        values["lora_rank"] = None
        values["freeze"] = Freeze(ts.freeze_layers, ts.freeze_modules, ts.freeze_extra, ts.llama_pro)
        sources["lora_rank"] = sources["freeze"] = src or Source("freeze tuning")
    elif ts.method == "full":
        values["lora_rank"] = None
        if src:
            sources["lora_rank"] = src
    else:
        values["lora_rank"] = None
        sources["lora_rank"] = src or Source("finetuning_type")
        out["finetuning_type"] = "full fine-tuning (this fine-tuning method is not one the plan knows)"
    return out


def _quantization(ts: TrainSettings, values: Dict[str, Any], sources: Dict[str, Source]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    if ts.quant_bits is None:
        return out
    where = next((s.source for s in ts.settings if s.key in ("quantization_bit", "load_in_4bit", "load_in_8bit",
                                                             "adapter")), Source("a BitsAndBytesConfig in the script"))
    if ts.quant_method != "bnb" or ts.quant_bits not in (4, 8) or ts.method not in ("lora", "oft"):
        out["quantization_bit"] = ("a 16-bit base (only bitsandbytes' 4- and 8-bit quantization under LoRA is "
                                   "sized)")
        return out
    values["quant_bits"] = ts.quant_bits
    values["double_quant"] = ts.double_quant
    sources["quant_bits"] = where
    if ts.quant_bits == 8:
        out["quantization_bit"] = ("8-bit weights sized (1 B each, fp32 row scales), LLM.int8's matmul buffers "
                                   "(the quantized input and outlier columns) not")
    return out


def _optimizer(ts: TrainSettings, ds, values: Dict[str, Any], sources: Dict[str, Source]) -> Dict[str, str]:
    out: Dict[str, str] = {}
    opt = ts.optimizer
    if opt is None:
        return out
    where = next((s.source for s in ts.settings if s.key in ("optim", "optimizer", "use_galore", "use_apollo",
                                                             "use_badam", "use_adam_mini", "use_muon")), Source(""))
    if opt in ("galore", "apollo", "badam", "adam_mini", "muon"):
        out[f"use_{opt}"] = NOT_MODELLED[f"use_{opt}"]
        return out
    if ds is not None and ds.optimizer is not None:
        node = ds.doc.get("optimizer.type")
        sources["optimizer"] = Source(f"{ds.doc.path} optimizer.type {ds.optimizer} (the DeepSpeed config's "
                                      f"optimizer is used; {where.text} is not)", ds.doc.path,
                                      node.line if node is not None else None, "optimizer.type")
        return out
    if opt in EIGHT_BIT_OPTIMS:
        if ds is not None and ds.offload_optimizer:
            out["optim"] = ("DeepSpeed's optimizer on the CPU (offload_optimizer refuses a client optimizer unless "
                            "zero_force_ds_cpu_optimizer is false, and bitsandbytes' 8-bit step needs the GPU)")
            return out
        values["optimizer"] = "adamw_8bit"
        sources["optimizer"] = where
        if opt.startswith("paged"):
            out["optim"] = ("the 8-bit states counted as GPU memory (paged, they live in CUDA managed memory outside "
                            "PyTorch's allocator and can be evicted to the host)")
    elif opt in ADAMW_OPTIMS or opt.startswith("adamw_torch"):
        values["optimizer"] = "adamw"
        sources["optimizer"] = where
    else:
        out["optim"] = "AdamW's two fp32 states per element"
    return out


def apply_settings(ts: TrainSettings, ds, values: Dict[str, Any], sources: Dict[str, Source]) -> \
        Tuple[Tuple[str, str], ...]:
    """Set ``values`` (PlanInputs fields) and ``sources`` from ``ts`` (``ds``: the DeepSpeed config's
    :class:`~zeropilot.launch.facts.DsFacts`, or None); return the settings the plan does not model, as (setting with
    where it is, what the figure assumes)."""
    skip: set = set()
    judged = _method(ts, values, sources, skip)
    judged.update(_quantization(ts, values, sources))
    judged.update(_optimizer(ts, ds, values, sources))
    if ts.fused_loss is not None:
        values["fused_loss"] = ts.fused_loss
        sources["fused_loss"] = next(s.source for s in ts.settings if s.key in (
            "enable_liger_kernel", "use_liger_kernel", "liger_fused_linear_cross_entropy", "cut_cross_entropy"))
    packing = [s for s in ts.settings if s.topic == "packing" and _active(s)]
    if packing and "seq_len" in sources:
        seq = sources["seq_len"]
        sources["seq_len"] = replace(seq, text=f"{seq.text} ({packing[0].key}: every sample that long)")
    out = []
    for s in ts.settings:
        if s.key in judged:
            out.append((_name(s), judged.pop(s.key)))
        elif s.key in NOT_MODELLED and s.key not in skip and _active(s):
            out.append((_name(s), NOT_MODELLED[s.key]))
        elif s.key == "stage" and isinstance(s.value, str) and s.value not in ("sft", "pt"):
            out.append((_name(s), _RLHF))
        elif s.key in ("enable_liger_kernel", "use_liger_kernel") and _active(s) and ts.fused_loss is None:
            out.append((_name(s), "transformers' loss and kernels (Liger without its fused cross-entropy here)"))
    out += [(f"{key}", why) for key, why in judged.items()]  # said by a script or an adapter config
    return tuple(out)


def modelled_or_named(key: str) -> Optional[str]:
    """``modelled``, ``not modelled``, ``read as an input`` or None for a key no table knows."""
    if key in MODELLED:
        return "modelled"
    if key in NOT_MODELLED:
        return "not modelled"
    if key in READ_AS_INPUT:
        return "read as an input"
    return None
