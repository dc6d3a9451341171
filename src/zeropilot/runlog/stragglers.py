"""Stragglers: a rank whose own share of each step, or whose GPU, stays well above its peers', from the step records.

In a data-parallel job every rank's optimizer step ends in the same collectives, so the step time (``seconds``)
is the same on every rank: a slow rank makes the others wait, and they are as slow as it is. What differs is what
is the rank's **own**:

- **its data time**: the seconds its DataLoader's iterator took to hand over its batches (``data_seconds``,
  ``guard.data_time``), whatever the framework does after it: the HF Trainer gathers the batch's token count across
  ranks before the forward, so the time before the forward (phase ``idle``) holds the slowest rank's loading on
  every rank there. Where a step has no ``data_seconds`` (older records, a loop without a torch DataLoader) the
  phase ``idle`` stands in for it: in a raw loop it is the rank's own (loading its batch before the forward);
- **its forward** below ZeRO-3 (the parameters are whole on every rank, no collective): ZeRO-3 gathers parameters
  inside the forward, which then waits for the slowest rank;
- **its GPU's speed**: a fixed matrix product the guard times on the card every few steps (``gpu_probe_seconds``,
  ``guard.gpu_probe``): a slow card runs behind asynchronous launches, which no CPU time shows.

:func:`find` compares, step by step, each rank's own seconds with the median of its peers' (NVRx's relative
section scores). A rank is a straggler when its own seconds are at least :data:`RATIO` x its peers' median and the
difference is at least :data:`MIN_EXCESS_FRACTION` of the step (so that noise on a near-zero data time is not a
finding), for at least :data:`MIN_STEPS` steps in a row. :func:`find_gpu` compares the probe's readings in windows
of :data:`PROBE_WINDOW` probes (their mean: a card shared with another process is slowed in time slices, which hit
some probes and not others): a rank whose mean is at least :data:`PROBE_RATIO` x its peers' median for
:data:`MIN_WINDOWS` windows in a row has a slow GPU.

Pure functions over step times; no torch. The report, ``zeropilot top``, the trackers (``guard.metrics``) and the
watchdog's hang cause (``runner.watchdog``) use them; ``docs/run.md`` ("Stragglers") describes them for users.
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
PROBE_RATIO = 1.25
PROBE_WINDOW = 4  # probes per window (every rank probes at the same steps: guard.gpu_probe)
MIN_WINDOWS = 2
OWN_LIMIT_S = 1e4  # a data time or probe reading above this is no reading (a stranger's record)


@dataclass(frozen=True)
class StepTimes:
    """One rank's step: its number, its duration, the seconds of the phases before any wait for a peer, its data
    time (``data_seconds``: None where the rank's DataLoader was not timed) and the GPU probe read at its end."""

    step: int
    seconds: Optional[float]
    idle: Optional[float]
    forward: Optional[float]
    data: Optional[float] = None
    probe: Optional[float] = None


def own_phases(zero_stage: Optional[int]) -> Tuple[str, ...]:
    """The phases a rank spends without waiting for its peers: data loading; the forward too below ZeRO-3."""
    return ("idle",) if zero_stage is None or zero_stage >= 3 else ("idle", "forward")


def part(st: StepTimes, phase: str) -> Optional[float]:
    """A rank's own seconds in ``phase`` of a step: for ``idle`` (loading its batch) its data time where timed."""
    return st.data if phase == "idle" and st.data is not None else getattr(st, phase)


def own_seconds(st: StepTimes, phases: Sequence[str]) -> Optional[float]:
    """The rank's own seconds in a step (None when the record has no phase times)."""
    total = 0.0
    for p in phases:
        value = part(st, p)
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
        self.data_steps = 0  # steps of the run whose data time was timed in the DataLoader (not the idle phase)
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


def _aligned_rows(ranks: Mapping[int, Iterable[StepTimes]], phases: Sequence[str]
                  ) -> Iterator[Dict[int, Tuple[StepTimes, float]]]:
    """:func:`_rows` of ranks that hold the same steps, each once and in increasing order (a sampled reading; a job
    whose ranks all ran to the end): the i-th step of every rank together, without merging 1,024 streams."""
    order = sorted(ranks)
    for sts in zip(*[ranks[r] for r in order]):
        row = {}
        for r, st in zip(order, sts):
            own = own_seconds(st, phases)
            if own is not None:
                row[r] = (st, own)
        yield row


def _slow_steps(ranks: Mapping[int, Iterable[StepTimes]], phases: Sequence[str], aligned: bool = False
                ) -> Dict[int, _Run]:
    """Per rank, its longest run of consecutive slow steps (steps that several ranks recorded, in order;
    ``aligned``: every rank's steps are the same, each once, in increasing order: :func:`_aligned_rows`)."""
    best: Dict[int, _Run] = {}
    current: Dict[int, _Run] = {}
    names = list(ranks)
    for row in (_aligned_rows if aligned else _rows)(ranks, phases):
        if len(row) < 2:
            continue
        own = {r: o for r, (_, o) in row.items()}
        ordered = sorted(own.values())
        secs = [st.seconds for st, _ in row.values() if st.seconds is not None]
        step_s = statistics.median(secs) if secs else None
        per_phase: Dict[str, List[float]] = {}
        for r in _maybe_slow(names, own, ordered, step_s, current):
            peers = _median_without(ordered, own[r]) if r in own else None
            if peers is None or step_s is None or own[r] < RATIO * peers or \
                    own[r] - peers < MIN_EXCESS_FRACTION * step_s:
                current.pop(r, None)
                continue
            st = row[r][0]
            run = current.setdefault(r, _Run(st.step, phases))
            run.count, run.last = run.count + 1, st.step
            run.data_steps += st.data is not None
            run.own.append(own[r])
            run.peers.append(peers)
            run.step_seconds.append(step_s)
            for p in phases:
                if p not in per_phase:  # sorted once per step, for its slow ranks only
                    per_phase[p] = sorted(part(x, p) for x, _ in row.values())
                run.phase_excess[p].append(part(st, p) - _median_without(per_phase[p], part(st, p)))
            if r not in best or run.count > best[r].count:
                best[r] = run
    return best


def _maybe_slow(names: List[int], own: Dict[int, float], ordered: List[float], step_s: Optional[float],
                current: Dict[int, _Run]) -> List[int]:
    """The ranks of a step that :func:`_slow_steps` must test (those in a run of slow steps, and those whose own
    seconds could be slow: its peers' median is at least that of every rank but the slowest), in ``names``' order;
    at 1,024 ranks a step's test is then a few ranks, not all of them. Every other rank cannot be slow."""
    if step_s is None:
        return [r for r in names if r in current]
    low = _median_without(ordered, ordered[-1])
    floor = max(RATIO * low, low + MIN_EXCESS_FRACTION * step_s)
    floor -= 1e-9 * (abs(floor) + 1.0)  # a margin for rounding: the test itself decides
    return [r for r in names if r in current or own.get(r, floor) > floor]


def find(ranks: Mapping[int, Iterable[StepTimes]], zero_stage: Optional[int],
         places: Optional[Mapping[int, Dict[str, Any]]] = None, aligned: bool = False) -> List[Dict[str, Any]]:
    """The stragglers among ``ranks`` (each rank's steps in order; ``aligned``: the same steps on every rank, each
    once, in increasing order), the slowest first.

    Each: ``rank``, ``ratio`` (its own seconds over its peers' median, median over its slow steps; None when the
    peers' is 0), ``steps`` (how many in a row), ``first_step``, ``last_step``, ``own_seconds`` and
    ``peers_seconds`` (medians), ``excess_seconds`` (what every other rank waits for it per step),
    ``step_seconds`` (the step's median then), ``phase`` (``idle``: loading data, or ``forward``: where the excess
    is), ``phases`` (the phases compared), ``evidence`` (``data``: the DataLoader's time, or ``phases``: the phase
    times, where the DataLoader was not timed), and ``place`` (host, node rank, local rank, GPU) from ``places``.
    """
    phases = own_phases(zero_stage)
    out = []
    for rank, run in _slow_steps(ranks, phases, aligned).items():
        if run.count < MIN_STEPS:
            continue
        own, peers = statistics.median(run.own), statistics.median(run.peers)
        excess = {p: statistics.median(v) for p, v in run.phase_excess.items()}
        phase = max(excess, key=lambda p: excess[p])
        out.append({"rank": rank, "ratio": round(own / peers, 3) if peers > 0 else None,
                    "steps": run.count, "first_step": run.first, "last_step": run.last,
                    "own_seconds": round(own, 6), "peers_seconds": round(peers, 6),
                    "excess_seconds": round(own - peers, 6),
                    "step_seconds": round(statistics.median(run.step_seconds), 6),
                    "phase": phase, "phases": list(phases),
                    "evidence": "data" if phase == "idle" and run.data_steps == run.count else "phases",
                    "place": dict((places or {}).get(rank) or {})})
    out.sort(key=lambda s: (-(s["excess_seconds"]), s["rank"]))
    return out[:MAX_NAMED]


def _where(s: Dict[str, Any]) -> str:
    place = s.get("place") or {}
    where = ", ".join(x for x in (
        f"node {place['node_rank']}" if place.get("node_rank") is not None else None,
        place.get("host"),
        f"GPU {place['gpu']}" if place.get("gpu") is not None else
        (f"local rank {place['local_rank']}" if place.get("local_rank") is not None else None)) if x)
    return f"rank {s['rank']}" + (f" ({where})" if where else "")


def evidence(s: Dict[str, Any]) -> str:
    """What a straggler was named by, in a few words (the HTML table's column)."""
    if s.get("evidence") == "gpu":
        return "GPU probe"
    if s.get("evidence") == "data":
        return "DataLoader time"
    return "loading data" if s.get("phase") == "idle" else "forward"


def describe(s: Dict[str, Any]) -> str:
    """One straggler in words, with the evidence it was named by (text report, ``top``, the run's output, a hang's
    cause): a :func:`find` or a :func:`find_gpu` finding."""
    r = s.get("ratio")
    ratio = "far above" if r is None else f"{r:.1f}×" if r < 100 else "over 100×"
    if s.get("evidence") == "gpu":
        return (f"{_where(s)} has a slow GPU: the guard's fixed matrix product takes {ratio} its peers' median on "
                f"its card ({1e3 * s['own_seconds']:.2f} ms against {1e3 * s['peers_seconds']:.2f} ms), "
                f"{s['probes']} probes in a row (steps {s['first_step']}-{s['last_step']}); every other rank waits "
                "for its kernels")
    if s.get("evidence") == "data":
        what = f"its DataLoader takes {ratio} its peers' median to hand over its batches"
    else:
        what = f"it spends {ratio} its peers' median time " + ("loading its data" if s["phase"] == "idle"
                                                                else "in its forward")
    share = f" ({100 * s['excess_seconds'] / s['step_seconds']:.0f}% of the step)" if s.get("step_seconds") else ""
    return (f"{_where(s)} straggles: {what} ({s['own_seconds']:.2f} s against {s['peers_seconds']:.2f} s a step), "
            f"{s['steps']} steps in a row (steps {s['first_step']}-{s['last_step']}); every other rank waits "
            f"{s['excess_seconds']:.2f} s for it each step{share}")


# -- the GPU probe -------------------------------------------------------------------------------------------


class _ProbeRun:
    """One rank's run of consecutive slow windows."""

    def __init__(self, first: int) -> None:
        self.windows, self.probes, self.first, self.last = 0, 0, first, first
        self.ratios: deque = deque(maxlen=KEPT)
        self.own: deque = deque(maxlen=KEPT)
        self.peers: deque = deque(maxlen=KEPT)


def _probe_rows(ranks: Mapping[int, Iterable[Tuple[int, float]]]) -> Iterator[Tuple[int, Dict[int, float]]]:
    """``(step, {rank: reading})`` for the steps at which two ranks or more read a probe, in order."""
    def keyed(rank: int, probes: Iterable[Tuple[int, float]]) -> Iterator[Tuple[int, int, int, float]]:
        for i, (step, seconds) in enumerate(probes):
            if 0.0 < seconds < OWN_LIMIT_S:
                yield step, rank, i, seconds

    merged = heapq.merge(*[keyed(r, probes) for r, probes in ranks.items()])
    for step, group in itertools.groupby(merged, key=lambda x: x[0]):
        row = {r: seconds for _, r, _, seconds in group}
        if len(row) >= 2:
            yield step, row


def _windows(ranks: Mapping[int, Iterable[Tuple[int, float]]]
             ) -> Iterator[Tuple[int, int, Dict[int, Tuple[float, int]]]]:
    """``(first step, last step, {rank: (mean reading, readings)})`` per window of :data:`PROBE_WINDOW` rows; a rank
    with fewer than half the window's readings is left out of it."""
    rows: List[Tuple[int, Dict[int, float]]] = []
    for row in _probe_rows(ranks):
        rows.append(row)
        if len(rows) < PROBE_WINDOW:
            continue
        sums: Dict[int, List[float]] = {}
        for _, readings in rows:
            for r, x in readings.items():
                sums.setdefault(r, []).append(x)
        yield rows[0][0], rows[-1][0], {r: (sum(v) / len(v), len(v)) for r, v in sums.items()
                                        if 2 * len(v) >= PROBE_WINDOW}
        rows = []


def find_gpu(ranks: Mapping[int, Iterable[Tuple[int, float]]],
             places: Optional[Mapping[int, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """The ranks with a slow GPU, the slowest first, from each rank's ``(step, gpu_probe_seconds)`` in order.

    Each: ``rank``, ``evidence`` (``gpu``), ``ratio`` (its windows' mean over its peers' median, median over its slow
    windows), ``windows`` and ``probes`` (in its longest run of slow windows), ``first_step``, ``last_step`` (the
    steps that run's probes were read at), ``own_seconds`` and ``peers_seconds`` (medians of the windows' means),
    ``place`` as in :func:`find`."""
    best: Dict[int, _ProbeRun] = {}
    current: Dict[int, _ProbeRun] = {}
    for first, last, means in _windows(ranks):
        ordered = sorted(m for m, _ in means.values())
        for r in list(current):
            if r not in means:
                current.pop(r)
        if len(means) < 2:
            current.clear()
            continue
        for r, (mean, n) in means.items():
            peers = _median_without(ordered, mean)
            if peers <= 0 or mean < PROBE_RATIO * peers:
                current.pop(r, None)
                continue
            run = current.setdefault(r, _ProbeRun(first))
            run.windows, run.probes, run.last = run.windows + 1, run.probes + n, last
            run.ratios.append(mean / peers)
            run.own.append(mean)
            run.peers.append(peers)
            if r not in best or run.windows > best[r].windows:
                best[r] = run
    out = [{"rank": r, "evidence": "gpu", "ratio": round(statistics.median(run.ratios), 3),
            "windows": run.windows, "probes": run.probes, "first_step": run.first, "last_step": run.last,
            "own_seconds": round(statistics.median(run.own), 7), "peers_seconds": round(statistics.median(run.peers), 7),
            "place": dict((places or {}).get(r) or {})}
           for r, run in best.items() if run.windows >= MIN_WINDOWS]
    out.sort(key=lambda s: (-s["ratio"], s["rank"]))
    return out[:MAX_NAMED]


def few(found: Sequence[Dict[str, Any]], each: int = 3) -> List[Dict[str, Any]]:
    """The first ``each`` stragglers of each evidence (``data``, ``phases``, ``gpu``), in their order: what one screen
    names of many ranks (``runlog.spread``)."""
    seen: Dict[Any, int] = {}
    out = []
    for s in found:
        seen[s.get("evidence")] = seen.get(s.get("evidence"), 0) + 1
        if seen[s.get("evidence")] <= each:
            out.append(s)
    return out


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
    return find(ranks, stage, {r: place(rec.events) for r, rec in records.ranks.items()}, _aligned(records))


def _aligned(records: Any) -> bool:
    """Every rank holds the same step numbers, each once, in increasing order (no step without a number)."""
    cols = [rec.steps["step"] for rec in records.ranks.values()]
    if not cols or any(c != cols[0] for c in cols[1:]):
        return False
    steps = cols[0]
    return all(x == x for x in steps) and all(int(a) < int(b) for a, b in zip(steps, steps[1:]))


def gpu_from_records(records: Any) -> List[Dict[str, Any]]:
    """:func:`find_gpu` over a run directory's records."""
    ranks = {r: _probes(rec) for r, rec in records.ranks.items()}
    return find_gpu(ranks, {r: place(rec.events) for r, rec in records.ranks.items()})


def _step_times(rec: Any) -> Iterator[StepTimes]:
    """One rank's step columns as :class:`StepTimes`, one at a time (NaN: unknown)."""
    cols = rec.steps
    for step, seconds, idle, fwd, data in zip(cols["step"], cols["seconds"], cols["idle_seconds"],
                                              cols["forward_seconds"], cols["data_seconds"]):
        if step == step:  # NaN != NaN: a record without a step number (and below: no value; _known inlined)
            yield StepTimes(int(step), seconds if seconds == seconds else None, idle if idle == idle else None,
                            fwd if fwd == fwd else None, data if 0.0 <= data < OWN_LIMIT_S else None)


def _probes(rec: Any) -> Iterator[Tuple[int, float]]:
    """One rank's GPU probe readings, ``(step, seconds)``, in order."""
    for step, probe in zip(rec.steps["step"], rec.steps["gpu_probe_seconds"]):
        if step == step and probe == probe:
            yield int(step), probe


def _known(x: float) -> Optional[float]:
    return None if x != x else x


def own_time(x: Any) -> Optional[float]:
    """A recorded data time or probe reading, or None: not a number, negative, or over :data:`OWN_LIMIT_S` (a
    stranger's record is read, never trusted)."""
    return float(x) if type(x) in (int, float) and 0.0 <= x < OWN_LIMIT_S else None
