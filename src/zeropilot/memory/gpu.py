"""Per-GPU memory of one ZeRO training process: each component in bytes, with the reason for its size.

Training's peak is ``resident + max(backward transient, optimizer-step transient)`` bytes allocated by
PyTorch, plus what the caching allocator reserves on top (fragmentation), plus memory outside PyTorch
(CUDA context, cuBLAS, NCCL). That sum is what ``nvidia-smi`` shows. Before training, building the model
and ``deepspeed.initialize`` have their own peak (the init phase): for ZeRO-3 without ``zero.Init`` every
GPU holds the whole 16-bit model until ``initialize`` partitions it, and the caching allocator keeps it
reserved. The larger of the two phases is the peak. Formulas and constants: ``docs/plan.md``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.segments import Exceeded, zero3_reserved, zero12_reserved
from zeropilot.memory import tuning
from zeropilot.models.params import ParamCounts, count_params, layer_tensor_sizes, tensor_sizes
from zeropilot.models.trainable import named_parameters


@dataclass(frozen=True)
class Component:
    """One part of a GPU's memory.

    Attributes:
        name: stable key (``weights_frozen``, ``logits`` ...), used in JSON.
        bytes: size on one GPU.
        phase: ``resident`` (held through the step), ``gradients`` (ZeRO-1/2's gradient partition and reduce
            buckets: taken as gradients arrive and released after each step, so absent at the loss backward),
            ``backward`` (peak of the backward pass), ``step`` (peak of the optimizer step), ``overhead``
            (allocator and outside PyTorch) or ``init`` (building the model and ``deepspeed.initialize``).
        reason: how the size was worked out, in words.
    """

    name: str
    bytes: int
    phase: str
    reason: str


@dataclass(frozen=True)
class GpuMemory:
    """The per-GPU estimate.

    Attributes:
        components: every part, in display order.
        peak_bytes: what nvidia-smi would show at the peak (``gpu_peak_bytes``).
        allocated_peak_bytes: PyTorch's ``max_memory_allocated`` at the peak.
        reserved_peak_bytes: PyTorch's ``max_memory_reserved`` at the peak.
        peak_phase: ``backward``, ``step`` (which transient of training sets the peak) or ``init``
            (building and partitioning the model sets it).
        params: total parameters (with LoRA: the base model plus the adapters); trainable: those with
            gradients.
        train_peak_bytes / init_peak_bytes: the peak of each phase as nvidia-smi shows it.
    """

    components: Tuple[Component, ...]
    peak_bytes: int
    allocated_peak_bytes: int
    reserved_peak_bytes: int
    peak_phase: str
    params: int
    trainable: int
    train_peak_bytes: int = 0
    init_peak_bytes: int = 0

    def by_name(self) -> dict:
        return {c.name: c.bytes for c in self.components}


def trainable_params(inputs: PlanInputs, counts: ParamCounts) -> int:
    """Parameters with gradients (:func:`zeropilot.memory.tuning.trainable_params`): all of them, freeze tuning's
    layers and modules, or LoRA's adapters (and ``modules_to_save`` copies)."""
    return tuning.trainable_params(inputs, counts)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def _weights(inputs: PlanInputs, counts: ParamCounts, trainable: int) -> List[Component]:
    """16-bit weights: whole on every GPU for stages 0-2, a 1/N slice for stage 3 (none if offloaded).

    With LoRA the base model's weights are all frozen (4 or 8 bits when bitsandbytes quantizes them) and the
    adapters, and any ``modules_to_save`` copies, come on top of them; with freeze tuning the frozen rest of the model
    is listed apart from the trainable layers.
    """
    n = inputs.world_size
    if inputs.stage == 3:
        share = 0.0 if inputs.offload_param != "none" else 1.0 / n
        why = ("offloaded to CPU (offload_param); only gathered layers are on the GPU"
               if share == 0 else f"bf16, ZeRO-3 keeps 1/{n} of each parameter per GPU")
    else:
        share, why = 1.0, f"bf16, ZeRO-{inputs.stage} keeps every parameter on every GPU"
    if inputs.freeze is not None:  # the trainable share of the model, the rest frozen below
        out = [Component("weights_trainable", int(2 * trainable * share), "resident",
                         f"{trainable / 1e6:.1f} M trainable (freeze tuning) × 2 B, {why}")]
    else:
        out = [Component("weights_trainable", int(2 * trainable * share), "resident",
                         f"{trainable / 1e6:.1f} M trainable × 2 B, {why}")]
    partitioned, whole, what = tuning.frozen_base_bytes(inputs, counts, trainable)
    if what:
        held = partitioned * share + (whole if share else 0.0)
        extra = (f"; the quantization state ({whole / 2**20:.0f} MiB) is no parameter: whole on every GPU"
                 if whole and inputs.stage == 3 and share else "")
        out.append(Component("weights_frozen", int(held), "resident", f"{what}, {why}{extra}"))
    return out


def _grads_and_optimizer(inputs: PlanInputs, trainable: int) -> List[Component]:
    n = inputs.world_size
    part = trainable / n if inputs.stage >= 1 else trainable
    grad_share = trainable / n if inputs.stage >= 2 else trainable
    grad_why = (f"bf16 gradient partition (1/{n}) in a flat buffer" if inputs.stage >= 2
                else "bf16 gradients of every trainable parameter (ZeRO-0/1 do not partition them)")
    off = inputs.offload_optimizer != "none"
    if off and inputs.stage == 3:
        grad_share, grad_why = 0, "ZeRO-3 with offload_optimizer keeps gradient partitions in pinned CPU memory"
    elif off and inputs.stage in (1, 2):
        grad_share = 0
        grad_why = ("ZeRO-1/2 with offload_optimizer copies each reduced gradient into the fp32 partition on the CPU "
                    "(copy_grads_in_partition): no gradient partition on the GPU, only the reduce bucket")
    where = f"on {inputs.offload_optimizer.upper()} (offload_optimizer)" if off else "on the GPU"
    master = 0 if off else 4 * part
    per = tuning.adam_bytes(inputs)
    adam = 0 if off else per * part
    return [
        Component("gradients", int(2 * grad_share), "resident", grad_why),
        Component("optimizer_master", int(master), "resident",
                  f"fp32 master copy, 4 B × {part / 1e6:.1f} M (1/{n if inputs.stage >= 1 else 1}), {where}"),
        Component("optimizer_states", int(adam), "resident",
                  (f"bitsandbytes 8-bit AdamW states, {per:.2f} B × {part / 1e6:.1f} M (two 1-byte states with a "
                   f"block absmax each), {where}" if inputs.optimizer == "adamw_8bit"
                   else f"AdamW exp_avg + exp_avg_sq, 8 B × {part / 1e6:.1f} M, {where}")),
    ]


def _zero_buffers(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants) -> Component:
    """Reduce bucket(s); for ZeRO-3 also the gathered (live) parameters and the prefetch bucket.

    With ``contiguous_gradients`` (DeepSpeed's default) each bucket is ``torch.empty(reduce_bucket_size)`` whatever
    the number of trainable elements (0.19.8: ``stage_1_and_2.py`` ``setup_buckets``, ``stage3.py`` after
    ``initialize_optimizer_states``): a LoRA run at the default 5e8 holds 0.93 GiB for it (call 7's traces).
    """
    rbs = inputs.reduce_bucket_size
    buckets = 2 if (inputs.overlap and inputs.stage in (1, 2)) else 1
    total = 2 * rbs * buckets
    why = f"{buckets} reduce bucket(s) of {rbs / 1e6:.0f} M bf16 elements"
    if gathers(inputs):
        live, kept = _gathered(inputs, counts, c)
        persist = _persistent(inputs)
        total += 2 * (live + kept + persist)
        why += (f"; gathered parameters: the largest layer/tensor + prefetch bucket, {live / 1e6:.0f} M bf16"
                f", + {kept / 1e6:.0f} M kept gathered for reuse ({c.fit_live:.2f} × min("
                f"stage3_max_live_parameters {inputs.max_live_parameters / 1e6:.0f} M, all parameters))")
        if persist:
            why += (f"; + {persist / 1e6:.1f} M elements of matrices at or under stage3_param_persistence_threshold "
                    f"({inputs.param_persistence_threshold}) held whole on every GPU")
    if inputs.hpz_partition_size > 1 and inputs.stage == 3:
        hpz = 2 * counts.total / inputs.hpz_partition_size
        total += hpz
        why += f"; ZeRO++ hpZ secondary partition: 2 B × {counts.total / 1e6:.0f} M / {inputs.hpz_partition_size}"
    return Component("zero_buffers", int(total), "resident", why)


def _gathered(inputs: PlanInputs, counts: ParamCounts, c: Constants) -> Tuple[float, float]:
    """ZeRO-3's gathered parameters in elements: (the largest layer/tensor + the prefetch bucket, kept for reuse)."""
    live = max(counts.largest, max(counts.per_layer)) + min(inputs.prefetch_bucket_size, inputs.max_live_parameters)
    kept = c.fit_live * min(inputs.max_live_parameters, counts.total) if inputs.max_reuse_distance > 0 else 0.0
    return live, kept


def _persistent(inputs: PlanInputs) -> float:
    """Elements DeepSpeed keeps whole on every GPU beyond their partition: matrices with at most
    ``stage3_param_persistence_threshold`` elements (``mark_persistent_parameters``; norms and biases,
    always persistent and under 0.1%, are left out)."""
    small = sum(n for n in tensor_sizes(inputs.arch) if n <= inputs.param_persistence_threshold)
    share = 1.0 if inputs.offload_param != "none" else 1.0 - 1.0 / inputs.world_size
    return small * share


def gathers(inputs: PlanInputs) -> bool:
    """Whether ZeRO-3 gathers parameters for each layer (world size > 1, or parameters on the CPU)."""
    return inputs.stage == 3 and (inputs.world_size > 1 or inputs.offload_param != "none")


def lora_fp32_inputs(inputs: PlanInputs) -> float:
    """Bytes per token per decoder layer of the fp32 copies LoRA saves of its layers' inputs.

    PEFT keeps adapters in fp32 (``autocast_adapter_dtype``) and casts each wrapped layer's input to
    their dtype, and lora_A saves that copy for backward. DeepSpeed casts every parameter to bf16, adapters
    included, except for a model built inside zero.Init (``_cast_module_mixed_precision`` skips it), so
    only ZeRO-3 + zero.Init + LoRA pays this (counted with saved-tensor hooks, ``bench/plan/lora_saved.py``). With
    LoRA on named modules only the wrapped layers make the copies (each its own, weighted by the share of decoder
    layers where it is wrapped).
    """
    if not inputs.lora_rank or inputs.stage != 3 or not inputs.zero_init:
        return 0.0
    if tuning.wrapped_fraction(inputs) is not None:
        return float(sum(share * 4 * (width + inputs.lora_rank) for _, width, share in tuning.wrapped_inputs(inputs)))
    return float(sum(_lora_fp32_copies(inputs)))


def _lora_fp32_copies(inputs: PlanInputs) -> List[int]:
    """:func:`lora_fp32_inputs` tensor by tensor, in bytes per token: each wrapped layer's fp32 input, then each
    lora_A's fp32 output (rank wide, saved by lora_B)."""
    if not inputs.lora_rank or inputs.stage != 3 or not inputs.zero_init:
        return []
    if tuning.wrapped_fraction(inputs) is not None:  # LoRA on named modules: only where adapters sit
        kept = [(width, share) for _, width, share in tuning.wrapped_inputs(inputs) if share >= 0.5]
        return [4 * width for width, _ in kept] + [4 * inputs.lora_rank] * len(kept)
    a = inputs.arch
    q = a.heads * a.head_dim
    inter = a.intermediate if a.moe is None else a.moe.shared_intermediate
    reads_h = 2 if a.fused else 5  # q, k, v, gate, up (fused: qkv, gate_up) read the hidden state
    modules = 4 if a.fused else 7
    return [4 * a.hidden] * reads_h + [4 * q, 4 * inter] + [4 * inputs.lora_rank] * modules


def activation_bytes(inputs: PlanInputs, c: Constants = DEFAULT) -> Tuple[int, str]:
    """Bytes the forward pass keeps for the backward pass (all decoder layers), and why."""
    a = inputs.arch
    tokens = inputs.micro_batch * inputs.seq_len
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    inter = a.intermediate
    if a.moe is not None:
        inter = a.moe.active * a.moe.expert_intermediate + a.moe.shared_intermediate
    per_layer = c.act_h * a.hidden + c.act_q * q + c.act_kv * kv + c.act_i * inter
    if a.norms_per_layer > 2:
        per_layer += (a.norms_per_layer - 2) * 8 * a.hidden
    if inputs.attn == "eager":
        per_layer += c.eager_bytes * a.heads * inputs.seq_len
    per_layer += lora_fp32_inputs(inputs)
    layers = tuning.saving_layers(inputs)  # freeze tuning: the frozen layers before the first trainable keep nothing
    skipped = (f"; the {a.layers - layers} frozen layers before the first trainable one keep nothing (their inputs "
               "need no gradient)" if layers < a.layers else "")
    full = per_layer * tokens * layers
    if inputs.gradient_checkpointing:
        kept = 2 * a.hidden * tokens * layers + (per_layer * tokens if layers else 0)
        why = (f"checkpointed: {layers} layer inputs (2 B × h per token) + one layer recomputed "
               f"({per_layer:.0f} B/token), {tokens} tokens{skipped}")
        return int(kept * c.fit_act), why
    why = (f"{per_layer:.0f} B per token per layer × {layers} layers × {tokens} tokens ({inputs.attn}"
           + (", with LoRA's fp32 input copies" if lora_fp32_inputs(inputs) else "") + f"){skipped}")
    return int(full * c.fit_act), why


def logits_bytes(inputs: PlanInputs, c: Constants = DEFAULT) -> Tuple[int, str]:
    """Logits and cross-entropy buffers at the loss backward: ``tokens × vocab × bytes``."""
    if inputs.fused_loss is not None:
        return tuning.fused_loss_bytes(inputs, tuning.output_trains(inputs))
    a = inputs.arch
    tokens = inputs.micro_batch * inputs.seq_len
    per = c.logits_bytes + (c.softcap_bytes if a.logit_softcap else 0)
    why = (f"{tokens} tokens × {a.vocab} vocab × {per:.0f} B (bf16 logits, fp32 copy, log-softmax "
           f"and its gradient{', soft-capping' if a.logit_softcap else ''})")
    return int(tokens * a.vocab * per * c.fit_logits), why


def step_elements(inputs: PlanInputs, counts: ParamCounts, trainable: int) -> float:
    """Elements one optimizer step works on at once: the partition, or for ZeRO-3 one sub-group.

    DeepSpeed's ``_create_fp16_sub_groups`` closes a sub-group once it reaches ``sub_group_size``, so a
    sub-group can exceed it by one parameter's partition.
    """
    part = trainable / inputs.world_size if inputs.stage >= 1 else trainable
    if inputs.stage != 3:
        return part
    largest = counts.largest if inputs.lora_rank is None and inputs.freeze is None else 0
    return min(part, inputs.sub_group_size + largest / inputs.world_size)


def _step_temporaries(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants) -> Component:
    if inputs.offload_optimizer != "none":
        return Component("step_temporaries", 0, "step", "optimizer step runs on the CPU (offload_optimizer)")
    elems = step_elements(inputs, counts, trainable)
    where = (f"one sub-group at a time ({elems / 1e6:.0f} M elements; sub_group_size "
             f"{inputs.sub_group_size / 1e6:.0f} M)" if inputs.stage == 3 else "per trainable element of the partition")
    if inputs.optimizer == "adamw_8bit":  # bitsandbytes' fused 8-bit kernel updates in place
        return Component("step_temporaries", int(6 * elems), "step",
                         "fp32 gradient (4 B) and the flattened 16-bit gradient it is cast from (2 B; bitsandbytes' "
                         f"8-bit step itself makes no temporaries), {where}")
    return Component("step_temporaries", int((4 + c.step_temp) * elems), "step",
                     f"fp32 gradient (4 B) + AdamW foreach temporaries ({c.step_temp:.1f} B), {where}")


def _non_torch(inputs: PlanInputs, c: Constants) -> Component:
    if inputs.stage == 3:
        base = c.non_torch_zero3_init if inputs.zero_init else c.non_torch_zero3
        what = "ZeRO-3, " + ("built in zero.Init" if inputs.zero_init else "model built on the GPU")
    else:
        base, what = c.non_torch_zero12, "ZeRO-1/2"
    why = f"CUDA context, cuBLAS, NCCL: {_gib(base)} at world size 1 ({what}; {c.source})"
    if not c.nccl_multi_gpu:  # a hardware profile: measured at its own world size, NCCL included
        why = f"CUDA context, BLAS, NCCL/RCCL: {_gib(base)} per rank ({what}; {c.source})"
    elif inputs.world_size > 1:
        base += c.nccl_multi_gpu
        why += f"; + {_gib(c.nccl_multi_gpu)} NCCL communicators at world size > 1 ({c.source})"
    return Component("non_torch", int(base), "overhead", why)


def _gap(inputs: PlanInputs, optimizer_bytes: int, transient: int, step_bytes: int, largest: int,
         c: Constants) -> Component:
    """Reserved but unallocated memory of the caching allocator at the peak (fitted), where no allocator replay
    applies (with ``expandable_segments`` scaled by ``gap_expandable``, set by hand).

    ZeRO-1/2 and ZeRO-3 at world size 1 scale with the optimizer state on the GPU; ZeRO-3 at world size
    > 1 frees and re-allocates each sub-group's step temporaries (the gap scales with them, not with the
    whole state) and each gathered parameter (the gap scales with the largest gathered tensor).
    """
    overlap = 2 * inputs.reduce_bucket_size if (inputs.overlap and inputs.stage in (1, 2)) else 0
    if gathers(inputs):
        state = c.fit_gap_sub * step_bytes + c.fit_gap_gather * 2 * largest
        state_why = (f"{c.fit_gap_sub:.2f} × one sub-group's step temporaries + {c.fit_gap_gather:.2f} × the "
                     "largest gathered tensor")
    else:
        state = c.fit_gap_state * optimizer_bytes
        state_why = f"{c.fit_gap_state:.2f} × GPU optimizer state"
    gap = state + c.fit_gap_trans * transient + c.fit_gap_overlap * overlap
    why = (f"caching-allocator fragmentation: {state_why} + {c.fit_gap_trans:.2f} × the peak transient"
           + (f" + {c.fit_gap_overlap:.1f} × overlap_comm bucket" if overlap else "")
           + " (fitted on H200 measurements)")
    if inputs.expandable_segments:
        gap *= c.gap_expandable
        why += f"; × {c.gap_expandable} with expandable_segments"
    return Component("allocator_overhead", int(gap), "overhead", why)


def _init_phase(inputs: PlanInputs, params: int, trainable: int, whole_bytes: Optional[float] = None) -> Component:
    """Bytes allocated while the model is built and ``deepspeed.initialize`` partitions it (ZeRO-3).

    Inside ``zero.Init`` each GPU only ever holds its partition; without it the whole 16-bit model is on
    every GPU until ``initialize`` partitions it. ``initialize`` then adds the fp32 master partition and
    the 16-bit gradient buffer (on the GPU unless the optimizer is offloaded).
    """
    n = inputs.world_size
    whole = 2 * params if whole_bytes is None else whole_bytes  # a quantized base is smaller
    on_gpu_states = 0 if inputs.offload_optimizer != "none" else 6 * trainable / n
    part_weights = 0 if inputs.offload_param != "none" else whole / n
    after = part_weights + on_gpu_states
    if inputs.zero_init:
        return Component("init_peak", int(after), "init",
                         f"built inside zero.Init: 1/{n} of the 16-bit weights, then initialize's fp32 master "
                         "partition and gradient buffer")
    return Component("init_peak", int(max(whole, after)), "init",
                     f"no zero.Init: the whole {'quantized' if inputs.quant_bits else '16-bit'} model "
                     f"({whole / GIB:.2f} GiB) on every GPU until "
                     "deepspeed.initialize partitions it; the caching allocator keeps it reserved")


def _build_cache(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants,
                 phase: str, activations: int = 0) -> Optional[Component]:
    """The whole-model build's blocks that stay reserved through training (ZeRO-3, no zero.Init, offload_param).

    ``deepspeed.initialize`` partitions the parameters and, with ``offload_param``, moves the partitions to the
    CPU. Only when parameters stay on the GPU does it copy them into one flat buffer through ``defragment``, which
    calls ``empty_cache()`` (DeepSpeed 0.19.8, ``runtime/zero/stage3.py`` ``_create_fp16_partitions_with_
    defragmentation`` and ``runtime/zero/utils.py`` ``defragment``). With ``offload_param`` nothing empties the
    cache, so the blocks that held the whole 16-bit model, one per parameter, stay reserved. Training's gathered
    parameters have exactly those sizes and reuse them; its other tensors (logits, activations, buckets) do not
    fit the per-parameter blocks and get new segments. So the cached blocks beyond the gathered working set count
    on top of training. When the optimizer step on the GPU sets the peak (``phase``), nothing is gathered then and
    the whole build cache sits beside it: call 7's allocator trace of Qwen2.5-3B at world size 2 has 6.52 of its
    6.58 GiB of build segments free at the peak. Without gradient checkpointing the backward's peak also holds every
    layer's activations, tensors of a layer's width that fit in the per-parameter blocks: call 35's trace of
    Phi-3-mini LoRA at 4096 tokens has 7.2 of its 7.5 GiB of build blocks taken by training at the peak.
    """
    if inputs.stage != 3 or inputs.zero_init or inputs.offload_param == "none":
        return None
    cache = 2 * (counts.total + (trainable if inputs.lora_rank else 0)) * c.init_reserved  # the whole 16-bit model
    held = 2 * sum(_gathered(inputs, counts, c)) + (0 if inputs.gradient_checkpointing else activations)
    reused = min(cache, held) if phase == "backward" else 0
    return Component("build_cache", int(cache - reused), "overhead",
                     f"no zero.Init with offload_param: the whole-model build's blocks ({cache / GIB:.2f} GiB) stay "
                     "cached (DeepSpeed empties the cache only when parameters stay on the GPU); the gathered "
                     + (f"parameters{'' if inputs.gradient_checkpointing else ' and the activations'} reuse "
                        f"{reused / GIB:.2f} GiB of them, the rest stays beside training" if reused
                        else "nothing is gathered during the optimizer step, which sets the peak: all of it stays"))


# One decoder layer's forward as the caching allocator saw it on H200s: every tensor of 1 MiB or more, in order, as
# UNIT>i (released before the layer's i-th tensor; past the end: the residual stream, released with the layer),
# UNITK (saved for the backward) or UNITW (saved only for a norm weight's gradient: with LoRA the norms are frozen
# and it is released at once, as autograd keeps nothing for a frozen multiplicand's gradient); a leading * marks a
# linear layer's output (with LoRA PEFT adds lora_B's output, its scaled copy and their sum, which takes the output's
# place: call 20's traces). Units are per token:
# h2 = 2 x hidden bytes, q4 = 4 x heads x head_dim, kv1 = kv_heads x head_dim, i2 = 2 x intermediate, qkv2 / gu2 =
# Phi-3's fused projections. Read off the allocator traces (bench/plan/analyze_trace.py; bench/plan/data/traces):
# Qwen2.5-0.5B (call 10, the llama-style layer), Qwen3-1.7B (q/k norms), Gemma-2-2B and Gemma-3-1B (four norms
# per layer; Gemma 3 with q/k norms) and Phi-3-mini (fused) (call 15).
LAYER_TEMPLATES = {
    "llama": "h4K h4>2 h4>5 h2W h2K *q2>18 *kv2>18 *kv2>20 q2>13 q1>11 q2>12 q2>13 q2K kv2>18 kv1>16 kv2>17 kv2>18 "
             "kv2>20 kv2K kv2K q2K *h2>23 h2>34 h4K h4>25 h4>28 h2W h2K *i2K i2K *i2K i2K *h2>34 h2>34",
    "qwen3": "h4K h4>2 h4>5 h2W h2K *q2>11 q4K q4>8 q4>11 q2K q2>28 *kv2>17 kv4K kv4>14 kv4>17 kv2K kv2>28 *kv2>30 "
             "q2>23 q1>21 q2>22 q2>23 q2K kv2>28 kv1>26 kv2>27 kv2>28 kv2>30 kv2K kv2K q2K *h2>33 h2>44 h4K h4>35 "
             "h4>38 h2W h2K *i2K i2K *i2K i2K *h2>44 h2>44",
    "gemma2": "h4K h4>2 h4W h4>5 h2K *q2>18 *kv2>18 *kv2>20 q2>13 q1>11 q2>12 q2>13 q2K kv2>18 kv1>16 kv2>17 kv2>18 "
              "kv2>20 kv2K kv2K q2K *h2>27 h4K h4>24 h4W h4>27 h2>28 h2>44 h4K h4>30 h4W h4>33 h2K *i2K i2K *i2K i2K "
              "*h2>43 h4K h4>40 h4W h4>43 h2>44 h2>44",
    "gemma3": "h4K h4>2 h4W h4>5 h2K *q2>13 *kv2>18 *kv2>29 q4K q4>10 q4W q4>13 q2>27 kv4K kv4>15 kv4W kv4>18 kv2>27 "
              "q2>23 q1>21 q2>22 q2>23 q2K kv2>27 kv2>26 kv2>27 kv2>29 kv2K kv2K q4K q2K *h2>37 h4K h4>34 h4W h4>37 "
              "h2>38 h2>54 h4K h4>40 h4W h4>43 h2K *i2K i2K *i2K i2K *h2>53 h4K h4>50 h4W h4>53 h2>54 h2>54",
    "fused": "h4K h4>2 h4>5 h2W h2K *qkv2>23 q2>11 q1>9 q2>10 q2>11 q2>12 q2K kv2>17 kv1>15 kv2>16 kv2>17 kv2>18 "
             "kv2>20 kv2K kv2K q2K *h2>24 h2>33 h4K h4>26 h4>29 h2W h2K *gu2K i2K i2K *h2>33 h2>33",
}

# The same layer run without autograd, as gradient checkpointing's first forward runs it (``torch.utils.checkpoint``):
# nothing is saved for the backward, so each tensor is released once its last user is done (UNIT>i throughout) and the
# layer's output (UNITK, the last) stays as the next layer's input. Read off checkpointed traces the same way: the
# llama-style layer from Qwen2.5-3B (call 41), Qwen3-1.7B (call 10), Gemma-2-2B (call 39) and Gemma-3-1B (call 27);
# no checkpointed Phi-3 run was traced, so the fused layer is the llama one with its fused projections (v19's
# candidate patch: ``git show 221f33b:bench/plan/nograd_v19_candidate.patch``).
NO_GRAD_TEMPLATES = {
    "llama": "h4>3 h4>2 h4>5 h2>5 h2>20 *q2>18 *kv2>18 *kv2>20 q2>13 q1>11 q2>12 q2>13 q2>20 kv2>18 kv1>16 kv2>17 "
             "kv2>18 kv2>20 q2>20 *h2>21 h2>32 h4>24 h4>23 h4>26 h2>26 h2>31 *i2>28 i2>30 *i2>30 i2>31 *h2>32 h2K",
    "qwen3": "h4>3 h4>2 h4>5 h2>5 h2>30 *q2>11 q4>9 q4>8 q4>11 q2>11 q2>28 *kv2>17 kv4>15 kv4>14 kv4>17 kv2>17 kv2>28 "
             "*kv2>30 q2>23 q1>21 q2>22 q2>23 q2>30 kv2>28 kv1>26 kv2>27 kv2>28 kv2>30 q2>30 *h2>31 h2>42 h4>34 h4>33 "
             "h4>36 h2>36 h2>41 *i2>38 i2>40 *i2>40 i2>41 *h2>42 h2K",
    "gemma2": "h4>3 h4>2 h4>4 h4>5 h2>20 *q2>18 *kv2>18 *kv2>20 q2>13 q1>11 q2>12 q2>13 q2>20 kv2>18 kv1>16 kv2>17 "
              "kv2>18 kv2>20 q2>20 *h2>25 h4>23 h4>22 h4>24 h4>25 h2>26 h2>42 h4>29 h4>28 h4>30 h4>31 h2>36 *i2>33 "
              "i2>35 *i2>35 i2>36 *h2>41 h4>39 h4>38 h4>40 h4>41 h2>42 h2K",
    "gemma3": "h4>3 h4>2 h4>4 h4>5 h2>31 *q2>13 *kv2>18 *kv2>31 q4>11 q4>10 q4>12 q4>13 q2>28 kv4>16 kv4>15 kv4>17 "
              "kv4>18 kv2>28 q2>23 q1>21 q2>22 q2>23 q2>31 kv2>28 kv1>26 kv2>27 kv2>28 kv2>31 q2>30 q2>31 *h2>36 h4>34 "
              "h4>33 h4>35 h4>36 h2>37 h2>53 h4>40 h4>39 h4>41 h4>42 h2>47 *i2>44 i2>46 *i2>46 i2>47 *h2>52 h4>50 "
              "h4>49 h4>51 h4>52 h2>53 h2K",
    "fused": "h4>3 h4>2 h4>5 h2>5 h2>18 *qkv2>18 q2>11 q1>9 q2>10 q2>11 q2>18 kv2>16 kv1>14 kv2>15 kv2>16 kv2>18 q2>18 "
             "*h2>19 h2>29 h4>22 h4>21 h4>24 h2>24 h2>28 *gu2>28 i2>27 i2>28 *h2>29 h2K",
}


def _template(arch) -> str:
    if arch.norms_per_layer >= 4:
        return "gemma3" if arch.qk_norm else "gemma2"
    if arch.fused:
        return "fused"
    return "qwen3" if arch.qk_norm else "llama"


# The linear layers of LAYER_TEMPLATES' ``*`` tensors, in order (the llama-style layers and Phi-3's fused one)
_LINEARS = {"llama": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
            "fused": ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}


def layer_tensors(inputs: PlanInputs, no_grad: bool = False,
                  cache: bool = False) -> Optional[Tuple[Tuple[float, Optional[int]], ...]]:
    """One decoder layer's forward for the allocator replay: (bytes, the index of the tensor before which it is
    released, or None when the backward keeps it), from :data:`LAYER_TEMPLATES`; eager attention adds its fp32
    softmax and bf16 copy (kept). ``no_grad``: the checkpointed first forward (:data:`NO_GRAD_TEMPLATES`), whose
    last tensor is the layer's output; None without checkpointing, and with eager attention (not traced); ``cache``:
    that layer with the key/value cache on (:func:`_with_cache`).

    With LoRA each linear layer's output ``O`` is followed by PEFT's ``result + lora_B(lora_A(x)) * scaling``
    (``peft/tuners/lora/layer.py`` ``Linear.forward``): lora_A's output (rank wide, kept for lora_B's gradient),
    lora_B's output, its scaled copy (lora_B's output released), and the sum, which lives as ``O`` did; ``O`` and the
    scaled copy are released once the sum exists. These transients leave holes of the output's size that small
    long-lived tensors later fill (call 20's traces). Without autograd lora_A's output goes once lora_B's exists; in
    zero.Init (fp32 adapters, :func:`lora_fp32_inputs`) the input is first cast to fp32, lora_B's output, the scaled
    copy and the sum are fp32, and the sum is cast back to ``O``'s dtype, the fp32 input released with it (call 35's
    Qwen2.5-7B trace).
    """
    a = inputs.arch
    t = inputs.micro_batch * inputs.seq_len
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    inter = a.intermediate if a.moe is None else a.moe.active * a.moe.expert_intermediate + a.moe.shared_intermediate
    per_token = {"h": a.hidden, "q": q, "kv": kv, "i": inter, "qkv": q + 2 * kv, "gu": 2 * inter}
    if no_grad:
        if not inputs.gradient_checkpointing or inputs.attn == "eager":
            return None
        ops = NO_GRAD_TEMPLATES[_template(a)].split()
        if cache:
            ops = _with_cache(ops)
    else:
        ops = LAYER_TEMPLATES[_template(a)].split()
    fp32_inputs = no_grad and bool(_lora_fp32_copies(inputs))  # zero.Init LoRA: the input cast to fp32 first
    shares = tuning.wrapped_fraction(inputs)  # LoRA on named modules: PEFT's tensors only where adapters sit
    kinds = iter(_LINEARS["fused" if a.fused else "llama"])
    parsed, outputs_h = [], 0
    for i, op in enumerate(ops):
        unit, until = op.strip("*KW").partition(">")[0], op.partition(">")[2]
        name, width = unit.rstrip("0123456789"), int(unit[len(unit.rstrip("0123456789")):])
        if op.endswith("W"):
            until = str(i + 1) if inputs.lora_rank else ""
        reads = "h"  # what the linear layer reads: o_proj the attention's output, down_proj the MLP's
        if op.startswith("*") and name == "h":
            reads, outputs_h = ("q" if outputs_h == 0 else "i"), outputs_h + 1
        linear = op.startswith("*") and (shares is None or shares.get(next(kinds, ""), 0.0) >= 0.5)
        parsed.append((float(width * t * per_token[name]), int(until) if until else None, linear,
                       4.0 * t * per_token[reads]))
    per_linear = 7 if fp32_inputs else 5
    start, n = [], 0  # where each template tensor's first tensor lands in the expanded layer
    for _, _, linear, _ in parsed:
        start.append(n)
        n += per_linear if linear and inputs.lora_rank else 1
    start.append(n)
    out: List[Tuple[float, Optional[int]]] = []
    for i, (size, until, linear, fp32_input) in enumerate(parsed):
        end = None if until is None else start[min(until, len(parsed))]
        if linear and inputs.lora_rank:
            k = len(out)
            if fp32_inputs:  # O, the fp32 input, then in fp32: lora_A's output, lora_B's, the scaled copy, the sum;
                # the sum cast back to O's dtype (``result.to(torch_result_dtype)``)
                out += [(size, k + 6), (fp32_input, k + 7), (4.0 * t * inputs.lora_rank, k + 4), (2 * size, k + 5),
                        (2 * size, k + 6), (2 * size, k + 7), (size, end)]
            else:  # O, lora_A's output, lora_B's, the scaled copy, the sum
                out += [(size, k + 5), (2.0 * t * inputs.lora_rank, k + 3 if no_grad else None), (size, k + 4),
                        (size, k + 5), (size, end)]
        else:
            out.append((size, end))
    if no_grad:
        return tuple(out)
    if inputs.attn == "eager":
        out += [(4.0 * t * a.heads * inputs.seq_len, None), (2.0 * t * a.heads * inputs.seq_len, None)]
    out += [(float(t * per), None) for per in _lora_fp32_copies(inputs)]  # kept for the adapters' backward
    return tuple(out)


def _with_cache(ops: List[str]) -> List[str]:
    """A :data:`NO_GRAD_TEMPLATES` layer run with transformers' key/value cache on. A causal LM called without
    ``use_cache=False`` takes it from its config (``use_cache``, true by default) and builds a ``DynamicCache``
    (:class:`~zeropilot.memory.inputs.PlanInputs`' ``kv_cache`` says who turns it off); ``merge_with_config_defaults``
    turns it off under gradient checkpointing, so the checkpointed traces the templates were read from have none.
    ``DynamicLayer.update`` concatenates the key and the value onto empty tensors (``torch.cat``: a copy of each) and
    the attention reads the copies, so the key after its rotary embedding and the value are released once copied, and
    the copies stay in the cache, which the model's output holds, until the output is released after the logits. A
    trained layer keeps them for the backward anyway (``kv2K kv2K`` in :data:`LAYER_TEMPLATES`); a layer run without
    autograd keeps nothing else. Call 3's traces of freeze tuning without checkpointing show it on every frozen front
    layer: two kv-sized tensors after the key's rotary embedding, released after the logits, in layer order reversed;
    the rest of the layer as the template (``tests/memory/test_accuracy_bench.py``)."""
    parsed = []
    for op in ops:
        unit, _, until = op.strip("*K").partition(">")
        parsed.append((op.startswith("*"), unit, int(until) if until else None))
    kinds = [unit.rstrip("0123456789") for _, unit, _ in parsed]
    at = 1 + max(i for i, kind in enumerate(kinds) if kind == "kv")  # right after the key's last tensor
    out = []
    for i, (star, unit, until) in enumerate(parsed):
        if i == at:
            out += ["kv2K", "kv2K"]  # the cache's copies of the key and the value
        if until is not None and until > at:  # a key or value the attention would have read goes once copied (Phi-3:
            # the fused projection, whose view the value is); the rest as before, two tensors later
            until = at + 2 if i < at and kinds[i] in ("kv", "qkv") else until + 2
        out.append(("*" if star else "") + unit + ("K" if until is None else f">{until}"))
    return out


def front_layer(inputs: PlanInputs) -> Optional[Tuple[Tuple[float, Optional[int]], ...]]:
    """Freeze tuning's frozen layers before the first trainable one: nothing needs their gradient, so they run as
    gradient checkpointing's first forward runs a layer (:data:`NO_GRAD_TEMPLATES`), with the key/value cache where
    the run keeps one (``inputs.kv_cache`` without checkpointing; :func:`_with_cache`: its copies are the tensors kept
    before the layer's output)."""
    return layer_tensors(replace(inputs, gradient_checkpointing=True), no_grad=True,
                         cache=inputs.kv_cache and not inputs.gradient_checkpointing)


def final_norm(inputs: PlanInputs) -> Tuple[Tuple[float, Optional[int]], ...]:
    """The final RMSNorm's forward (as in :data:`LAYER_TEMPLATES`): fp32 input and two bf16 tensors kept (one of
    them only for the norm's weight, so not with LoRA)."""
    t = inputs.micro_batch * inputs.seq_len
    h2, h4 = 2.0 * t * inputs.arch.hidden, 4.0 * t * inputs.arch.hidden
    # with LoRA the normalized input (kept only for the frozen weight's gradient) goes once ``weight * x`` exists
    # (issue 40's ``c6_x_q15_mts_z2_mb2``, events 9972-9975), which the expandable replay takes; the default
    # allocator's replay keeps the earlier release (before it), which its committed rows were matched with (see
    # _expandable_only)
    return ((h4, None), (h4, 2), (h4, 5), (h2, (5 if _expandable_only(inputs) else 4) if inputs.lora_rank else None),
            (h2, None))


def _expandable_only(inputs: PlanInputs) -> bool:
    """Whether to replay the request-order facts read off issue 40's expandable-segments traces (call 6): the final
    norm's release above, and under checkpointing every layer keeping its input (:func:`replay_front`). Both hold in
    the default allocator's traces too, but its replay places blocks less exactly than :class:`~zeropilot.memory.
    segments.ExpandableAllocator` (which maps, fed a trace's own requests, what the real allocator mapped, to the
    byte), and there they move committed rows that were right (``bench/plan/HISTORY.md``): taken where the allocator
    model is exact."""
    return inputs.expandable_segments


def replay_front(inputs: PlanInputs) -> int:
    """Freeze tuning's frozen layers the replay runs without keeping anything: :func:`tuning.first_backward_layer`
    with expandable segments (``c6_x_q3_freeze4_z3_gc`` and ``next_x_q7_freeze4_z3_gc``: every layer's input held at
    the loss, every layer recomputed; call 3's ``call3_l8_f4_gc`` on the default allocator alike), the default
    allocator's replay still :func:`tuning.first_saving_layer` (:func:`_expandable_only`)."""
    if _expandable_only(inputs):
        return tuning.first_backward_layer(inputs)
    return tuning.first_saving_layer(inputs)


def kept_input(inputs: PlanInputs) -> float:
    """Bytes of one decoder layer's input, which gradient checkpointing keeps for the backward."""
    return 2.0 * inputs.arch.hidden * inputs.micro_batch * inputs.seq_len


def _gradient_units(inputs: PlanInputs, trainable: int) -> List[Tuple[float, Optional[int], bool]]:
    """The trainable tensors in the order DeepSpeed flattens them (the model's), as (elements, decoder layer or None,
    whether it is one tensor): every tensor of full fine-tuning, the freeze-tuned ones, or LoRA's ``modules_to_save``
    copies beside its adapters (each layer's adapters counted as one unit of that layer, not one tensor)."""
    a = inputs.arch
    listed = tuning.trainable_list(inputs)
    if listed is None:
        edge = [(float(a.vocab * a.hidden), None, True)]
        return edge + [(float(x), i, True) for i in range(a.layers) for x in layer_tensor_sizes(a, i)] \
            + edge[:not a.tied]
    units = [(float(p.numel), p.layer, True) for p in listed]
    adapters = trainable - sum(p.numel for p in listed)
    if inputs.lora_rank and adapters > 0:
        per = adapters / a.layers
        tail = 1 if len(units) > 1 and units[-1][1] is None else 0  # the output layer's copy comes last
        units = units[:len(units) - tail] + [(per, i, False) for i in range(a.layers)] + units[len(units) - tail:]
    return units


def _first_reduction(inputs: PlanInputs, trainable: int) -> Tuple[int, float]:
    """ZeRO-1/2's first reduction of a bucket that holds a gradient of rank 0's partition: (decoder layers whose
    backward comes before it, bytes that reduction flattens across ranks).

    Gradients reach the bucket in backward order (the output layer, the decoder layers from the last, the embedding);
    a bucket is reduced when the next gradient would overflow it (``reduce_bucket_size`` elements) and at backward's
    end (stage_1_and_2.py ``reduce_independent_p_g_buckets_and_remove_grads``; a gradient larger than the bucket is
    reduced by the next one's arrival). Rank 0 owns the first 1/N of the flattened trainable parameters (the
    embedding, the first layers), so at world size 2 its first such reduction comes late in backward; when every
    gradient fits in one bucket it is backward's epilogue (calls 26 and 27's traces).
    """
    a, n = inputs.arch, inputs.world_size
    flat = (lambda held: 2.0 * held if n > 1 else 0.0)  # noqa: E731
    if inputs.lora_rank and not inputs.modules_to_save:  # a few adapters, all in one bucket
        return a.layers, flat(trainable)
    units = _gradient_units(inputs, trainable)
    offsets, offset = [], 0.0
    for size, _, _ in units:
        offsets.append(offset)
        offset += size
    arrival = [(size, a.layers if layer is None and k == 0 else 0 if layer is None else a.layers - 1 - layer, at)
               for k, ((size, layer, _), at) in reversed(list(enumerate(zip(units, offsets))))]
    part, bucket, held, mine = trainable / n, float(inputs.reduce_bucket_size), 0.0, False
    for size, done, at in arrival:
        if held and held + size > bucket:
            if mine:
                return done, flat(held)
            held, mine = 0.0, False
        held += size
        mine = mine or at < part
    return a.layers, flat(held)


def _rank0_partition(inputs: PlanInputs, trainable: int, trained: List[int],
                     listed: Optional[list]) -> Tuple[List[float], float]:
    """Rank 0's partition of ZeRO-1/2's flattened trainable tensors (the first 1/N, in the model's order): the elements
    of each listed tensor in it, whose gradient norms DeepSpeed takes in fp64 one tensor at a time, and the elements of
    the gradient partition ``copy_grads_in_partition`` allocates, every trainable tensor that reaches into it, whole
    (``grads_in_partition``: the sum of ``numel()`` over ``params_in_partition``; stage_1_and_2.py, 0.19.8).

    With LoRA and ``modules_to_save`` the adapters train beside the copies and are flattened with them, in the model's
    order (:func:`_gradient_units`), so they are in that partition too: at world size 1 it is every trainable
    element (call 1's trace ``call1_y9_mts_z2``, event 39818: 1103.9 MiB, the copies' 1000 MiB and the adapters'
    104 MiB). Their norms are left out of the pieces: each adapter is a small tensor (rank x width), its fp64 copy
    taken and released at once."""
    part = trainable / inputs.world_size
    if listed is not None and inputs.lora_rank:  # the copies and each layer's adapters, in the model's order
        units = [(size, one) for size, _, one in _gradient_units(inputs, trainable)]
    else:
        units = [(float(n), True) for n in trained]
    owned: List[float] = []
    whole, start = 0.0, 0.0
    for n, own in units:
        if start >= part:
            break
        if own:
            owned.append(min(n, part - start))
        whole += n
        start += n
    return owned, whole


def zero12_replay(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants) -> Optional[dict]:
    """ZeRO-1/2: the arguments of :func:`~zeropilot.memory.segments.zero12_reserved` for this launch: its large
    tensors, from the same activation and logits sizes as the estimate, replayed through the expandable-segments
    allocator under ``expandable_segments``. None for ZeRO-3.

    Freeze tuning and LoRA's ``modules_to_save`` train a subset: only those tensors are built, flattened and
    released, the rest stay where they were built; the output layer's and the embedding's gradients exist only when
    they train; the frozen layers before the first trainable one run without autograd and keep nothing for the
    backward, each one's input released once its output exists (:func:`front_layer`: the checkpointed first forward's
    tensors, and the key/value cache's copies where the run keeps one, until the logits go)."""
    if inputs.stage not in (1, 2) or not tuning.replayed(inputs, zero12=True):
        return None  # tuning.replayed: quantization, fused losses ... were never traced
    a = inputs.arch
    tokens = inputs.micro_batch * inputs.seq_len
    elements = tensor_sizes(a)
    sizes = [2.0 * n for n in elements]
    listed = tuning.trainable_list(inputs)  # freeze tuning's tensors, LoRA's modules_to_save copies
    if listed is not None:
        names = {p.name for p in listed}
        trained = [p.numel for p in listed]
        build = [2.0 * n for n in trained]  # built whole (PEFT copies each module), flattened, released
        frozen = sizes if inputs.lora_rank else [2.0 * p.numel for p in named_parameters(a) if p.name not in names]
    else:
        trained = [] if inputs.lora_rank else elements
        build, frozen = ([], sizes) if inputs.lora_rank else (sizes, [])
    layer = layer_tensors(inputs)
    no_grad_layer = layer_tensors(inputs, no_grad=True)
    h2 = kept_input(inputs)
    edges = (h2, final_norm(inputs))  # the embedding's output; the final norm
    owned, whole = _rank0_partition(inputs, trainable, trained, listed)
    first = _first_reduction(inputs, trainable)
    front = replay_front(inputs)  # freeze tuning: the frozen layers before the first trainable one
    trains = tuning.output_trains(inputs)
    embedding = not inputs.lora_rank if listed is None else any(p.name.startswith("model.embed_tokens")
                                                                    for p in listed)
    return dict(build=build, frozen=frozen, trainable=trainable, world_size=inputs.world_size,
                gpu_optimizer=inputs.offload_optimizer == "none", layer=layer, layers=a.layers,
                no_grad_layer=no_grad_layer,
                checkpointed=inputs.gradient_checkpointing, edges=edges,
                logits_bf16=2.0 * tokens * a.vocab, logits_fp32=4.0 * tokens * a.vocab,
                output_grad=2.0 * a.vocab * a.hidden if trains else 0.0,
                buckets=[2.0 * inputs.reduce_bucket_size] * (2 if inputs.overlap else 1),
                embedding_grad=2.0 * a.vocab * a.hidden if embedding else 0.0, tied=a.tied,
                softcap=a.logit_softcap, norm_pieces=owned, grad_partition=2.0 * whole, first_reduction=first,
                eight_bit=inputs.optimizer == "adamw_8bit", frozen_layers=front,
                front_layer=front_layer(inputs) if front else None, expandable=inputs.expandable_segments,
                second_group=tuning.second_param_group(inputs), foreach=inputs.torch_adam,
                **_accumulation(inputs, listed, front))


def _accumulation(inputs: PlanInputs, listed, front: int) -> dict:
    """Gradient accumulation: :func:`~zeropilot.memory.segments.zero12_reserved`'s ``micro_batches`` and what the
    micro batches before the boundary leave held.

    ZeRO-1: ``layer_grads`` (each decoder layer's 16-bit gradients, in backward order), the gradients autograd keeps
    from the first micro batch to the boundary (DeepSpeed 0.19.8 reduces ZeRO-1 only there:
    ``engine.allreduce_gradients``; witness in tests/memory/test_zero1_accumulation.py). Full fine-tuning only: LoRA's
    adapters' gradients are small, and holding its reduce bucket alone over-predicted call 9's ``h9_q4_lora_z1_ga4``
    (+2.5% against -2.2%), so LoRA and the trained subsets (freeze tuning, ``modules_to_save``) keep each step's
    boundary micro batch alone.

    ZeRO-2 with the optimizer on the GPU: ``partition_gradients``, every micro batch reduced into its own flat
    gradient partition, the first one's kept to the boundary (``all_grad_tensors``; witness in
    tests/memory/test_zero2_accumulation.py), whatever trains. With ``offload_optimizer`` DeepSpeed accumulates in the
    CPU partition instead (``async_accumulate_grad_in_cpu_via_gpu``): not replayed."""
    if inputs.grad_accum < 2:
        return {}
    if inputs.stage == 2:
        return {} if inputs.offload_optimizer != "none" else dict(micro_batches=inputs.grad_accum,
                                                                   partition_gradients=True)
    if listed is not None or front or inputs.lora_rank:
        return {}
    a = inputs.arch
    grads = [2.0 * n for n in reversed(layer_tensor_sizes(a, 0))]
    if any(layer_tensor_sizes(a, i) != layer_tensor_sizes(a, 0) for i in range(a.layers)):
        return {}  # layers of different shapes: not replayed this way
    return dict(micro_batches=inputs.grad_accum, layer_grads=grads)


def zero12_segments(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants) -> Optional[int]:
    """ZeRO-1/2: bytes the caching allocator reserves, replaying the run's large tensors (``memory/segments.py``).

    What training reserves (the plan's figure for ZeRO-1/2): segments are never given back, and the step's whole fp32
    blocks or the logits' fp32 copies need new ones once the cache is split (the allocator traces).
    """
    key = _zero12_key(inputs, counts, trainable, c)
    return None if key is None else _replay(key)


def _zero12_key(inputs: PlanInputs, counts: ParamCounts, trainable: int, c: Constants) -> Optional[tuple]:
    args = zero12_replay(inputs, counts, trainable, c)
    return None if args is None else tuple(sorted((k, _frozen(v)) for k, v in args.items()))


def zero3_replay(inputs: PlanInputs) -> Optional[dict]:
    """ZeRO-3: the arguments of :func:`~zeropilot.memory.segments.zero3_reserved`, for full fine-tuning with
    ``offload_param`` and the optimizer on the GPU, LoRA with both offloads at world size 1, and full or LoRA
    fine-tuning with the parameters on the GPU at world size 1 (nothing gathered), the optimizer on the GPU or
    offloaded. None elsewhere (the fitted gap holds there)."""
    on_gpu, gpu_optimizer, lora = (inputs.offload_param == "none", inputs.offload_optimizer == "none",
                                   inputs.lora_rank is not None)
    if on_gpu:
        replayed = inputs.world_size == 1
    else:
        replayed = (not lora and gpu_optimizer) or (lora and not gpu_optimizer and inputs.world_size == 1)
    listed = tuning.trainable_list(inputs)  # freeze tuning, modules_to_save: replayed with the parameters on the GPU
    if inputs.stage != 3 or not replayed \
            or not tuning.replayed(inputs, zero12=on_gpu and inputs.world_size == 1) \
            or inputs.optimizer != "adamw":  # ZeRO-3's sub-group steps with the 8-bit states: never replayed
        return None
    a, n = inputs.arch, inputs.world_size
    per_layer = [layer_tensor_sizes(a, i) for i in range(a.layers)]
    edge = [a.vocab * a.hidden] * (1 if a.tied else 2)  # the embedding, and an untied output layer
    elements = edge[:1] + [x for layer in per_layer for x in layer] + edge[1:]  # the model's order
    sizes = [2.0 * x for x in elements]
    trainable = elements if inputs.lora_rank is None else [trainable_params(inputs, count_params(a))]
    order: List[Tuple[float, bool]] = []  # zero.Init, a trained subset: every tensor as built, and whether it trains
    copies: List[float] = []  # modules_to_save: PEFT's copies, built after the model
    if listed is not None:
        names = {p.name for p in listed}
        if inputs.lora_rank is None:  # freeze tuning: the frozen tensors stay, the trained ones are flattened
            order = [(2.0 * p.numel, p.name in names) for p in named_parameters(a)]
            sizes = [size for size, trains in order if not trains]
            copies = [size for size, trains in order if trains]
            trainable = [p.numel for p in listed]
        else:  # LoRA's adapters (one tensor) and the copies
            copies = [2.0 * p.numel for p in listed]
            trainable = [trainable[0] - sum(p.numel for p in listed)] + [p.numel for p in listed]
    sub_groups: List[float] = []  # the optimizer on the GPU: its sub-groups' fp32 bytes
    offload_buckets: List[List[float]] = []  # the optimizer on the CPU: each reduction's gradients, backward order
    current = held = 0.0
    if gpu_optimizer:
        for x in trainable:
            current += -(-x // n)
            if current >= inputs.sub_group_size:  # _create_fp16_sub_groups closes a group once it reaches the size
                sub_groups.append(4.0 * current)
                current = 0.0
        if current:
            sub_groups.append(4.0 * current)
    else:
        for x in trainable[::-1]:  # a bucket is reduced when the next gradient would overflow it
            if not offload_buckets or (held and held + x > inputs.reduce_bucket_size):
                offload_buckets.append([])
                held = 0.0
            offload_buckets[-1].append(float(x))
            held += x
    part = -(-sum(trainable) // n)
    frozen = sizes if inputs.lora_rank is not None or listed is not None else []
    tokens = inputs.micro_batch * inputs.seq_len
    # built whole, a tied model first gets its own output-layer weight, released when transformers ties it to the
    # embedding (its block stays cached; calls 21 and 49's traces)
    build = [] if inputs.zero_init else sizes + copies + [2.0 * a.vocab * a.hidden] * a.tied
    front = replay_front(inputs)
    return dict(build=build, sub_groups=sub_groups,
                bucket=2.0 * inputs.reduce_bucket_size, grad_partition=2.0 * part if gpu_optimizer else 0.0,
                layer=layer_tensors(inputs), layers=a.layers, no_grad_layer=layer_tensors(inputs, no_grad=True),
                gathered=[] if on_gpu else [[2.0 * x for x in layer] for layer in per_layer],
                embedding=0.0 if on_gpu else 2.0 * a.vocab * a.hidden,
                checkpointed=inputs.gradient_checkpointing, edges=(kept_input(inputs), final_norm(inputs)),
                logits_bf16=2.0 * tokens * a.vocab, logits_fp32=4.0 * tokens * a.vocab,
                output_grad=2.0 * a.vocab * a.hidden if tuning.output_trains(inputs) else 0.0,
                softcap=a.logit_softcap, norm_pieces=[float(-(-x // n)) for x in trainable] if gpu_optimizer else [],
                offload_buckets=offload_buckets, frozen=frozen,
                hooked=[2.0 * x for x in elements] if listed is None and inputs.lora_rank is None
                else copies,  # LoRA's adapters: small
                live=0.0 if on_gpu else 2.0 * inputs.max_live_parameters,
                init_gathers=[(2.0 * a.vocab * a.hidden, 2.0 * -(-a.vocab * a.hidden // n))] * 2
                if inputs.zero_init and not on_gpu else [],
                flat=2.0 * part if on_gpu else 0.0,
                side_stream=2.0 * min(inputs.reduce_bucket_size, part) if inputs.overlap else 0.0,
                init_order=order if inputs.zero_init else [], frozen_layers=front,
                front_layer=front_layer(inputs) if front else None, expandable=inputs.expandable_segments,
                foreach=inputs.torch_adam)


def zero3_segments(inputs: PlanInputs, steps: int = 2) -> Optional[int]:
    """ZeRO-3 of :func:`zero3_replay`'s kinds: bytes the caching allocator reserves, replaying the run's large tensors
    (``memory/segments.py``), after ``steps`` training steps (0: at the end of the init phase, its peak on every
    committed trace); None where :func:`zero3_replay` is."""
    key = _zero3_key(inputs, steps)
    return None if key is None else _replay(key)


def _zero3_key(inputs: PlanInputs, steps: int = 2) -> Optional[tuple]:
    args = zero3_replay(inputs)
    if args is None:
        return None
    return ("zero3",) + tuple(sorted((k, _frozen(v)) for k, v in dict(args, steps=steps).items()))


def _frozen(value):
    """``value`` with its lists made tuples, to key :func:`_replay`'s cache."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


#: :func:`_replay`'s results by arguments, oldest first (at most ``_REPLAYS_KEPT``)
_REPLAYS: "OrderedDict[tuple, int]" = OrderedDict()
_REPLAYS_KEPT = 512


def _replay(args: tuple, ceiling: float = float("inf")) -> Optional[int]:
    """The replay of ``args`` (a ``_zero12_key`` or ``_zero3_key``), remembered: ``plan --search`` asks for one replay
    for ZeRO-1 and ZeRO-2, and for variants that differ only where the replay does not look (about 20 ms each).
    None when it would reserve more than ``ceiling`` (:class:`~zeropilot.memory.segments.Exceeded`; not
    remembered, as the replay stopped there)."""
    if args in _REPLAYS:
        _REPLAYS.move_to_end(args)
        return _REPLAYS[args]
    try:
        if args[:1] == ("zero3",):
            value = zero3_reserved(**dict(args[1:]), ceiling=ceiling)
        else:
            value = zero12_reserved(**dict(args), ceiling=ceiling)
    except Exceeded:
        return None
    _REPLAYS[args] = value
    if len(_REPLAYS) > _REPLAYS_KEPT:
        _REPLAYS.popitem(last=False)
    return value


def exceeds(inputs: PlanInputs, limit: float, c: Constants = DEFAULT) -> bool:
    """Whether ``inputs``' GPU peak is surely over ``limit`` bytes, found without the whole plan: the allocator
    replay (where one applies) plus memory outside PyTorch passes it. :func:`estimate_gpu`'s peak is at least that sum
    (training's peak is the replay's segments plus memory outside PyTorch), and a replay stops as soon as it passes,
    so ``plan --search`` spends a few milliseconds, not a whole replay, on most candidates that cannot fit. False
    means only: not shown this way."""
    if inputs.stage in (1, 2):
        counts = count_params(inputs.arch)
        key = _zero12_key(inputs, counts, trainable_params(inputs, counts), c)
    else:
        key = _zero3_key(inputs)
    if key is None:
        return False
    outside = _non_torch(inputs, c).bytes
    segs = _replay(key, ceiling=limit - outside)
    return segs is None or segs + outside > limit


def estimate_gpu(inputs: PlanInputs, c: Constants = DEFAULT) -> GpuMemory:
    """The per-GPU memory of ``inputs`` at its peak, component by component."""
    counts = count_params(inputs.arch)
    trainable = trainable_params(inputs, counts)
    resident = _weights(inputs, counts, trainable) + _grads_and_optimizer(inputs, trainable)
    resident.append(_zero_buffers(inputs, counts, trainable, c))
    act, act_why = activation_bytes(inputs, c)
    lg, lg_why = logits_bytes(inputs, c)
    backward = [Component("activations", act, "backward", act_why), Component("logits", lg, "backward", lg_why)]
    if inputs.quant_bits is not None:
        backward.append(Component("dequant_buffer", tuning.dequant_bytes(inputs), "backward",
                                  "bitsandbytes dequantizes each quantized matrix to 16 bits for its matmul: the "
                                  "largest one's copy"))
    step = _step_temporaries(inputs, counts, trainable, c)
    if inputs.stage in (1, 2):
        # ZeRO-1/2 release the gradient partition and the reduce buckets after each step (0.19.8,
        # ``_release_ipg_buffers``) and take them again as gradients arrive: at the loss backward, where logits and
        # activations peak, neither is there (call 7's traces; witness in tests/memory/test_gpu.py).
        resident = [replace(x, phase="gradients") if x.name in ("gradients", "zero_buffers") else x for x in resident]
    late = sum(x.bytes for x in resident if x.phase == "gradients")
    resident_bytes = sum(x.bytes for x in resident if x.phase == "resident")
    backward_bytes = sum(x.bytes for x in backward)
    phase = "backward" if backward_bytes >= late + step.bytes else "step"
    allocated = resident_bytes + max(backward_bytes, late + step.bytes)
    opt = sum(x.bytes for x in resident if x.name.startswith("optimizer_"))
    gap = _gap(inputs, opt, max(backward_bytes - late, step.bytes), step.bytes, counts.largest, c)
    non_torch = _non_torch(inputs, c)
    reserved = allocated + gap.bytes
    segs = zero12_segments(inputs, counts, trainable, c) if inputs.stage in (1, 2) else zero3_segments(inputs)
    adjust: List[Component] = []
    if segs is not None:
        # ZeRO-1/2: the replay, not the fitted gap, says what the allocator reserves (pre-registered calls 24 and 25:
        # nearer the measurement on every committed row where the two differ); ZeRO-3 with offload_param and the
        # optimizer on the GPU likewise (calls 7 and 21's traces; pre-registered call 32)
        if segs < allocated:  # the fitted transients over-count (Gemma 2's soft-capped logits at large token counts)
            adjust = [Component("replay_adjustment", segs - allocated, "overhead",
                                f"the allocator replay, tensor by tensor, peaks at {_gib(segs)}, below the fitted "
                                f"components above ({_gib(allocated)}): the plan takes the replay's "
                                "(memory/segments.py)")]
            allocated = segs
        if inputs.stage in (1, 2):
            what = ("initialize's cached blocks are split and the step's whole fp32 blocks or the logits' fp32 copies "
                    "take new segments")
        elif inputs.offload_param == "none" and inputs.offload_optimizer != "none":
            what = ("deepspeed.initialize empties the cache as it flattens the parameters; the logits' fp32 copies "
                    "and the gradients' copies on their way to the CPU take new segments once the cache is split")
        elif inputs.offload_param == "none":
            what = ("deepspeed.initialize empties the cache as it flattens the parameters; the logits' fp32 copies, "
                    "the gradients' fp64 norms and the step's fp32 blocks, one sub-group at a time, take new segments "
                    "once the cache is split")
        elif inputs.offload_optimizer != "none":
            what = ("" if inputs.zero_init else "the whole-model build's blocks stay cached (no zero.Init), and ") + (
                "from the second step up to stage3_max_live_parameters prefetched parameters stay gathered, so the "
                "logits' fp32 copies take new segments")
        else:
            what = ("" if inputs.zero_init else "the whole-model build's blocks stay cached (no zero.Init), and ") + (
                "the optimizer step's fp32 blocks, one sub-group at a time, take new segments once smaller "
                "sub-groups' states have split the cached ones")
        if inputs.expandable_segments:  # one address range, 20 MiB pages mapped as needed: no whole-block demand
            why = (f"expandable segments: replaying the run's large tensors through the allocator's policy maps "
                   f"{_gib(segs)} of pages; the blocks freed inside the mapped range are what a later request does "
                   "not fit (memory/segments.py ExpandableAllocator)")
        else:
            why = (f"caching-allocator segments: replaying the run's large tensors through the allocator's best-fit "
                   f"policy reserves {_gib(segs)}: {what} (memory/segments.py)")
        gap = Component(gap.name, segs - allocated, gap.phase, why)
        reserved = segs
    params = counts.total + (trainable if inputs.lora_rank else 0)
    comps = resident + backward + [step] + adjust + [gap, non_torch]
    train_peak = reserved + non_torch.bytes
    init_peak = 0
    if inputs.stage == 3:
        quantized = None
        if inputs.quant_bits is not None:
            packed, state, _ = tuning.frozen_base_bytes(inputs, counts, trainable)
            quantized = packed + state + 2 * trainable
        init = _init_phase(inputs, params, trainable, quantized)
        comps.append(init)
        init_peak = int(init.bytes * c.init_reserved) + non_torch.bytes
        if segs is not None:  # the replay's segments at the init's end (within 0.1 GiB of the 22 traces' own)
            init_peak = zero3_segments(inputs, steps=0) + non_torch.bytes
        cache = _build_cache(inputs, counts, trainable, c, phase, act) if segs is None else None  # the replay has it
        if cache is not None:
            comps.insert(comps.index(gap) + 1, cache)
            reserved += cache.bytes
            train_peak += cache.bytes
        if init_peak > train_peak:
            phase, allocated, reserved = "init", init.bytes, int(init.bytes * c.init_reserved)
    peak = max(train_peak, init_peak)
    return GpuMemory(tuple(comps), peak, allocated, reserved, phase, params, trainable, train_peak, init_peak)
