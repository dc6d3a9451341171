"""Reading a run directory: bounded, tolerant of torn last lines, columnar for steps.

Step records are the bulk of a run (100k steps x 8 ranks is 800k lines), so they are kept as
columns of ``array('d')`` (NaN for null) rather than 800k dicts; every other record is kept whole.
A rank's records are its closed segments in order (``rank-N.seg-K.jsonl`` as the writer closed them, or
``rank-N.seg-K.col`` once compacted: ``runlog.segments``), then its live ``rank-N.jsonl``.

A run of at most :data:`FULL_ROWS` step records is read whole. A longer one (1,024 ranks x 100k steps) is read
**sampled**: every rank's steps at the same step numbers (multiples of the segments' sample stride, doubled until
the run fits :data:`SAMPLE_ROWS`), its first steps, the steps around every other record (the step holding a save,
the one before it) and its newest step, with exact aggregates over every step record (count, minimum, maximum and
where, sum: :class:`ColStats`) from the segments' heads: peaks, maxima, counts and means are exact, medians are those
of the sample.

A run directory may come from someone else: lines longer than :data:`MAX_LINE` and lines that are
not JSON objects are skipped and counted, never fatal; JSON side files over :data:`MAX_SIDE_FILE`
are refused with a problem note; a damaged segment is read up to the damage, with a note saying where. Memory
stays bounded whatever the directory holds: at most :data:`MAX_STEP_ROWS` step records and :data:`MAX_EVENTS`
other records per run are kept (the rest are counted in a note), and each rank's stack file is read up to
:data:`MAX_STACK` bytes.
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
from zeropilot.runlog.columns import (  # noqa: F401 (the reader's layer, its names here as before)
    MAX_LINE, MAX_SIDE_FILE, MAX_STEP_ROWS, MAX_EVENTS, MAX_STACK, FULL_ROWS, SAMPLE_ROWS, MAX_EXTRA_COLUMNS,
    PHASE_COLUMNS, OTHER_PHASES, BATCH_COLUMNS, OWN_COLUMNS, STEP_COLUMNS, _FLOAT32, _NAMED_PHASES, COLUMN_PATHS,
    PATH_COLUMNS, _KNOWN_TOP, _MEM_KEYS, _BATCH_KEYS, _KNOWN_IN, NAN, _decode, _EMPTY, extra_name, ColStats,
    RankRecords, _later, RunRecords, LIMIT, _number, _Budget, regular_file, _open, _lines, read_rank,
    fold_records, _fold_extras, set_extra, extend_extra, finish_columns, _other)


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
    pieces = rank_pieces(d, problems)
    if not budget.planned:
        budget.stride = plan_stride(sum(p.rows for ps in pieces.values() for p in ps))
    ranks = {r: _read_pieces(r, ps, budget, problems) for r, ps in pieces.items() if ps}
    if budget.dropped_steps or budget.dropped_events:
        problems.append(f"run larger than the reader's budget: {budget.dropped_steps} step record(s) and "
                        f"{budget.dropped_events} other record(s) not read")
    if run is None and not ranks:
        raise InputError("not a run directory: no run.json and no rank-N.jsonl", path=root)
    if run is None and not any(rec.n_steps or rec.events for rec in ranks.values()) and problems:
        raise InputError("nothing in it could be read: " + "; ".join(problems[:3]), path=root)
    ooms = _by_rank(d.ranks("oom-rank"), lambda r: read_side_json(d.oom(r), problems))
    beats = _by_rank(d.ranks("heartbeat-rank"), lambda r: read_side_json(d.heartbeat(r), problems))
    stacks = _by_rank(d.ranks("stacks-rank"), lambda r: read_stack(d.stacks(r), problems))
    timeouts = read_side_json(d.timeouts_file, problems) if os.path.lexists(d.timeouts_file) else None
    heal = read_side_json(d.heal_file, problems) if os.path.lexists(d.heal_file) else None
    return RunRecords(root=root, run=run, ranks=ranks, ooms=ooms, hang=read_side_json(d.hang_file, problems),
                      heartbeats=beats, problems=problems, stacks=stacks, node_runs=node_runs,
                      rank_dirs={r: root for r in ranks}, timeouts=timeouts, heal=heal)


def rank_pieces(d: RunDir, problems: List[str]) -> Dict[int, List[Any]]:
    """Rank -> the files its records are in, in order (``runlog.segread.Piece``): each closed segment (its JSON
    lines while they are there, else its compacted file, whose head is read), then the live file."""
    from zeropilot.runlog.segread import Piece, open_col

    try:
        names = os.listdir(d.root)
    except OSError:
        names = []
    segs = d.segments(names)
    out: Dict[int, List[Any]] = {}
    for r in d.ranks("rank"):
        pieces: List[Any] = []
        for s in segs.get(r, []):
            _segment_pieces(s, pieces, problems, open_col, Piece)
        live = d.events(r)
        if os.path.lexists(live) and regular_file(live, problems):
            pieces.append(Piece(live, size=_size(live)))
        out[r] = pieces
    return out


def _segment_pieces(s: Any, pieces: List[Any], problems: List[str], open_col: Callable, piece: Callable) -> None:
    """A closed segment's piece: its JSON lines while there, else its compacted file (a merged file that cannot be
    read: the files of the segments it holds, where they are still there)."""
    if s.jsonl is not None and regular_file(s.jsonl, problems):
        pieces.append(piece(s.jsonl, size=_size(s.jsonl)))
        return
    if s.col is not None and regular_file(s.col, problems):
        got = open_col(s.col, problems)
        if got is not None:
            pieces.append(got)
            return
    for c in s.covered:
        _segment_pieces(c, pieces, problems, open_col, piece)


def plan_stride(rows: int) -> Optional[int]:
    """The sample's step stride for a run of ``rows`` step records: None (every one) up to :data:`FULL_ROWS`, else
    the segments' stride doubled until the sample fits :data:`SAMPLE_ROWS`."""
    from zeropilot.runlog.segments import SAMPLE_EVERY

    if rows <= FULL_ROWS:
        return None
    stride = SAMPLE_EVERY
    while rows // stride > SAMPLE_ROWS:
        stride *= 2
    return stride


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def _read_pieces(rank: int, pieces: List[Any], budget: _Budget, problems: List[str]) -> RankRecords:
    from zeropilot.runlog.segread import read_pieces

    records = RankRecords(rank)
    read_pieces(records, pieces, budget, budget.stride, problems)
    return records


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
