"""A rank's records as the reader keeps them (``runlog.read``): step records as columns of ``array('d')``, the
rest whole, within the run's budget; the lower layer both ``runlog.read`` (a run directory) and ``runlog.segread``
(a rank's segments, whole or sampled) fold records into, so neither imports the other.
"""

from __future__ import annotations

import json
import math
import os
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.runlog.events import MEMORY_FIELDS

MAX_LINE = 1 << 20
MAX_SIDE_FILE = 64 << 20
MAX_STEP_ROWS = 4_000_000  # all ranks together: 14 columns of 8 bytes and 12 of 4, about 640 MB at most
MAX_EVENTS = 200_000  # non-step records, all ranks together
MAX_STACK = 1 << 20
#: a run of at most this many step records (all ranks) is read whole; a longer one is read sampled (module doc): the
#: report of a whole reading costs about 11 us a step record (64 ranks x 10k steps: 7.2 s), of a sampled one 0.07 to
#: 0.2 us (1,024 x 10k: 1.9 s; 1,024 x 100k: 7.1 s; bench/report/results/scale.md), so it stays within seconds
FULL_ROWS = 250_000
#: the step records a sampled run keeps at most (all ranks), on top of those around other records and the last ones
SAMPLE_ROWS = 400_000
#: step-record fields without a column of their own, kept as columns by name (``mem.x``, ``loss``) per rank
MAX_EXTRA_COLUMNS = 32
#: the phases of a step record's ``phase_seconds`` (``guard.rank``) kept as columns, as ``(phase, column)``: the
#: time before the forward (loading data) and in it (stragglers, ``runlog.stragglers``), in saves and loads
#: (learned timeouts, ``runlog.timeouts``), in the backward and the optimizer step (the step's split,
#: ``runlog.timing``); float32 (``array('f')``): seconds need no more
PHASE_COLUMNS = (("idle", "idle_seconds"), ("forward", "forward_seconds"), ("save", "save_seconds"),
                 ("load", "load_seconds"), ("backward", "backward_seconds"), ("step", "step_phase_seconds"))
#: the seconds of every other phase a step record holds (``init``, ``startup``, ``collective``), summed: with the
#: columns above they add up to the step's ``seconds``
OTHER_PHASES = "other_phase_seconds"
#: a step record's ``batch`` (``guard.rank``) kept as columns, as ``(key, column)``: the micro batches of the step,
#: the largest micro batch and padded length among them (``runlog.timing``: the batch the plan is asked about)
BATCH_COLUMNS = (("micro_batches", "micro_batches"), ("micro_batch_size", "micro_batch_size"), ("seq_len", "seq_len"))
#: a step record's own-time fields (``guard.rank``) kept as columns: the seconds its DataLoader took to hand over the
#: step's batches (``guard.data_time``) and the GPU probe read at its end (``guard.gpu_probe``): stragglers
OWN_COLUMNS = ("data_seconds", "gpu_probe_seconds")
STEP_COLUMNS = (("t", "step", "seconds") + MEMORY_FIELDS + tuple(c for _, c in PHASE_COLUMNS) + (OTHER_PHASES,)
                + tuple(c for _, c in BATCH_COLUMNS) + OWN_COLUMNS)
_FLOAT32 = frozenset(c for _, c in PHASE_COLUMNS + BATCH_COLUMNS) | {OTHER_PHASES} | frozenset(OWN_COLUMNS)
_NAMED_PHASES = frozenset(p for p, _ in PHASE_COLUMNS)
#: the key path of each column in a step record (``runlog.segments``' paths), and back
COLUMN_PATHS: Dict[str, Tuple[str, ...]] = {"t": ("t",), "step": ("step",), "seconds": ("seconds",),
                                            **{f: ("mem", f) for f in MEMORY_FIELDS},
                                            **{c: ("phase_seconds", p) for p, c in PHASE_COLUMNS},
                                            **{c: ("batch", k) for k, c in BATCH_COLUMNS},
                                            **{c: (c,) for c in OWN_COLUMNS}}
PATH_COLUMNS = {p: c for c, p in COLUMN_PATHS.items()}
_KNOWN_TOP = frozenset({"v", "event", "t", "rank", "step", "seconds", "mem", "phase_seconds", "batch", *OWN_COLUMNS})
_MEM_KEYS = frozenset(MEMORY_FIELDS)
_BATCH_KEYS = frozenset(k for k, _ in BATCH_COLUMNS)
_KNOWN_IN = {"mem": _MEM_KEYS, "phase_seconds": _NAMED_PHASES, "batch": _BATCH_KEYS}
NAN = float("nan")
_decode = json.JSONDecoder().decode
_EMPTY: Dict[str, Any] = {}


def extra_name(path: Tuple[str, ...]) -> Optional[str]:
    """The column name of a step-record field the reader has no column for (``mem.new_field``, ``loss``,
    ``batch.tokens``), or None: a field it knows, a path below one, or deeper than three keys."""
    if len(path) > 3:
        return None
    known = _KNOWN_IN.get(path[0])
    if known is None:
        return None if path[0] in _KNOWN_TOP else ".".join(path)
    return ".".join(path) if len(path) > 1 and path[1] not in known else None


@dataclass
class ColStats:
    """Exact aggregates of one column over every step record of a rank (a sampled reading holds fewer rows):
    how many numbers, the smallest and largest and the ``(step, t)`` of the first row holding each, their sum."""

    n: int
    lo: float
    hi: float
    total: float
    lo_at: Tuple[Optional[float], Optional[float]]
    hi_at: Tuple[Optional[float], Optional[float]]

    def merge(self, later: "ColStats") -> "ColStats":
        """These aggregates with those of later rows (a tie keeps the earlier row)."""
        lo, lo_at = (self.lo, self.lo_at) if self.lo <= later.lo else (later.lo, later.lo_at)
        hi, hi_at = (self.hi, self.hi_at) if self.hi >= later.hi else (later.hi, later.hi_at)
        return ColStats(self.n + later.n, lo, hi, self.total + later.total, lo_at, hi_at)


@dataclass
class RankRecords:
    """What one rank recorded."""

    rank: int
    steps: Dict[str, array] = field(default_factory=lambda: {c: array("f" if c in _FLOAT32 else "d")
                                                             for c in STEP_COLUMNS})
    events: List[Dict[str, Any]] = field(default_factory=list)  # every record but steps, in file order
    #: sampled reading (module doc): the step stride of the sample held in ``steps``; None: every step record
    sample_every: Optional[int] = None
    #: sampled reading: the rank's step records in all, and exact aggregates per column over all of them
    total_steps: Optional[int] = None
    stats: Dict[str, ColStats] = field(default_factory=dict)
    _computed: Dict[str, Optional[ColStats]] = field(default_factory=dict, repr=False)

    @property
    def n_steps(self) -> int:
        """Step rows held (all of them, or the sample)."""
        return len(self.steps["t"])

    @property
    def step_records(self) -> int:
        """Step records the rank wrote (more than :attr:`n_steps` when sampled)."""
        return self.total_steps if self.total_steps is not None else self.n_steps

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    def column(self, name: str) -> List[Optional[float]]:
        return [None if math.isnan(x) else x for x in self.steps[name]]

    def col_stats(self, name: str) -> Optional[ColStats]:
        """Aggregates of a column over every step record (None: no number in it)."""
        if self.sample_every is not None:
            return self.stats.get(name)
        if name not in self._computed:
            self._computed[name] = self._stats_of(name)
        return self._computed[name]

    def _stats_of(self, name: str) -> Optional[ColStats]:
        col = self.steps.get(name)
        if col is None:
            return None
        nums = [x for x in col if x == x]  # NaN != NaN
        if not nums:
            return None
        lo, hi = min(nums), max(nums)
        i_lo, i_hi = col.index(lo), col.index(hi)
        step, t = self.steps["step"], self.steps["t"]
        return ColStats(len(nums), lo, hi, math.fsum(nums), (step[i_lo], t[i_lo]), (step[i_hi], t[i_hi]))

    def col_max(self, name: str) -> Optional[float]:
        s = self.col_stats(name)
        return None if s is None else s.hi

    def col_min(self, name: str) -> Optional[float]:
        s = self.col_stats(name)
        return None if s is None else s.lo

    def shift_time(self, offset: float) -> None:
        """Move every time of the step records back by ``offset`` seconds (a node's clock aligned)."""
        col = self.steps["t"]
        for i in range(len(col)):
            col[i] -= offset
        self._computed.clear()
        for name, s in self.stats.items():
            if name == "t":
                s = ColStats(s.n, s.lo - offset, s.hi - offset, s.total - s.n * offset, s.lo_at, s.hi_at)
            self.stats[name] = ColStats(s.n, s.lo, s.hi, s.total, _later(s.lo_at, offset), _later(s.hi_at, offset))


def _later(at: Tuple[Optional[float], Optional[float]], offset: float) -> Tuple[Optional[float], Optional[float]]:
    return at[0], None if at[1] is None else at[1] - offset


@dataclass
class RunRecords:
    """Everything in a run directory, read once."""

    root: Path
    run: Optional[Dict[str, Any]]
    ranks: Dict[int, RankRecords]
    ooms: Dict[int, Dict[str, Any]]
    hang: Optional[Dict[str, Any]]
    heartbeats: Dict[int, Dict[str, Any]]
    problems: List[str]
    stacks: Dict[int, str] = field(default_factory=dict)  # stacks-rank-N.txt, bounded, undecodable bytes replaced
    # run-node-K.json of each node's supervisor (a job across nodes, ``runlog.job``): file key -> record
    node_runs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    rank_dirs: Dict[int, Path] = field(default_factory=dict)  # rank -> the directory its records came from
    clock: Optional[Dict[str, Any]] = None  # how the nodes' clocks were aligned (``runlog.job.align_clocks``)
    timeouts: Optional[Dict[str, Any]] = None  # timeouts.json as read (``runlog.timeouts.from_json`` checks it)
    heal: Optional[Dict[str, Any]] = None  # heal.json of a ``zeropilot run --heal`` (its root directory)


LIMIT = float(1 << 62)  # no time, step, second count or byte count of a real run comes near 4.6e18


def _number(value: Any) -> float:
    """A float, or NaN for null, non-numbers, NaN, infinities and magnitudes over :data:`LIMIT`.

    The common cases (an int of a sane size, a finite float) are tested first by exact type: this
    runs 14 times per step record, 11 million times for 100k steps x 8 ranks.
    """
    kind = type(value)
    if kind is int or kind is float:
        return float(value) if -LIMIT < value < LIMIT else NAN  # NaN compares false: NaN
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NAN
    return float(value) if -LIMIT < value < LIMIT else NAN


@dataclass
class _Budget:
    """What is left of the run's row budgets, shared by every rank's reader."""

    steps: int
    events: int
    dropped_steps: int = 0
    dropped_events: int = 0
    stride: Optional[int] = None  # the sample's step stride (None: every step record is read)
    planned: bool = False  # the stride was chosen for the whole job (several directories), not per directory


def regular_file(path: Path, problems: List[str]) -> bool:
    """True for a regular file that is not a symbolic link; a note for anything else that exists.

    The guard writes only regular files. A FIFO or a device would block or never end a read, and a
    link could make the report read a file outside the directory the user named.
    """
    kind = safefile.kind_of(path, follow_symlinks=False)
    if kind in (None, "file"):
        return kind == "file"
    problems.append(f"{path.name}: {'a symbolic link' if kind == 'symlink' else 'not a regular file'}, not read")
    return False


def _open(path: Path, problems: List[str]) -> Optional[int]:
    """A descriptor of a regular file of the run (no symlink, no FIFO: :mod:`zeropilot.safefile`), or None."""
    try:
        return safefile.open_regular(path, follow_symlinks=False)
    except safefile.UnsafePathError:  # swapped in after regular_file() looked
        problems.append(f"{path.name}: not a regular file, not read")
    except InputError as exc:
        problems.append(f"{path.name}: unreadable ({exc.reason})")
    return None


def _lines(path: Path, problems: List[str]) -> Iterator[Dict[str, Any]]:
    skipped = 0
    fd = _open(path, problems)
    if fd is None:
        return
    with os.fdopen(fd, "rb") as fh:
        while True:
            raw = fh.readline(MAX_LINE + 1)
            if not raw:
                break
            if len(raw) > MAX_LINE:
                skipped += 1
                while raw and not raw.endswith(b"\n"):  # drain the rest of the long line
                    raw = fh.readline(MAX_LINE)
                continue
            try:
                record = _decode(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; deep nesting recurses
                skipped += 1  # a torn last line after a kill, or garbage
                continue
            if isinstance(record, dict):
                yield record
            else:
                skipped += 1
    if skipped:
        problems.append(f"{path.name}: {skipped} unreadable line(s) skipped")


def read_rank(path: Path, rank: int, problems: List[str], budget: Optional[_Budget] = None) -> RankRecords:
    """One rank's records from one file of JSON lines: steps as columns, the rest whole, within the run's budgets."""
    records = RankRecords(rank)
    fold_records(records, _lines(path, problems), budget if budget is not None else _Budget(MAX_STEP_ROWS,
                                                                                             MAX_EVENTS))
    finish_columns(records)
    return records


def fold_records(records: RankRecords, recs: Iterator[Dict[str, Any]], budget: _Budget) -> None:
    """Append records read one by one: a step record to the columns, any other to ``events``."""
    cols = records.steps
    t_col, step_col, secs_col = cols["t"], cols["step"], cols["seconds"]
    mem_cols = [(name, cols[name]) for name in MEMORY_FIELDS]
    phase_cols = [(phase, cols[name]) for phase, name in PHASE_COLUMNS]
    other_col = cols[OTHER_PHASES]
    batch_cols = [(key, cols[name]) for key, name in BATCH_COLUMNS]
    own_cols = [(name, cols[name]) for name in OWN_COLUMNS]
    for rec in recs:
        if rec.get("event") != "step":
            if budget.events <= 0:
                budget.dropped_events += 1
                continue
            budget.events -= 1
            records.events.append(rec)
            continue
        if budget.steps <= 0:
            budget.dropped_steps += 1
            continue
        budget.steps -= 1
        mem = rec.get("mem")
        get = mem.get if isinstance(mem, dict) else _EMPTY.get
        row = len(t_col)
        t_col.append(_number(rec.get("t")))
        step_col.append(_number(rec.get("step")))
        secs_col.append(_number(rec.get("seconds")))
        for name, col in mem_cols:
            col.append(_number(get(name)))
        phases = rec.get("phase_seconds")
        if type(phases) is dict:  # a phase the step did not enter took 0 s; no phase_seconds: unknown
            get = phases.get
            for name, col in phase_cols:
                col.append(_number(get(name, 0.0)))
            other_col.append(0.0 if phases.keys() <= _NAMED_PHASES else _other(phases))
        else:
            for name, col in phase_cols:
                col.append(NAN)
            other_col.append(NAN)
            phases = _EMPTY
        batch = rec.get("batch")
        get = batch.get if type(batch) is dict else _EMPTY.get
        for name, col in batch_cols:
            col.append(_number(get(name)))
        for name, col in own_cols:
            col.append(_number(rec.get(name)))
        unknown = [((), rec.keys() - _KNOWN_TOP, rec)]
        for key, part, known in (("mem", mem, _MEM_KEYS), ("phase_seconds", phases, _NAMED_PHASES),
                                 ("batch", batch, _BATCH_KEYS)):
            if type(part) is dict and part:
                unknown.append(((key,), part.keys() - known, part))
        if any(keys for _, keys, _ in unknown):
            _fold_extras(records, unknown, row)


def _fold_extras(records: RankRecords, unknown: List[Tuple[Tuple[str, ...], Any, Dict[str, Any]]], row: int) -> None:
    """A step record's fields without a column of their own, as columns by name (:func:`extra_name`): ``unknown``
    holds ``(prefix, keys, object)`` for the record and each of its objects with keys the reader has no column for."""
    from zeropilot.runlog.segments import MAX_DEPTH, flatten

    paths: List[Tuple[str, ...]] = []
    values: List[Any] = []
    for prefix, keys, obj in unknown:
        for key in sorted(keys, key=list(obj).index) if len(keys) > 1 else keys:
            value = obj[key]
            if type(value) is dict and value and len(prefix) < MAX_DEPTH:
                flatten(value, prefix + (key,), len(prefix) + 1, paths, values)
            else:
                paths.append(prefix + (key,))
                values.append(value)
    for path, value in zip(paths, values):
        name = extra_name(path)
        if name is not None and type(value) in (int, float):
            set_extra(records, name, row, _number(value))


def set_extra(records: RankRecords, name: str, row: int, value: float) -> None:
    """Row ``row`` of the extra column ``name`` (created, NaN before, when it is new and the rank has room)."""
    extend_extra(records, name, row, array("d", (value,)))


def extend_extra(records: RankRecords, name: str, row: int, values: array) -> None:
    """Rows ``row`` on of the extra column ``name`` (:func:`set_extra`, for many rows at once)."""
    col = records.steps.get(name)
    if col is None:
        if len(records.steps) >= len(STEP_COLUMNS) + MAX_EXTRA_COLUMNS:
            return
        col = records.steps[name] = array("d")
    if len(col) < row:
        col.extend(array("d", [NAN]) * (row - len(col)))
    col.extend(values)


def finish_columns(records: RankRecords) -> None:
    """Extra columns padded with NaN to the rank's rows."""
    n = records.n_steps
    for name, col in records.steps.items():
        if len(col) < n:
            col.extend(array(col.typecode, [NAN]) * (n - len(col)))


def _other(phases: Dict[str, Any]) -> float:
    """The seconds of a step's phases that have no column of their own, summed (NaN when one of them is not a
    number: a sum that would not add up)."""
    total = 0.0
    for i, (name, value) in enumerate(phases.items()):
        if i >= 64:  # the guard records a handful of phases; a stranger's thousands are not read
            return NAN
        if name not in _NAMED_PHASES:
            total += _number(value)
    return total if -LIMIT < total < LIMIT else NAN
