"""A whole plan: per-GPU memory, host memory, checkpoint size and save time, and the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.disk import Checkpoint, estimate_checkpoint
from zeropilot.memory.gpu import GpuMemory, estimate_gpu
from zeropilot.memory.host import HostMemory, estimate_host
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.steptime import TIME_DEFAULT, RunTime, StepTime, TimeConstants, estimate_time, run_time

SAFE_MARGIN = 0.10  # headroom --search keeps: above the median hold-out error (4%), under the largest (17%)


@dataclass(frozen=True)
class Verdict:
    """Whether the peak fits one GPU.

    Attributes:
        kind: ``fits`` (reserved peak fits), ``tight`` (only the allocated peak fits: the run depends on
            the caching allocator flushing its cache, and fragmentation can still end it), ``oom``
            (the allocated peak alone is larger than the GPU), or ``unknown`` (no hardware given).
        headroom_bytes: GPU memory minus the predicted peak (negative: short by that much).
        message: one line for people.
        approximate: the launch gives settings the plan does not model (``PlanInputs.not_modelled``).
    """

    kind: str
    headroom_bytes: Optional[int]
    message: str
    approximate: bool = False


def verdict_of(gpu: GpuMemory, gpu_bytes: Optional[int], nodes: int = 1, outside_nodes: int = 1) -> Verdict:
    """Compare the predicted peak with one GPU's memory.

    Across nodes NCCL adds its network transport (per-peer buffers and proxy state for IB/RoCE), which no
    run here measured and the plan does not model: a plan for more nodes than its outside-PyTorch figure
    was measured across is refused a verdict (``unknown``), with the single-node figures and how to measure.
    """
    if gpu_bytes is None:
        return Verdict("unknown", None, "no --gpus given: no verdict")
    non_torch = gpu.peak_bytes - gpu.reserved_peak_bytes
    head = gpu_bytes - gpu.peak_bytes
    if nodes > outside_nodes:
        return Verdict("unknown", head, f"not judged: {nodes} nodes, and NCCL's inter-node buffers (network "
                                        "transport) are neither modelled nor measured here; without them the "
                                        f"peak is {gpu.peak_bytes / GIB:.1f} GiB of {gpu_bytes / GIB:.1f} GiB "
                                        f"({head / GIB:+.1f} GiB). Measure memory outside PyTorch per rank on "
                                        "your nodes (`zeropilot run` records it: `zeropilot report DIR`, column "
                                        "'outside torch') and plan with --outside-torch GiB, or run `zeropilot "
                                        "calibrate` as the ranks of a launch across your nodes and plan with "
                                        "--hardware PROFILE")
    if head >= 0:
        return Verdict("fits", head, f"fits: {head / GIB:.1f} GiB headroom of {gpu_bytes / GIB:.1f} GiB "
                                     f"({100 * head / gpu_bytes:.0f}%)")
    if gpu.allocated_peak_bytes + non_torch <= gpu_bytes:
        return Verdict("tight", head, f"tight: the peak with allocator overhead is {-head / GIB:.1f} GiB over "
                                      f"{gpu_bytes / GIB:.1f} GiB; it runs only if PyTorch's allocator flushes its "
                                      "cache (slower), and fragmentation may still end it with an OOM")
    return Verdict("oom", head, f"does not fit: {-head / GIB:.1f} GiB over {gpu_bytes / GIB:.1f} GiB per GPU "
                                f"(allocated peak alone {(gpu.allocated_peak_bytes + non_torch) / GIB:.1f} GiB)")


def host_verdict_of(host: HostMemory, host_mem_bytes: Optional[int]) -> Verdict:
    """Compare what every process of a node holds (steady, and while loading the weights) with its RAM."""
    if host_mem_bytes is None:
        return Verdict("unknown", None, "host RAM unknown (--host-mem GiB, or plan on the machine itself)")
    need = max(host.per_node_bytes, host.load_peak_per_node_bytes + host.per_node_bytes // 2)
    head = host_mem_bytes - need
    if head >= 0:
        return Verdict("fits", head, f"host fits: {need / GIB:.0f} of {host_mem_bytes / GIB:.0f} GiB RAM per node")
    return Verdict("oom", head, f"host does NOT fit: every process of the node together holds ~{need / GIB:.0f} GiB, "
                                f"the node has {host_mem_bytes / GIB:.0f} GiB: the kernel's OOM killer ends the run "
                                "(fewer ranks per node, parameter offload off, or NVMe offload)")


@dataclass(frozen=True)
class Plan:
    """Everything ``zeropilot plan`` reports for one configuration."""

    inputs: PlanInputs
    gpu: GpuMemory
    host: HostMemory
    checkpoint: Checkpoint
    verdict: Verdict
    after_save_extra_bytes: int
    notes: Tuple[str, ...]
    host_verdict: Verdict = Verdict("unknown", None, "host RAM unknown")
    not_modelled: Tuple[Tuple[str, str], ...] = ()
    time: Optional[StepTime] = None
    time_reason: str = "no speed figures: give the card (--gpus 4xH100) or a hardware profile (--hardware)"
    run: Optional[RunTime] = None

    @property
    def gpu_peak_bytes(self) -> int:
        return self.gpu.peak_bytes


def _after_save(inputs: PlanInputs, gpu: GpuMemory) -> Tuple[int, str]:
    """Extra GPU memory at the first step after a save."""
    if inputs.stage == 3 and inputs.gather_16bit_on_save:
        largest = max(c.bytes for c in gpu.components if c.name == "zero_buffers")
        return largest, "save_16bit_model gathers layer by layer on the GPU (gather_16bit_weights_on_model_save)"
    return 0, "engine.save_checkpoint copies tensors to the CPU as it writes; peaks unchanged after a save (H200)"


#: Where the plan is known to under-predict: the worst error on H200 runs never used for fitting, per kind of
#: run (``bench/plan/results/accuracy.json``; ``tests/memory/test_accuracy_bench.py`` recomputes these figures).
KNOWN_UNDER = {
    "zero12_large_logits": (-13.0, "ZeRO-1/2 where one fp32 copy of the logits is a tenth of the peak or more",
                            "Qwen2.5-0.5B LoRA r8 at world size 2, 4096 tokens, no checkpointing: whether the next "
                            "step's logits need one more such block depends on where a 32 MiB cuBLAS workspace "
                            "settles (call 22's allocator trace)"),
    "zero3_lora_offload_param_zero_init": (-9.1, "ZeRO-3 LoRA with parameter offload built in zero.Init",
                                           "Mistral-7B with both offloads, checkpointed, 2048 tokens: 0.57 GiB, within "
                                           "the 1.16 GiB by which repeated runs of this kind differed"),
}


def known_under(inputs: PlanInputs, peak: Optional[int] = None) -> Optional[str]:
    """The :data:`KNOWN_UNDER` kind this launch belongs to, if any (``peak``: the plan's GPU peak, if known)."""
    if inputs.stage in (1, 2) and not inputs.expandable_segments and inputs.fused_loss is None:
        logits = 4 * inputs.micro_batch * inputs.seq_len * inputs.arch.vocab
        if logits >= 0.1 * (peak if peak is not None else estimate_gpu(inputs).peak_bytes):
            return "zero12_large_logits"
    return known_spread(inputs)


#: Where one configuration's measured peak differed between runs (GiB): the largest spread among H200 runs of that
#: kind measured more than once (``tests/memory/test_accuracy_bench.py`` recomputes it from the committed rows).
KNOWN_SPREAD = {
    "zero3_lora_offload_param_zero_init": (1.16, "ZeRO-3 LoRA with parameter offload built in zero.Init",
                                           "likely because parameters are copied on side streams, whose freed blocks "
                                           "are reused only once those copies are done; docs/plan.md, Repeatability"),
}


def known_spread(inputs: PlanInputs) -> Optional[str]:
    """The :data:`KNOWN_SPREAD` kind this launch belongs to, if any."""
    if inputs.stage == 3 and inputs.lora_rank and inputs.offload_param != "none" and inputs.zero_init:
        return "zero3_lora_offload_param_zero_init"
    return None


def _notes(inputs: PlanInputs, ckpt: Checkpoint, c: Constants, peak: int) -> List[str]:
    notes = []
    kind, spread = known_under(inputs, peak), known_spread(inputs)
    if spread is not None:
        gib, _, why = KNOWN_SPREAD[spread]
        spread_note = (f"the same configuration reserved up to {gib:.1f} GiB more in one run than in another on H200s "
                       f"({why}); the plan may be that far off either way")
    if kind is not None:
        pct, what, where = KNOWN_UNDER[kind]
        notes.append(f"{what}: measured peaks ran up to {-pct:.0f}% above the plan on H200 runs not used for "
                     f"fitting ({where}; bench/plan/results/accuracy.md): keep at least that much headroom"
                     + (f"; {spread_note}" if spread == kind else ""))
    if spread is not None and spread != kind:
        notes.append(f"{KNOWN_SPREAD[spread][1]}: {spread_note}")
    if inputs.world_size > 2 and c.nccl_multi_gpu:  # H200 figures; a profile or the flag is the user's own
        notes.append(f"memory outside PyTorch was measured at world sizes 1 and 2; at world size "
                     f"{inputs.world_size} the world-size-2 figure is used (NCCL rings grow little with ranks)")
    if inputs.hardware is not None and inputs.hardware.nodes > 1:
        notes.append(f"{inputs.hardware.nodes} nodes: parameters, gradients and optimizer state are partitioned "
                     f"over all {inputs.world_size} ranks"
                     + (f"; ZeRO++ hpZ keeps a secondary 16-bit partition over {inputs.hpz_partition_size} GPUs "
                        "(counted in ZeRO buffers)" if inputs.hpz_partition_size > 1 and inputs.stage == 3 else "")
                     + "; NCCL's inter-node (IB/RoCE) buffers are not modelled: neither the H200 runs nor "
                     "`zeropilot calibrate` (one node) measure them")
    if inputs.attn == "flash":
        notes.append("flash attention sized like sdpa (both keep O(seq) per head); not measured separately")
    if inputs.offload_optimizer == "nvme" or inputs.offload_param == "nvme":
        notes.append("NVMe offload sized like CPU offload on the GPU side; host buffers not modelled")
    if inputs.arch.moe is not None:
        notes.append("mixture-of-experts activations sized by the active experts; not measured")
    if inputs.disk_free_bytes is not None:
        need = ckpt.disk_peak_bytes if ckpt.disk_peak_bytes is not None else ckpt.total_bytes
        what = ("checkpoints kept + the one being written" if ckpt.disk_peak_bytes is not None
                else "one save (no save_total_limit: every further save adds as much)")
        fits = "fits" if need <= inputs.disk_free_bytes else "does NOT fit"
        notes.append(f"disk: {what} need {need / 1e9:.1f} GB; {inputs.disk_free_bytes / 1e9:.1f} GB free: {fits}")
    if ckpt.save_seconds > inputs.collective_timeout_s:
        notes.append(f"a save takes ~{ckpt.save_seconds:.0f} s at {inputs.disk_write_bytes_per_s / 1e9:.2f} GB/s, "
                     f"longer than the {inputs.collective_timeout_s:.0f} s collective timeout")
    return notes


def unmodelled(inputs: PlanInputs) -> Tuple[Tuple[str, str], ...]:
    """What the plan does not model of ``inputs``, as (setting, what the figure assumes): the launch's settings it
    does not model (:attr:`PlanInputs.not_modelled`) and the combinations of modelled ones it does not."""
    out = list(inputs.not_modelled)
    src = inputs.sources
    if inputs.fused_loss == "liger" and not inputs.gradient_checkpointing:
        out.append((f"fused_loss: liger ({src.get('fused_loss', 'given')}) without gradient checkpointing",
                    "transformers' RMSNorm, SwiGLU and RoPE activations (Liger's kernels, which it patches in too, "
                    "save fewer: the figure is high by up to a few GiB without checkpointing)"))
    if inputs.arch.moe is not None and inputs.lora_targets not in (None, "all-linear"):
        out.append((f"lora_targets: {inputs.lora_targets} on a mixture-of-experts model",
                    "adapters on the named linear layers only (PEFT rewrites MLP names onto the fused expert tensors, "
                    "which are not counted)"))
    if inputs.arch.moe is not None and inputs.quant_bits:
        out.append(("quantization of a mixture-of-experts model", "16-bit expert tensors (only linear layers are "
                                                                  "sized as quantized)"))
    f = inputs.freeze
    if f is not None and not inputs.gradient_checkpointing and (f.layers < 0 or f.llama_pro or f.modules != ("all",)):
        out.append((f"freeze tuning ({src.get('freeze', 'given')}) with frozen modules after trainable ones, "
                    "without gradient checkpointing", "those frozen modules keep what trained ones keep (they keep "
                    "less: nothing only a weight's gradient needs; tests/memory/test_settings_witness.py)"))
    if inputs.quant_bits and inputs.offload_param != "none":
        out.append(("a quantized base with offload_param", "the packed weights offloaded like 16-bit ones"))
    return tuple(out)


def approximate(verdict: Verdict, inputs: PlanInputs) -> Verdict:
    """The verdict, saying it is approximate when the launch gives settings the plan does not model
    (:func:`unmodelled`, listed with the plan)."""
    missing = unmodelled(inputs)
    if not missing:
        return verdict
    keys = dict.fromkeys(setting.split(" (")[0] for setting, _ in missing)
    return Verdict(verdict.kind, verdict.headroom_bytes,
                   f"{verdict.message} — approximate: {', '.join(keys)} not modelled (see 'Not modelled')",
                   approximate=True)


def make_plan(inputs: PlanInputs, c: Constants = DEFAULT, speed=None, tc: TimeConstants = TIME_DEFAULT,
              gpu_hour_cost: Optional[float] = None) -> Plan:
    """The plan for ``inputs``; with ``speed`` (:class:`~zeropilot.memory.speed.Speed`) also its step time
    and, where the launch says how long it is, the run's.

    Raises:
        InputError: values out of range (:meth:`PlanInputs.validate`).
    """
    inputs.validate()
    gpu = estimate_gpu(inputs, c)
    host = estimate_host(inputs, gpu.params, gpu.trainable, c)
    ckpt = estimate_checkpoint(inputs, gpu.params, gpu.trainable)
    hw = inputs.hardware
    verdict = verdict_of(gpu, hw.gpu_bytes if hw else None, hw.nodes if hw else 1, c.outside_nodes)
    extra, _ = _after_save(inputs, gpu)
    notes = _notes(inputs, ckpt, c, gpu.peak_bytes)
    verdict = approximate(verdict, inputs)
    if gpu.peak_phase == "init":
        notes.insert(0, f"the init phase sets the peak ({gpu.init_peak_bytes / GIB:.1f} GiB against training's "
                        f"{gpu.train_peak_bytes / GIB:.1f} GiB): the model is built whole on every GPU before "
                        "deepspeed.initialize partitions it — build it inside deepspeed.zero.Init")
    step = estimate_time(inputs, speed, tc) if speed is not None else None
    return Plan(inputs, gpu, host, ckpt, verdict, extra, tuple(notes),
                host_verdict_of(host, inputs.host_mem_bytes), unmodelled(inputs), step,
                run=run_time(step, inputs, gpu_hour_cost) if step is not None else None)
