"""``--search``: the fastest configuration that fits with a safe margin, ranked, with the reason.

Candidates vary the ZeRO stage, the micro batch (gradient accumulation changes with it so the global
batch stays the same), gradient checkpointing, optimizer and parameter offload, and the bucket sizes.
A candidate fits when its predicted peak leaves :data:`~zeropilot.memory.plan.SAFE_MARGIN` of the GPU
free. Among those, speed decides, in this order (measured on an H200, ``step_s`` in ``bench/plan/data/rows.jsonl``):
no offload before optimizer offload before parameter offload (3B, ZeRO-2: 0.54 s per step without,
6.2 s with optimizer offload), ZeRO-2 before ZeRO-1 before ZeRO-3 (ZeRO-3 steps 4x slower than ZeRO-2
at world size 1, FACTS F; ZeRO-1 uses more memory for the same speed), no recomputation before
gradient checkpointing (a second forward pass, about a third more compute), then the largest micro batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

from zeropilot.memory.constants import DEFAULT, Constants
from zeropilot.memory.gpu import exceeds
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.plan import SAFE_MARGIN, Plan, make_plan

_STAGE_ORDER = {2: 0, 1: 1, 3: 2}
_OFFLOAD_ORDER = {("none", "none"): 0, ("cpu", "none"): 1, ("cpu", "cpu"): 2}


@dataclass(frozen=True)
class Candidate:
    """One configuration the search tried.

    Attributes:
        plan: its plan.
        fits: whether it leaves the safe margin free.
        rank_key: sort key (smaller is faster).
        reason: why it ranks where it does, in words.
    """

    plan: Plan
    fits: bool
    rank_key: Tuple
    reason: str


def _micro_batches(inputs: PlanInputs) -> List[int]:
    """Micro batches that divide the per-GPU batch of one optimizer step, largest first."""
    per_step = inputs.micro_batch * inputs.grad_accum
    return [m for m in range(per_step, 0, -1) if per_step % m == 0]


def _variants(inputs: PlanInputs) -> Iterator[PlanInputs]:
    per_step = inputs.micro_batch * inputs.grad_accum
    small_bucket = min(inputs.reduce_bucket_size, 50_000_000)
    for stage in (1, 2, 3):
        for off_opt, off_par in _OFFLOAD_ORDER:
            if off_par != "none" and stage != 3:
                continue
            for gc in (False, True):
                for mb in _micro_batches(inputs):
                    for rbs in sorted({inputs.reduce_bucket_size, small_bucket}, reverse=True):
                        yield inputs.with_(stage=stage, offload_optimizer=off_opt, offload_param=off_par,
                                           gradient_checkpointing=gc, micro_batch=mb, grad_accum=per_step // mb,
                                           reduce_bucket_size=rbs, prefetch_bucket_size=min(
                                               inputs.prefetch_bucket_size, rbs),
                                           overlap_comm=False if stage < 3 else inputs.overlap_comm)


def _rank(p: PlanInputs) -> Tuple:
    return (_OFFLOAD_ORDER[(p.offload_optimizer, p.offload_param)], _STAGE_ORDER[p.stage],
            int(p.gradient_checkpointing), -p.micro_batch, -p.reduce_bucket_size)


def _reason(p: PlanInputs, plan: Plan, gpu_bytes: int) -> str:
    parts = [f"ZeRO-{p.stage}"]
    if p.offload_optimizer != "none":
        parts.append(f"optimizer on {p.offload_optimizer.upper()}")
    if p.offload_param != "none":
        parts.append(f"parameters on {p.offload_param.upper()}")
    parts.append("gradient checkpointing" if p.gradient_checkpointing else "no recomputation")
    parts.append(f"micro batch {p.micro_batch} x accumulation {p.grad_accum}")
    free = 100 * (gpu_bytes - plan.gpu_peak_bytes) / gpu_bytes
    return ", ".join(parts) + f": peak {plan.gpu_peak_bytes / 2**30:.1f} GiB, {free:.0f}% free"


def search(inputs: PlanInputs, limit: int = 5, constants: Constants = DEFAULT
           ) -> Tuple[List[Candidate], Optional[Candidate]]:
    """Ranked configurations that fit (at most ``limit``), and the smallest-peak one if none fits.

    ``constants``: the estimator's constants (a hardware profile's, from ``zeropilot calibrate``).

    Raises:
        InputError: no hardware in ``inputs`` (nothing to fit against), or values out of range.
    """
    from zeropilot.errors import InputError

    inputs.validate()  # before any replay (make_plan validates too, but exceeds() runs first)
    if inputs.hardware is None:
        raise InputError("--search needs the GPUs: pass --gpus COUNTxMEM (e.g. 4x16GiB)")
    gpu_bytes = inputs.hardware.gpu_bytes
    variants: Dict[Tuple, PlanInputs] = {}
    for variant in _variants(inputs):
        variants.setdefault(_rank(variant), variant)
    # In rank order; each family (offload, stage, recomputation) is shown by its first fit, so the rest of it is not
    # planned unless nothing fits at all (then every candidate is, to find the smallest peak): fewer replays. A
    # candidate whose allocator replay passes the limit cannot fit; its replay stops there, and it is not planned.
    tried: Dict[Tuple, Candidate] = {}
    best: Dict[Tuple, Candidate] = {}
    most = gpu_bytes * (1 - SAFE_MARGIN)
    for key in sorted(variants):
        if key[:3] not in best and not exceeds(variants[key], most, constants):
            tried[key] = cand = _candidate(variants[key], key, gpu_bytes, constants)
            if cand.fits:
                best[key[:3]] = cand
    ranked = sorted(best.values(), key=lambda c: c.rank_key)
    if ranked:
        return ranked[:limit], None
    # nothing fits: the first candidate (in the order tried above) with the smallest peak. One whose replay passes the
    # smallest so far is not it; the last ones (parameter offload, the smallest micro batches) are the likeliest to be,
    # so they go first and the others' replays stop early.
    order = {key: i for i, key in enumerate(variants)}
    closest: Optional[Tuple[int, int, Candidate]] = None
    for key in reversed(order):
        if closest is None or not exceeds(variants[key], closest[0], constants):
            cand = tried.get(key) or _candidate(variants[key], key, gpu_bytes, constants)
            if closest is None or (cand.plan.gpu_peak_bytes, order[key]) < closest[:2]:
                closest = (cand.plan.gpu_peak_bytes, order[key], cand)
    return [], closest[2] if closest else None


def _candidate(variant: PlanInputs, key: Tuple, gpu_bytes: int, constants: Constants) -> Candidate:
    plan = make_plan(variant, constants)
    fits = plan.gpu_peak_bytes <= gpu_bytes * (1 - SAFE_MARGIN)  # as exceeds() is asked in search()
    return Candidate(plan, fits, key, _reason(variant, plan, gpu_bytes))


def deepspeed_config(p: PlanInputs) -> dict:
    """The ``zero_optimization`` and batch settings of a candidate, as a DeepSpeed JSON dict."""
    zero: dict = {"stage": p.stage, "overlap_comm": p.overlap, "contiguous_gradients": True,
                  "reduce_bucket_size": p.reduce_bucket_size}
    if p.stage == 3:
        zero.update({"stage3_prefetch_bucket_size": p.prefetch_bucket_size,
                     "stage3_param_persistence_threshold": p.param_persistence_threshold,
                     "stage3_max_live_parameters": p.max_live_parameters,
                     "stage3_gather_16bit_weights_on_model_save": p.gather_16bit_on_save})
    if p.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": p.offload_optimizer, "pin_memory": True}
    if p.offload_param != "none":
        zero["offload_param"] = {"device": p.offload_param, "pin_memory": True}
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": zero}


def training_changes(before: PlanInputs, after: PlanInputs) -> Dict[str, object]:
    """Training-argument values that differ between the launch and a candidate."""
    out: Dict[str, object] = {}
    if after.micro_batch != before.micro_batch:
        out["per_device_train_batch_size"] = after.micro_batch
    if after.grad_accum != before.grad_accum:
        out["gradient_accumulation_steps"] = after.grad_accum
    if after.gradient_checkpointing != before.gradient_checkpointing:
        if before.flavour == "llamafactory":  # LLaMA-Factory checkpoints unless told not to
            out["disable_gradient_checkpointing"] = not after.gradient_checkpointing
        else:
            out["gradient_checkpointing"] = after.gradient_checkpointing
    return out
