"""Why a run stopped making progress: pure functions over heartbeats and faulthandler stacks.

Input per rank: its last heartbeat (phase, step, pid), whether its process is alive, and the text
``faulthandler`` wrote for it. Output: the verdict of ``hang.json`` ({ranks, where, reason, cause,
fixes}). A rank is *waiting* when the innermost frames of its main thread are in a collective
(``torch.distributed`` / ``deepspeed.comm``) or a build lock; the odd ranks are those that are not
waiting while others are, those that died, those that never started, or the phase minority.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all",
                "reduce", "gather", "scatter", "send", "recv", "wait", "allreduce", "allgather",
                "monitored_barrier", "_all_gather_base", "all_gather_into_tensor", "reduce_scatter_tensor")
_COMM_FILES = ("torch/distributed/", "deepspeed/comm/", "torch/nn/parallel/", "deepspeed/runtime/comm/")
MARKER = "--- zeropilot: stacks requested at"


@dataclass
class RankState:
    """What the watchdog knows about one rank."""

    rank: int
    phase: Optional[str] = None
    step: Optional[int] = None
    phase_since: Optional[float] = None
    alive: Optional[bool] = None
    frames: List[Dict[str, Any]] = field(default_factory=list)  # main thread, innermost last


def parse_stacks(text: str) -> List[Dict[str, Any]]:
    """The main thread's frames (innermost last) of the last dump in a faulthandler file."""
    if MARKER in text:
        text = text[text.rindex(MARKER):]
    blocks: List[List[Dict[str, Any]]] = []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
            continue
        m = _FRAME.match(line)
        if m and blocks:
            blocks[-1].append({"file": m.group("file"), "line": int(m.group("line")), "func": m.group("func")})
    if not blocks:
        return []
    main = blocks[-1]  # faulthandler lists the newest thread first: the main thread is last
    return list(reversed(main))


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def collective(frames: List[Dict[str, Any]]) -> Optional[str]:
    """The collective (or build lock) a rank waits in, from its innermost frames; None if none."""
    for f in reversed(frames[-12:]):
        path = _norm(f["file"])
        if "file_baton" in path:
            return "build lock (torch.utils.file_baton)"
        if any(p in path for p in _COMM_FILES) and f["func"].lstrip("_") in {c.lstrip("_") for c in _COLLECTIVES}:
            return f["func"]
    return None


def _short(f: Dict[str, Any]) -> str:
    return f"{f['func']} ({_norm(f['file']).rsplit('/', 1)[-1]}:{f['line']})"


def where(frames: List[Dict[str, Any]], limit: int = 6) -> List[str]:
    """The frames worth showing, innermost last: skip the guard's own wrappers."""
    useful = [f for f in frames if "zeropilot/guard" not in _norm(f["file"])]
    return [_short(f) for f in useful[-limit:]]


def _user_frame(frames: List[Dict[str, Any]]) -> Optional[str]:
    for f in reversed(frames):
        path = _norm(f["file"])
        if not any(s in path for s in ("site-packages/", "dist-packages/", "/lib/python", "zeropilot/")):
            return _short(f)
    return None


def _describe(s: RankState) -> str:
    coll = collective(s.frames)
    phase = s.phase or "unknown phase"
    if s.alive is False:
        return f"rank {s.rank} exited (last phase {phase}, step {s.step})"
    if coll:
        return f"rank {s.rank} in {phase}, waiting in {coll}" + (f" from {_user_frame(s.frames)}" if _user_frame(s.frames) else "")
    inner = _short(s.frames[-1]) if s.frames else "no stack"
    return f"rank {s.rank} in {phase} at {inner}"


def hang_verdict(states: List[RankState], world_size: Optional[int], timeout_s: float,
                 locks: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The ``verdict`` object of ``hang.json``."""
    locks = locks or []
    seen = {s.rank for s in states}
    missing = [r for r in range(world_size or 0) if r not in seen]
    lines = [_describe(s) for s in sorted(states, key=lambda s: s.rank)]
    base = f"no rank made progress for {timeout_s:.0f} s"
    if not states:
        cause = "the job hung before any rank started training"
        fixes = ["look at the launcher's output; a rank may wait for its peers to join (MASTER_ADDR/PORT, nnodes)"]
        if locks:
            cause = ("an op build waits on a lock left by a killed build: "
                     + ", ".join(f"{lock['path']} (age {lock.get('age_s')} s)" for lock in locks[:3]))
            fixes = [f"if no build is running, delete {locks[0]['path']}",
                     "or set TORCH_EXTENSIONS_DIR to a fresh folder"]
        return {"ranks": list(range(world_size or 0)), "where": [], "reason": base, "cause": cause, "fixes": fixes,
                "ranks_detail": lines}
    lock_waiters = [s for s in states if (collective(s.frames) or "").startswith("build lock")]
    dead = [s for s in states if s.alive is False]
    waiting = [s for s in states if s.alive is not False and collective(s.frames)]
    outside = [s for s in states if s.alive is not False and not collective(s.frames) and s.frames]
    savers = [s for s in states if (s.phase or "").startswith("save")]
    if lock_waiters:
        odd = lock_waiters
        cause = ("an op build waits on a lock left by a killed build"
                 + (": " + ", ".join(str(lock["path"]) for lock in locks[:3]) if locks else ""))
        fixes = ["if no build is running, delete the lock file", "or set TORCH_EXTENSIONS_DIR to a fresh folder"]
    elif dead or missing:
        odd = dead
        who = ", ".join(str(r) for r in [s.rank for s in dead] + missing)
        cause = f"rank(s) {who} are gone or never started while the others wait for them"
        fixes = ["look at the first error of those ranks (their rank-N.jsonl and the launcher's output)"]
    elif outside and waiting:
        odd = outside
        cause = ("rank(s) " + ", ".join(str(s.rank) for s in outside) + " are outside any collective while the others "
                 "wait in one: code that runs on some ranks only (a save, an evaluation or a forward under "
                 "`if rank == 0`), or one slow rank")
        fixes = ["call collective work (save_checkpoint, save_model, evaluation under ZeRO-3) on every rank",
                 "if the work is legitimately long, raise --hang-timeout and the collective timeout above it"]
    elif savers and len(savers) < len(states):
        odd = savers
        cause = ("rank(s) " + ", ".join(str(s.rank) for s in savers) + " are in a checkpoint save the other ranks "
                 "did not enter: a save called on some ranks only (DeepSpeed's save_checkpoint must run on every rank)")
        fixes = ["call engine.save_checkpoint / trainer.save_model on every rank, not under `if rank == 0`"]
    else:
        phases = {}
        for s in states:
            phases.setdefault(s.phase, []).append(s)
        odd = min(phases.values(), key=len) if len(phases) > 1 else []
        cause = ("ranks wait in different places: " + "; ".join(lines)) if len(phases) > 1 else \
            "every rank waits in the same collective: a peer outside this job, the network, or the transport " \
            "(see the NCCL flight recorder dump)"
        fixes = ["compare the ranks' stacks in stacks-rank-N.txt", "with NCCL: python -m torch.distributed.flight_recorder.fr_trace on the nccl-trace-rank-N files"]
    shown = odd or states
    where_frames = []
    for s in shown[:2]:
        where_frames.extend(where(s.frames))
    return {"ranks": sorted(s.rank for s in odd) + missing, "where": where_frames,
            "reason": base + ": " + "; ".join(lines), "cause": cause, "fixes": fixes, "ranks_detail": lines}
