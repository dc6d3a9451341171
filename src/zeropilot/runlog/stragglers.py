"""Stragglers: a rank whose own share of each step stays well above its peers', from the step records.

In a data-parallel job every rank's optimizer step ends in the same collectives, so the step time (``seconds``)
is the same on every rank: a slow rank makes the others wait, and they are as slow as it is. What differs is the
time each rank spends **before it first waits for a peer**: loading its batch (phase ``idle``, between the end of
the previous step and the forward) and, where the forward holds no collective (ZeRO stage 0-2: the parameters are
whole on every rank), the forward itself. ZeRO-3 gathers parameters inside the forward, so there the forward waits
for the slowest rank and only the data time is the rank's own. The guard records the seconds of every phase in
each step record (``phase_seconds``, ``guard.rank``); this module compares, step by step, each rank's **own
seconds** with the median of its peers' (NVRx's relative section scores, on the sections zeropilot already sees).

A rank is a straggler when its own seconds are at least :data:`RATIO` × its peers' median and the difference is at
least :data:`MIN_EXCESS_FRACTION` of the step (so that noise on a near-zero data time is not a finding), for at
least :data:`MIN_STEPS` steps in a row. A slow GPU whose kernels run behind asynchronous launches shows in the GPU's
timings only, which zeropilot does not take (NVRx times the kernels through CUPTI): the CPU sees that as a step
time that grew on every rank.

Pure functions over step times; no torch. The report, ``zeropilot top`` and the trackers (``guard.metrics``) use
:func:`find`; ``docs/run.md`` ("Stragglers") describes it for users.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

RATIO = 1.5
MIN_EXCESS_FRACTION = 0.1
MIN_STEPS = 5
MAX_NAMED = 8  # stragglers named at most (the slowest first)


@dataclass(frozen=True)
class StepTimes:
    """One rank's step: its number, its duration, and the seconds of the phases before any wait for a peer."""

    step: int
    seconds: Optional[float]
    idle: Optional[float]
    forward: Optional[float]


def own_phases(zero_stage: Optional[int]) -> Tuple[str, ...]:
    """The phases a rank spends without waiting for its peers: data loading; the forward too below ZeRO-3."""
    return ("idle",) if zero_stage is None or zero_stage >= 3 else ("idle", "forward")


def own_seconds(st: StepTimes, phases: Sequence[str]) -> Optional[float]:
    """The rank's own seconds in a step (None when the record has no phase times)."""
    total = 0.0
    for p in phases:
        value = getattr(st, p)
        if value is None:
            return None
        total += value
    return total


def _median_without(ordered: List[float], value: float) -> float:
    """The median of ``ordered`` (sorted, at least two values, ``value`` among them) with one ``value`` taken out;
    O(log n), so that comparing every rank with its peers stays linear in the ranks."""
    i = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1

    def rest(j: int) -> float:
        return ordered[j if j < i else j + 1]

    return rest(m // 2) if m % 2 else (rest(m // 2 - 1) + rest(m // 2)) / 2


KEPT = 4096  # values kept per run of slow steps for its medians (the newest): memory stays bounded in long runs


class _Run:
    """One rank's run of consecutive slow steps: how many, the first and last, the newest values for medians."""

    def __init__(self, first: int, phases: Sequence[str]) -> None:
        self.count, self.first, self.last = 0, first, first
        self.own: deque = deque(maxlen=KEPT)
        self.peers: deque = deque(maxlen=KEPT)
        self.step_seconds: deque = deque(maxlen=KEPT)
        self.phase_excess: Dict[str, deque] = {p: deque(maxlen=KEPT) for p in phases}


def _rows(ranks: Mapping[int, Iterable[StepTimes]], phases: Sequence[str]
          ) -> Iterator[Dict[int, Tuple[StepTimes, float]]]:
    """The steps that ranks recorded, step by step in order: ``{rank: (StepTimes, own seconds)}`` (the ranks' steps
    merged, each rank's in its own order, so that a run of any length is read once, in bounded memory)."""
    def keyed(rank: int, steps: Iterable[StepTimes]) -> Iterator[Tuple[int, int, int, StepTimes, float]]:
        for i, st in enumerate(steps):  # i: a step number recorded twice (a resume) never compares StepTimes
            own = own_seconds(st, phases)
            if own is not None:
                yield st.step, rank, i, st, own

    merged = heapq.merge(*[keyed(r, steps) for r, steps in ranks.items()])
    for _, group in itertools.groupby(merged, key=lambda x: x[0]):
        yield {r: (st, own) for _, r, _, st, own in group}


def _slow_steps(ranks: Mapping[int, Iterable[StepTimes]], phases: Sequence[str]) -> Dict[int, _Run]:
    """Per rank, its longest run of consecutive slow steps (steps that several ranks recorded, in order)."""
    best: Dict[int, _Run] = {}
    current: Dict[int, _Run] = {}
    names = list(ranks)
    for row in _rows(ranks, phases):
        if len(row) < 2:
            continue
        own = {r: o for r, (_, o) in row.items()}
        ordered = sorted(own.values())
        secs = [st.seconds for st, _ in row.values() if st.seconds is not None]
        step_s = statistics.median(secs) if secs else None
        per_phase: Dict[str, List[float]] = {}
        for r in names:
            peers = _median_without(ordered, own[r]) if r in own else None
            if peers is None or step_s is None or own[r] < RATIO * peers or \
                    own[r] - peers < MIN_EXCESS_FRACTION * step_s:
                current.pop(r, None)
                continue
            st = row[r][0]
            run = current.setdefault(r, _Run(st.step, phases))
            run.count, run.last = run.count + 1, st.step
            run.own.append(own[r])
            run.peers.append(peers)
            run.step_seconds.append(step_s)
            for p in phases:
                if p not in per_phase:  # sorted once per step, for its slow ranks only
                    per_phase[p] = sorted(getattr(x, p) for x, _ in row.values())
                run.phase_excess[p].append(getattr(st, p) - _median_without(per_phase[p], getattr(st, p)))
            if r not in best or run.count > best[r].count:
                best[r] = run
    return best


def find(ranks: Mapping[int, Iterable[StepTimes]], zero_stage: Optional[int],
         places: Optional[Mapping[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The stragglers among ``ranks`` (each rank's steps in order), the slowest first.

    Each: ``rank``, ``ratio`` (its own seconds over its peers' median, median over its slow steps; None when the
    peers' is 0), ``steps`` (how many in a row), ``first_step``, ``last_step``, ``own_seconds`` and
    ``peers_seconds`` (medians), ``excess_seconds`` (what every other rank waits for it per step),
    ``step_seconds`` (the step's median then), ``phase`` (``idle``: loading data, or ``forward``: where the excess
    is), ``phases`` (the phases compared), and ``place`` (host, node rank, local rank, GPU) from ``places``.
    """
    phases = own_phases(zero_stage)
    out = []
    for rank, run in _slow_steps(ranks, phases).items():
        if run.count < MIN_STEPS:
            continue
        own, peers = statistics.median(run.own), statistics.median(run.peers)
        excess = {p: statistics.median(v) for p, v in run.phase_excess.items()}
        out.append({"rank": rank, "ratio": round(own / peers, 3) if peers > 0 else None,
                    "steps": run.count, "first_step": run.first, "last_step": run.last,
                    "own_seconds": round(own, 6), "peers_seconds": round(peers, 6),
                    "excess_seconds": round(own - peers, 6),
                    "step_seconds": round(statistics.median(run.step_seconds), 6),
                    "phase": max(excess, key=lambda p: excess[p]), "phases": list(phases),
                    "place": dict((places or {}).get(rank) or {})})
    out.sort(key=lambda s: (-(s["excess_seconds"]), s["rank"]))
    return out[:MAX_NAMED]


def describe(s: Dict[str, Any]) -> str:
    """One straggler in words (text report, ``top``, the run's output)."""
    place = s.get("place") or {}
    where = ", ".join(x for x in (
        f"node {place['node_rank']}" if place.get("node_rank") is not None else None,
        place.get("host"),
        f"GPU {place['gpu']}" if place.get("gpu") is not None else
        (f"local rank {place['local_rank']}" if place.get("local_rank") is not None else None)) if x)
    ratio = f"{s['ratio']:.1f}×" if s.get("ratio") is not None else "far above"
    what = "loading its data" if s["phase"] == "idle" else "in its forward"
    share = f" ({100 * s['excess_seconds'] / s['step_seconds']:.0f}% of the step)" if s.get("step_seconds") else ""
    return (f"rank {s['rank']}" + (f" ({where})" if where else "") + f" straggles: it spends {ratio} its peers' "
            f"median time {what} ({s['own_seconds']:.2f} s against {s['peers_seconds']:.2f} s a step), {s['steps']} "
            f"steps in a row (steps {s['first_step']}-{s['last_step']}); every other rank waits "
            f"{s['excess_seconds']:.2f} s for it each step{share}")


# -- from a run directory ------------------------------------------------------------------------------------


def zero_stage(events: Sequence[Dict[str, Any]]) -> Optional[int]:
    """The ZeRO stage a rank's records name (its ``setup`` record's ``zero.stage``, else ``init``'s), or None."""
    for e in events:
        zero = e.get("zero") if e.get("event") == "setup" else None
        stage = zero.get("stage") if isinstance(zero, dict) else e.get("zero_stage") if e.get("event") == "init" \
            else None
        if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3:
            return stage
    return None


def place(events: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Where a rank ran, from its ``start`` and ``init`` records: ``host``, ``node_rank``, ``local_rank``, ``gpu``
    (the CUDA device index; None on a CPU)."""
    start = next((e for e in events if e.get("event") == "start"), {})
    init = next((e for e in events if e.get("event") == "init"), {})
    node = start.get("node") if isinstance(start.get("node"), dict) else {}
    device = init.get("device") if isinstance(init.get("device"), dict) else {}

    def _int(v: Any) -> Optional[int]:
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 else None

    host = start.get("host") if isinstance(start.get("host"), str) else node.get("hostname")
    return {"host": host[:256] if isinstance(host, str) else None, "node_rank": _int(node.get("node_rank")),
            "local_rank": _int(start.get("local_rank")) if _int(start.get("local_rank")) is not None
            else _int(node.get("local_rank")), "gpu": _int(device.get("index"))}


def from_records(records: Any) -> List[Dict[str, Any]]:
    """:func:`find` over a run directory's records (:class:`zeropilot.runlog.read.RunRecords`)."""
    stage = next((s for s in (zero_stage(rec.events) for rec in records.ranks.values()) if s is not None), None)
    ranks = {r: _step_times(rec) for r, rec in records.ranks.items()}
    return find(ranks, stage, {r: place(rec.events) for r, rec in records.ranks.items()})


def _step_times(rec: Any) -> Iterator[StepTimes]:
    """One rank's step columns as :class:`StepTimes`, one at a time (NaN: unknown)."""
    cols = rec.steps
    for step, seconds, idle, fwd in zip(cols["step"], cols["seconds"], cols["idle_seconds"], cols["forward_seconds"]):
        if step == step:  # NaN != NaN: a record without a step number
            yield StepTimes(int(step), _known(seconds), _known(idle), _known(fwd))


def _known(x: float) -> Optional[float]:
    return None if x != x else x
