"""Preemption seen from the supervisor: SIGTERM or SIGUSR1 to ``zeropilot run`` becomes a save and a clean stop.

Slurm's ``--signal`` and cloud spot notices send one of these some time before the machine goes. When every rank's
guard says it can stop at a step (``stoppable`` in its heartbeat: a Trainer with the guard's callback), the
supervisor writes ``preempt.json`` in the run directory with a ``stop_step`` beyond every rank's last recorded step
(:func:`stop_step`) and lets the job run on: each rank, at the end of that step, saves and leaves its training loop
(:mod:`zeropilot.guard.preempt`), deciding alone from the same file — no collective. After ``grace_s`` the job is
ended as any stop ends it. A raw DeepSpeed loop cannot be made to save: the signal goes to the job at once and the
record says no save was possible. A second signal does not wait.

The margin: a rank reads the file at the end of each optimizer step, so the stop step must lie beyond every step
that may end between the supervisor's reading of the records and the ranks' reading of the file: the steps of
:data:`LEAD_S` seconds at the recorded step time, and one more.

**Across nodes** (a job whose ranks publish heartbeats in its c10d store, :mod:`zeropilot.runner.peers`) the signal
often reaches one node only, and a node that stops alone leaves a checkpoint the other nodes never wrote (or hangs
in the save's collectives). So the preempted node's stop step is the job's: computed over every rank of every node
(the local records, and each remote rank's step in its store heartbeat), with the margin of :data:`SHARED_LEAD_S`
(a heartbeat is up to a beat old, and the other nodes' readers see the request up to a beat and a poll later), and
published under ``zeropilot/stop`` with ``compare_set``: the first node's request holds, a node signalled later
takes that one instead of its own (:func:`request`). Every other node's supervisor reads the key with the
heartbeats and writes the same ``preempt.json`` in its own run directory (:func:`adopt`): every rank of every node
saves at the end of the same step. Key-value calls from the supervisors only, never a collective, nothing a rank
waits for.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.guard.storebeat import STORE_BEAT_S
from zeropilot.runlog.layout import RunDir, write_json_atomic

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
DEFAULT_GRACE_S = 120.0
LEAD_S = 2.0  # seconds between reading the ranks' records and every rank having read the stop request, at most
#: across nodes: a remote step is up to a beat old, the other supervisors read the key up to a beat (and a poll) later
SHARED_LEAD_S = LEAD_S + 2 * STORE_BEAT_S + 1.0
TAIL_BYTES = 64 << 10


def last_steps(folder: Path, rank: int, limit: int = 8) -> List[Dict[str, Any]]:
    """The last ``step`` records of a rank (``step``, ``t``), from the tail of its ``rank-N.jsonl`` (and of its newest
    closed segment when the live file was just begun: ``runlog.events`` closes it every few MB)."""
    d = RunDir(folder)
    out = _steps(_tail(d.events(rank)))
    if len(out) < limit:
        segs = d.segments().get(rank, [])
        newest = segs[-1] if segs else None
        if newest is not None and newest.jsonl is not None:
            out = _steps(_tail(newest.jsonl)) + out
        elif newest is not None and newest.col is not None:
            from zeropilot.runlog.segread import front_records

            recs, _ = front_records(newest.col, True, [])
            out = [{"step": r["step"], "t": r.get("t")} for r in recs
                   if r.get("event") == "step" and isinstance(r.get("step"), int)] + out
    return out[-limit:]


def _tail(path: Path) -> List[bytes]:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(size - TAIL_BYTES, 0))
            data = fh.read(TAIL_BYTES)
    except OSError:
        return []
    return data.splitlines()[1 if size > TAIL_BYTES else 0:]  # a cut first line is no record


def _steps(lines: List[bytes]) -> List[Dict[str, Any]]:
    out = []
    for line in lines[-256:]:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "step" and isinstance(rec.get("step"), int):
            out.append({"step": rec["step"], "t": rec.get("t")})
    return out


def stop_step(steps_by_rank: Dict[int, List[Dict[str, Any]]], lead_s: float = LEAD_S,
              remote: Optional[Dict[int, int]] = None) -> Optional[int]:
    """The step every rank stops at: past the highest recorded step by one, plus the steps of ``lead_s`` seconds
    at the fastest recorded step time; None before any step (nothing to save yet). ``remote``: the other nodes'
    ranks' last steps (from their store heartbeats) count for the highest step."""
    latest = [s[-1]["step"] for s in steps_by_rank.values() if s] + [v for v in (remote or {}).values()
                                                                      if type(v) is int and v >= 0]
    if not latest:
        return None
    gaps = []
    for s in steps_by_rank.values():
        for a, b in zip(s, s[1:]):
            if isinstance(a.get("t"), (int, float)) and isinstance(b.get("t"), (int, float)) and b["step"] > a["step"]:
                gaps.append((b["t"] - a["t"]) / (b["step"] - a["step"]))
    fastest = min((g for g in gaps if g > 0), default=None)
    ahead = math.ceil(lead_s / fastest) if fastest else 1
    return max(latest) + 1 + min(ahead, 10_000)


def stoppable(folder: Path) -> Optional[List[int]]:
    """The ranks (all of those with a heartbeat) when every one can be asked to stop at a step, else None."""
    d = RunDir(folder)
    ranks = d.ranks("heartbeat-rank")
    beats = []
    for r in ranks:
        try:
            with open(d.heartbeat(r), encoding="utf-8") as fh:
                beats.append(json.load(fh))
        except (OSError, ValueError):
            return None
    live = [b for b in beats if isinstance(b, dict) and b.get("phase") != "exit"]
    if not live or not all(b.get("stoppable") is True for b in live):
        return None
    return ranks


def remote_steps(peers: Any) -> Dict[int, int]:
    """Every rank's last step as its store heartbeat says (:class:`zeropilot.runner.peers.Peers`)."""
    beats, _ = peers.snapshot()
    return {r: hb["step"] for r, hb in beats.items() if type(hb.get("step")) is int}


def _cannot(name: str, grace_s: float, why: str) -> Dict[str, Any]:
    return {"signal": name, "t": time.time(), "stop_step": None, "saved_step": None, "grace_s": grace_s, "why": why}


def request(folder: Path, signum: int, grace_s: float, peers: Any = None, node: Optional[int] = None
            ) -> Dict[str, Any]:
    """Write the stop request when the ranks can take one; the ``preempted`` record of ``run.json`` so far.

    With ``peers`` (a job across nodes) the stop step is computed over every node's ranks and published in the
    store; the one that holds there (this node's, or an earlier one of another node) is written. ``node``: this
    node's rank, named in the published request."""
    name = signal.Signals(signum).name
    ranks = stoppable(folder)
    if ranks is None:
        return _cannot(name, grace_s, "the ranks cannot be asked to save (not an HF Trainer with the guard's "
                                      "callback, or not training yet): the signal went to the job at once, no save "
                                      "was possible")
    remote = remote_steps(peers) if peers is not None else None
    stop = stop_step({r: last_steps(folder, r) for r in ranks}, SHARED_LEAD_S if peers is not None else LEAD_S,
                     remote)
    if stop is None:
        return _cannot(name, grace_s, "no step ended yet: nothing to save; the signal went to the job at once")
    mine = {"stop_step": stop, "signal": name, "t": time.time(), "grace_s": grace_s, "node": node}
    shared = None
    if peers is not None:
        held = peers.publish_stop(mine)
        if held is not None and type(held.get("stop_step")) is int:
            shared = {"store": peers.where, "by_node": held.get("node"), "own": held.get("t") == mine["t"]}
            mine = dict(held, signal=name, t=mine["t"], grace_s=grace_s)
    write_json_atomic(RunDir(folder).preempt_file, mine)
    return {"signal": name, "t": mine["t"], "stop_step": mine["stop_step"], "saved_step": None, "grace_s": grace_s,
            "why": None, "node": node, "shared": shared}


def adopt(folder: Path, held: Dict[str, Any], grace_s: float, peers: Any, node: Optional[int]) -> Dict[str, Any]:
    """Another node's stop request, read from the store, taken by this node (no signal here): the same
    ``preempt.json``; the ``preempted`` record of ``run.json`` so far (``signal``: the other node's)."""
    name = str(held.get("signal") or "?")
    stop = held.get("stop_step")
    shared = {"store": peers.where, "by_node": held.get("node"), "own": False}
    if type(stop) is not int or stoppable(folder) is None:
        return dict(_cannot(name, grace_s, f"node {held.get('node')} was preempted, and this node's ranks cannot be "
                                           "asked to save: they stop when the job does"), node=node, shared=shared)
    write_json_atomic(RunDir(folder).preempt_file, {"stop_step": stop, "signal": name, "t": time.time(),
                                                    "grace_s": grace_s, "node": held.get("node")})
    return {"signal": name, "t": time.time(), "stop_step": stop, "saved_step": None, "grace_s": grace_s, "why": None,
            "node": node, "shared": shared}


def outcome(folder: Path, preempted: Dict[str, Any], events_by_rank: Dict[int, List[Dict[str, Any]]]) -> Dict[str, Any]:
    """``preempted`` completed from the ranks' records: the step every rank saved at, or why there is none."""
    out = dict(preempted)
    if out.get("stop_step") is None:
        return out
    took = {r: e for r, evs in events_by_rank.items() for e in evs if e.get("event") == "preempt"}
    saves = {r: [e for e in evs if e.get("event") == "save" and not e.get("error")]
             for r, evs in events_by_rank.items()}
    steps = {e.get("step") for e in took.values()}
    if len(took) == len(events_by_rank) and len(steps) == 1:
        step = steps.pop()
        if all(any(s.get("step") == step for s in saves[r]) for r in took):
            out["saved_step"] = step
            return out
        out["why"] = f"every rank stopped at step {step}, but not every rank recorded its save there"
        return out
    out["why"] = (f"{len(took)} of {len(events_by_rank)} rank(s) took the stop request"
                  + (f" at steps {sorted(steps)}" if steps else "") + "; the job was stopped after the grace period")
    return out
