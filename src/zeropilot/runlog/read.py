"""Reading a run directory: bounded, tolerant of torn last lines, columnar for steps.

Step records are the bulk of a run (100k steps x 8 ranks is 800k lines), so they are kept as
columns of ``array('d')`` (NaN for null) rather than 800k dicts; every other record is kept whole.
A run directory may come from someone else: lines longer than :data:`MAX_LINE` and lines that are
not JSON objects are skipped and counted, never fatal; JSON side files over :data:`MAX_SIDE_FILE`
are refused with a problem note. Memory stays bounded whatever the directory holds: at most
:data:`MAX_STEP_ROWS` step records and :data:`MAX_EVENTS` other records per run are kept (the rest
are counted in a note), and each rank's stack file is read up to :data:`MAX_STACK` bytes.
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
from zeropilot.runlog.layout import RunDir

MAX_LINE = 1 << 20
MAX_SIDE_FILE = 64 << 20
MAX_STEP_ROWS = 4_000_000  # all ranks together: 14 columns of 8 bytes and 12 of 4, about 640 MB at most
MAX_EVENTS = 200_000  # non-step records, all ranks together
MAX_STACK = 1 << 20
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
NAN = float("nan")
_decode = json.JSONDecoder().decode
_EMPTY: Dict[str, Any] = {}


@dataclass
class RankRecords:
    """What one rank recorded."""

    rank: int
    steps: Dict[str, array] = field(default_factory=lambda: {c: array("f" if c in _FLOAT32 else "d")
                                                             for c in STEP_COLUMNS})
    events: List[Dict[str, Any]] = field(default_factory=list)  # every record but steps, in file order

    @property
    def n_steps(self) -> int:
        return len(self.steps["t"])

    def of(self, kind: str) -> List[Dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]

    def column(self, name: str) -> List[Optional[float]]:
        return [None if math.isnan(x) else x for x in self.steps[name]]


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
    """One rank's records: steps as columns, the rest whole, within the run's row budgets."""
    budget = budget if budget is not None else _Budget(MAX_STEP_ROWS, MAX_EVENTS)
    records = RankRecords(rank)
    cols = records.steps
    t_col, step_col, secs_col = cols["t"], cols["step"], cols["seconds"]
    mem_cols = [(name, cols[name]) for name in MEMORY_FIELDS]
    phase_cols = [(phase, cols[name]) for phase, name in PHASE_COLUMNS]
    other_col = cols[OTHER_PHASES]
    batch_cols = [(key, cols[name]) for key, name in BATCH_COLUMNS]
    own_cols = [(name, cols[name]) for name in OWN_COLUMNS]
    for rec in _lines(path, problems):
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
        batch = rec.get("batch")
        get = batch.get if type(batch) is dict else _EMPTY.get
        for name, col in batch_cols:
            col.append(_number(get(name)))
        for name, col in own_cols:
            col.append(_number(rec.get(name)))
    return records


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


def read_side_json(path: Path, problems: List[str]) -> Optional[Dict[str, Any]]:
    """A JSON object file of the run directory, or None (with a note) when absent or unreadable."""
    if not regular_file(path, problems):
        return None
    too_large = f"larger than {MAX_SIDE_FILE >> 20} MiB, not read"
    try:
        data = json.loads(safefile.read_bytes(path, MAX_SIDE_FILE, follow_symlinks=False, too_large=too_large))
    except safefile.UnsafePathError:  # swapped in after regular_file() looked
        problems.append(f"{path.name}: not a regular file, not read")
        return None
    except InputError as exc:
        problems.append(f"{path.name}: " + (too_large if exc.reason == too_large else f"unreadable ({exc.reason})"))
        return None
    except (ValueError, RecursionError) as exc:
        problems.append(f"{path.name}: unreadable ({exc.__class__.__name__})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name}: not a JSON object")
        return None
    return data


def read_stack(path: Path, problems: List[str]) -> Optional[str]:
    """The text of a stacks file, at most :data:`MAX_STACK` bytes of it (a note says when cut)."""
    fd = _open(path, problems) if regular_file(path, problems) else None
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_STACK + 1)
    except OSError as exc:
        problems.append(f"{path.name}: unreadable ({exc.__class__.__name__})")
        return None
    if len(raw) > MAX_STACK:
        problems.append(f"{path.name}: longer than {MAX_STACK >> 20} MiB, only the start is shown")
        raw = raw[:MAX_STACK]
    return raw.decode("utf-8", errors="replace")


def read_run(root: Path, budget: Optional[_Budget] = None) -> RunRecords:
    """Read a run directory written by ``zeropilot run``; an input error if it is none.

    Where each node of a job ran its own ``zeropilot run`` into this directory there is no ``run.json`` but one
    ``run-node-K.json`` per node: they are kept in ``node_runs`` and merged into ``run``
    (:func:`zeropilot.runlog.job.merge_runs`). ``budget`` is shared when several directories make one job.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError("not a run directory (" + ("not a folder" if root.exists() else "no such folder") + ")",
                         path=root)
    d = RunDir(root)
    problems: List[str] = []
    run = read_side_json(d.run_file, problems) if os.path.lexists(d.run_file) else None
    node_runs = {}
    for path in d.node_run_files():
        got = read_side_json(path, problems)
        if got is not None:
            node_runs[path.name[len("run-node-"):-len(".json")]] = got
    if run is None and node_runs:
        run = merge_runs(node_runs, problems)
    budget = budget if budget is not None else _Budget(MAX_STEP_ROWS, MAX_EVENTS)
    ranks = {r: read_rank(d.events(r), r, problems, budget) for r in d.ranks("rank")
             if regular_file(d.events(r), problems)}
    if budget.dropped_steps or budget.dropped_events:
        problems.append(f"run larger than the reader's budget: {budget.dropped_steps} step record(s) and "
                        f"{budget.dropped_events} other record(s) not read")
    if run is None and not ranks:
        raise InputError("not a run directory: no run.json and no rank-N.jsonl", path=root)
    ooms = _by_rank(d.ranks("oom-rank"), lambda r: read_side_json(d.oom(r), problems))
    beats = _by_rank(d.ranks("heartbeat-rank"), lambda r: read_side_json(d.heartbeat(r), problems))
    stacks = _by_rank(d.ranks("stacks-rank"), lambda r: read_stack(d.stacks(r), problems))
    timeouts = read_side_json(d.timeouts_file, problems) if os.path.lexists(d.timeouts_file) else None
    heal = read_side_json(d.heal_file, problems) if os.path.lexists(d.heal_file) else None
    return RunRecords(root=root, run=run, ranks=ranks, ooms=ooms, hang=read_side_json(d.hang_file, problems),
                      heartbeats=beats, problems=problems, stacks=stacks, node_runs=node_runs,
                      rank_dirs={r: root for r in ranks}, timeouts=timeouts, heal=heal)


def merge_runs(runs: Dict[str, Dict[str, Any]], problems: List[str]) -> Dict[str, Any]:
    """The supervisors' records of one job's nodes as one ``run.json``: the first node's (lowest key) command,
    versions and plan; the earliest start; the worst exit status; ended when at least one node ended (a node
    whose supervisor recorded no end is noted: its machine or its ``zeropilot run`` may be gone)."""
    keys = sorted(runs, key=_sort_key)
    first = dict(runs[keys[0]])
    ended = [runs[k] for k in keys if "ended_at" in runs[k]]
    starts = [t for t in (_num(runs[k].get("started_at")) for k in keys) if t is not None]
    if starts:
        first["started_at"] = min(starts)
    first.pop("ended_at", None)
    first.pop("exit_code", None)
    if ended:
        first["ended_at"] = max((_num(r.get("ended_at")) or 0.0) for r in ended)
        codes = [_int(r.get("exit_code")) for r in ended]
        first["exit_code"] = next((c for c in codes if c not in (0, None)), 0)
        first["signal"] = next((_txt(r.get("signal")) for r in ended if _txt(r.get("signal"))), None)
        first["stopped_on_hang"] = any(r.get("stopped_on_hang") is True for r in ended)
    for k in keys:
        if ended and "ended_at" not in runs[k]:
            problems.append(f"node {k}: its zeropilot run recorded no end (its machine or supervisor may be gone)")
    return first


def _sort_key(key: str) -> Tuple[int, Any]:
    return (0, int(key)) if key.isdigit() else (1, key)


def _by_rank(ranks: List[int], read: Callable[[int], Any]) -> Dict[int, Any]:
    """{rank: what ``read(rank)`` returned} for the ranks it could read (``None``: not read)."""
    out = {}
    for r in ranks:
        got = read(r)
        if got is not None:
            out[r] = got
    return out


def _num(value: Any) -> Optional[float]:
    x = _number(value)
    return None if math.isnan(x) else x


def _int(value: Any) -> Optional[int]:
    x = _num(value)
    return None if x is None else int(x)


def _txt(value: Any) -> Optional[str]:
    return value[:4000] if isinstance(value, str) else None
