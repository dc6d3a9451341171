"""The job's processes as Linux shows them in ``/proc``: compilers building an op, a rank's children.

The supervisor starts the job in a session of its own (``start_new_session``); the job's processes are those of
that session and every descendant of its first process (launchers start their ranks in sessions of their own:
torchrun's workers do); ``/proc/PID/stat`` gives session, parent, state and CPU time, and
``/proc/PID/cwd`` the folder a compiler runs in (PyTorch runs ninja in the op's build folder). Read on demand
only (when the watchdog is about to fire), bounded by :data:`MAX_PROCS`; elsewhere than Linux it finds nothing.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Dict, List, Optional

MAX_PROCS = 20000
#: programs of a C++/CUDA extension build (PyTorch's JIT: ninja driving the compiler and the linker)
COMPILERS = frozenset({"ninja", "c++", "g++", "gcc", "cc", "cc1plus", "cc1", "clang", "clang++", "nvcc", "cicc",
                       "ptxas", "fatbinary", "nvlink", "ld", "ld.gold", "ld.lld", "collect2", "as", "hipcc",
                       "amdclang++", "lld", "make", "cmake", "cudafe++"})


@dataclass(frozen=True)
class Proc:
    """One process: id, name (``comm``), parent, session, state, CPU ticks used (user + system)."""

    pid: int
    comm: str
    ppid: int
    session: int
    state: str
    ticks: int


def read_proc(pid: int) -> Optional[Proc]:
    """``/proc/PID/stat`` of one process, or None (gone, not Linux, unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    try:
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        return Proc(pid, comm, int(rest[1]), int(rest[3]), rest[0], int(rest[11]) + int(rest[12]))
    except (ValueError, IndexError):
        return None


def scan(session: Optional[int] = None) -> List[Proc]:
    """Every process (of one session when given), at most :data:`MAX_PROCS`."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in names[:MAX_PROCS]:
        if name.isdigit():
            p = read_proc(int(name))
            if p is not None and p.state != "Z" and (session is None or p.session == session):
                out.append(p)
    return out


def job(root: int) -> List[Proc]:
    """The job's processes: those of session ``root`` and every descendant of process ``root``."""
    every = scan()
    kids: Dict[int, List[Proc]] = {}
    for p in every:
        kids.setdefault(p.ppid, []).append(p)
    out = {p.pid: p for p in every if p.session == root}
    todo, seen = [root, *out], {root, *out}
    while todo:
        for child in kids.get(todo.pop(), []):
            if child.pid not in seen:
                seen.add(child.pid)
                out[child.pid] = child
                todo.append(child.pid)
    return list(out.values())


def cwd(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def compilers(root: int) -> List[Dict[str, object]]:
    """The job's compiler processes now (:func:`job`): pid, name, CPU ticks, working folder."""
    return [{"pid": p.pid, "comm": p.comm, "ticks": p.ticks, "cwd": cwd(p.pid)}
            for p in job(root) if p.comm in COMPILERS]


def kill_session(sid: int) -> None:
    """SIGKILL process group ``sid`` and every other process of session ``sid``: ninja starts each compiler in a
    process group of its own, so a group kill alone leaves a stopped build's compiler running (it then writes its
    object file after the stop, into a folder whose lock the stop has removed)."""
    _kill(os.killpg, sid)
    for p in scan(session=sid):
        _kill(os.kill, p.pid)


def _kill(kill, target: int) -> None:
    try:
        kill(target, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> List[int]:
    """Direct children of a process (``/proc/PID/task/*/children``): a rank's DataLoader workers."""
    out: List[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks[:256]:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                out.extend(int(x) for x in fh.read().split() if x.isdigit())
        except OSError:
            continue
    return sorted(set(out))
