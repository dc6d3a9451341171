"""The hang watchdog: no rank progressed for the timeout -> stacks, flight recorder, ``hang.json``.

It reads heartbeats (``heartbeat-rank-N.json``) and the size of every ``rank-N.jsonl``; progress is
any change of either. On a hang it asks every live rank for its stacks (faulthandler's signal, see
:mod:`zeropilot.guard.rank`), asks NCCL's flight recorder for a dump through its pipe where the
ranks use NCCL, waits a moment for both, and writes the verdict of :mod:`zeropilot.guard.hangs`.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from zeropilot.guard.flight import read_dump, summarize as fr_summary
from zeropilot.guard.hangs import MARKER, RankState, hang_verdict, parse_stacks, where
from zeropilot.guard.locks import find_locks
from zeropilot.runlog.layout import RunDir, write_json_atomic
from zeropilot.runlog.read import read_side_json

STACK_SIGNAL = signal.SIGUSR2
PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_WAIT_S = 2.0
FR_WAIT_S = 5.0  # more, only while a rank with a flight-recorder pipe has not dumped yet
#: before any rank exists (the launcher starting, a rendezvous waiting for nodes) the watchdog waits this
#: long at least: a rank is live from its interpreter's start, so this only covers the launcher itself
STARTUP_GRACE_S = 120.0


def _alive(pid: Optional[int]) -> Optional[bool]:
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


class Watchdog:
    """Polled by the supervisor; :meth:`poll` returns the hang record once, when it fires."""

    def __init__(self, run_dir: Path, timeout_s: float, action: str, world_size: Optional[int],
                 env: Dict[str, str]) -> None:
        self.dir = RunDir(run_dir)
        self.timeout_s = timeout_s
        self.action = action
        self.world_size = world_size
        self.env = env
        self.last_key: Tuple = ()
        self.last_change = time.time()
        self.fired = False

    def _key(self) -> Tuple:
        parts = []
        problems: List[str] = []
        for r in self.dir.ranks("heartbeat-rank"):
            hb = read_side_json(self.dir.heartbeat(r), problems) or {}
            parts.append((r, hb.get("progress"), hb.get("phase"), hb.get("activity")))
        for r in self.dir.ranks("rank"):
            try:
                parts.append((r, os.path.getsize(self.dir.events(r))))
            except OSError:
                pass
        return tuple(parts)

    def poll(self) -> Optional[Dict]:
        if self.fired:
            return None
        key = self._key()
        now = time.time()
        if key != self.last_key:
            self.last_key, self.last_change = key, now
            return None
        limit = self.timeout_s if key else max(self.timeout_s, STARTUP_GRACE_S)
        if now - self.last_change < limit:
            return None
        self.fired = True
        return self.fire()

    def _beats(self) -> Dict[int, Dict]:
        problems: List[str] = []
        return {r: read_side_json(self.dir.heartbeat(r), problems) or {} for r in self.dir.ranks("heartbeat-rank")}

    def request_dumps(self, beats: Dict[int, Dict]) -> None:
        """Stacks from every live rank; the NCCL flight recorder where its pipe exists (waits for its files)."""
        for rank, hb in beats.items():
            if hb.get("host") not in (None, socket.gethostname()):
                continue  # a rank of another node in a shared run directory: its pid means nothing here
            pid = hb.get("pid")  # the signal faulthandler listens on (guard.rank: ZEROPILOT_STACK_SIGNAL)
            if _alive(pid):
                try:
                    with open(self.dir.stacks(rank), "a", encoding="utf-8") as fh:
                        fh.write(f"\n{MARKER} {time.time():.3f} ---\n")
                    os.kill(pid, STACK_SIGNAL)
                except OSError:
                    pass
            pipe = self.env.get(PIPE_ENV)
            if pipe:
                self._poke_pipe(Path(f"{pipe}{rank}.pipe"))
        time.sleep(DUMP_WAIT_S)
        pipes = [r for r in beats if Path(f"{self.env.get(PIPE_ENV, '')}{r}.pipe").exists()] if self.env.get(PIPE_ENV) else []
        deadline = time.time() + FR_WAIT_S
        while pipes and time.time() < deadline and not all(self.dir.flight_recorder(r).exists() for r in pipes):
            time.sleep(0.5)

    @staticmethod
    def _poke_pipe(path: Path) -> None:
        try:
            fd = os.open(str(path), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return  # no pipe (not NCCL) or nobody reading
        try:
            os.write(fd, b"1\n")
        except OSError:
            pass
        finally:
            os.close(fd)

    def _flight_recorder(self) -> Optional[Dict]:
        """What the NCCL flight-recorder dumps say (torch-free reader), or None without dumps."""
        dumps = {}
        for r in self.dir.ranks("rank"):
            dump = read_dump(self.dir.flight_recorder(r))
            if dump is not None:
                dumps[r] = dump
        return fr_summary(dumps) if dumps else None

    def fire(self) -> Dict:
        beats = self._beats()
        self.request_dumps(beats)
        states = []
        for rank, hb in sorted(beats.items()):
            try:
                text = self.dir.stacks(rank).read_text(encoding="utf-8", errors="replace")[-1_000_000:]
            except OSError:
                text = ""
            states.append(RankState(rank=rank, phase=hb.get("phase"), step=hb.get("step"),
                                    phase_since=hb.get("phase_since"), alive=_alive(hb.get("pid")),
                                    frames=parse_stacks(text)))
        early = not states or any(s.phase in ("startup", "init") or s.step in (0, None) for s in states)
        locks = find_locks(self.env) if early else []
        verdict = hang_verdict(states, self.world_size, self.timeout_s, locks)
        fr = self._flight_recorder()
        if fr is not None and fr["text"]:
            verdict["reason"] += "; " + "; ".join(fr["text"])
            if fr["desync"]:
                verdict["cause"] = fr["text"][0] + ". " + verdict["cause"]
        record = {"t": time.time(), "timeout_s": self.timeout_s, "action": self.action,
                  "ranks": [{"rank": s.rank, "phase": s.phase, "phase_since": s.phase_since, "step": s.step,
                             "alive": s.alive, "where": where(s.frames, limit=10),
                             "stack_file": self.dir.stacks(s.rank).name if s.frames else None} for s in states],
                  "locks": locks, "verdict": verdict,
                  "flight_recorder": sorted(p.name for p in self.dir.root.glob("nccl-trace-rank-*")),
                  "flight_recorder_summary": fr}
        write_json_atomic(self.dir.hang_file, record)
        return record
