"""Checkpoint saves and loads as one record each, with their phases, bytes and memory.

The outermost operation (``Trainer._save_checkpoint`` or ``DeepSpeedEngine.save_checkpoint`` when
called directly) owns the record; operations inside it (the engine's save under the Trainer's) only
add phases. Phases may nest: ``write`` (every file DeepSpeed's checkpoint engine writes; ``read`` in a
load) lies inside ``model_states`` and ``optimizer_states``; ``gather_16bit`` is the ZeRO-3 16-bit
consolidation. A load's ``step`` is the step the engine resumed at, its ``bytes`` the files read.
"""

from __future__ import annotations

import functools
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from zeropilot.guard.rank import RankGuard, peek


@dataclass
class CheckpointOp:
    """One save or load in progress."""

    kind: str  # save | load
    step: int
    tag: Optional[str]
    path: Optional[str]
    t0: float
    mem_before: Dict[str, Any]
    phases: List[Dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    files: int = 0
    error: Optional[str] = None  # set by a wrapper that saw it fail without an exception
    universal: Optional[bool] = None  # a load: whether DeepSpeed read a universal checkpoint (load_universal)


@contextmanager
def operation(kind: str, path: Any = None, tag: Any = None, step: Optional[int] = None) -> Iterator[Optional[CheckpointOp]]:
    """A save or load; records one ``save``/``load`` event when the outermost one ends."""
    guard = peek()
    if guard is None:
        yield None
        return
    if guard.op_stack:
        yield guard.op_stack[-1]
        return
    op = CheckpointOp(kind, guard.step if step is None else int(step), None if tag is None else str(tag),
                      None if path is None else str(path), time.time(), guard.memory())
    guard.op_stack.append(op)
    previous = guard.set_phase(kind)
    guard.beat()  # saves and loads are rare and where ranks die or hang: their heartbeat is written at once
    error = None
    try:
        yield op
    except BaseException as exc:
        error = f"{exc.__class__.__name__}: {exc}"[:500]
        raise
    finally:
        guard.op_stack.pop()
        _finish(guard, op, error or op.error)
        guard.set_phase("idle" if previous in ("forward", "backward", "step") else previous)


def _finish(guard: RankGuard, op: CheckpointOp, error: Optional[str]) -> None:
    after = guard.memory()
    peak = {k: after.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes")}
    fields = dict(step=op.step, tag=op.tag, path=op.path, bytes=op.bytes, files=op.files,
                  seconds=time.time() - op.t0, phases=op.phases, mem_before=op.mem_before, mem_peak=peak,
                  mem_after=after)
    if error:
        fields["error"] = error
    if op.universal is not None:
        fields["universal"] = op.universal
    guard.record(op.kind, **fields)
    if op.kind == "save" and not error:
        # the memory the save held, for an OOM after it (verdicts.save_context): said only with these numbers
        guard.last_save = {"step": op.step, "t": time.time(), "tag": op.tag, "mem_before": op.mem_before,
                           "mem_peak": peak, "mem_after": after}
        guard.steps_since_save = 0


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A phase of the save or load in progress (no-op outside one)."""
    guard = peek()
    op = guard.op_stack[-1] if guard is not None and guard.op_stack else None
    if op is None:
        yield
        return
    previous = guard.set_phase(f"{op.kind}:{name}")
    guard.beat()
    t0 = time.time()
    try:
        yield
    finally:
        op.phases.append({"name": name, "seconds": time.time() - t0})
        guard.set_phase(previous)


def wrote(path: Any) -> None:
    """A file of the checkpoint was written (save) or read (load): count its bytes."""
    guard = peek()
    if guard is None or not guard.op_stack:
        return
    try:
        guard.op_stack[-1].bytes += os.path.getsize(path)
        guard.op_stack[-1].files += 1
    except (OSError, TypeError):
        pass


_MARK = "__zeropilot_wrapped__"


def wrap_method(cls: Any, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``cls.name`` with ``make(original)`` once (a second patch of the same class is a no-op)."""
    original = getattr(cls, name, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def count_new_files(op: CheckpointOp, folder: str, limit: int = 1000) -> None:
    """Add to ``op`` the files at the top of ``folder`` written since it began (a framework's own files beside
    the engine's: weights, trainer state, RNG), reading at most ``limit`` entries."""
    try:
        with os.scandir(folder) as it:
            for i, entry in enumerate(it):
                if i >= limit:
                    break
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime >= op.t0 - 1:
                    op.bytes += entry.stat().st_size
                    op.files += 1
    except OSError:
        pass
