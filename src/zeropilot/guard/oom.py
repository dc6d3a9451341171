"""OOM forensics inside a rank: PyTorch's OOM observer writes ``oom-rank-N.json`` before the stack unwinds.

``torch._C._cuda_attach_out_of_memory_observer(fn(device, alloc, device_alloc, device_free))``
(torch >= 2.1) is called by the caching allocator after it gave up, outside its lock, while the
failing frame is still live: the record has the request, the allocator's counters as they were, the
rank's phase and what happened just before. The verdict is :func:`zeropilot.guard.verdicts.classify_oom`,
a pure function of that record. With ``--memory-history`` the rank also records allocation history
(``torch.cuda.memory._record_memory_history``) and dumps a snapshot for PyTorch's memory_viz.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

from zeropilot.guard import rank, setup, telemetry
from zeropilot.guard.rank import RankGuard
from zeropilot.guard.verdicts import classify_oom, just_before
from zeropilot.runlog import frames as runlog_frames
from zeropilot.runlog.layout import write_json_atomic

MEMORY_HISTORY_ENV = "ZEROPILOT_MEMORY_HISTORY"
PLAN_ENV = "ZEROPILOT_PLAN_FILE"  # run.json, for the plan's numbers in the fixes

_installed = False


def stack(limit: int = 40) -> List[Dict[str, Any]]:
    """The calling frames, innermost last, without the guard's own: ``{func, file, line, kind}``."""
    frames = [f for f in traceback.extract_stack()[:-1] if "zeropilot/guard" not in f.filename.replace(os.sep, "/")]
    return [runlog_frames.frame(f.name, f.filename, f.lineno) for f in frames[-limit:]]


def where(limit: int = 12) -> List[str]:
    """The calling frames worth reading, innermost last: the user's and the model's, and the innermost one."""
    return runlog_frames.display([], stack(), limit)[0]


def _plan() -> Optional[Dict[str, Any]]:
    path = os.environ.get(PLAN_ENV)
    if not path:
        return None
    try:
        import json

        with open(path, encoding="utf-8") as fh:
            plan = json.load(fh).get("plan")
        return plan if isinstance(plan, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def build_record(guard: RankGuard, request: int, device_free: Optional[int], mem: Dict[str, Any],
                 device_limit: Optional[int] = None, injected: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The OOM record (everything but the snapshot path) with its verdict and fixes; ``injected``: the law of an
    OOM injected for a test (:mod:`zeropilot.guard.inject`), kept in the record and used by the fixes."""
    torch = sys.modules.get("torch")
    setup.refresh(guard)
    frames = stack()
    record: Dict[str, Any] = {
        "t": time.time(), "rank": guard.rank, "step": guard.step, "phase": guard.phase,
        "request_bytes": int(request), "device_free_reported_bytes": device_free, "mem": mem,
        "baseline": guard.baseline_mem, "where": runlog_frames.display([], frames)[0], "frames": frames,
        "allocator_limit_bytes": _limit(torch, device_limit, mem), "observer_device_limit_bytes": device_limit,
        "build": build_info(torch), "save_mem_before": guard.op_stack[-1].mem_before if guard.op_stack else None,
        "setup": guard.setup or None, "allocator_settings": guard.allocator_settings,
        "batch": _batch(guard.last_batch), "batch_history": guard.batch_history(), "last_save": guard.save_context(),
    }
    if injected is not None:
        record["injected"] = injected
    record["just_before"] = just_before(record)
    verdict, fixes = classify_oom(record, _plan())
    if injected is not None:
        verdict["summary"] = f"INJECTED ({injected.get('env')}): {verdict.get('summary')}"
    record["verdict"] = verdict
    record["fixes"] = fixes
    return record


def _batch(shape: Any) -> Optional[Dict[str, Any]]:
    if not shape:
        return None
    return {"micro_batch_size": shape[0], "seq_len": shape[1], "tokens": shape[2]}


def _limit(torch: Any, device_limit: Optional[int], mem: Dict[str, Any]) -> Optional[int]:
    """The allocator's cap when ``set_per_process_memory_fraction`` was called, else None.

    The observer's third argument is that cap when one is set and the device's total otherwise
    (``CUDACachingAllocator``: ``set_fraction ? allowed_memory_maximum : device_total``)."""
    total = mem.get("device_total_bytes")
    if isinstance(device_limit, int) and isinstance(total, int) and 0 < device_limit < total:
        return device_limit
    return telemetry.allocator_limit(torch)


def build_info(torch: Any) -> Dict[str, Any]:
    """What the build can do that a fix depends on: HIP or CUDA, versions, expandable segments."""
    hip = getattr(getattr(torch, "version", None), "hip", None) if torch is not None else None
    return {"torch": getattr(torch, "__version__", None), "hip": hip,
            "cuda": getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None,
            "dtk": bool(hip) and ("dtk" in str(getattr(torch, "__version__", "")).lower()
                                  or "das" in str(getattr(torch, "__version__", "")).lower())}


def _observer(guard: RankGuard):
    def observe(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        try:
            torch = sys.modules.get("torch")
            mem = telemetry.read_memory(torch, device)
            record = build_record(guard, alloc, device_free, mem, device_alloc)
            record["snapshot"] = _dump_snapshot(guard, torch)
            path = guard.dir.oom(guard.rank)
            write_json_atomic(path, record)
            guard.record("oom", step=guard.step, phase=guard.phase, request_bytes=int(alloc), file=path.name,
                         verdict=record["verdict"].get("kind"))
            guard.beat(force=True)
        except Exception as exc:  # noqa: BLE001 - forensics must not mask the OOM itself
            print(f"zeropilot guard: OOM record failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
    return observe


def _dump_snapshot(guard: RankGuard, torch: Any) -> Optional[str]:
    if not os.environ.get(MEMORY_HISTORY_ENV):
        return None
    path = guard.dir.memory_snapshot(guard.rank)
    try:
        torch.cuda.memory._dump_snapshot(str(path))
        return path.name
    except Exception:  # noqa: BLE001
        return None


def installed() -> bool:
    return _installed


def _at_first_step(guard: RankGuard) -> None:
    """One attempt, at the rank's first step (CUDA is up by then on a GPU rank), for ranks that went live after
    CUDA started and were not attached at ``deepspeed.initialize`` or ``Trainer`` construction."""
    if not guard.oom_observer:
        install(guard)
        guard.oom_observer = True


rank.on_step(_at_first_step)


def install(guard: RankGuard) -> bool:
    """Attach the OOM observer (and memory history when asked) once per process; False without CUDA/HIP.

    No memory is read here: the baseline for "memory outside PyTorch grew" is the rank's first memory
    record after it selected its device (see :meth:`RankGuard.memory`)."""
    global _installed
    torch = sys.modules.get("torch")
    if _installed or torch is None or telemetry.accelerator(torch) is None:
        return _installed
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return False
    if os.environ.get(MEMORY_HISTORY_ENV):
        try:
            torch.cuda.memory._record_memory_history(max_entries=int(os.environ[MEMORY_HISTORY_ENV] or 100000))
        except Exception:  # noqa: BLE001
            pass
    attach(_observer(guard))
    _installed = guard.oom_observer = True
    return True
