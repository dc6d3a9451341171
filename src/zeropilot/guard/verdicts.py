"""Why a rank ran out of memory: a pure function of its OOM record (no torch, no I/O).

Classes, tested in this order (the first that holds is the verdict; the others' evidence is kept):

- ``save_spike``: the OOM happened inside a checkpoint save phase (``phase`` is ``save:...``).
- ``fragmentation``: the request is no larger than what PyTorch holds reserved but unallocated
  (free space inside segments it could not release even after flushing its cache: ``alloc_retries``).
- ``outside_torch``: memory outside PyTorch (CUDA context, NCCL, other processes) grew since the
  guard's baseline by more than the shortfall, so the same working set fitted before.
- ``capacity``: the working set (allocated + request) does not fit under the allocator's limit.

Fixes are ranked by expected effect; ``expected_bytes`` is what the fix frees or the shortfall it
must cover, from the record, or from the plan's breakdown where ``plan`` is known.
``expandable_segments`` is offered only where the build supports it: CUDA, or ROCm >= 7.0;
unknown on Hygon DTK.
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
            "free": _num(mem.get("device_free_bytes"))}


def _evidence(f: Dict[str, Optional[int]], record: Dict[str, Any]) -> List[str]:
    ev = [f"request {_g(f['request'])}; allocated {_g(f['allocated'])}, reserved {_g(f['reserved'])}, "
          f"reserved but unallocated {_g(f['unallocated'])}, allocator retries {f['retries']}",
          f"device total {_g(f['total'])}, free {_g(f['free'])}, outside PyTorch {_g(f['outside'])}"
          + (f" (at start {_g(f['outside_base'])})" if f["outside_base"] is not None else "")
          + (f", allocator limit {_g(f['limit'])}" if record.get("allocator_limit_bytes") else "")]
    if record.get("phase"):
        ev.append(f"phase {record['phase']} at step {record.get('step')}")
    if record.get("just_before"):
        ev.append(f"just before: {record['just_before']}")
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
        would_fit = alloc + req <= f["total"] - f["outside_base"]
        if would_fit:
            return "outside_torch", (f"memory outside PyTorch grew by {_g(grown)} since start (CUDA context, NCCL "
                                     "or another process): the same working set fitted then")
    need = None if alloc is None or req is None or limit is None else alloc + req - limit
    return "capacity", ("the working set does not fit: allocated + request exceed the allocator's limit"
                        + (f" by {_g(need)}" if need is not None and need > 0 else ""))


def _plan_component(plan: Optional[Dict[str, Any]], name: str) -> Optional[int]:
    if not plan or not isinstance(plan.get("breakdown"), dict):
        return None
    item = plan["breakdown"].get(name)
    return _num(item.get("bytes")) if isinstance(item, dict) else None


def _fixes(kind: str, f: Dict[str, Optional[int]], record: Dict[str, Any],
           plan: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    es_ok, es_why = expandable_segments_support(record.get("build") or {})
    fixes: List[Dict[str, Any]] = []

    def add(fix: str, why: str, expected: Optional[int]) -> None:
        fixes.append({"fix": fix, "why": why, "expected_bytes": expected})

    shortfall = None
    if f["allocated"] is not None and f["request"] is not None and f["limit"] is not None:
        shortfall = max(f["allocated"] + f["request"] - f["limit"], 0)
    if kind == "save_spike":
        add("stage3_gather_16bit_weights_on_model_save: false (save ZeRO shards, consolidate offline with "
            "zeropilot ckpt export)", "the 16-bit gather on save holds whole layers on the GPU",
            _plan_component(plan, "zero_buffers"))
        add("save_only_model: true where resuming is not needed", "skips the optimizer-state save", None)
        add("torch.cuda.empty_cache() before and after saves", "returns cached segments before the save needs them",
            f["unallocated"])
    if kind == "fragmentation" or kind == "save_spike":
        if es_ok:
            add("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", f"segments grow in place, no stranded pieces ({es_why})",
                f["unallocated"])
        elif es_ok is None:
            add("try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and check it took effect "
                "(torch.cuda.memory._snapshot()['allocator_settings'])", es_why, f["unallocated"])
        add("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:<request size in MiB> (where expandable_segments is not available)",
            "large blocks are not split, so they stay whole for large requests", None)
        add("torch.cuda.empty_cache() after each save", "releases segments freed by the save", f["unallocated"])
    if kind == "outside_torch":
        grown = None if f["outside"] is None or f["outside_base"] is None else f["outside"] - f["outside_base"]
        add("find what else holds the GPU (nvidia-smi / rocm-smi: other processes; NCCL buffers: NCCL_BUFFSIZE)",
            "memory outside PyTorch is not PyTorch's to free", grown)
        add("plan with the measured outside-PyTorch memory (zeropilot plan --gpus) and keep that headroom", "", grown)
    if kind in ("capacity", "outside_torch", "save_spike"):
        add("offload_optimizer: {device: cpu}", "moves fp32 master weights and Adam states to the host",
            _sum(_plan_component(plan, "optimizer_master"), _plan_component(plan, "optimizer_states")) or shortfall)
        add("halve train_micro_batch_size_per_gpu (and double gradient_accumulation_steps)",
            "activations scale with the micro batch", _half(_plan_component(plan, "activations")) or shortfall)
        add("gradient_checkpointing: true", "keeps one layer's activations instead of all", shortfall)
        add("ZeRO-3 (or more GPUs)", "partitions the 16-bit weights and gradients too", shortfall)
    return fixes


def _sum(*values: Optional[int]) -> Optional[int]:
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _half(value: Optional[int]) -> Optional[int]:
    return None if value is None else value // 2


def classify_oom(record: Dict[str, Any], plan: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The verdict ``{kind, summary, evidence}`` and ranked fixes for an OOM record."""
    f = _facts(record)
    kind, summary = _kind(f, record)
    evidence = _evidence(f, record)
    peak = _num(plan.get("gpu_peak_bytes")) if isinstance(plan, dict) else None
    if peak is not None:
        evidence.append(f"plan: {_g(peak)} per GPU at peak")
    return {"kind": kind, "summary": summary, "evidence": evidence}, _fixes(kind, f, record, plan)
