"""OOM fixes as what-ifs of the plan: this run's plan at the failing batch, and one plan per candidate change.

Pure (no torch, no I/O): an OOM record in, ranked fix records out. The record carries what the guard saw in the
rank (``setup``: the model's config sizes, LoRA, the ZeRO and batch settings in force; ``batch``: the failing micro
batch; ``batch_history``: the padded lengths of the steps before; ``mem``/``baseline``: the allocator's counters
and memory outside PyTorch; ``allocator_limit_bytes``). From it :func:`situation` builds the
:class:`~zeropilot.memory.PlanInputs` of *this* run (:func:`zeropilot.memory.from_run.plan_inputs`; memory outside
PyTorch as measured on this rank, not the H200 figure), and :func:`what_ifs` plans each change the launch does not already have:

- a shorter maximum length (``cutoff_len`` / ``max_length``): the longest that fits, and whether the failing batch
  is an outlier against the run's median length;
- packing (when the batch's padding is known and large), a smaller micro batch (accumulation raised so the global
  batch stays), gradient checkpointing, ``expandable_segments`` (where the build honours it), a higher ZeRO stage,
  optimizer offload, parameter offload, twice the GPUs; and a combination when no single change fits;
- per class: ``stage3_gather_16bit_weights_on_model_save: false`` (a save spike), freeing the GPU of what grew
  outside PyTorch (outside_torch).

Each fix is a record: the change (plan-input names), where it applies, the predicted peak against the budget
and whether it fits, the evidence. Ranking: changes that fit first, cheapest first (:data:`TIERS`: the cost order
``plan --search`` uses, measured on an H200), then by predicted peak; then those that do not fit, closest first.
Where the plan cannot size the model the caller falls back to the record's own evidence, marked unranked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.memory.constants import DEFAULT, GIB, Constants
from zeropilot.memory.from_run import budget as budget_of, expandable_in, num as _num, plan_inputs
from zeropilot.memory.inputs import Hardware, PlanInputs
from zeropilot.memory.plan import SAFE_MARGIN, make_plan
from zeropilot.memory.profile import with_outside_torch

#: a batch this many times longer than the run's median length is an outlier
OUTLIER_RATIO = 4.0
#: how a change costs, cheapest first: no speed cost (allocator settings, a cap that only touches outlier batches,
#: packing, the class's own cause), the same global batch in more micro steps, recomputation or a ZeRO stage with
#: more communication, optimizer offload, parameter offload or more hardware (plan --search's order, docs/plan.md)
TIERS = {"expandable_segments": 0, "gather_16bit_on_save": 0, "outside_torch": 0, "packing": 0,
         "seq_len_outlier": 0, "micro_batch": 1, "gradient_checkpointing": 2, "stage": 2, "seq_len": 3,
         "offload_optimizer": 3, "offload_param": 4, "world_size": 4}
SEQ_STEP = 128


def _g(n: Optional[float]) -> str:
    return "?" if n is None else f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Situation:
    """This run as the plan sees it at the failure.

    Attributes:
        inputs: the plan's inputs for this run at the failing batch (None: it cannot be sized; ``reason`` says why).
        constants: the model's constants with memory outside PyTorch as measured on this rank.
        budget: what the plan's peak (reserved + outside PyTorch) must stay under: the allocator limit plus memory
            outside PyTorch, or the device's total, whichever is smaller.
        need: allocated + request at the failure (what this point of the step needed at least).
        unmodelled: bytes the plan does not see (``need`` above its allocated peak), added to every what-if.
        outside / outside_base: memory outside PyTorch at the failure and at the rank's first reading.
        expandable: expandable segments in force; expandable_ok: whether the build honours them (None: unknown).
        flavour: whose keys to name (``llamafactory``, ``hf``, ``deepspeed``).
        notes: assumptions the plan of this run made.
        injected_tokens: an OOM injected for a test (``ZEROPILOT_INJECT_OOM``, :mod:`zeropilot.guard.inject`)
            emulates a device on which a micro batch of fewer padded tokens than this fits: a change fits when it
            brings micro batch x length under it, whatever the plan's bytes say (a CPU run has no device budget).
    """

    inputs: Optional[PlanInputs]
    reason: Optional[str]
    constants: Constants
    budget: Optional[int]
    limit: Optional[int]
    total: Optional[int]
    need: Optional[int]
    outside: Optional[int]
    outside_base: Optional[int]
    expandable: bool
    expandable_ok: Optional[bool]
    flavour: str
    unmodelled: int = 0
    base_peak: Optional[int] = None
    base_allocated: Optional[int] = None
    notes: List[str] = field(default_factory=list)
    injected_tokens: Optional[int] = None  # an injected OOM's law (guard.inject): fits iff micro batch x length < this


def _flavour(record: Dict[str, Any], plan: Optional[Dict[str, Any]]) -> str:
    inputs = plan.get("inputs") if isinstance(plan, dict) and isinstance(plan.get("inputs"), dict) else {}
    if inputs.get("flavour") in ("llamafactory", "hf"):
        return str(inputs["flavour"])
    train = ((record.get("setup") or {}).get("train") or {})
    return "hf" if train.get("gradient_checkpointing_arg") is not None else "deepspeed"


def situation(record: Dict[str, Any], plan: Optional[Dict[str, Any]] = None,
              expandable_ok: Optional[bool] = None) -> Situation:
    """Everything the what-ifs need from an OOM record (``plan``: run.json's plan, for the training-argument names)."""
    mem = record.get("mem") if isinstance(record.get("mem"), dict) else {}
    base = record.get("baseline") if isinstance(record.get("baseline"), dict) else {}
    total, outside = _num(mem.get("device_total_bytes")), _num(mem.get("outside_torch_bytes"))
    limit = _num(record.get("allocator_limit_bytes"))
    budget = budget_of(total, limit, outside)
    allocated, request = _num(mem.get("allocated_bytes")), _num(record.get("request_bytes"))
    need = allocated + request if allocated is not None and request is not None else None
    constants = DEFAULT if outside is None else with_outside_torch(DEFAULT, outside, "measured on this rank at the OOM")
    inputs, reason, notes = plan_inputs(record, budget)
    injected = record.get("injected") if isinstance(record.get("injected"), dict) else {}
    common = dict(constants=constants, budget=budget, limit=limit, total=total, need=need, outside=outside,
                  injected_tokens=_num(injected.get("tokens_limit")),
                  outside_base=_num(base.get("outside_torch_bytes")), expandable=expandable_in(record),
                  expandable_ok=expandable_ok, flavour=_flavour(record, plan), notes=notes)
    if inputs is None:
        return Situation(None, reason, **common)
    try:
        p = make_plan(inputs, constants)
    except InputError as exc:
        return Situation(None, f"the plan cannot take this run's settings: {exc}", **common)
    unmodelled = max(0, need - p.gpu.allocated_peak_bytes) if need is not None else 0
    return Situation(inputs, None, unmodelled=unmodelled, base_peak=p.gpu_peak_bytes + unmodelled,
                     base_allocated=p.gpu.allocated_peak_bytes, **common)


# -- candidates --------------------------------------------------------------------------------------------------

@dataclass
class _Cand:
    key: str
    change: Dict[str, Any]
    fix: str
    applies_to: str
    why: str
    inputs: Optional[PlanInputs] = None
    constants: Optional[Constants] = None
    predicted: Optional[int] = None  # set directly when measured rather than planned
    measured: bool = False
    tier: float = 0.0


def _peak(s: Situation, inputs: PlanInputs, constants: Optional[Constants] = None) -> Optional[int]:
    try:
        return make_plan(inputs, constants or s.constants).gpu_peak_bytes + s.unmodelled
    except InputError:
        return None


def _fits(s: Situation, peak: Optional[int], measured: bool = False) -> Optional[bool]:
    if s.injected_tokens is not None:
        return None  # judged by the injected law on the inputs (_fits_inputs), never by bytes
    if peak is None or s.budget is None:
        return None
    return peak <= s.budget * (1.0 if measured else 1.0 - SAFE_MARGIN)


def _fits_inputs(s: Situation, inputs: Optional[PlanInputs], constants: Optional[Constants] = None
                 ) -> Optional[bool]:
    """Whether a plan's inputs fit: the injected law where one is in force, else the plan's peak against the budget."""
    if s.injected_tokens is not None:
        return None if inputs is None else inputs.micro_batch * inputs.seq_len < s.injected_tokens
    return None if inputs is None else _fits(s, _peak(s, inputs, constants))


def _keys(s: Situation) -> Dict[str, str]:
    """Where each change is made, in the words of this launch's framework."""
    if s.flavour == "llamafactory":
        return {"seq": "cutoff_len", "mb": "per_device_train_batch_size / gradient_accumulation_steps",
                "gc": "disable_gradient_checkpointing: false", "args": "the LLaMA-Factory YAML"}
    if s.flavour == "hf":
        return {"seq": "max_length (TRL's SFTConfig; max_seq_length before TRL 0.20) or your tokenizer's max_length",
                "mb": "per_device_train_batch_size / gradient_accumulation_steps",
                "gc": "gradient_checkpointing: true", "args": "the TrainingArguments"}
    return {"seq": "the data pipeline (truncate or drop longer samples)",
            "mb": "train_micro_batch_size_per_gpu / gradient_accumulation_steps",
            "gc": "model.gradient_checkpointing_enable()", "args": "the DeepSpeed config"}


def outlier(record: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The failing batch against the run's median padded length: ``{seq_len, median, ratio, steps}`` when it is
    :data:`OUTLIER_RATIO` times longer or more, else None (also when no step came before it)."""
    batch = record.get("batch") if isinstance(record.get("batch"), dict) else {}
    hist = record.get("batch_history") if isinstance(record.get("batch_history"), dict) else {}
    seq, median = _num(batch.get("seq_len")), _num(hist.get("median_seq_len"))
    if not seq or not median:
        return None
    ratio = seq / median
    return {"seq_len": seq, "median": median, "ratio": ratio, "steps": _num(hist.get("steps"))} \
        if ratio >= OUTLIER_RATIO else None


def _longest_fitting(s: Situation, lo: int, hi: int) -> Optional[int]:
    """The longest length in [lo, hi) (multiples of :data:`SEQ_STEP`) whose plan fits, or None."""
    inputs = s.inputs
    assert inputs is not None
    lo = max(SEQ_STEP, lo - lo % SEQ_STEP)
    if not _fits_inputs(s, inputs.with_(seq_len=lo)):
        return None
    a, b = lo // SEQ_STEP, max(lo // SEQ_STEP, (hi - 1) // SEQ_STEP)
    while a < b:  # the peak grows with the length: bisect
        mid = (a + b + 1) // 2
        if _fits_inputs(s, inputs.with_(seq_len=mid * SEQ_STEP)):
            a = mid
        else:
            b = mid - 1
    return a * SEQ_STEP


def _seq_candidates(s: Situation, record: Dict[str, Any], keys: Dict[str, str]) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    out = outlier(record)
    if inputs.seq_len <= SEQ_STEP:
        return []
    cap = _longest_fitting(s, SEQ_STEP, inputs.seq_len)
    if cap is None:
        return []
    if out:
        why = (f"this batch is {out['ratio']:.0f} times the run's median length ({out['seq_len']} tokens against "
               f"{out['median']}): capping the length touches only such rare batches (or drop samples longer than "
               f"{cap} tokens)")
    else:
        why = f"activations and logits grow with the tokens of a micro batch; samples longer than {cap} are cut"
    return [_Cand("seq_len_outlier" if out else "seq_len", {"seq_len": cap}, f"cap sequences at {cap} tokens",
                  keys["seq"], why, inputs.with_(seq_len=cap))]


def _micro_batch(s: Situation, keys: Dict[str, str]) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    per_step = inputs.micro_batch * inputs.grad_accum
    options = [m for m in range(inputs.micro_batch - 1, 0, -1) if per_step % m == 0]
    if not options:
        return []
    pick = next((m for m in options if _fits_inputs(s, inputs.with_(micro_batch=m, grad_accum=per_step // m))),
                options[-1])
    return [_Cand("micro_batch", {"micro_batch": pick, "grad_accum": per_step // pick},
                  f"micro batch {pick}, gradient accumulation {per_step // pick} (was {inputs.micro_batch} and "
                  f"{inputs.grad_accum}: the same {per_step} samples per optimizer step)", keys["mb"],
                  "activations and logits scale with the micro batch",
                  inputs.with_(micro_batch=pick, grad_accum=per_step // pick))]


def _packing(s: Situation, record: Dict[str, Any]) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    tokens = _num((record.get("batch") or {}).get("tokens")) if isinstance(record.get("batch"), dict) else None
    padded = inputs.micro_batch * inputs.seq_len
    if not tokens or tokens > 0.6 * padded or inputs.micro_batch < 2:
        return []
    rows = max(1, math.ceil(tokens / inputs.seq_len))
    return [_Cand("packing", {"micro_batch": rows, "packing": True},
                  f"pack samples without padding ({tokens} tokens in this micro batch, padded to {padded})",
                  "packing / padding_free in the training arguments (LLaMA-Factory: packing: true; TRL: "
                  "padding_free=True)", "activations are allocated for padding tokens too",
                  inputs.with_(micro_batch=rows))]


def _zero_candidates(s: Situation) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    out: List[_Cand] = []
    ds = "the DeepSpeed config (zero_optimization)"
    if inputs.stage < 3:
        nxt = 2 if inputs.stage < 2 else 3
        out.append(_Cand("stage", {"stage": nxt}, f"ZeRO stage {nxt} (was {inputs.stage})", ds,
                         "partitions gradients (stage 2) and the 16-bit weights (stage 3) across the ranks",
                         inputs.with_(stage=nxt, overlap_comm=None)))
    if inputs.offload_optimizer == "none":
        st = max(inputs.stage, 2) if inputs.stage < 1 else inputs.stage
        out.append(_Cand("offload_optimizer", {"offload_optimizer": "cpu", **({"stage": st} if st != inputs.stage else {})},
                         "offload_optimizer: {device: cpu}" + (f" with ZeRO stage {st}" if st != inputs.stage else ""),
                         ds, "moves the fp32 master weights, the Adam states and the step to the host",
                         inputs.with_(offload_optimizer="cpu", stage=st)))
    if inputs.offload_param == "none":
        opt = "cpu" if inputs.offload_optimizer == "none" else inputs.offload_optimizer
        out.append(_Cand("offload_param", {"offload_param": "cpu", "offload_optimizer": opt,
                                           **({"stage": 3} if inputs.stage != 3 else {})},
                         "offload_param and offload_optimizer: {device: cpu}"
                         + (" with ZeRO stage 3" if inputs.stage != 3 else ""), ds,
                         "keeps only the layers being computed on the GPU", inputs.with_(
                             stage=3, offload_param="cpu", offload_optimizer=opt, overlap_comm=None)))
    if inputs.stage >= 1 and inputs.hardware is not None:
        hw = inputs.hardware
        more = Hardware(hw.gpus_per_node * 2, hw.gpu_bytes, hw.nodes)
        out.append(_Cand("world_size", {"world_size": hw.world_size * 2},
                         f"{hw.world_size * 2} GPUs instead of {hw.world_size}", "the launcher (--nproc_per_node / "
                         "--num_gpus, or more nodes)", "ZeRO partitions its states over more ranks",
                         inputs.with_(hardware=more, world=hw.world_size * 2)))
    return out


def _class_candidates(s: Situation, kind: str, record: Dict[str, Any]) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    out: List[_Cand] = []
    if kind == "outside_torch" and s.outside is not None and s.outside_base is not None:
        base_c = with_outside_torch(DEFAULT, s.outside_base, "measured on this rank at start")
        cand = _Cand("outside_torch", {"outside_torch_bytes": s.outside_base},
                     f"free the GPU: stop what took {_g(s.outside - s.outside_base)} outside PyTorch since the "
                     f"start (another process, or NCCL buffers: NCCL_BUFFSIZE)",
                     "the machine (nvidia-smi / rocm-smi: other processes on this GPU)",
                     "memory outside PyTorch is not PyTorch's to free; the same working set fitted at the start",
                     inputs, base_c)
        out.append(cand)
    if kind == "save_spike" and inputs.stage == 3 and inputs.gather_16bit_on_save:
        before = record.get("save_mem_before") if isinstance(record.get("save_mem_before"), dict) else {}
        held = _num(before.get("reserved_bytes"))  # what training left reserved when the save began: measured
        plan_peak = _peak(s, inputs.with_(gather_16bit_on_save=False))
        planned = None if plan_peak is None else plan_peak - s.unmodelled  # the excess was the gather itself
        measured = None if held is None else held + (s.outside or 0)
        peak = max((p for p in (measured, planned) if p is not None), default=None)
        out.append(_Cand("gather_16bit_on_save", {"gather_16bit_on_save": False},
                         "stage3_gather_16bit_weights_on_model_save: false (save ZeRO shards with save_checkpoint; "
                         "consolidate offline: zeropilot ckpt export)", "the DeepSpeed config (zero_optimization)",
                         "the 16-bit gather on save holds whole layers on one GPU; without it a save writes each "
                         "rank's own partition (peak: the training peak measured before the save)",
                         predicted=peak, measured=measured is not None))
    return out


def _expandable_candidate(s: Situation) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    if s.expandable or s.expandable_ok is False:
        return []
    word = "" if s.expandable_ok else "try "
    return [_Cand("expandable_segments", {"expandable_segments": True},
                  f"{word}PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "the environment of the launch",
                  "segments grow in place and free pieces are returned, so less is reserved but unused"
                  + ("" if s.expandable_ok else " (unknown on this build: check it took effect in "
                     "torch.cuda.memory._snapshot()['allocator_settings'])"),
                  inputs.with_(expandable_segments=True))]


def _gc_candidate(s: Situation, keys: Dict[str, str]) -> List[_Cand]:
    inputs = s.inputs
    assert inputs is not None
    if inputs.gradient_checkpointing:
        return []
    return [_Cand("gradient_checkpointing", {"gradient_checkpointing": True}, "gradient checkpointing on",
                  keys["gc"], "keeps one input per layer and recomputes the rest in the backward (about a third "
                  "more compute)", inputs.with_(gradient_checkpointing=True))]


def _evaluate(s: Situation, c: _Cand) -> Dict[str, Any]:
    if c.predicted is None and c.inputs is not None:
        c.predicted = _peak(s, c.inputs, c.constants)
    fits = _fits(s, c.predicted, c.measured)
    if s.injected_tokens is not None:
        fits = bool(_fits_inputs(s, c.inputs)) if c.constants is None else False
    saved = None if c.predicted is None or s.base_peak is None else max(s.base_peak - c.predicted, 0)
    evidence = (f"predicted peak {_g(c.predicted)} against {_g(s.budget)}"
                + (" (measured)" if c.measured else f" (this run: {_g(s.base_peak)})"))
    if s.injected_tokens is not None:
        tokens = None if c.inputs is None else c.inputs.micro_batch * c.inputs.seq_len
        evidence = (f"INJECTED OOM (ZEROPILOT_INJECT_OOM): a micro batch fits under {s.injected_tokens} padded tokens; "
                    + ("this change does not touch the micro batch's tokens" if tokens is None else
                       f"with this change {c.inputs.micro_batch} x {c.inputs.seq_len} = {tokens}"))
    return {"fix": c.fix, "why": c.why, "expected_bytes": saved, "change": c.change, "applies_to": c.applies_to,
            "predicted_peak_bytes": c.predicted, "limit_bytes": s.budget, "fits": fits, "ranked": True,
            "evidence": evidence, "key": c.key, "tier": TIERS.get(c.key, 3) + (0.5 if "+" in c.key else 0.0)}


_FIELDS = ("seq_len", "micro_batch", "grad_accum", "gradient_checkpointing", "expandable_segments", "stage",
           "offload_optimizer", "offload_param", "hardware", "world", "overlap_comm")


def _apply(inputs: PlanInputs, cands: List[_Cand]) -> Optional[PlanInputs]:
    """``inputs`` with every candidate's changed fields, or None when together they are not a valid plan."""
    changes: Dict[str, Any] = {}
    for c in cands:
        assert c.inputs is not None
        changes.update({k: getattr(c.inputs, k) for k in _FIELDS if getattr(c.inputs, k) != getattr(inputs, k)})
    try:
        trial = inputs.with_(**changes)
        trial.validate()
    except InputError:
        return None
    return trial


def _combine(s: Situation, singles: List[Tuple[_Cand, Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """No single change fits: apply changes cheapest first, each kept when it lowers the peak, until it fits."""
    inputs = s.inputs
    assert inputs is not None
    order = sorted((c for c, f in singles if c.inputs is not None and c.constants is None and f["predicted_peak_bytes"]
                    is not None and s.base_peak is not None and f["predicted_peak_bytes"] < s.base_peak),
                   key=lambda c: (TIERS.get(c.key, 3), c.predicted))
    used: List[_Cand] = []
    peak = s.base_peak
    for c in order:
        trial = _apply(inputs, used + [c])
        p = None if trial is None else _peak(s, trial)
        if p is not None and peak is not None and p < peak:
            used.append(c)
            peak = p
            if _fits(s, p):
                break
    if not _fits(s, peak):
        return None
    for c in sorted(used, key=lambda c: -TIERS.get(c.key, 3)):  # drop what is not needed, dearest first
        rest = [u for u in used if u is not c]
        trial = _apply(inputs, rest) if len(rest) > 1 else None
        if trial is not None and _fits(s, _peak(s, trial)):
            used = rest
    current = _apply(inputs, used)
    if len(used) < 2 or current is None:
        return None
    change: Dict[str, Any] = {}
    for c in used:
        change.update(c.change)
    combo = _Cand("+".join(c.key for c in used), change, " + ".join(c.fix for c in used),
                  "; ".join(dict.fromkeys(c.applies_to for c in used)), "no single change fits: together they do",
                  current)
    result = _evaluate(s, combo)
    result["tier"] = max(TIERS.get(c.key, 3) for c in used) + 0.5
    return result


def what_ifs(s: Situation, kind: str, record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Every applicable change as a fix record, ranked (see the module's docstring)."""
    if s.inputs is None:
        return []
    keys = _keys(s)
    cands = (_class_candidates(s, kind, record) + _expandable_candidate(s) + _seq_candidates(s, record, keys)
             + _packing(s, record) + _micro_batch(s, keys) + _gc_candidate(s, keys) + _zero_candidates(s))
    evaluated = [(c, _evaluate(s, c)) for c in cands]
    fixes = [f for _, f in evaluated]
    if not any(f["fits"] for f in fixes) and s.injected_tokens is None:
        combo = _combine(s, evaluated)
        if combo is not None:
            fixes.append(combo)
    return rank(fixes)


def rank(fixes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Fits first, cheapest tier first, then the lower predicted peak; then the rest, closest first."""
    def key(f: Dict[str, Any]) -> tuple:
        peak = f.get("predicted_peak_bytes")
        peak = float("inf") if peak is None else peak
        if f.get("fits"):
            return (0, f.get("tier", 3), peak)
        return (1, peak, f.get("tier", 3))
    return sorted(fixes, key=key)
