"""Why a rank ran out of memory: a pure function of its OOM record (no torch, no I/O).

Classes, tested in this order (the first that holds is the verdict; the others' evidence is kept):

- ``save_spike``: the OOM happened inside a checkpoint save phase (``phase`` is ``save:...``).
- ``fragmentation``: the request is no larger than what PyTorch holds reserved but unallocated
  (free space inside segments it could not release even after flushing its cache: ``alloc_retries``).
- ``outside_torch``: memory outside PyTorch (CUDA context, NCCL, other processes) grew since the
  guard's baseline by more than the shortfall, so the same working set fitted before: never when the allocator's
  own cap (``set_per_process_memory_fraction``) is below the working set, which no outside memory changes.
- ``capacity``: the working set (allocated + request) does not fit under the allocator's limit.

Fixes are what-ifs of the plan (:mod:`zeropilot.guard.whatif`): this run's plan at the failing batch with the
memory measured on the rank, and one plan per change the launch does not already have, ranked by whether it fits
and what it costs; each fix is a record (the change, where it applies, its predicted peak, whether it fits, the
evidence). The class's own allocator and save fixes, which the plan does not model, come from the record
(``ranked: false``), as every fix does where the plan cannot size the model. ``expandable_segments`` is offered
only where the build supports it: CUDA, or ROCm >= 7.0; unknown on Hygon DTK.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

GiB = float(1 << 30)
KINDS = ("capacity", "fragmentation", "outside_torch", "save_spike")
#: outside-PyTorch growth below this is noise (cuBLAS workspaces, lazily loaded kernels)
OUTSIDE_NOISE = 256 << 20


def _num(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _g(value: Optional[int]) -> str:
    return "?" if value is None else f"{value / GiB:.2f} GiB"


def expandable_segments_support(build: Dict[str, Any]) -> Tuple[Optional[bool], str]:
    """Whether this torch build honours ``expandable_segments``: True, False, or None (unknown)."""
    hip = build.get("hip")
    if build.get("dtk"):
        return None, "Hygon DTK build: unknown until seen working"
    if not hip:
        return (True, "CUDA build") if build.get("cuda") else (None, "not a CUDA or ROCm build")
    m = re.match(r"(\d+)\.(\d+)", str(hip))
    if not m:
        return None, f"ROCm {hip}: version unreadable"
    if (int(m.group(1)), int(m.group(2))) >= (7, 0):
        return True, f"ROCm {hip} (>= 7.0)"
    return False, f"ROCm {hip}: expandable_segments is ignored before 7.0"


def _facts(record: Dict[str, Any]) -> Dict[str, Optional[int]]:
    mem = record.get("mem") if isinstance(record.get("mem"), dict) else {}
    base = record.get("baseline") if isinstance(record.get("baseline"), dict) else {}
    total = _num(mem.get("device_total_bytes"))
    outside = _num(mem.get("outside_torch_bytes"))
    limit = _num(record.get("allocator_limit_bytes"))
    if limit is None and total is not None and outside is not None:
        limit = total - outside
    allocated = _num(mem.get("allocated_bytes"))
    reserved = _num(mem.get("reserved_bytes"))
    unalloc = _num(mem.get("unallocated_reserved_bytes"))
    if unalloc is None and allocated is not None and reserved is not None:
        unalloc = reserved - allocated
    return {"request": _num(record.get("request_bytes")), "allocated": allocated, "reserved": reserved,
            "unallocated": unalloc, "retries": _num(mem.get("alloc_retries")), "total": total,
            "outside": outside, "outside_base": _num(base.get("outside_torch_bytes")), "limit": limit,
            "cap": _num(record.get("allocator_limit_bytes")),
            "free": _num(mem.get("device_free_bytes"))}


def _evidence(f: Dict[str, Optional[int]], record: Dict[str, Any]) -> List[str]:
    ev = [f"request {_g(f['request'])}; allocated {_g(f['allocated'])}, reserved {_g(f['reserved'])}, "
          f"reserved but unallocated {_g(f['unallocated'])}, allocator retries {f['retries']}",
          f"device total {_g(f['total'])}, free {_g(f['free'])}, outside PyTorch {_g(f['outside'])}"
          + (f" (at start {_g(f['outside_base'])})" if f["outside_base"] is not None else "")
          + (f", allocator limit {_g(f['limit'])}" if record.get("allocator_limit_bytes") else "")]
    if record.get("phase"):
        ev.append(f"phase {record['phase']} at step {record.get('step')}")
    context = just_before(record) if record.get("last_save") or record.get("setup") else record.get("just_before")
    if context:
        ev.append(f"just before: {context}")
    return ev


def _kind(f: Dict[str, Optional[int]], record: Dict[str, Any]) -> Tuple[str, str]:
    req, alloc, limit = f["request"], f["allocated"], f["limit"]
    phase = str(record.get("phase") or "")
    if phase.startswith("save"):
        return "save_spike", f"out of memory inside the checkpoint save ({phase.split(':', 1)[-1]})"
    if req is not None and f["unallocated"] is not None and req <= f["unallocated"]:
        return "fragmentation", (f"the {_g(req)} request is smaller than the {_g(f['unallocated'])} PyTorch holds "
                                 "reserved but unallocated: free memory is split into pieces too small")
    grown = None if f["outside"] is None or f["outside_base"] is None else f["outside"] - f["outside_base"]
    if grown is not None and grown > OUTSIDE_NOISE and alloc is not None and req is not None and f["total"]:
        room_then = f["total"] - f["outside_base"]
        if f["cap"] is not None:  # set_per_process_memory_fraction bounds PyTorch alone, whatever else the card holds
            room_then = min(room_then, f["cap"])
        would_fit = alloc + req <= room_then
        if would_fit:
            return "outside_torch", (f"memory outside PyTorch grew by {_g(grown)} since start (CUDA context, NCCL "
                                     "or another process): the same working set fitted then")
    need = None if alloc is None or req is None or limit is None else alloc + req - limit
    return "capacity", ("the working set does not fit: allocated + request exceed the allocator's limit"
                        + (f" by {_g(need)}" if need is not None and need > 0 else ""))


def _shortfall(f: Dict[str, Optional[int]]) -> Optional[int]:
    if f["allocated"] is None or f["request"] is None or f["limit"] is None:
        return None
    return max(f["allocated"] + f["request"] - f["limit"], 0)


def _has(setup: Dict[str, Any], part: str, key: str) -> Any:
    value = (setup.get(part) or {}).get(key) if isinstance(setup.get(part), dict) else None
    return value


def _evidence_fixes(kind: str, f: Dict[str, Optional[int]], record: Dict[str, Any], ranked_plan: bool
                    ) -> List[Dict[str, Any]]:
    """Fixes from the record's own evidence, not predicted by the plan (``ranked: false``).

    With a plan (``ranked_plan``) only the class's own allocator and save fixes, which the plan does not model;
    without one, also the capacity changes, each dropped when the recorded setup shows the launch has it already.
    """
    es_ok, es_why = expandable_segments_support(record.get("build") or {})
    setup = record.get("setup") if isinstance(record.get("setup"), dict) else {}
    fixes: List[Dict[str, Any]] = []

    def add(fix: str, why: str, expected: Optional[int], key: str, change: Optional[Dict[str, Any]] = None,
            applies_to: Optional[str] = None) -> None:
        fixes.append({"fix": fix, "why": why, "expected_bytes": expected, "change": change or {},
                      "applies_to": applies_to, "predicted_peak_bytes": None, "limit_bytes": f["limit"],
                      "fits": None, "ranked": False, "evidence": "from the OOM record (not predicted by the plan)",
                      "key": key})

    shortfall = _shortfall(f)
    if kind == "save_spike":
        if not ranked_plan and _has(setup, "zero", "gather_16bit_on_save") is not False:
            add("stage3_gather_16bit_weights_on_model_save: false (save ZeRO shards, consolidate offline with "
                "zeropilot ckpt export)", "the 16-bit gather on save holds whole layers on the GPU", f["request"],
                "gather_16bit_on_save", {"gather_16bit_on_save": False}, "the DeepSpeed config (zero_optimization)")
        add("save_only_model: true where resuming is not needed", "skips the optimizer-state save", None,
            "save_only_model", {"save_only_model": True}, "the training arguments")
        add("torch.cuda.empty_cache() before and after saves", "returns cached segments before the save needs them",
            f["unallocated"], "empty_cache")
    if kind in ("fragmentation", "save_spike"):
        already = _expandable_in(record)
        if not ranked_plan and not already:
            if es_ok:
                add("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", f"segments grow in place, no stranded pieces "
                    f"({es_why})", f["unallocated"], "expandable_segments", {"expandable_segments": True},
                    "the environment of the launch")
            elif es_ok is None:
                add("try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and check it took effect "
                    "(torch.cuda.memory._snapshot()['allocator_settings'])", es_why, f["unallocated"],
                    "expandable_segments", {"expandable_segments": True}, "the environment of the launch")
        if es_ok is not True:
            add("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<request size in MiB> (where expandable_segments is not "
                "available)", "large blocks are not split, so they stay whole for large requests", None,
                "max_split_size_mb", None, "the environment of the launch")
        add("torch.cuda.empty_cache() after each save", "releases segments freed by the save", f["unallocated"],
            "empty_cache_after_save")
    if kind == "outside_torch" and not ranked_plan:
        grown = None if f["outside"] is None or f["outside_base"] is None else f["outside"] - f["outside_base"]
        add("find what else holds the GPU (nvidia-smi / rocm-smi: other processes; NCCL buffers: NCCL_BUFFSIZE)",
            "memory outside PyTorch is not PyTorch's to free", grown, "outside_torch")
    if kind in ("capacity", "outside_torch", "save_spike") and not ranked_plan:
        zero = setup.get("zero") if isinstance(setup.get("zero"), dict) else {}
        train = setup.get("train") if isinstance(setup.get("train"), dict) else {}
        model = setup.get("model") if isinstance(setup.get("model"), dict) else {}
        if zero.get("offload_optimizer") in (None, "none"):
            add("offload_optimizer: {device: cpu}", "moves fp32 master weights and Adam states to the host",
                shortfall, "offload_optimizer", {"offload_optimizer": "cpu"}, "the DeepSpeed config")
        if train.get("micro_batch") in (None,) or (isinstance(train.get("micro_batch"), int) and train["micro_batch"] > 1):
            add("halve train_micro_batch_size_per_gpu (and double gradient_accumulation_steps)",
                "activations scale with the micro batch", shortfall, "micro_batch", None, "the batch settings")
        if not model.get("gradient_checkpointing") and not train.get("gradient_checkpointing_arg"):
            add("gradient_checkpointing: true", "keeps one layer's activations instead of all", shortfall,
                "gradient_checkpointing", {"gradient_checkpointing": True}, "the training arguments")
        if zero.get("stage") != 3:
            add("ZeRO-3 (or more GPUs)", "partitions the 16-bit weights and gradients too", shortfall, "stage",
                {"stage": 3}, "the DeepSpeed config")
    return fixes


def _expandable_in(record: Dict[str, Any]) -> bool:
    from zeropilot.memory.from_run import expandable_in

    return expandable_in(record)


def _save_line(record: Dict[str, Any]) -> Optional[str]:
    """What the last save did to GPU memory (before, at its peak, after), or None without a save or numbers."""
    ls = record.get("last_save") if isinstance(record.get("last_save"), dict) else None
    if ls is None:
        return None
    before = ls.get("mem_before") if isinstance(ls.get("mem_before"), dict) else {}
    after = ls.get("mem_after") if isinstance(ls.get("mem_after"), dict) else {}
    peak = ls.get("mem_peak") if isinstance(ls.get("mem_peak"), dict) else {}
    key = "reserved_bytes" if _num(before.get("reserved_bytes")) is not None else "host_rss_bytes"
    what = "GPU memory (reserved)" if key == "reserved_bytes" else "host memory (RSS)"
    b, a = _num(before.get(key)), _num(after.get(key))
    if b is None or a is None:
        return None
    pb, pa = _num(before.get("peak_reserved_bytes")), _num(peak.get("peak_reserved_bytes"))
    new_peak = pa if pa is not None and pb is not None and pa > pb else None
    peak_txt = f"{_g(new_peak)} at its peak" if new_peak is not None else "no new peak during it"
    if a - b <= (1 << 20) and new_peak is None:
        return f"the save at step {ls.get('step')} added no {what}: {_g(b)} before, {_g(a)} after, {peak_txt}"
    return f"the save at step {ls.get('step')} changed {what}: {_g(b)} before, {peak_txt}, {_g(a)} after"


def just_before(record: Dict[str, Any]) -> str:
    """What came just before the OOM, in words: a save only with the memory it added (before, peak, after)."""
    step = _num(record.get("step")) or 0
    ls = record.get("last_save") if isinstance(record.get("last_save"), dict) else None
    if str(record.get("phase") or "").startswith("save"):
        return f"inside the save at step {step}"
    if ls is None:
        return f"step {step + 1}, no save before it" if step else "before the first optimizer step"
    since = _num(ls.get("steps_since")) or 0
    where = "the first step after" if since == 0 else f"{since} step(s) after"
    line = _save_line(record)
    return f"step {step + 1}, {where} the save at step {ls.get('step')}" + (f"; {line}" if line else "")


def _batch_lines(record: Dict[str, Any]) -> List[str]:
    from zeropilot.guard.whatif import outlier

    batch = record.get("batch") if isinstance(record.get("batch"), dict) else None
    if not batch:
        return []
    hist = record.get("batch_history") if isinstance(record.get("batch_history"), dict) else {}
    tokens = batch.get("tokens")
    line = (f"the failing micro batch: {batch.get('micro_batch_size')} x {batch.get('seq_len')} tokens (padded)"
            + (f", {tokens} of them not padding" if tokens is not None else ""))
    out = outlier(record)
    if out:
        line += (f"; {out['ratio']:.0f} times the run's median length ({out['median']} tokens over "
                 f"{out['steps']} steps before it)")
    elif hist.get("median_seq_len"):
        line += f"; the run's median length {hist['median_seq_len']} (longest {hist.get('max_seq_len')})"
    return [line]


def classify_oom(record: Dict[str, Any], plan: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The verdict ``{kind, summary, evidence}`` and the ranked fixes of an OOM record.

    Fixes are what-ifs of the plan (:mod:`zeropilot.guard.whatif`) built from the record's own setup, batch and
    measured memory; where the plan cannot size the run, the evidence says why and the fixes are the record's own
    (``ranked: false``). ``plan``: run.json's plan of the launch, for evidence and the training-argument names.
    """
    from zeropilot.guard import whatif

    f = _facts(record)
    kind, summary = _kind(f, record)
    out = whatif.outlier(record)
    if out and kind == "capacity":
        summary += (f"; the failing batch is {out['ratio']:.0f} times the run's median length "
                    f"({out['seq_len']} tokens against {out['median']})")
    evidence = _evidence(f, record) + _batch_lines(record)
    es_ok, _ = expandable_segments_support(record.get("build") or {})
    s = whatif.situation(record, plan, es_ok)
    if s.inputs is not None:
        evidence.append(f"plan of this run at this batch: peak {_g(s.base_peak)} (allocated {_g(s.base_allocated)})"
                        f" against {_g(s.budget)} (allocator limit + memory outside PyTorch, measured here)"
                        + (f"; {_g(s.unmodelled)} allocated at the failure that the plan does not see is added to "
                           "every what-if" if s.unmodelled else ""))
        evidence.extend(f"plan assumes: {n}" for n in s.notes)
        fixes = whatif.what_ifs(s, kind, record)
    else:
        evidence.append(f"not ranked: {s.reason}; the fixes below come from the record alone")
        fixes = []
    peak = _num(plan.get("gpu_peak_bytes")) if isinstance(plan, dict) else None
    if peak is not None:
        evidence.append(f"plan of the launch (zeropilot run, before it started): {_g(peak)} per GPU at peak")
    extra = _evidence_fixes(kind, f, record, s.inputs is not None)
    fitting = [x for x in fixes if x.get("fits")]
    rest = [x for x in fixes if not x.get("fits")]
    ordered = fitting + extra + rest if kind in ("fragmentation", "save_spike") or not fitting else fitting + rest + extra
    for x in ordered:
        x.pop("tier", None)
    return {"kind": kind, "summary": summary, "evidence": evidence}, ordered
