"""A plan (and a search) as text for people and as a JSON-ready dict."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from zeropilot.memory.inputs import GB, GIB, PlanInputs
from zeropilot.memory.plan import Plan
from zeropilot.memory.search import Candidate, deepspeed_config, training_changes
from zeropilot.memory.steptime import to_dict as steptime_dict

_LABELS = {"weights_trainable": "weights (trainable)", "weights_frozen": "weights (frozen)",
           "gradients": "gradients", "optimizer_master": "fp32 master weights", "optimizer_states": "AdamW states",
           "zero_buffers": "ZeRO buffers", "activations": "activations", "logits": "logits + loss buffers",
           "step_temporaries": "optimizer step temporaries", "allocator_overhead": "allocator overhead",
           "build_cache": "build's cached blocks", "replay_adjustment": "replay below the fit",
           "non_torch": "outside PyTorch", "init_peak": "init phase (allocated)",
           "dequant_buffer": "dequantized weight"}
_FIELDS = ("stage", "micro_batch", "seq_len", "grad_accum", "gradient_checkpointing", "lora_rank", "lora_targets",
           "lora_rank_pattern", "dora", "modules_to_save", "freeze", "quant_bits", "double_quant", "fused_loss",
           "optimizer",
           "offload_optimizer", "offload_param", "overlap_comm", "reduce_bucket_size", "prefetch_bucket_size",
           "attn", "expandable_segments", "save_total_limit", "gather_16bit_on_save", "save_only_model",
           "disk_write_bytes_per_s", "collective_timeout_s", "zero_init", "sub_group_size", "max_live_parameters",
           "max_reuse_distance", "hpz_partition_size", "host_mem_bytes")


def _gib(n: float) -> str:
    return f"{n / GIB:6.2f} GiB"


def _training(p: PlanInputs, plan: Plan) -> str:
    """What trains, in words: ``LoRA r8 on q_proj,v_proj: 6.8 M trainable``, ``freeze tuning ...``."""
    trainable = f"{plan.gpu.trainable / 1e6:.1f} M trainable"
    if p.freeze is not None:
        f = p.freeze
        which = (f"every {p.arch.layers // max(f.layers, 1)}th layer (LLaMA Pro)" if f.llama_pro
                 else f"last {f.layers} layers" if f.layers > 0 else f"first {-f.layers} layers")
        modules = "" if f.modules == ("all",) else f" ({','.join(f.modules)})"
        extra = f" + {','.join(f.extra)}" if f.extra else ""
        return f"freeze tuning, {which}{modules}{extra}: {trainable}"
    if not p.lora_rank:
        return "full fine-tuning"
    kind = f"QLoRA {p.quant_bits}-bit" if p.quant_bits == 4 else (f"LoRA on an {p.quant_bits}-bit base"
                                                                 if p.quant_bits else "LoRA")
    targets = ("" if p.lora_targets in (None, "all-linear") else f" on {p.lora_targets}" if isinstance(
        p.lora_targets, str) else f" on {','.join(p.lora_targets)}")
    copies = f" + trainable copies of {','.join(p.modules_to_save)}" if p.modules_to_save else ""
    return f"{'Do' if p.dora else ''}{kind} r{p.lora_rank}{targets}{copies}: {trainable}"


def _headline(p: PlanInputs, plan: Plan) -> str:
    a = p.arch
    train = _training(p, plan)
    hw = p.hardware.name if p.hardware else "GPUs not given"
    bits = [f"ZeRO-{p.stage}", f"micro batch {p.micro_batch} x {p.seq_len} tokens"]
    if p.gradient_checkpointing:
        bits.append("gradient checkpointing")
    if p.fused_loss:
        bits.append({"liger": "Liger fused cross-entropy", "cce": "cut cross-entropy"}[p.fused_loss])
    if p.optimizer != "adamw":
        bits.append("8-bit AdamW")
    if p.offload_optimizer != "none":
        bits.append(f"optimizer offload {p.offload_optimizer}")
    if p.offload_param != "none":
        bits.append(f"parameter offload {p.offload_param}")
    return (f"{a.name} ({a.model_type}, {plan.gpu.params / 1e9:.2f} B parameters, {train}) on {hw}, "
            + ", ".join(bits))


#: the fields that choose what trains: with none of them given, the plan is of full fine-tuning
_METHOD = ("lora_rank", "freeze", "quant_bits")


def assumed_defaults(p: PlanInputs) -> List[Tuple[str, str]]:
    """The headline settings that no flag or launch value gave, in the headline's words: (field, what was assumed).

    What trains is named under ``lora_rank``, one of the :data:`_METHOD` fields that choose it.
    """
    given = set(p.sources) | ({"lora_rank"} if any(f in p.sources for f in _METHOD) else set())
    said = [("stage", f"ZeRO-{p.stage}"), ("lora_rank", "full fine-tuning"),
            ("micro_batch", f"micro batch {p.micro_batch}"), ("seq_len", f"{p.seq_len} tokens per sample"),
            ("grad_accum", f"gradient accumulation {p.grad_accum}"),
            ("gradient_checkpointing", f"gradient checkpointing {'on' if p.gradient_checkpointing else 'off'}"),
            ("offload_optimizer", f"optimizer offload {p.offload_optimizer}"),
            ("offload_param", f"parameter offload {p.offload_param}")]
    return [(name, words) for name, words in said if name not in given]


def render_text(plan: Plan, candidates: Optional[Tuple[List[Candidate], Optional[Candidate]]] = None) -> str:
    """The plan for people: one line per component with its reason, the verdict, host, disk, inputs."""
    p = plan.inputs
    out = [f"zeropilot plan: {_headline(p, plan)}", "", f"Per GPU (world size {p.world_size}):"]
    for c in plan.gpu.components:
        if c.bytes or c.name in ("activations", "logits"):
            out.append(f"  {_LABELS.get(c.name, c.name):28s}{_gib(c.bytes)}   {c.reason}")
    if plan.gpu.init_peak_bytes:
        out.append(f"  {'init phase peak':28s}{_gib(plan.gpu.init_peak_bytes)}   building the model and "
                   f"deepspeed.initialize ({'zero.Init' if p.zero_init else 'no zero.Init'})")
        out.append(f"  {'training phase peak':28s}{_gib(plan.gpu.train_peak_bytes)}")
    out.append(f"  {'peak, as nvidia-smi shows it':28s}{_gib(plan.gpu_peak_bytes)}   set by the "
               f"{plan.gpu.peak_phase} (allocated {plan.gpu.allocated_peak_bytes / GIB:.2f} GiB, reserved "
               f"{plan.gpu.reserved_peak_bytes / GIB:.2f} GiB)")
    out += ["", f"Verdict: {plan.verdict.message}", f"Host verdict: {plan.host_verdict.message}", ""]
    h = plan.host
    out.append(f"Host memory: {h.per_process_bytes / GIB:.1f} GiB per process, {h.per_node_bytes / GIB:.1f} GiB "
               f"per node; loading the weights: {h.load_peak_per_node_bytes / GIB:.1f} GiB per node. {h.reason}")
    k = plan.checkpoint
    keep = (f"with save_total_limit {p.save_total_limit}: {k.disk_peak_bytes / GB:.1f} GB on disk during a save"
            if k.disk_peak_bytes is not None else "no save_total_limit: every checkpoint is kept")
    out.append(f"Each save: {k.total_bytes / GB:.1f} GB ({k.per_rank_bytes / GB:.1f} GB per rank at most, "
               f"{k.frozen_bytes / GB:.1f} GB of it frozen weights), ~{k.save_seconds:.0f} s at "
               f"{p.disk_write_bytes_per_s / GB:.2f} GB/s; {keep}. {k.reason}")
    out.append(f"Steady step peak {plan.gpu_peak_bytes / GIB:.2f} GiB; first step after a save: "
               f"+{plan.after_save_extra_bytes / GIB:.2f} GiB.")
    out += [""] + time_lines(plan)
    for note in plan.notes:
        out.append(f"Note: {note}")
    if plan.not_modelled:
        out += ["", "Not modelled (the figures above are approximate):"]
        out += [f"  {setting} — the figure assumes {assumes}" for setting, assumes in plan.not_modelled]
    out += ["", "Inputs:"] + [f"  {name} = {getattr(p, name)}  ({p.sources.get(name, 'default')})"
                              for name in _FIELDS]
    out.append(f"  model = {p.arch.name}  ({p.arch.source or 'given'})")
    if candidates is not None:
        out += [""] + _search_text(p, *candidates)
    return "\n".join(out) + "\n"


def time_lines(plan: Plan) -> List[str]:
    """The plan's time section, or one line saying why there is none."""
    from zeropilot.memory.steptime import render_lines

    if plan.time is None:
        return [f"Time: unknown: {plan.time_reason}"]
    return render_lines(plan.time, plan.run)


def _search_text(p: PlanInputs, ranked: List[Candidate], closest: Optional[Candidate]) -> List[str]:
    import json

    if not ranked:
        msg = ["Search: nothing fits with a 10% margin on these GPUs."]
        if closest is not None:
            msg.append(f"  closest: {closest.reason}. More GPUs (ZeRO-3 shards by world size), a shorter "
                       "sequence or a smaller model are left.")
        return msg
    timed = ranked[0].ratio is not None
    if timed:
        out = [f"Search (fastest first by predicted step time on {ranked[0].plan.time.card}, the same "
               f"{p.micro_batch * p.grad_accum} samples per GPU per step; each leaves at least 10% of the GPU free):"]
    else:
        from zeropilot.memory.search import FIXED_ORDER

        out = ["Search (each leaves at least 10% of the GPU free), in a fixed order, not by time: no speed figures "
               f"for this card (give --gpus COUNTxCARD such as 4xH100, or --hardware PROFILE); the order: {FIXED_ORDER}:"]
    for i, c in enumerate(ranked, 1):
        out.append(f"  {i}. {c.reason}" + (f" ({c.ratio:.2f}x the first)" if timed and i > 1 else ""))
    best = ranked[0].plan.inputs
    out += ["", "DeepSpeed config for #1:", json.dumps(deepspeed_config(best), indent=2)]
    changes = training_changes(p, best)
    out.append("Training-argument changes for #1: " + (", ".join(f"{k}: {v}" for k, v in changes.items())
                                                        if changes else "none"))
    return out


def _plain(value):
    """An input as JSON-ready data (the freeze settings as a mapping, tuples as lists)."""
    import dataclasses

    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_dict(plan: Plan, candidates: Optional[Tuple[List[Candidate], Optional[Candidate]]] = None) -> Dict:
    """The plan as JSON-ready data (``gpu_peak_bytes`` per GPU and the breakdown)."""
    p = plan.inputs
    k, h = plan.checkpoint, plan.host
    data: Dict = {
        "model": {"name": p.arch.name, "model_type": p.arch.model_type, "source": p.arch.source,
                  "params": plan.gpu.params, "trainable": plan.gpu.trainable},
        "hardware": None if p.hardware is None else {"gpus_per_node": p.hardware.gpus_per_node,
                                                     "nodes": p.hardware.nodes, "gpu_bytes": p.hardware.gpu_bytes},
        "world_size": p.world_size,
        "gpu_peak_bytes": plan.gpu_peak_bytes,
        "gpu_allocated_peak_bytes": plan.gpu.allocated_peak_bytes,
        "gpu_reserved_peak_bytes": plan.gpu.reserved_peak_bytes,
        "peak_phase": plan.gpu.peak_phase,
        "breakdown": {c.name: {"bytes": c.bytes, "phase": c.phase, "reason": c.reason} for c in plan.gpu.components},
        "verdict": {"kind": plan.verdict.kind, "headroom_bytes": plan.verdict.headroom_bytes,
                    "message": plan.verdict.message, "approximate": plan.verdict.approximate},
        "init_peak_bytes": plan.gpu.init_peak_bytes, "train_peak_bytes": plan.gpu.train_peak_bytes,
        "host_verdict": {"kind": plan.host_verdict.kind, "headroom_bytes": plan.host_verdict.headroom_bytes,
                         "message": plan.host_verdict.message},
        "host": {"per_process_bytes": h.per_process_bytes, "per_node_bytes": h.per_node_bytes,
                 "load_peak_per_node_bytes": h.load_peak_per_node_bytes, "reason": h.reason},
        "checkpoint": {"total_bytes": k.total_bytes, "per_rank_bytes": k.per_rank_bytes,
                       "frozen_bytes": k.frozen_bytes, "excludes_frozen": k.excludes_frozen,
                       "save_seconds": round(k.save_seconds, 1), "disk_peak_bytes": k.disk_peak_bytes,
                       "reason": k.reason},
        "after_save_extra_bytes": plan.after_save_extra_bytes,
        "time": None if plan.time is None else steptime_dict(plan.time, plan.run),
        "time_reason": None if plan.time is not None else plan.time_reason,
        "notes": list(plan.notes),
        "not_modelled": [{"setting": setting, "assumes": assumes} for setting, assumes in plan.not_modelled],
        "inputs": {name: _plain(getattr(p, name)) for name in _FIELDS},
        "sources": dict(p.sources),
    }
    if candidates is not None:
        ranked, closest = candidates
        data["search"] = [{"rank": i, "reason": c.reason, "gpu_peak_bytes": c.plan.gpu_peak_bytes,
                           "step_s": c.step_s, "ratio": c.ratio,
                           "deepspeed_config": deepspeed_config(c.plan.inputs),
                           "training_changes": training_changes(p, c.plan.inputs)}
                          for i, c in enumerate(ranked, 1)]
        data["search_closest"] = None if closest is None else {"reason": closest.reason,
                                                               "gpu_peak_bytes": closest.plan.gpu_peak_bytes}
    return data
