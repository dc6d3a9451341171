"""``--search``: the configurations that fit with a safe margin, fastest first by the time model, with the reason.

Candidates vary every lever that keeps the training the same: the ZeRO stage, the micro batch (gradient accumulation
changes with it so the global batch stays the same), gradient checkpointing, optimizer and parameter offload, the
reduce bucket, ``overlap_comm`` (ZeRO-1/2 across GPUs), ZeRO-3's ``stage3_max_live_parameters`` and prefetch bucket,
and a fused loss where the launch's framework offers one and it is available (``fused_losses``: Liger). A candidate
fits when its predicted peak leaves :data:`~zeropilot.memory.plan.SAFE_MARGIN` of the GPU free.

With the card's speed figures (:class:`~zeropilot.memory.speed.Speed`) the fitting candidates are ranked by their
predicted step time (the global batch is the same, so step time is time per sample), one per family (stage, offload,
recomputation, fused loss): the fastest of its micro batches and bucket settings that fits (a change from the launch
must be predicted faster by :data:`PER_CHANGE` per changed setting to rank above it). Candidates are tried in
the order of their predicted time and each family stops at its first fit, so the allocator replays run only on
candidates that could be shown. Without speed figures the search says so and ranks by the fixed order of
:data:`FIXED_ORDER` (no offload, ZeRO-2, no recomputation, the largest micro batch first), which nothing measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from zeropilot.memory.constants import DEFAULT, Constants
from zeropilot.memory.gpu import exceeds
from zeropilot.memory.inputs import PlanInputs
from zeropilot.memory.plan import SAFE_MARGIN, Plan, make_plan
from zeropilot.memory.steptime import TIME_DEFAULT, TimeConstants, estimate_time

_STAGE_ORDER = {2: 0, 1: 1, 3: 2}
_OFFLOAD_ORDER = {("none", "none"): 0, ("cpu", "none"): 1, ("cpu", "cpu"): 2}
FIXED_ORDER = "no offload, then optimizer offload, then parameter offload; ZeRO-2, ZeRO-1, ZeRO-3; no recomputation " \
              "first; the largest micro batch first"
#: ZeRO-3's ``stage3_max_live_parameters`` and prefetch bucket a candidate may lower them to (elements): fewer
#: gathered parameters alive at once, less prefetched ahead
#: a change from the launch must be predicted faster by this much per changed setting to rank above it: within
#: the model's error, the launch's own settings win (ZeRO-1 and ZeRO-2 on one GPU, optimizer offload with LoRA)
PER_CHANGE = 0.01
LOW_LIVE = 100_000_000
LOW_PREFETCH = 10_000_000
SMALL_BUCKET = 50_000_000


@dataclass(frozen=True)
class Candidate:
    """One configuration the search tried.

    Attributes:
        plan: its plan (with its time when the card's speed is known).
        fits: whether it leaves the safe margin free.
        rank_key: sort key (smaller is better): the predicted step time, or the fixed order without speed figures.
        reason: what it is and why it ranks where it does, in words.
        ratio: its predicted step time over the first candidate's (1.0 for the first; None without speed figures).
    """

    plan: Plan
    fits: bool
    rank_key: Tuple
    reason: str
    ratio: Optional[float] = None

    @property
    def step_s(self) -> Optional[float]:
        return self.plan.time.step_s if self.plan.time is not None else None


def _micro_batches(inputs: PlanInputs) -> List[int]:
    """Micro batches that divide the per-GPU batch of one optimizer step, largest first."""
    per_step = inputs.micro_batch * inputs.grad_accum
    return [m for m in range(per_step, 0, -1) if per_step % m == 0]


def _family(p: PlanInputs) -> Tuple:
    """What a family of candidates shares: everything but the micro batch and the bucket settings."""
    return (p.stage, p.offload_optimizer, p.offload_param, p.gradient_checkpointing, p.fused_loss or "")


def _variants(inputs: PlanInputs, fused_losses: Sequence[str] = ()) -> Iterator[PlanInputs]:
    per_step = inputs.micro_batch * inputs.grad_accum
    losses = list(dict.fromkeys([inputs.fused_loss] + list(fused_losses)))
    multi = inputs.world_size > 1
    for stage in (1, 2, 3):
        for off_opt, off_par in _OFFLOAD_ORDER:
            if off_par != "none" and stage != 3:
                continue
            for gc in (False, True):
                for loss in losses:
                    for mb in _micro_batches(inputs):
                        for rbs in sorted({inputs.reduce_bucket_size, min(inputs.reduce_bucket_size, SMALL_BUCKET)},
                                          reverse=True):
                            base = dict(stage=stage, offload_optimizer=off_opt, offload_param=off_par,
                                        gradient_checkpointing=gc, fused_loss=loss, micro_batch=mb,
                                        grad_accum=per_step // mb, reduce_bucket_size=rbs)
                            if stage == 3:
                                for live in sorted({inputs.max_live_parameters,
                                                    min(inputs.max_live_parameters, LOW_LIVE)}, reverse=True):
                                    for pf in sorted({inputs.prefetch_bucket_size,
                                                      min(inputs.prefetch_bucket_size, LOW_PREFETCH, rbs)},
                                                     reverse=True):
                                        yield inputs.with_(**base, max_live_parameters=live, prefetch_bucket_size=pf,
                                                           overlap_comm=inputs.overlap_comm)
                            else:
                                for overlap in ((False, True) if multi else (False,)):
                                    yield inputs.with_(**base, overlap_comm=overlap,
                                                       prefetch_bucket_size=min(inputs.prefetch_bucket_size, rbs))


_LEVERS = ("stage", "offload_optimizer", "offload_param", "gradient_checkpointing", "fused_loss", "micro_batch",
           "reduce_bucket_size", "max_live_parameters", "prefetch_bucket_size", "overlap_comm")


def changes(p: PlanInputs, launch: PlanInputs) -> int:
    """How many of the search's levers a candidate sets otherwise than the launch."""
    return sum(getattr(p, name) != getattr(launch, name) for name in _LEVERS)


def _fixed_rank(p: PlanInputs) -> Tuple:
    return (_OFFLOAD_ORDER[(p.offload_optimizer, p.offload_param)], _STAGE_ORDER[p.stage],
            int(p.gradient_checkpointing), -p.micro_batch, -p.reduce_bucket_size)


def _words(p: PlanInputs, launch: PlanInputs) -> str:
    parts = [f"ZeRO-{p.stage}"]
    if p.offload_optimizer != "none":
        parts.append(f"optimizer on {p.offload_optimizer.upper()}")
    if p.offload_param != "none":
        parts.append(f"parameters on {p.offload_param.upper()}")
    parts.append("gradient checkpointing" if p.gradient_checkpointing else "no recomputation")
    if p.fused_loss:
        parts.append({"liger": "Liger kernels and fused loss", "cce": "cut cross-entropy"}[p.fused_loss])
    parts.append(f"micro batch {p.micro_batch} x accumulation {p.grad_accum}")
    if p.reduce_bucket_size != launch.reduce_bucket_size:
        parts.append(f"reduce bucket {p.reduce_bucket_size / 1e6:.0f} M")
    if p.stage == 3 and p.max_live_parameters != launch.max_live_parameters:
        parts.append(f"max live parameters {p.max_live_parameters / 1e6:.0f} M")
    if p.stage == 3 and p.prefetch_bucket_size != launch.prefetch_bucket_size:
        parts.append(f"prefetch bucket {p.prefetch_bucket_size / 1e6:.0f} M")
    if p.stage in (1, 2) and p.overlap_comm:
        parts.append("overlap_comm")
    return ", ".join(parts)


def _reason(p: PlanInputs, launch: PlanInputs, plan: Plan, gpu_bytes: int) -> str:
    free = 100 * (gpu_bytes - plan.gpu_peak_bytes) / gpu_bytes
    step = f"{plan.time.step_s:.3f} s per step, " if plan.time is not None else ""
    return _words(p, launch) + f": {step}peak {plan.gpu_peak_bytes / 2**30:.1f} GiB, {free:.0f}% free"


def search(inputs: PlanInputs, limit: int = 5, constants: Constants = DEFAULT, speed=None,
           tc: TimeConstants = TIME_DEFAULT, fused_losses: Sequence[str] = ()
           ) -> Tuple[List[Candidate], Optional[Candidate]]:
    """Ranked configurations that fit (at most ``limit``, one per family), and the smallest-peak one if none fits.

    ``constants``: the memory model's (a hardware profile's, from ``zeropilot calibrate``); ``speed``: the card's
    speed figures, which rank by predicted time (None: the fixed order); ``fused_losses``: fused losses the search
    may propose (``("liger",)`` where the launch's framework offers it and it is installed or will be).

    Raises:
        InputError: no hardware in ``inputs`` (nothing to fit against), or values out of range.
    """
    from zeropilot.errors import InputError

    inputs.validate()  # before any replay (make_plan validates too, but exceeds() runs first)
    if inputs.hardware is None:
        raise InputError("--search needs the GPUs: pass --gpus COUNTxMEM or COUNTxCARD (e.g. 4x16GiB, 4xH100)")
    gpu_bytes = inputs.hardware.gpu_bytes
    most = gpu_bytes * (1 - SAFE_MARGIN)
    variants: Dict[Tuple, PlanInputs] = {}
    for v in _variants(inputs, fused_losses):
        key = (_family(v), v.micro_batch, v.reduce_bucket_size, v.max_live_parameters, v.prefetch_bucket_size,
               bool(v.overlap_comm))
        variants.setdefault(key, v)
    if speed is not None:
        order = sorted(variants, key=lambda k: (estimate_time(variants[k], speed, tc).step_s
                                                * (1 + PER_CHANGE * changes(variants[k], inputs)),
                                                _fixed_rank(variants[k])))
    else:
        order = sorted(variants, key=lambda k: _fixed_rank(variants[k]))
    best: Dict[Tuple, Candidate] = {}
    tried: Dict[Tuple, Candidate] = {}
    for key in order:
        family = key[0]
        if family in best:
            continue
        if len(best) >= limit:
            break
        if not exceeds(variants[key], most, constants):
            tried[key] = cand = _candidate(variants[key], inputs, gpu_bytes, constants, speed, tc)
            if cand.fits:
                best[family] = cand
    ranked = list(best.values())
    if ranked:
        first = ranked[0].step_s
        return [Candidate(c.plan, c.fits, c.rank_key, c.reason,
                          None if first is None or c.step_s is None else c.step_s / first) for c in ranked], None
    # nothing fits: the candidate with the smallest peak (ties: the first in the fixed order). One whose replay passes
    # the smallest so far is not it; parameter offload and the smallest micro batches are the likeliest, so they go
    # first and the others' replays stop early.
    fixed = sorted(variants, key=lambda k: _fixed_rank(variants[k]))
    position = {key: i for i, key in enumerate(fixed)}
    closest: Optional[Tuple[int, int, Candidate]] = None
    for key in reversed(fixed):
        if closest is None or not exceeds(variants[key], closest[0], constants):
            cand = tried.get(key) or _candidate(variants[key], inputs, gpu_bytes, constants, speed, tc)
            if closest is None or (cand.plan.gpu_peak_bytes, position[key]) < closest[:2]:
                closest = (cand.plan.gpu_peak_bytes, position[key], cand)
    return [], closest[2] if closest else None


def _candidate(variant: PlanInputs, launch: PlanInputs, gpu_bytes: int, constants: Constants, speed,
               tc: TimeConstants) -> Candidate:
    plan = make_plan(variant, constants, speed, tc)
    fits = plan.gpu_peak_bytes <= gpu_bytes * (1 - SAFE_MARGIN)  # as exceeds() is asked in search()
    key = (plan.time.step_s,) if plan.time is not None else _fixed_rank(variant)
    return Candidate(plan, fits, key, _reason(variant, launch, plan, gpu_bytes))


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
    if after.fused_loss == "liger" and before.fused_loss != "liger":
        out["enable_liger_kernel" if before.flavour == "llamafactory" else "use_liger_kernel"] = True
    return out
