"""Memory of one rank, read from PyTorch's allocator counters and the driver, never reset.

One :func:`read_memory` call per optimizer step: ``torch.cuda.memory_stats`` (the allocator's own
counters, including ``num_alloc_retries`` and ``num_ooms``), ``torch.cuda.mem_get_info`` (what the
driver says is free: the only view of memory outside PyTorch) and ``/proc/self/statm`` for the host.
The peak counters are read as they are: resetting them (as DeepSpeed's ``see_memory_usage`` does)
would break whoever else reads them, so windows are computed by readers from counter increases.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from zeropilot.runlog.events import MEMORY_FIELDS

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def host_rss_bytes() -> Optional[int]:
    """Resident set size of this process (Linux ``/proc/self/statm``), None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def empty_memory() -> Dict[str, Any]:
    """Every memory field unknown but the host's."""
    mem: Dict[str, Any] = {name: None for name in MEMORY_FIELDS}
    mem["host_rss_bytes"] = host_rss_bytes()
    return mem


def accelerator(torch: Any) -> Optional[str]:
    """``cuda`` or ``hip`` when this process has an initialised GPU context, else None.

    Only an already initialised context is read: the guard must not create one (it costs memory
    and, before ``set_device``, would land on GPU 0)."""
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return None
    except Exception:  # noqa: BLE001 - a broken driver must not break the job
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


_COUNTERS = (("allocated_bytes", "current"), ("allocated_bytes", "peak"), ("reserved_bytes", "current"),
             ("reserved_bytes", "peak"))


def _counters(torch: Any, dev: int) -> Dict[str, Any]:
    """The allocator counters the records need, under ``memory_stats``' flat names.

    From ``memory_stats_as_nested_dict`` (the allocator's own dict): ``memory_stats`` flattens and sorts
    every one of its ~100 entries in Python on each call, which is most of the guard's per-step cost.
    Falls back to ``memory_stats`` where the nested form is missing or shaped otherwise."""
    try:
        nested = torch.cuda.memory_stats_as_nested_dict(dev)
        out = {f"{a}.all.{b}": nested[a]["all"][b] for a, b in _COUNTERS}
        out["num_alloc_retries"] = nested["num_alloc_retries"]
        out["num_ooms"] = nested["num_ooms"]
        return out
    except (AttributeError, KeyError, TypeError):
        return torch.cuda.memory_stats(dev)


def read_memory(torch: Any = None, device: Optional[int] = None) -> Dict[str, Any]:
    """The :data:`MEMORY_FIELDS` of this rank now; unknown values are None."""
    mem = empty_memory()
    if torch is None or accelerator(torch) is None:
        return mem
    try:
        dev = torch.cuda.current_device() if device is None else device
        stats = _counters(torch, dev)
        free, total = torch.cuda.mem_get_info(dev)
    except Exception:  # noqa: BLE001
        return mem
    allocated = stats.get("allocated_bytes.all.current")
    reserved = stats.get("reserved_bytes.all.current")
    mem.update(
        allocated_bytes=allocated,
        reserved_bytes=reserved,
        peak_allocated_bytes=stats.get("allocated_bytes.all.peak"),
        peak_reserved_bytes=stats.get("reserved_bytes.all.peak"),
        unallocated_reserved_bytes=None if reserved is None or allocated is None else reserved - allocated,
        alloc_retries=stats.get("num_alloc_retries"),
        num_ooms=stats.get("num_ooms"),
        device_free_bytes=int(free),
        device_total_bytes=int(total),
        outside_torch_bytes=None if reserved is None else max(int(total) - int(free) - int(reserved), 0),
    )
    return mem


def device_info(torch: Any = None) -> Dict[str, Any]:
    """Name, backend (cuda / hip / cpu) and total memory of this rank's device."""
    backend = accelerator(torch) if torch is not None else None
    if backend is None:
        return {"name": "cpu", "backend": "cpu", "total_bytes": None}
    try:
        dev = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(dev)
        return {"name": props.name, "backend": backend, "total_bytes": int(props.total_memory), "index": dev}
    except Exception:  # noqa: BLE001
        return {"name": None, "backend": backend, "total_bytes": None}


def allocator_settings(torch: Any = None) -> Dict[str, Any]:
    """The allocator settings in force, as the build reports them (not as the environment asks).

    ``torch.cuda.memory._snapshot()['allocator_settings']`` where the build has it (CUDA, torch >=
    2.5); otherwise only the environment variables, marked as such."""
    env = {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
           if k in os.environ}
    out: Dict[str, Any] = {"environment": env, "in_force": None, "source": None}
    if torch is None or accelerator(torch) is None:
        out["source"] = "no GPU context in this process"
        return out
    try:
        settings = torch.cuda.memory._snapshot().get("allocator_settings")
    except Exception as exc:  # noqa: BLE001
        out["source"] = f"torch.cuda.memory._snapshot failed: {exc.__class__.__name__}"
        return out
    out["in_force"] = settings
    out["source"] = "torch.cuda.memory._snapshot()['allocator_settings']" if settings else "not reported by this build"
    return out


def allocator_limit(torch: Any = None) -> Optional[int]:
    """The allocator's cap from ``set_per_process_memory_fraction`` (an emulated smaller card), else None."""
    if torch is None or accelerator(torch) is None:
        return None
    try:
        fraction = torch.cuda.get_per_process_memory_fraction()
        if fraction is None or fraction >= 1.0:
            return None
        return int(fraction * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    except Exception:  # noqa: BLE001 - older builds have no getter
        return None
