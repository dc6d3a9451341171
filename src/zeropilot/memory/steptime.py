"""The time model: seconds per optimizer step on one GPU, term by term, each with its reason.

Pure functions of the plan's inputs (:class:`~zeropilot.memory.inputs.PlanInputs`) and the card's speed figures
(:class:`~zeropilot.memory.speed.Speed`); no torch. Formulas and their evidence: ``docs/plan.md`` (Time).

One micro batch is a forward and a backward pass (with gradient checkpointing, each decoder layer's forward runs
again inside the backward). The GPU's work in a pass is

- the matrix products of every linear layer (forward; the input's gradient wherever the input needs one, the weight's
  for trainable weights), each at the rate ``calibrate`` measured at that shape, or at the memory bandwidth where the
  product is too thin to be bound by arithmetic (LoRA's rank-r products);
- attention (``scaled_dot_product_attention``, causal: ``2 b H s^2 d`` FLOPs forward, 2.5 times that backward) at the
  measured attention rate; eager attention as two batched products and a softmax over the whole ``s x s`` scores;
- every other kernel (norms, rotary embedding, activations, residual adds, dtype casts, the loss) at the memory
  bandwidth: bytes per token and decoder layer counted by running a real transformers layer under torch's
  dispatcher (``bench/plan/time/op_census.py``, :data:`ELEMENTWISE`), plus a floor per kernel;

and the host's work is one eager launch per kernel (PyTorch's dispatch, autograd), plus DeepSpeed's Python hooks:
ZeRO-1/2's per gradient tensor, ZeRO-3's per module on every pass. The GPU runs behind the host, so a pass takes the
longer of the two. Then the optimizer step (memory-bound over the trainable partition on the GPU; DeepSpeed's CPUAdam
or torch's AdamW on the host with optimizer offload, with the gradient and parameter copies over PCIe), ZeRO-3's
parameter gathers (copies, host-to-device copies with parameter offload), and at world size 2 or more ZeRO's
collectives over the ring of the job's ranks (:mod:`zeropilot.memory.links`), laid use by use over each micro
batch's compute as DeepSpeed issues them (:mod:`zeropilot.memory.schedule`): what the compute does not hide counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from zeropilot.memory import links, schedule, tuning
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.speed import Speed
from zeropilot.models.params import attention_linears, count_params, dense_mlp_linears
from zeropilot.models.trainable import named_parameters

#: ``num_train_epochs`` of the HF Trainer's (and LLaMA-Factory's) TrainingArguments when a launch leaves it out
TRAINER_EPOCHS = 3.0
#: the guard's phases (``runlog`` step records' ``phase_seconds``) a term's time falls in
PHASES = ("forward", "backward", "step")

#: Bytes of the kernels that are not matrix products or attention, per token and decoder layer, as
#: ``(a, b, c)`` for ``a*hidden + b*intermediate + c*kv_width``, by what trains and the pass: counted on transformers
#: 5.24's Llama/Qwen2 layers with PEFT 0.21.2 (``bench/plan/time/op_census.py``: every aten kernel's tensor inputs and
#: outputs; ``tests/memory/test_steptime.py`` counts them again). ``lora`` is LoRA with 16-bit adapters (DeepSpeed
#: casts them, :func:`~zeropilot.memory.gpu.lora_fp32_inputs`), ``lora_fp32`` with PEFT's fp32 adapters (ZeRO-3 in
#: zero.Init): each wrapped layer casts its input to fp32. A recomputed forward costs what the forward costs.
ELEMENTWISE = {
    ("full", "forward"): (106.0, 10.0, 20.0), ("full", "backward"): (256.0, 18.0, 33.0),
    ("lora", "forward"): (136.0, 30.0, 40.0), ("lora", "backward"): (288.0, 32.0, 41.0),
    ("lora_fp32", "forward"): (214.0, 64.0, 68.0), ("lora_fp32", "backward"): (372.0, 70.0, 73.0),
}
#: kernels per decoder layer that are not matrix products or attention, by what trains and the pass (same census)
KERNELS = {("full", "forward"): 30, ("full", "backward"): 56, ("lora", "forward"): 44, ("lora", "backward"): 66,
           ("lora_fp32", "forward"): 58, ("lora_fp32", "backward"): 87}
#: the loss's kernels: bytes per token per vocabulary entry (bf16 logits, their fp32 copy, log-softmax, NLL; and
#: backward), and the rest of the head per token and unit of hidden size (final norm, embedding, rotary tables)
LOSS_BYTES_PER_VOCAB = {"forward": 21.6, "backward": 29.2}
HEAD_BYTES_PER_HIDDEN = {"forward": 53.0, "backward": 106.0}
HEAD_KERNELS = {"forward": 31, "backward": 21}
#: What Liger's kernels (LLaMA-Factory's ``enable_liger_kernel``: RMSNorm, SwiGLU, RoPE, with its fused linear
#: cross-entropy) save against transformers' per token and layer, as (bytes per hidden unit (two norms), per
#: intermediate unit, per query+kv unit; kernels): transformers' modules counted by the census, Liger's Triton kernels
#: read off their source (0.8.5 ``ops/rms_norm.py``: X and Y once, rstd per row; ``ops/swiglu.py``: a, b, c once,
#: recomputing silu in the backward; ``ops/rope.py``: q and k in place)
LIGER_SAVES = {"forward": (64.0, 4.0, 17.0, 27), "backward": (172.0, 6.0, 22.0, 44)}
#: ZeRO-1/2 with optimizer offload, per trainable tensor of the partition at the gradient accumulation boundary
#: (DeepSpeed 0.19.8 ``stage_1_and_2.py`` ``copy_grads_in_partition``): ``set_norm_for_param_grad_in_gpu`` (cast
#: to float64, norm), ``update_offload_overflow_tracker`` (``utils.has_inf_or_nan``: amax, amin, two isfinite,
#: logical_and, logical_not, then ``if`` on the result: a host synchronisation), and
#: ``async_inplace_copy_grad_to_fp32_buffer_from_gpu`` (cast to fp32, the copy to pinned memory): eager ops each
#: issued from Python, and the bytes per element they move on the GPU (2 + 8 the cast, 8 the norm, 2 + 2 amax and
#: amin, 2 + 4 the cast to fp32) besides the 4 B copied to the host. The synchronisation per tensor makes the host
#: wait for the GPU tensor by tensor, so this work adds to the pass rather than hiding under it.
OFFLOAD_EPILOGUE_OPS = 11
OFFLOAD_EPILOGUE_KERNELS = 10
OFFLOAD_EPILOGUE_BYTES = 28.0
#: ZeRO-1 (no ``overlap_comm``) on a micro batch before the accumulation boundary: its gradient hook only
#: accumulates (``_fill_param_grad_accum_attribute``: the cast and ``add_``); the reduction runs at the boundary
#: (``engine.py allreduce_gradients``; ``process_gradients`` reduces only with ``partition_gradients`` or
#: ``overlap_comm``)
ZERO1_ACCUMULATE_OPS = 2
#: kernels Liger's fused linear cross-entropy launches per chunk of tokens (0.8.5 ``ops/fused_linear_cross_entropy.py``:
#: the chunk's logits, the cross-entropy kernel, the input's gradient and its copy, the weight's gradient, the casts)
LIGER_CHUNK_KERNELS = 7


@dataclass(frozen=True)
class TimeConstants:
    """The time model's constants, each with where it came from. Host costs are in units of the card's measured eager
    launch (``Speed.launch_s``): a slower host has a slower Python, and calibrate measures it.

    Attributes:
        host_forward / host_backward: host time per kernel of the forward / the backward (PyTorch's dispatch,
            autograd, transformers' and PEFT's modules) (fitted).
        grad_hook: DeepSpeed's gradient hook per trainable tensor per micro batch (ZeRO-1/2 bucketing, ZeRO-3's
            reduce and partition) (fitted).
        step_tensor: DeepSpeed's optimizer step per trainable tensor (norms, clipping, the 16-bit copy) (fitted).
        offload_hook: with optimizer offload at ZeRO-3, DeepSpeed's further work per trainable tensor per micro
            batch (fitted). ZeRO-1/2's is counted from the code instead (:data:`OFFLOAD_EPILOGUE_OPS`).
        zero3_fetch / zero3_module: ZeRO-3's gather and release of one partitioned parameter, and its hooks on one
            module, on one forward-type pass: the forward, and with checkpointing the recomputation, which runs the
            same forward hooks (DeepSpeed 0.19.8 ``parameter_offload.py``: fetch, trace, release, and the autograd
            functions wrapped around each module's inputs and outputs) (fitted).
        zero3_fetch_backward / zero3_module_backward: the same on the backward (fetch and release from the
            autograd functions' backward) (fitted). Split from the forward's after issue 40's ZeRO-3 rows of calls
            1-5, every one of which had its forward longer than the model and its backward shorter with one cost for
            both.
        gpu_kernel_s: the least time one kernel takes on the GPU (launch latency and tail), seconds.
        attention_backward: backward FLOPs of flash attention per forward FLOP (FlashAttention-2: five products
            against two).
        adam_bytes_fused / adam_bytes_torch: bytes read and written per trainable element by the update on the GPU:
            a fused AdamW (one kernel: parameter, gradient, two states read, three written: 28) or torch's foreach
            AdamW (nine passes: 84).
        step_bytes_zero12 / step_bytes_zero3: DeepSpeed 0.19.8's other bytes per element of the partition at the
            step: the gradient norm in float64 (``zero/utils.py get_norm_dtype``: each gradient cast to a double copy,
            written and read by ``vector_norm``: ZeRO-1/2's 16-bit gradients 2 + 8 + 8, ZeRO-3's fp32 partition
            4 + 8 + 8), ZeRO-1/2's cast of the flat gradient to fp32 (2 + 4), and the 16-bit copy of the updated
            fp32 partition (4 + 2).
        clip_bytes: the gradient clipping's bytes per element of the fp32 gradient partition at the step, read and
            written once (``unscale_and_clip_grads``: ``mul_(1 / combined_scale)``; DeepSpeed's
            ``gradient_clipping`` defaults to 1.0 since 0.19.3, ``runtime/constants.py``), every stage; on the host
            with optimizer offload at ZeRO-1/2.
        grad_bytes_zero2 / grad_bytes_zero1: ZeRO-2's bytes per trainable element per micro batch beyond autograd's
            own (the copy into the reduce bucket, the average, the copy into the partition); ZeRO-1's (accumulation).
        source: where the fitted values come from.
    """

    host_forward: float = 4.313
    host_backward: float = 1.524
    grad_hook: float = 30.0
    step_tensor: float = 23.87
    offload_hook: float = 27.53
    zero3_fetch: float = 53.77
    zero3_module: float = 21.48
    zero3_fetch_backward: float = 15.59
    zero3_module_backward: float = 14.16
    gpu_kernel_s: float = 2.5e-6
    attention_backward: float = 2.5
    adam_bytes_fused: float = 28.0
    adam_bytes_torch: float = 84.0
    step_bytes_zero12: float = 18.0 + 6.0 + 6.0
    step_bytes_zero3: float = 20.0 + 6.0
    clip_bytes: float = 8.0
    grad_bytes_zero2: float = 12.0
    grad_bytes_zero1: float = 6.0
    source: str = ("host costs fitted on the 12 fit rows of GPU call 1 (one H100, bench/plan/time/data/call1; "
                   "`python bench/plan/time/fit.py ... --fit`)")


TIME_DEFAULT = TimeConstants()


@dataclass(frozen=True)
class Term:
    """One part of an optimizer step's time.

    Attributes:
        name: what it is (``matmul``, ``attention``, ``elementwise``, ``loss``, ``launch``, ``zero3_fetch``,
            ``collectives``, ``optimizer``, ``offload_copies``, ``cpu_adam``, ...).
        seconds: its time per optimizer step (all micro batches), as it adds to the step (overlapped time is 0).
        phase: the guard's phase it falls in (:data:`PHASES`).
        reason: how it was worked out, in words, with the figures it used.
    """

    name: str
    seconds: float
    phase: str
    reason: str


@dataclass(frozen=True)
class StepTime:
    """One optimizer step on one GPU.

    Attributes:
        step_s: seconds per optimizer step.
        terms: what makes it up (their seconds add up to ``step_s``).
        tokens_per_step: tokens one GPU trains on per optimizer step (micro batch x sequence x accumulation).
        model_flops: the model's FLOPs per step on one GPU (matrix products and attention of the forward and the
            backward the training needs, without recomputation: what MFU counts).
        peak_flops_per_s: the card's datasheet peak (MFU's denominator).
        world_size: GPUs of the job.
        card: the card the figures are of.
        estimated: the speed figures this used that were not measured on the card (:meth:`Speed.estimated`).
        notes: what the model leaves out for this launch.
        figures: every speed figure of the card as (name, value, source, measured).
        constants: where the model's fitted constants come from.
    """

    step_s: float
    terms: Tuple[Term, ...]
    tokens_per_step: int
    model_flops: float
    peak_flops_per_s: float
    world_size: int
    card: str = ""
    estimated: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = field(default=())
    figures: Tuple[Tuple[str, float, str, bool], ...] = ()
    constants: str = ""
    collectives: Optional["Collectives"] = None

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second on one GPU."""
        return self.tokens_per_step / self.step_s

    @property
    def job_tokens_per_s(self) -> float:
        """Tokens per second of the whole job (every GPU)."""
        return self.tokens_per_s * self.world_size

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: the model's FLOPs per second against the card's datasheet peak."""
        return self.model_flops / self.step_s / self.peak_flops_per_s

    def phases(self) -> Dict[str, float]:
        """Seconds per guard phase (``forward``, ``backward``, ``step``) per optimizer step."""
        out = {p: 0.0 for p in PHASES}
        for t in self.terms:
            out[t.phase] += t.seconds
        return out


@dataclass(frozen=True)
class RunTime:
    """The whole run: how many optimizer steps, how long, what it costs.

    Attributes:
        steps: optimizer steps, None when the launch does not say how long it is (``reason`` says what is missing).
        seconds: wall time of the steps (no start-up, evaluation or saves), None with ``steps``.
        gpu_hours: ``seconds`` x GPUs / 3600.
        cost: ``gpu_hours`` x the cost of a GPU-hour, None without one.
        reason: where ``steps`` came from, or why it is unknown.
        gpu_hour_cost: the cost of one GPU-hour it was priced at (``--gpu-hour-cost``), None without one.
    """

    steps: Optional[int]
    seconds: Optional[float]
    gpu_hours: Optional[float]
    cost: Optional[float]
    reason: str
    gpu_hour_cost: Optional[float] = None


# -- what one micro batch computes ---------------------------------------------------------------------------------

@dataclass
class _Pass:
    """The GPU's and the host's work of one pass (forward, backward or recomputation) of one micro batch."""

    matmul_s: float = 0.0
    attention_s: float = 0.0
    elementwise_s: float = 0.0
    kernels: int = 0
    flops: float = 0.0
    bytes: float = 0.0

    def gpu_s(self, c: TimeConstants) -> float:
        return self.matmul_s + self.attention_s + self.elementwise_s + self.kernels * c.gpu_kernel_s


def _rate(speed: Speed, m: int, k: int, n: int) -> float:
    """The matmul rate at ``(m x k) @ (k x n)``: the measured point nearest in shape (log distance), else the card's
    large-shape rate."""
    pts = [p for p in speed.matmul_points if p.flops_per_s > 0]
    if not pts:
        return speed.matmul_flops_per_s.value

    def dist(p) -> float:
        return (math.log(p.m / m) ** 2 + math.log(p.k / k) ** 2 + math.log(p.n / n) ** 2)

    return min(pts, key=dist).flops_per_s


def _matmul_s(speed: Speed, m: int, k: int, n: int, count: int = 1) -> Tuple[float, float]:
    """(seconds, FLOPs) of ``count`` products ``(m x k) @ (k x n)`` in bf16: arithmetic at the measured rate or memory
    traffic (both operands and the result, 2 B each) at the memory bandwidth, whichever is longer."""
    flops = 2.0 * m * k * n
    traffic = 2.0 * (m * k + k * n + m * n)
    return count * max(flops / _rate(speed, m, k, n), traffic / speed.mem_bytes_per_s.value), count * flops


def _method(inputs: PlanInputs) -> str:
    if not inputs.lora_rank:
        return "full"
    fp32 = inputs.stage == 3 and inputs.zero_init and inputs.quant_bits is None
    return "lora_fp32" if fp32 else "lora"


def _layer_linears(inputs: PlanInputs) -> List[Tuple[int, int]]:
    a = inputs.arch
    inter = a.intermediate if a.moe is None else a.moe.active * a.moe.expert_intermediate + a.moe.shared_intermediate
    return attention_linears(a) + dense_mlp_linears(a, inter)


def _frozen_front(inputs: PlanInputs) -> int:
    """Decoder layers before the first trainable one (freeze tuning) whose inputs need no gradient, so their backward
    does nothing and checkpointing does not run them again: none under checkpointing
    (:func:`tuning.first_backward_layer`)."""
    return tuning.first_backward_layer(inputs)


def _layer_pass(inputs: PlanInputs, speed: Speed, c: TimeConstants, which: str, weight_grads: bool,
                input_grads: bool = True) -> _Pass:
    """One decoder layer's pass on one micro batch: ``which`` is ``forward`` or ``backward``."""
    a = inputs.arch
    t = inputs.micro_batch * inputs.seq_len
    out = _Pass()
    lins = _layer_linears(inputs)
    r = inputs.lora_rank or 0
    for k_in, n_out in lins:
        if which == "forward":
            s, f = _matmul_s(speed, t, k_in, n_out)
        else:
            s, f = (_matmul_s(speed, t, n_out, k_in) if input_grads else (0.0, 0.0))
            if weight_grads:
                s2, f2 = _matmul_s(speed, k_in, t, n_out)
                s, f = s + s2, f + f2
        out.matmul_s += s
        out.flops += f
        if r:  # LoRA: x A (t x in -> r), then B (r -> out); backward: both gradients and the input's
            n = 2 if which == "forward" else 4
            s, f = _matmul_s(speed, t, k_in, r)
            s2, f2 = _matmul_s(speed, t, r, n_out)
            out.matmul_s += (s + s2) * n / 2
            out.flops += (f + f2) * n / 2
    out.kernels += len(lins) * (1 if which == "forward" else 2) + (len(lins) * (2 if which == "forward" else 4)
                                                                    if r else 0)
    # attention
    d, heads, s_len, b = a.head_dim, a.heads, inputs.seq_len, inputs.micro_batch
    if inputs.attn == "eager":
        sc, fl = _matmul_s(speed, s_len, d, s_len, count=b * heads)  # q k^T
        sv, fv = _matmul_s(speed, s_len, s_len, d, count=b * heads)  # p v
        n = 1 if which == "forward" else 2
        soft = b * heads * s_len * s_len * (12.0 if which == "forward" else 16.0) / speed.mem_bytes_per_s.value
        out.attention_s += (sc + sv) * n + soft
        out.flops += (fl + fv) * n
        out.kernels += 6 if which == "forward" else 10
    else:
        fwd = 2.0 * b * heads * s_len * s_len * d  # causal: half of 4 b H s^2 d
        fl = fwd * (1.0 if which == "forward" else c.attention_backward)
        out.attention_s += fl / speed.attention_flops_per_s.value
        out.flops += fl
        out.kernels += 1
    coef = ELEMENTWISE[(_method(inputs), which)]
    kv = a.kv_heads * a.head_dim
    per_token = coef[0] * a.hidden + coef[1] * a.intermediate + coef[2] * kv
    kernels = KERNELS[(_method(inputs), which)]
    if a.norms_per_layer > 2:  # Gemma 2/3's two more norms, each as an RMSNorm costs (the census's per-norm share)
        per_token += (a.norms_per_layer - 2) * (36.0 if which == "forward" else 92.0) * a.hidden
        kernels += (a.norms_per_layer - 2) * (8 if which == "forward" else 16)
    if inputs.fused_loss == "liger":
        sh, si, sq, sk = LIGER_SAVES[which]
        per_token -= sh * a.hidden + si * a.intermediate + sq * (a.heads * a.head_dim + kv)
        kernels -= sk
    out.bytes += per_token * t
    out.elementwise_s += per_token * t / speed.mem_bytes_per_s.value
    out.kernels += kernels
    return out


def _head_pass(inputs: PlanInputs, speed: Speed, c: TimeConstants, which: str) -> _Pass:
    """The output layer and the loss on one micro batch (and the embedding and final norm)."""
    a = inputs.arch
    t = inputs.micro_batch * inputs.seq_len
    out = _Pass()
    head_trains = tuning.output_trains(inputs)
    fused = inputs.fused_loss is not None
    s, f = 0.0, 0.0
    if which == "forward" or fused:  # a fused loss makes the logits' gradients in the forward, chunk by chunk
        s, f = _matmul_s(speed, t, a.hidden, a.vocab)
    if which == "backward" or fused:
        s1, f1 = _matmul_s(speed, t, a.vocab, a.hidden)
        s, f = s + s1, f + f1
        if head_trains:
            s2, f2 = _matmul_s(speed, a.hidden, t, a.vocab)
            s, f = s + s2, f + f2
    if fused and which == "backward":
        s, f = 0.0, 0.0
    out.matmul_s, out.flops = s, f
    if fused:
        # Liger / cut cross-entropy: 16-bit logits written, read and overwritten by their gradient, read again
        per_vocab = 8.0 if which == "forward" else 0.0
    else:
        per_vocab = LOSS_BYTES_PER_VOCAB[which] + (8.0 if a.logit_softcap else 0.0)
    by = t * (per_vocab * a.vocab + HEAD_BYTES_PER_HIDDEN[which] * a.hidden)
    out.bytes = by
    out.elementwise_s = by / speed.mem_bytes_per_s.value
    out.kernels = HEAD_KERNELS[which] + (1 if which == "forward" else 1 + int(head_trains))
    if inputs.fused_loss == "liger" and which == "forward":  # one pass of its loop per chunk of tokens
        out.kernels += LIGER_CHUNK_KERNELS * math.ceil(t / tuning.liger_chunk_tokens(inputs))
    return out


@dataclass
class _MicroBatch:
    forward: _Pass
    backward: _Pass
    recompute: _Pass
    kernels: Dict[str, int]
    head_forward: _Pass = field(default_factory=_Pass)
    head_backward: _Pass = field(default_factory=_Pass)


def _micro_batch(inputs: PlanInputs, speed: Speed, c: TimeConstants) -> _MicroBatch:
    a = inputs.arch
    front = _frozen_front(inputs)
    trained_layers = a.layers - front
    full_weights = not inputs.lora_rank and inputs.freeze is None
    fwd = _layer_pass(inputs, speed, c, "forward", False)
    if inputs.freeze is not None:
        # freeze tuning: the trainable layers' weights get gradients, the frozen ones after them pass gradients on
        share = _freeze_weight_share(inputs)
        bwd_w = _layer_pass(inputs, speed, c, "backward", True)
        bwd_n = _layer_pass(inputs, speed, c, "backward", False)
        bwd = _scale(bwd_w, share * trained_layers)
        bwd = _add(bwd, _scale(bwd_n, (1 - share) * trained_layers))
    else:
        bwd = _scale(_layer_pass(inputs, speed, c, "backward", full_weights), trained_layers)
    layers_f = _scale(fwd, a.layers)
    head_f, head_b = _head_pass(inputs, speed, c, "forward"), _head_pass(inputs, speed, c, "backward")
    rec = _scale(fwd, trained_layers) if inputs.gradient_checkpointing else _Pass()
    forward = _add(layers_f, head_f)
    backward = _add(bwd, head_b)
    return _MicroBatch(forward, backward, rec, {"forward": forward.kernels, "backward": backward.kernels + rec.kernels},
                       head_f, head_b)


def _freeze_weight_share(inputs: PlanInputs) -> float:
    """Freeze tuning: the share of the trained decoder layers' linear weights that train."""
    listed = tuning.trainable_list(inputs) or []
    front = _frozen_front(inputs)
    lin_total = sum(p.numel for p in named_parameters(inputs.arch)
                    if p.linear is not None and p.layer is not None and p.layer >= front)
    lin_train = sum(p.numel for p in listed if p.linear is not None and p.layer is not None)
    return lin_train / lin_total if lin_total else 0.0


def _scale(p: _Pass, k: float) -> _Pass:
    return _Pass(p.matmul_s * k, p.attention_s * k, p.elementwise_s * k, int(round(p.kernels * k)), p.flops * k,
                 p.bytes * k)


def _add(p: _Pass, q: _Pass) -> _Pass:
    return _Pass(p.matmul_s + q.matmul_s, p.attention_s + q.attention_s, p.elementwise_s + q.elementwise_s,
                 p.kernels + q.kernels, p.flops + q.flops, p.bytes + q.bytes)


# -- DeepSpeed's part ------------------------------------------------------------------------------------------------

def _fetched(inputs: PlanInputs) -> Tuple[float, int]:
    """ZeRO-3: (elements, tensors) of the parameters it partitions and gathers on every pass: those with at least
    ``stage3_param_persistence_threshold`` elements (smaller ones stay whole on every GPU: norms, biases, LoRA's
    adapters at the usual thresholds; :func:`zeropilot.memory.schedule.layout`)."""
    lay = schedule.layout(inputs.arch, inputs.param_persistence_threshold)
    return lay.elements, lay.tensors


def _trainable_tensors(inputs: PlanInputs) -> int:
    if inputs.freeze is not None or (inputs.lora_rank and inputs.modules_to_save):
        listed = len(tuning.trainable_list(inputs) or [])
        if inputs.freeze is not None:
            return listed
        return listed + 2 * len(_layer_linears(inputs)) * inputs.arch.layers
    if inputs.lora_rank:
        return 2 * len(_layer_linears(inputs)) * inputs.arch.layers
    return len(named_parameters(inputs.arch))


def estimate_time(inputs: PlanInputs, speed: Speed, c: TimeConstants = TIME_DEFAULT) -> StepTime:
    """The time of one optimizer step of ``inputs`` on the card of ``speed``."""
    a = inputs.arch
    counts = count_params(a)
    trainable = tuning.trainable_params(inputs, counts)
    ws, ga = inputs.world_size, inputs.grad_accum
    mb = _micro_batch(inputs, speed, c)
    terms: List[Term] = []
    notes: List[str] = []
    bw = speed.mem_bytes_per_s.value

    def add(name: str, seconds: float, phase: str, reason: str) -> None:
        terms.append(Term(name, seconds, phase, reason))

    # ZeRO-3's hooks and gathers ride on every pass; every stage's gradient hooks on the backward
    launch = speed.launch_s.value
    modules = schedule.modules(inputs)
    fetched, fetched_n = _fetched(inputs)
    passes = 3 if inputs.gradient_checkpointing else 2
    z3_host = {"forward": 0.0, "backward": 0.0}
    z3_gpu = {"forward": 0.0, "backward": 0.0}
    if inputs.stage == 3:
        per_fwd = (fetched_n * c.zero3_fetch + modules * c.zero3_module) * launch
        per_bwd = (fetched_n * c.zero3_fetch_backward + modules * c.zero3_module_backward) * launch
        # a recomputation is a forward: the forward's hooks fire again inside the backward
        z3_host["forward"], z3_host["backward"] = per_fwd, per_bwd + per_fwd * (passes - 2)
        copy = 2.0 * 2.0 * fetched / ws / bw  # the gathered 16-bit tensor written, its partition read
        z3_gpu["forward"], z3_gpu["backward"] = copy, copy * (passes - 1)
    grad_tensors = _trainable_tensors(inputs)
    hooks = grad_tensors * c.grad_hook * launch if inputs.stage >= 1 else 0.0
    # ZeRO-1 without overlap_comm reduces on the boundary micro batch only; the others' hooks only accumulate
    once = inputs.stage == 1 and not inputs.overlap
    accumulate_hooks = grad_tensors * ZERO1_ACCUMULATE_OPS * launch if once else hooks
    z12_gpu = 0.0
    if inputs.stage == 2:
        z12_gpu = trainable * c.grad_bytes_zero2 / bw
    elif inputs.stage == 1:
        z12_gpu = trainable * c.grad_bytes_zero1 / bw
    offload_out = 0.0
    epilogue = 0.0
    if inputs.offload_optimizer != "none" and inputs.stage == 3:
        # each micro batch's fp32 gradients go to pinned host memory as the backward makes them
        offload_out = (trainable / ws) * 4.0 / speed.d2h_bytes_per_s.value
        hooks += grad_tensors * c.offload_hook * launch
    elif inputs.offload_optimizer != "none":
        # ZeRO-1/2: tensor by tensor, the host synchronised with the GPU (OFFLOAD_EPILOGUE_OPS)
        part_tensors = math.ceil(grad_tensors / ws)
        epilogue = (part_tensors * (OFFLOAD_EPILOGUE_OPS * launch + OFFLOAD_EPILOGUE_KERNELS * c.gpu_kernel_s)
                    + (trainable / ws) * (OFFLOAD_EPILOGUE_BYTES / bw + 4.0 / speed.d2h_bytes_per_s.value))

    gpu_f = mb.forward.gpu_s(c) + z3_gpu["forward"]
    gpu_b = mb.backward.gpu_s(c) + mb.recompute.gpu_s(c) + z3_gpu["backward"] + z12_gpu + offload_out
    host_f = mb.kernels["forward"] * c.host_forward * launch + z3_host["forward"]
    host_b = (mb.kernels["backward"] - mb.recompute.kernels) * c.host_backward * launch \
        + mb.recompute.kernels * c.host_forward * launch + z3_host["backward"] + hooks
    host_b_early = host_b - hooks + accumulate_hooks  # a micro batch before the boundary

    # parameter offload: every pass copies the 16-bit partition from pinned host memory; on one GPU the host waits
    # for each copy (DeepSpeed 0.19.8 partition_parameters.py: NoGatherHandle.wait synchronizes the stream the copy
    # ran on), so the copies add to the host's time as well as the GPU's
    if inputs.offload_param != "none":
        h2d = 2.0 * fetched / ws / speed.h2d_bytes_per_s.value
        gpu_f += h2d
        gpu_b += h2d * (passes - 1)
        if ws == 1:
            host_f += h2d
            host_b += h2d * (passes - 1)
            host_b_early += h2d * (passes - 1)
    fwd_s, bwd_s = max(gpu_f, host_f), max(gpu_b, host_b)
    # ZeRO-1's hooks reduce, and its offload epilogue runs, on the boundary micro batch only; ZeRO-2's on every one
    bwd_total = ((ga - 1) * max(gpu_b, host_b_early) + bwd_s + epilogue if once
                 else ga * (bwd_s + epilogue))
    bound_f = "the host" if host_f > gpu_f else "the GPU"
    bound_b = "the host" if host_b > gpu_b else "the GPU"
    pf, pb, pr = mb.forward, mb.backward, mb.recompute
    z3_words = (f", ZeRO-3: {fetched_n} parameters gathered and {modules} modules' hooks per pass"
                if inputs.stage == 3 else "")
    add("forward", ga * fwd_s, "forward",
        f"{ga} x max(GPU {gpu_f * 1e3:.1f} ms: products {pf.matmul_s * 1e3:.1f} ms ({pf.flops / 1e12:.2f} TFLOP), "
        f"attention {pf.attention_s * 1e3:.1f} ms, other kernels {pf.elementwise_s * 1e3:.1f} ms "
        f"({pf.bytes / 1e9:.2f} GB at {bw / 1e12:.2f} TB/s), {pf.kernels} kernels"
        + (f", ZeRO-3 copies {z3_gpu['forward'] * 1e3:.1f} ms" if inputs.stage == 3 else "")
        + f"; host {host_f * 1e3:.1f} ms: {mb.kernels['forward']} launches{z3_words}): bound by {bound_f}")
    add("backward", bwd_total, "backward",
        (f"{ga - 1} x max(GPU {gpu_b * 1e3:.1f} ms, host {host_b_early * 1e3:.1f} ms: ZeRO-1's hooks only accumulate "
         "before the boundary) + " if once and ga > 1 else "")
        + (f"the offload epilogue {epilogue * 1e3:.1f} ms per {'step' if once else 'micro batch'} (per tensor "
           f"{OFFLOAD_EPILOGUE_OPS} ops and a host synchronisation; norm, overflow check and cast "
           f"{OFFLOAD_EPILOGUE_BYTES:.0f} B and 4 B to the host per element) + " if epilogue else "")
        + f"{1 if once else ga} x max(GPU {gpu_b * 1e3:.1f} ms: products {(pb.matmul_s + pr.matmul_s) * 1e3:.1f} ms "
        f"({(pb.flops + pr.flops) / 1e12:.2f} TFLOP"
        + (", recomputation included" if inputs.gradient_checkpointing else "")
        + f"), attention {(pb.attention_s + pr.attention_s) * 1e3:.1f} ms, other kernels "
        f"{(pb.elementwise_s + pr.elementwise_s) * 1e3:.1f} ms"
        + (f", ZeRO-{inputs.stage} gradient copies {z12_gpu * 1e3:.1f} ms" if z12_gpu else "")
        + (f", gradients to the host {offload_out * 1e3:.1f} ms" if offload_out else "")
        + f"; host {host_b * 1e3:.1f} ms: {mb.kernels['backward']} launches"
        + (f", DeepSpeed's hooks on {grad_tensors} gradient tensors" if hooks else "")
        + f"{z3_words}): bound by {bound_b}")

    # collectives (world size > 1), laid over the passes' compute
    collectives = _collectives(inputs, speed, ga, _compute(mb, c, gpu_f, gpu_b, host_f, host_b), terms, notes)
    # the optimizer step
    _optimizer(inputs, speed, c, trainable, grad_tensors, ga, terms)

    step_s = _ns(sum(t.seconds for t in terms))
    tokens = inputs.micro_batch * inputs.seq_len * ga
    model_flops = ga * (pf.flops + pb.flops)
    figures = tuple((name, f.value, f.source, f.measured) for name, f in speed.figures())
    return StepTime(step_s, tuple(terms), tokens, model_flops, speed.peak_flops_per_s.value, ws, speed.card,
                    tuple(speed.estimated()), tuple(speed.notes) + tuple(notes), figures, c.source, collectives)


@dataclass(frozen=True)
class Collectives:
    """The step's collectives at world size 2 or more, and where their figures came from.

    Attributes:
        ranks / nodes: the ring they run over.
        link: ``within the node`` or ``across N nodes``; None without a bus bandwidth (``reason`` says why).
        busbw: the ring's bus bandwidth, bytes per second, and ``busbw_source``, ``busbw_measured`` (measured by
            ``calibrate``; else estimated from the card table, or given or assumed across nodes: the source says).
        latency_s: NCCL's latency per collective (its tuning model: :data:`zeropilot.memory.links.NCCL_TUNING`).
        gathered_bytes / reduced_bytes: whole tensors all-gathered and reduce-scattered (or all-reduced) per step.
        link_s: seconds the link is busy per step.
        exposed_s: what they add to the step (the terms ``gathers``, ``collectives`` and ``step_collectives``).
        schedule: how the overlap was worked out.
        reason: why they are not counted, None when they are.
    """

    ranks: int
    nodes: int
    link: Optional[str] = None
    busbw: Optional[float] = None
    busbw_source: str = ""
    busbw_measured: bool = False
    latency_s: Optional[float] = None
    gathered_bytes: Optional[float] = None
    reduced_bytes: Optional[float] = None
    link_s: Optional[float] = None
    exposed_s: Optional[float] = None
    schedule: str = ""
    reason: Optional[str] = None


def _ns(seconds: float) -> float:
    """Seconds to the nanosecond: times that are equal but summed in another order tie exactly, so the search and
    ``--stage auto`` take their documented order between them, not a float's last bit."""
    return round(seconds, 9)


def _compute(mb: _MicroBatch, c: TimeConstants, gpu_f: float, gpu_b: float, host_f: float,
             host_b: float) -> schedule.Compute:
    """One micro batch's GPU seconds by part and host seconds by pass, for the schedule: the passes' kernels, with
    the passes' other GPU work (ZeRO's copies, offload's) spread over them in proportion."""
    f_all, rec = mb.forward.gpu_s(c), mb.recompute.gpu_s(c)
    b_all = mb.backward.gpu_s(c)
    hf, hb = mb.head_forward.gpu_s(c), mb.head_backward.gpu_s(c)
    sf = gpu_f / f_all if f_all else 1.0
    sb = gpu_b / (b_all + rec) if b_all + rec else 1.0
    return schedule.Compute(((f_all - hf) * sf, hf * sf, rec * sb, (b_all - hb) * sb, hb * sb), host_f, host_b)


def _collectives(inputs: PlanInputs, speed: Speed, ga: int, comp: schedule.Compute, terms: List[Term],
                 notes: List[str]) -> Optional[Collectives]:
    """ZeRO's collectives over the ring of the job's ranks (:func:`zeropilot.memory.links.ring`): those of the passes
    (ZeRO-3's gathers and every stage's reduce-scatters in the backward, ZeRO-1's only with ``overlap_comm``)
    simulated use by use against each micro batch's compute (:func:`zeropilot.memory.schedule.simulate`), what the
    compute does not hide counted; those at the optimizer step (ZeRO-1/2's all-gather of the updated weights,
    ZeRO-0/1's reduction without overlap) counted whole. Bytes: :func:`zeropilot.memory.comm.traffic`."""
    from zeropilot.memory.comm import traffic

    ws = inputs.world_size
    if ws < 2:
        return None
    nodes = inputs.hardware.nodes if inputs.hardware else 1
    ring = links.ring(speed, ws, nodes)
    if ring is None:
        why = ("no bus bandwidth across nodes: give --inter-node-gbps, or run `zeropilot calibrate` as the ranks of a "
               "launch across your nodes" if nodes > 1 else
               "no bus bandwidth for this world size (run `zeropilot calibrate --nproc N`)")
        notes.append(why + ": collectives are not counted")
        return Collectives(ws, nodes, reason=why)
    figure = f"{ring.busbw / 1e9:.1f} GB/s bus bandwidth {ring.link} ({ring.basis})"
    notes.append(f"collectives over {ws} ranks: {figure}: {ring.source}; {ring.latency_s * 1e6:.0f} us per "
                 f"collective ({links.NCCL_TUNING})")
    moved = traffic(inputs) if inputs.stage != 3 else {}
    plan = schedule.settings(inputs, reduce=inputs.stage >= 2 or (inputs.stage == 1 and inputs.overlap))
    at_step_bytes = [] if inputs.stage == 3 else [moved["all_gather"]] + (
        [moved["reduce_scatter"]] if inputs.stage == 0 or (inputs.stage == 1 and not plan.reduce) else [])
    stepwise = sum(at_step_bytes)
    at_step = sum(_ns(ring.seconds(b)) for b in at_step_bytes)
    sched, runs = None, 0
    if inputs.stage >= 2 or plan.reduce:
        sched = schedule.simulate(schedule.trace(inputs), comp, ring if inputs.stage == 3 else None, ring, plan)
        runs = ga if inputs.stage >= 2 else 1  # ZeRO-1 reduces in the last micro batch's backward only
    fwd = _ns(runs * sched.forward_exposed_s) if sched else 0.0
    exposed = _ns(runs * sched.exposed_s) if sched else 0.0
    how = (f"prefetch bucket {inputs.prefetch_bucket_size / 1e6:.0f} M, max live {inputs.max_live_parameters / 1e6:.0f}"
           f" M elements, " if inputs.stage == 3 else "") + f"reduce bucket {inputs.reduce_bucket_size / 1e6:.0f} M, " \
        f"overlap_comm {'on' if inputs.overlap else 'off'}"
    if sched is not None:
        per = (f"{sched.seconds * 1e3:.1f} ms per micro batch with them against {sched.without_s * 1e3:.1f} ms "
               f"without: " + (f"{sched.gathered * schedule.BYTES / 1e9:.2f} GB all-gathered in {sched.gathers} "
                               "calls, " if inputs.stage == 3 else "")
               + f"{sched.reduced * schedule.BYTES / 1e9:.2f} GB reduce-scattered in {sched.reduces}, the link busy "
               f"{sched.link_s * 1e3:.1f} ms; {how}; {figure} (simulated use by use: memory/schedule.py)")
        if inputs.stage == 3:
            terms.append(Term("gathers", fwd, "forward", f"{runs} x {fwd / runs * 1e3:.1f} ms the forward waited "
                                                         f"for ZeRO-3's all-gathers: " + per))
        terms.append(Term("collectives", _ns(exposed - fwd), "backward",
                          f"{runs} x {(exposed - fwd) / runs * 1e3:.1f} ms the backward waited for "
                          + ("ZeRO-3's all-gathers and " if inputs.stage == 3 else "")
                          + "the gradients' reduce-scatters" + (" (as above)" if inputs.stage == 3 else ": " + per)))
    if inputs.stage != 3:
        what = {2: "the updated 16-bit weights' all-gather", 1: "the updated 16-bit weights' all-gather"
                + ("" if plan.reduce else " and the gradients' reduce-scatter"), 0: "the gradients' all-reduce"}
        terms.append(Term("step_collectives", at_step, "step",
                          f"{what[inputs.stage]} at the optimizer step, nothing to hide it: "
                          f"{stepwise / 1e9:.2f} GB at {figure}"))
    gathered = ga * sched.gathered * schedule.BYTES if inputs.stage == 3 and sched else moved["all_gather"]
    reduced = runs * sched.reduced * schedule.BYTES if sched else moved["reduce_scatter"]
    busy = (runs * sched.link_s if sched else 0.0) + at_step
    return Collectives(ws, nodes, ring.link, ring.busbw, ring.source, ring.measured, ring.latency_s, gathered,
                       reduced, busy, exposed + at_step,
                       "simulated use by use against the compute (memory/schedule.py)" if sched else
                       "at the optimizer step, nothing to overlap")


def _optimizer(inputs: PlanInputs, speed: Speed, c: TimeConstants, trainable: int, tensors: int, ga: int,
               terms: List[Term]) -> None:
    """The optimizer step: DeepSpeed's bookkeeping per trainable tensor on the host, and the update: memory-bound on
    the GPU, or with optimizer offload CPU Adam on the host and the 16-bit weights copied back."""
    part = trainable / inputs.world_size if inputs.stage >= 1 else trainable
    bw = speed.mem_bytes_per_s.value
    host = tensors * c.step_tensor * speed.launch_s.value
    if inputs.offload_optimizer == "none":
        per = c.adam_bytes_torch if inputs.torch_adam else c.adam_bytes_fused
        what = "torch's AdamW (foreach)" if inputs.torch_adam else "a fused AdamW"
        extra = {3: c.step_bytes_zero3, 2: c.step_bytes_zero12, 1: c.step_bytes_zero12}.get(inputs.stage, 0.0)
        extra += c.clip_bytes if inputs.stage >= 1 else 0.0
        gpu = part * (per + extra) / bw
        if inputs.stage == 3:
            # stage3.py step: is_invalid_grad_norm(norm) reads the norm on the host (bool of a GPU tensor), so the
            # GPU's norm runs before the host goes on: the norm's float64 pass in series, the rest overlapped
            norm = part * 20.0 / bw
            seconds = norm + max(gpu - norm, host)
            how = f"the gradient norm {norm * 1e3:.1f} ms (read on the host), then max(GPU "
        else:
            seconds = max(gpu, host)
            how = "max(GPU "
        terms.append(Term("optimizer", seconds, "step",
                          f"{how}{gpu * 1e3:.1f} ms: {what} over {part / 1e6:.1f} M trainable elements of this "
                          f"GPU's partition, {per + extra:.0f} B each ({per:.0f} the update, {extra:.0f} DeepSpeed's "
                          f"float64 gradient norm, clipping, casts and 16-bit copy) at {bw / 1e12:.2f} TB/s; host "
                          f"{host * 1e3:.1f} ms: DeepSpeed's step over {tensors} trainable tensors)"))
        return
    # optimizer offload: (the gradients went to the host in the backward) the step on the CPU, the weights back
    h2d = speed.h2d_bytes_per_s.value
    accumulate = (ga - 1) * part * 8.0 / min(speed.d2h_bytes_per_s.value, h2d) if ga > 1 else 0.0
    rate = speed.torch_cpu_adamw_elems_per_s if inputs.torch_adam else speed.cpu_adam_elems_per_s
    cpu = part / rate.value
    # DeepSpeed casts the updated fp32 partition to a 16-bit host buffer before the copy (stage_1_and_2.py step):
    # 6 B per element through host memory, at the bandwidth CPUAdam's 28 B per element ran at
    cast = part * 6.0 / (28.0 * speed.cpu_adam_elems_per_s.value) if inputs.stage in (1, 2) else 0.0
    # and clips the fp32 gradient partition on the host (unscale_and_clip_grads: mul_), at the same bandwidth
    clip = part * c.clip_bytes / (28.0 * speed.cpu_adam_elems_per_s.value) if inputs.stage in (1, 2) else 0.0
    if inputs.stage in (1, 2):
        # the gradient norms were taken in the backward: the step reads each tensor's on the host
        # (complete_grad_norm_calculation_for_cpu_offload: .item() per tensor), not DeepSpeed's GPU step per tensor
        host = math.ceil(tensors / inputs.world_size) * speed.launch_s.value
    back = part * 2.0 / h2d + cast + clip
    terms.append(Term("offload_copies", accumulate + back, "step",
                      f"16-bit weights back to the GPU ({part / 1e6:.1f} M x 2 B at {h2d / 1e9:.1f} GB/s"
                      + (f", cast from fp32 on the host first: {cast * 1e3:.0f} ms" if cast else "")
                      + (f", the gradients clipped on the host {clip * 1e3:.0f} ms" if clip else "") + ")"
                      + (f", {ga - 1} accumulations of the host's gradients through the GPU" if ga > 1 else "")))
    what = "torch's AdamW on the CPU" if inputs.torch_adam else "DeepSpeed's CPUAdam"
    terms.append(Term("cpu_adam", cpu + host, "step",
                      f"{what}: {part / 1e6:.1f} M elements at {rate.value / 1e6:.0f} M/s, and DeepSpeed's step over "
                      f"{tensors} trainable tensors on the host ({host * 1e3:.1f} ms)"))


def run_time(step: StepTime, inputs: PlanInputs, gpu_hour_cost: Optional[float] = None) -> RunTime:
    """The whole run's optimizer steps and time: ``max_steps`` when the launch gives it, else its epochs over the
    samples the user gives (``inputs.samples``), counted as the HF Trainer counts them (each rank's share of the
    samples in micro batches, then optimizer steps of ``grad_accum`` micro batches, rounded up; epochs times that,
    rounded up). LLaMA-Factory's ``max_samples`` bounds the samples when they are not given."""
    steps: Optional[int] = None
    epochs, epochs_from = inputs.epochs, inputs.sources.get("epochs", "given")
    if epochs is None and inputs.flavour in ("hf", "llamafactory"):
        epochs, epochs_from = TRAINER_EPOCHS, "the Trainer's default num_train_epochs"
    if inputs.max_steps:
        steps, why = inputs.max_steps, f"max_steps {inputs.max_steps} ({inputs.sources.get('max_steps', 'given')})"
    elif epochs is not None and (inputs.samples or inputs.max_samples):
        samples = inputs.samples or inputs.max_samples
        assert samples is not None
        ws = inputs.world_size
        batches = math.ceil(math.ceil(samples / ws) / inputs.micro_batch)
        per_epoch = max(math.ceil(batches / inputs.grad_accum), 1)
        steps = math.ceil(epochs * per_epoch)
        given = (f"{samples} samples (--samples)" if inputs.samples else
                 f"at most {samples} samples (max_samples, {inputs.sources.get('max_samples', 'given')}: the dataset "
                 "may hold fewer; --samples N says how many)")
        why = (f"{epochs:g} epoch(s) ({epochs_from}) over {given}: {per_epoch} "
               f"optimizer steps per epoch of {inputs.micro_batch} x {inputs.grad_accum} x {ws} samples")
    elif epochs is not None:
        why = (f"the launch trains {epochs:g} epoch(s) ({epochs_from}) over a dataset "
               "whose size the plan does not know: pass --samples N (training samples) for the run's time")
    else:
        why = ("neither max_steps nor epochs given: pass --max-steps N, or --epochs E with --samples N (or plan a "
               "launch that says them)")
    if steps is None:
        return RunTime(None, None, None, None, why, gpu_hour_cost)
    seconds = steps * step.step_s
    hours = seconds * step.world_size / 3600.0
    cost = None if gpu_hour_cost is None else hours * gpu_hour_cost
    return RunTime(steps, seconds, hours, cost, why, gpu_hour_cost)


def to_dict(step: StepTime, run: Optional[RunTime]) -> Dict:
    """The step (and the run) as JSON-ready data: the plan's ``time`` object (docs/json-schema.md)."""
    return {
        "step_s": step.step_s, "tokens_per_s": step.tokens_per_s, "job_tokens_per_s": step.job_tokens_per_s,
        "tokens_per_step": step.tokens_per_step, "model_flops": step.model_flops, "mfu": step.mfu,
        "peak_flops_per_s": step.peak_flops_per_s, "card": step.card,
        "terms": [{"name": t.name, "seconds": t.seconds, "phase": t.phase, "reason": t.reason} for t in step.terms],
        "phases": step.phases(), "estimated": list(step.estimated), "notes": list(step.notes),
        "figures": {name: {"value": value, "source": source, "measured": measured}
                    for name, value, source, measured in step.figures},
        "constants": step.constants,
        "collectives": None if step.collectives is None else _collectives_dict(step.collectives),
        "run": None if run is None else {"steps": run.steps, "seconds": run.seconds, "gpu_hours": run.gpu_hours,
                                         "cost": run.cost, "gpu_hour_cost": run.gpu_hour_cost,
                                         "reason": run.reason},
    }


def _collectives_dict(c: Collectives) -> Dict:
    return {"ranks": c.ranks, "nodes": c.nodes, "link": c.link,
            "busbw": None if c.busbw is None else {"value": c.busbw, "source": c.busbw_source,
                                                   "measured": c.busbw_measured},
            "latency_s": c.latency_s, "latency_source": links.NCCL_TUNING if c.latency_s is not None else None,
            "gathered_bytes": c.gathered_bytes, "reduced_bytes": c.reduced_bytes, "link_s": c.link_s,
            "exposed_s": c.exposed_s, "schedule": c.schedule, "reason": c.reason}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


_UNITS = {"matmul_flops_per_s": ("matmul", 1e12, "TFLOP/s"), "attention_flops_per_s": ("attention", 1e12, "TFLOP/s"),
          "mem_bytes_per_s": ("memory", 1e12, "TB/s"), "h2d_bytes_per_s": ("host->device", 1e9, "GB/s"),
          "d2h_bytes_per_s": ("device->host", 1e9, "GB/s"), "cpu_adam_elems_per_s": ("CPUAdam", 1e9, "G/s"),
          "torch_cpu_adamw_elems_per_s": ("torch AdamW on the host", 1e9, "G/s"),
          "launch_s": ("launch", 1e-6, "us"), "intra_busbw_bytes_per_s": ("GPU-GPU bus", 1e9, "GB/s"),
          "inter_busbw_bytes_per_s": ("bus across nodes", 1e9, "GB/s"), "peak_flops_per_s": ("peak", 1e12, "TFLOP/s")}


def _figure(name: str, value: float) -> str:
    label, scale, unit = _UNITS.get(name, (name, 1.0, ""))
    return f"{label} {value / scale:.3g} {unit}"


def render_lines(step: StepTime, run: Optional[RunTime]) -> List[str]:
    """The plan's time section for people: each term with its reason, the step, tokens/s, MFU, the run."""
    out = [f"Time per optimizer step ({step.card or 'card unknown'}):"]
    out += [f"  {t.name:28s}{t.seconds:7.3f} s   {t.reason}" for t in step.terms]
    out.append(f"  {'step':28s}{step.step_s:7.3f} s   {step.tokens_per_step} tokens per GPU per step")
    out.append(f"  {'tokens/s':28s}{step.tokens_per_s:7.0f}     per GPU; {step.job_tokens_per_s:.0f} for the job "
               f"({step.world_size} GPUs); MFU {100 * step.mfu:.0f}% of {step.peak_flops_per_s / 1e12:.0f} "
               "TFLOP/s (the card's dense bf16 peak)")
    if run is not None and run.steps is not None and run.seconds is not None and run.gpu_hours is not None:
        money = "" if run.cost is None else f", {run.cost:,.2f} at {run.gpu_hour_cost:g} per GPU-hour"
        out.append(f"  {'run':28s}{_duration(run.seconds):>9s}   {run.steps} optimizer steps, "
                   f"{run.gpu_hours:,.1f} GPU-hours{money} (steps only: no start-up, evaluation or saves); "
                   f"{run.reason}")
    elif run is not None:
        out.append(f"  {'run':28s}{'unknown':>9s}   {run.reason}")
    est = [_figure(name, value) for name, value, _, m in step.figures if not m and name != "peak_flops_per_s"]
    got = [_figure(name, value) for name, value, _, m in step.figures if m]
    if est:
        out.append("  speed figures estimated (the card table; `--format json` gives each one's source): "
                   + ", ".join(est))
    if got:
        out.append("  speed figures measured on this card (zeropilot calibrate): " + ", ".join(got))
    out.append(f"  constants: {step.constants}")
    out += [f"  note: {n}" for n in step.notes]
    return out
