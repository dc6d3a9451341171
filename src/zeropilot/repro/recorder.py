"""What a repro rank records into the run directory (``rank-N.jsonl``, ``oom-rank-N.json``).

The records are the run-directory contract's (``docs/run-dir.md``), so ``zeropilot report`` reads a repro like
any run. Differences a reader should know: the repro owns its process, so it resets the allocator's peak counters
at the start of every step, save and load, and every record's ``peak_*`` is that window's own peak (records carry
``peaks: "window"``); records carry ``leg`` (1: the uninterrupted run, 2: the resumed one) and ``case``.

:func:`attach` starts the recorder in a rank; :func:`attach_guard` is the one call that hands the engine to the
guard (``zeropilot.guard.attach``) when the repro runs under ``zeropilot run``.
Imports torch lazily (this module is only imported inside a rank).
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

from zeropilot.runlog.events import MEMORY_FIELDS, EventWriter, event
from zeropilot.runlog.layout import RunDir, write_json_atomic


def host_rss_bytes() -> Optional[int]:
    """This process's resident memory (Linux ``/proc``), None elsewhere."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def read_memory(cuda: bool) -> Dict[str, Any]:
    """The contract's memory fields now (device ones None on CPU)."""
    mem: Dict[str, Any] = {name: None for name in MEMORY_FIELDS}
    mem["host_rss_bytes"] = host_rss_bytes()
    if not cuda:
        return mem
    import torch

    s = torch.cuda.memory_stats()
    free, total = torch.cuda.mem_get_info()
    reserved = s.get("reserved_bytes.all.current", 0)
    mem.update(allocated_bytes=s.get("allocated_bytes.all.current", 0), reserved_bytes=reserved,
               peak_allocated_bytes=s.get("allocated_bytes.all.peak", 0),
               peak_reserved_bytes=s.get("reserved_bytes.all.peak", 0),
               unallocated_reserved_bytes=reserved - s.get("allocated_bytes.all.current", 0),
               alloc_retries=s.get("num_alloc_retries", 0), num_ooms=s.get("num_ooms", 0),
               device_free_bytes=free, device_total_bytes=total, outside_torch_bytes=total - free - reserved)
    return mem


class RssPeak:
    """Samples host RSS every few milliseconds in a thread: the peak of a window on CPU, where no counter exists."""

    def __init__(self, interval: float = 0.005) -> None:
        self.peak = host_rss_bytes() or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.peak = max(self.peak, host_rss_bytes() or 0)

    def __enter__(self) -> "RssPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, host_rss_bytes() or 0)


class Recorder:
    """One rank's writer of contract records for one repro case."""

    def __init__(self, run_dir: Path, rank: int, cuda: bool, leg: int, case: str) -> None:
        self.dir = RunDir(Path(run_dir))
        self.rank, self.cuda, self.leg, self.case = rank, cuda, leg, case
        self.writer = EventWriter(self.dir.events(rank))

    def mem(self) -> Dict[str, Any]:
        return read_memory(self.cuda)

    def reset_peaks(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def write(self, kind: str, **fields: Any) -> None:
        self.writer.write(event(kind, self.rank, leg=self.leg, case=self.case, peaks="window", **fields))

    def oom(self, step: int, phase: str, exc: BaseException, just_before: str) -> None:
        """An OOM: the ``oom`` record and ``oom-rank-N.json`` with a first verdict from the memory fields."""
        mem = self.mem()
        text = str(exc)
        m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB)", text)
        scale = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10}
        request = int(float(m.group(1)) * scale[m.group(2)]) if m else None
        free_in_segments = mem.get("unallocated_reserved_bytes") or 0
        frag = request is not None and free_in_segments >= request
        verdict = {"kind": "fragmentation" if frag else "capacity",
                   "summary": (f"out of memory at step {step} ({phase}), {just_before}: "
                               + ("the request would fit in memory PyTorch holds but cannot use (fragmentation)"
                                  if frag else "the allocator limit is reached")),
                   "evidence": [text.splitlines()[0][:400] if text else type(exc).__name__]}
        path = self.dir.oom(self.rank)
        write_json_atomic(path, {"t": time.time(), "rank": self.rank, "step": step, "phase": phase,
                                 "request_bytes": request, "mem": mem, "just_before": just_before, "where": [],
                                 "verdict": verdict, "fixes": [], "snapshot": None, "leg": self.leg,
                                 "case": self.case})
        self.write("oom", step=step, phase=phase, request_bytes=request, file=path.name)

    def close(self) -> None:
        self.writer.close()


def attach(run_dir: Path, rank: int, cuda: bool, leg: int, case: str) -> Recorder:
    """Start recording this rank's contract records for one case."""
    return Recorder(run_dir, rank, cuda, leg, case)


def attach_guard(engine: Any) -> bool:
    """Hand the engine to the guard (``zeropilot.guard.attach``) when this rank runs under ``zeropilot run``.

    Only then: the guard writes into ``ZEROPILOT_RUN_DIR``, and without a run of its own it would only patch the
    engine class. The repro's own records above stay (they carry the legs, losses and data order).
    """
    if not os.environ.get("ZEROPILOT_RUN_DIR"):
        return False
    from zeropilot.guard import attach as guard_attach

    guard_attach(engine)
    return True
