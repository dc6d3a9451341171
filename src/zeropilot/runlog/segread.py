"""A rank's segments into the reader's columns (``runlog.read``), whole or sampled.

A rank's records are its closed segments in order and then its live file (``runlog.layout``). A segment in JSON lines
is read as ``runlog.read`` reads any rank file, record by record; a compacted one (``runlog.segments``) column by
column, to the same values: NaN where a record has none, a phase a step did not enter as 0 s, the same extra columns
by name (a test reads runs both ways and compares every column). A sampled reading (``runlog.read``) keeps, per
segment, the rows of its sample whose step is a multiple of the reading's stride, its first rows and those around
its other records, the last segment's last rows, and the exact aggregates of every column (:class:`ColStats`).
"""

from __future__ import annotations

import bisect
import math
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.runlog import segments as seg
from zeropilot.runlog.events import MEMORY_FIELDS
from zeropilot.runlog.columns import (BATCH_COLUMNS, LIMIT, MAX_LINE, NAN, OTHER_PHASES, OWN_COLUMNS, PATH_COLUMNS,
                                   PHASE_COLUMNS, ColStats, RankRecords, _Budget, _decode, _number, _other, extra_name,
                                   extend_extra, finish_columns, fold_records)

MAX_COL_FILE = 1 << 30  # a compacted segment holds a few MB; a stranger's larger file is not read
MAX_JSONL_SAMPLED = 1 << 30  # a segment of JSON lines read for a sample is held whole while read
_NAMED = frozenset(p for p, _ in PHASE_COLUMNS)
_ENVELOPE = frozenset({("v",), ("event",), ("rank",)})  # the same in every step row: not a column of the reader


@dataclass
class Piece:
    """One part of a rank's records: a file of JSON lines, or a compacted segment with its head."""

    path: Path
    head: Optional[Dict[str, Any]] = None  # a compacted segment's head (``runlog.segments``)
    body: int = 0  # where its parts start
    size: int = 0  # the file's size when its head was read

    @property
    def rows(self) -> int:
        """Step rows it holds (JSON lines: estimated from the size, about 400 bytes a step record)."""
        if self.head is None:
            return self.size // 400
        rows = self.head.get("rows")
        return rows if isinstance(rows, int) and rows >= 0 else 0


def open_col(path: Path, problems: List[str]) -> Optional[Piece]:
    """A compacted segment's head (a note and None when it cannot be read at all)."""
    try:
        fd = safefile.open_regular(path, follow_symlinks=False)
    except InputError as exc:
        problems.append(f"{path.name}: unreadable ({exc.reason})")
        return None
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, seg.PREAMBLE, 0)
        if len(data) == seg.PREAMBLE and data[:len(seg.MAGIC)] == seg.MAGIC:
            want = int.from_bytes(data[8:12], "little")
            data += os.pread(fd, min(want, seg.MAX_HEAD + 1), seg.PREAMBLE)
        head, body = seg.parse_head(data)
    except seg.Damaged as exc:
        problems.append(f"{path.name}: {exc}: nothing in it could be read")
        return None
    except OSError as exc:
        problems.append(f"{path.name}: unreadable ({exc.strerror or exc})")
        return None
    finally:
        os.close(fd)
    return Piece(path, head, body, size)


def _read_range(path: Path, start: int, length: int) -> bytes:
    fd = safefile.open_regular(path, follow_symlinks=False)
    try:
        out = bytearray()
        while len(out) < length:
            got = os.pread(fd, min(length - len(out), 16 << 20), start + len(out))
            if not got:
                break
            out += got
        return bytes(out)
    finally:
        os.close(fd)


# -- columns of a block -----------------------------------------------------------------------------------------


_GAPS = (type(None), type(seg.ABSENT))  # a row without a value: null, or without the key


def numbers(values: Sequence[Any]) -> array:
    """Values as the reader's numbers (``runlog.read._number``): NaN for anything that is not one."""
    kinds = set(map(type, values))
    if values and kinds <= {int, float} and (float not in kinds or all(map(math.isfinite, values))) \
            and -LIMIT < min(values) and max(values) < LIMIT:
        return array("d", values)
    if kinds <= {int, float, *_GAPS}:  # numbers with gaps (a probe every 10 steps, a first step without seconds)
        nums = [v for v in values if v is not None and v is not seg.ABSENT]
        if not nums or ((float not in kinds or all(map(math.isfinite, nums))) and -LIMIT < min(nums)
                        and max(nums) < LIMIT):
            return array("d", [NAN if v is None or v is seg.ABSENT else v for v in values])
    return array("d", map(_number, values))


def _nans(n: int) -> array:
    return array("d", [NAN]) * n


def fold_rows(records: RankRecords, block: seg.Block, rows: Optional[List[int]]) -> None:
    """Append rows of a block (``rows``: their numbers; None: all) to the rank's columns."""
    cols = block.cols
    n = block.n if rows is None else len(rows)
    if not n:
        return
    row0 = records.n_steps

    def values(path: Tuple[str, ...]) -> Optional[List[Any]]:
        col = cols.get(path)
        if col is None or rows is None:
            return col
        return list(map(col.__getitem__, rows))

    steps = records.steps
    for name, path in (("t", ("t",)), ("step", ("step",)), ("seconds", ("seconds",))):
        got = values(path)
        steps[name].extend(numbers(got) if got is not None else _nans(n))
    for name in MEMORY_FIELDS:
        got = values(("mem", name))
        steps[name].extend(numbers(got) if got is not None else _nans(n))
    for key, name in BATCH_COLUMNS:
        got = values(("batch", key))
        steps[name].extend(array("f", numbers(got) if got is not None else _nans(n)))
    for name in OWN_COLUMNS:
        got = values((name,))
        steps[name].extend(array("f", numbers(got) if got is not None else _nans(n)))
    _fold_phases(steps, cols, values, n)
    for path in cols:
        name = extra_name(path)
        if name is None:
            continue
        got = numbers(values(path))
        if any(x == x for x in got):  # NaN != NaN: a column with a number in it
            extend_extra(records, name, row0, got)


def _fold_phases(steps: Dict[str, array], cols: Dict[Tuple[str, ...], List[Any]], values, n: int) -> None:
    """The phase columns as ``runlog.read.fold_records`` makes them from each record's ``phase_seconds``."""
    under = [p for p in cols if p[0] == "phase_seconds" and len(p) > 1]
    leaf = values(("phase_seconds",)) if ("phase_seconds",) in cols else None
    got = {p: values(p) for p in under}
    whole = [v for p, v in got.items() if len(p) == 2 and seg.ABSENT not in v]
    if whole:
        has = None  # every row has the object
    else:
        has = [False] * n
        for v in got.values():
            for i, x in enumerate(v):
                if x is not seg.ABSENT:
                    has[i] = True
        if leaf is not None:
            for i, x in enumerate(leaf):
                if type(x) is dict:
                    has[i] = True

    def missing() -> array:
        return array("d", [0.0]) * n if has is None else array("d", (0.0 if h else NAN for h in has))

    for phase, name in PHASE_COLUMNS:
        v = got.get(("phase_seconds", phase))
        if v is None:
            col = missing()
        elif has is None and seg.ABSENT not in v:
            col = numbers(v)
        else:
            col = array("d", (_number(x) if x is not seg.ABSENT else 0.0 if has is None or has[i] else NAN
                              for i, x in enumerate(v)))
        for p, deep in got.items():  # an object where seconds belong: not a number
            if len(p) > 2 and p[1] == phase:
                for i, x in enumerate(deep):
                    if x is not seg.ABSENT:
                        col[i] = NAN
        steps[name].extend(array("f", col))
    steps[OTHER_PHASES].extend(array("f", _other_phases(got, has, n)))


def _other_phases(got: Dict[Tuple[str, ...], List[Any]], has: Optional[List[bool]], n: int) -> array:
    """The seconds of the phases without a column, summed per row (``runlog.read._other``)."""
    unnamed = {p: v for p, v in got.items() if p[1] not in _NAMED}
    out = array("d", [0.0]) * n if has is None else array("d", (0.0 if h else NAN for h in has))
    if not unnamed:
        return out
    rows = set()
    for v in unnamed.values():
        rows.update(i for i, x in enumerate(v) if x is not seg.ABSENT)
    keys = {p[1] for p in got}
    for i in sorted(rows):
        if len(keys) > 64 and sum(1 for k in keys if any(v[i] is not seg.ABSENT for p, v in got.items()
                                                          if p[1] == k)) > 64:
            out[i] = NAN  # more phases than a guard records: not read (``runlog.read._other``)
            continue
        phases = {p[1]: (v[i] if len(p) == 2 else {}) for p, v in unnamed.items() if v[i] is not seg.ABSENT}
        out[i] = _other(phases)
    return out


# -- the other records --------------------------------------------------------------------------------------------


def _parse(line: bytes) -> Optional[Dict[str, Any]]:
    if len(line) > MAX_LINE:
        return None
    try:
        rec = _decode(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def fold_segment(records: RankRecords, block: seg.Block, others: Sequence[Tuple[int, bytes]], budget: _Budget,
                 rows: Optional[List[int]] = None) -> int:
    """A segment's rows (``rows``: the numbers of those kept; None: all) and its other records, in their order: a step
    record kept as a line (one the columns could not hold) is folded in at its place. Returns how many of those."""
    keep = list(range(block.n)) if rows is None else rows
    at = odd = 0
    for pos, line in others:
        rec = _parse(line)
        if rec is None:
            continue
        if rec.get("event") == "step":
            upto = _upto(keep, pos, at)
            _rows(records, block, keep[at:upto], budget, rows is None and at == 0 and upto == len(keep))
            at, odd = upto, odd + 1
        fold_records(records, iter([rec]), budget)
    _rows(records, block, keep[at:], budget, rows is None and at == 0)
    return odd


def _upto(keep: List[int], pos: int, start: int) -> int:
    """The first index from ``start`` on whose row number is ``pos`` or more (``keep`` is in order)."""
    return bisect.bisect_left(keep, pos, start)


def _rows(records: RankRecords, block: seg.Block, rows: List[int], budget: _Budget, every: bool) -> None:
    if not rows:
        return
    if len(rows) > budget.steps:
        budget.dropped_steps += len(rows) - max(budget.steps, 0)
        rows, every = rows[:max(budget.steps, 0)], False
        if not rows:
            return
    budget.steps -= len(rows)
    fold_rows(records, block, None if every else rows)


# -- reading pieces -------------------------------------------------------------------------------------------------


def read_pieces(records: RankRecords, pieces: List[Piece], budget: _Budget, stride: Optional[int],
                problems: List[str]) -> None:
    """Fold a rank's pieces, in order, whole (``stride`` None) or sampled at ``stride`` steps."""
    from zeropilot.runlog.columns import _lines

    if stride is not None:
        records.sample_every, records.total_steps = stride, 0
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        if piece.head is None and stride is None:
            fold_records(records, _lines(piece.path, problems), budget)
        elif piece.head is None:
            _sampled_lines(records, piece, budget, stride, i == 0, last, problems)
        else:
            _col(records, piece, budget, stride, i == 0, last, problems)
    finish_columns(records)


def _sampled_lines(records: RankRecords, piece: Piece, budget: _Budget, stride: int, first: bool, last: bool,
                   problems: List[str]) -> None:
    """A segment of JSON lines read for a sample: its lines as a segment in memory, then as a compacted one."""
    try:
        data = safefile.read_bytes(piece.path, MAX_JSONL_SAMPLED, follow_symlinks=False)
    except InputError as exc:
        problems.append(f"{piece.path.name}: unreadable ({exc.reason})")
        return
    lines = data.split(b"\n")
    s = seg.from_lines(records.rank, 0, lines, MAX_LINE)
    if s.source.get("skipped"):
        problems.append(f"{piece.path.name}: {s.source['skipped']} unreadable line(s) skipped")
    _add_stats(records, seg.column_stats(s.rows))
    tail = [s.rows.n - 1] if last and s.rows.n else []  # the rank's newest step: where it was last seen
    odd = _fold_sample(records, s.rows, seg.sample_rows(s.rows, s.others, stride), tail, s.others, budget, stride,
                       first)
    records.total_steps = (records.total_steps or 0) + s.rows.n + odd


def _col(records: RankRecords, piece: Piece, budget: _Budget, stride: Optional[int], first: bool, last: bool,
         problems: List[str]) -> None:
    """A compacted segment: every row group (up to any damage), or its head and the sample of its stride (and, where
    that sample lacks the segment's last row, as schema 1's do, the tail)."""
    head, name = piece.head or {}, piece.path.name
    frames = head["frames"]
    if stride is None:
        want = [f for f in frames if f["kind"] in ("events", "rows")]
    else:
        chosen = sample_frame(head, stride)
        want = [f for f in frames if f["kind"] == "events" or f is chosen or (last and f["kind"] == "tail")]
    end = max((piece.body + f["at"] + f["len"] for f in want), default=piece.body)
    expected = piece.body + (head.get("body") if isinstance(head.get("body"), int) else end)
    if piece.size > MAX_COL_FILE:
        problems.append(f"{name}: larger than {MAX_COL_FILE >> 20} MiB, not read")
        return
    try:
        data = _read_range(piece.path, 0, end)
    except (OSError, InputError) as exc:
        problems.append(f"{name}: unreadable ({getattr(exc, 'reason', None) or exc})")
        return
    if stride is not None and piece.size < expected:
        problems.append(f"{name}: truncated at byte {piece.size} of {expected}: its rows past it are lost "
                        "(the sample and the aggregates before them are read)")
    parts, groups, damage = _decode_parts(piece, data, [f for f in want if f["kind"] != "tail"])
    sample = parts.get("sample")
    newest = piece.rows - 1  # the rank's newest step, where it was last seen: the last row of its last segment
    has_newest = sample is not None and bool(sample[1]) and sample[1][-1] == newest
    if stride is not None and damage is None and last and not has_newest:  # schema 1: the newest row in the tail
        more, _, damage = _decode_parts(piece, data, [f for f in want if f["kind"] == "tail"])
        parts.update(more)
    if damage is not None:
        problems.append(f"{name}: {damage}: read up to it")
    others = parts.get("events", [])
    if stride is None:
        _fold_groups(records, groups, others, budget)
        return
    _add_stats(records, head.get("stats"))
    if sample is None:
        records.total_steps = (records.total_steps or 0) + piece.rows + _odd_steps(others)
        return
    block, index = sample
    tail: List[int] = []
    tail_block, tail_index = parts.get("tail", (None, None))
    if tail_block is not None and tail_index:
        block, index = _union(block, index or [], tail_block.take([tail_block.n - 1]), tail_index[-1:])
        tail = [block.n - 1]
    elif last and has_newest:
        tail = [block.n - 1]
    odd = _fold_sample(records, block, list(range(block.n)), tail, others, budget, stride, first, index=index)
    records.total_steps = (records.total_steps or 0) + piece.rows + odd


def sample_frame(head: Dict[str, Any], stride: int) -> Optional[Dict[str, Any]]:
    """The sample a reading at ``stride`` decodes: of the segment's levels (``runlog.segments.sample_levels``; schema
    1: its one sample, of the head's ``sample_every``) the coarsest whose stride divides it, else the finest."""
    base = head.get("sample_every", seg.SAMPLE_EVERY)
    levels = []
    for f in head["frames"]:
        every = f.get("every", base) if f["kind"] == "sample" else None
        if isinstance(every, int) and not isinstance(every, bool) and every > 0:
            levels.append((every, f))
    fits = [(every, f) for every, f in levels if stride % every == 0]
    if fits:
        return max(fits, key=lambda x: x[0])[1]
    return min(levels, key=lambda x: x[0])[1] if levels else None


def _odd_steps(others: Sequence[Tuple[int, bytes]]) -> int:
    """Step records kept as lines among a segment's other records (one the columns could not hold)."""
    return sum(1 for _, line in others if b'"step"' in line and (_parse(line) or {}).get("event") == "step")


def _decode_parts(piece: Piece, data: bytes, want: List[Dict[str, Any]], skip: frozenset = _ENVELOPE
                  ) -> Tuple[Dict[str, Any], List[Tuple[int, seg.Block]], Optional[seg.Damaged]]:
    """The parts ``want`` of a compacted segment (``data``: its bytes from the start), decoded up to any damage:
    ``({"events": ..., "sample": ..., "tail": ...}, [(first row, block)] of the row groups, the damage or None)``."""
    parts: Dict[str, Any] = {}
    groups: List[Tuple[int, seg.Block]] = []
    try:
        for f in want:
            chunk = seg.frame(data, piece.body, f)
            try:
                if f["kind"] == "events":
                    parts["events"] = seg.decode_events(chunk)
                elif f["kind"] in ("sample", "tail"):
                    parts[f["kind"]] = seg.decode_group(chunk, skip=skip)
                else:
                    first = f.get("first")
                    groups.append((first if isinstance(first, int) else 0, seg.decode_group(chunk)[0]))
            except (ValueError, KeyError, TypeError, RecursionError, IndexError, AttributeError):
                raise seg.Damaged(piece.body + f["at"], f"its {seg.part_name(f)} cannot be decoded") from None
    except seg.Damaged as exc:
        return parts, groups, exc
    return parts, groups, None


def decode_segment(path: Path, problems: Optional[List[str]] = None, whole: bool = False) -> Optional[seg.Segment]:
    """A compacted file's segment, all its rows and records (up to any damage, noted in ``problems``; ``whole``:
    None instead when it is damaged)."""
    problems = [] if problems is None else problems
    piece = open_col(path, problems)
    if piece is None or piece.size > MAX_COL_FILE:
        return None
    try:
        data = _read_range(path, 0, piece.size)
    except (OSError, InputError):
        return None
    head = piece.head or {}
    frames = [f for f in head["frames"] if f["kind"] in ("events", "rows")]
    parts, groups, damage = _decode_parts(piece, data, frames)
    if damage is not None:
        problems.append(f"{path.name}: {damage}: read up to it")
        if whole:
            return None
    rank, first, last = head.get("rank"), head.get("segment"), head.get("last")
    chunks = [seg.Segment(0, 0, block) for _, block in groups] or [seg.Segment(0, 0, seg.Block(0, {}, [()]))]
    out = seg.concat(chunks)
    out.others = list(parts.get("events", []))
    out.rank = rank if isinstance(rank, int) else 0
    out.seq = first if isinstance(first, int) else 0
    out.last = last if isinstance(last, int) else None
    source = head.get("source")
    out.source = dict(source) if isinstance(source, dict) else {}
    return out


def read_records(path: Path, problems: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Every record of a compacted segment in its order (up to any damage, noted in ``problems``)."""
    got = decode_segment(path, problems)
    return [] if got is None else list(seg.records(got.rows, got.others))


def front_records(path: Path, with_tail: bool, problems: List[str], drop=None
                  ) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
    """What the front of a compacted segment says without its row groups: its records but steps (and, ``with_tail``,
    its last steps among them: those ``drop`` leaves, given each row's ``(True, holds a GPU probe)``), in their order;
    and the largest value of each memory field over all its steps."""
    piece = open_col(path, problems)
    if piece is None:
        return [], {}
    head = piece.head or {}
    want = [f for f in head["frames"] if f["kind"] == "events" or (with_tail and f["kind"] == "tail")]
    end = max((piece.body + f["at"] + f["len"] for f in want), default=piece.body)
    try:
        data = _read_range(path, 0, end)
    except (OSError, InputError):
        return [], {}
    parts, _, damage = _decode_parts(piece, data, want, frozenset())
    if damage is not None:
        problems.append(f"{path.name}: {damage}: read up to it")
    others = parts.get("events", [])
    block, index = parts.get("tail", (seg.Block(0, {}, [()]), []))
    if drop is not None and block.n:
        probe = block.cols.get(("gpu_probe_seconds",)) or [seg.ABSENT] * block.n
        gone = drop([(True, v is not seg.ABSENT) for v in probe])
        keep = [i for i in range(block.n) if i not in gone]
        block, index = block.take(keep), [(index or [])[i] for i in keep] if index else index
    placed = [(_upto(index or [], p, 0), line) for p, line in others]
    highs = {}
    for item in head.get("stats") or []:
        got = _stats(item)
        if got is not None and got[0] in MEMORY_FIELDS:
            highs[got[0]] = int(got[1].hi)
    return list(seg.records(block, placed)), highs


def _fold_groups(records: RankRecords, groups: List[Tuple[int, seg.Block]], others: List[Tuple[int, bytes]],
                 budget: _Budget) -> None:
    """Every row group in order, each with the other records placed before its rows or among them."""
    done = 0
    for first, block in groups:
        mine = [(p - first, line) for p, line in others[done:] if p < first + block.n]
        done += len(mine)
        fold_segment(records, block, mine, budget)
    for _, line in others[done:]:  # records past a damaged row group: kept, after the rows read
        rec = _parse(line)
        if rec is not None and rec.get("event") != "step":
            fold_records(records, iter([rec]), budget)


def _union(a: seg.Block, ia: List[int], b: seg.Block, ib: List[int]) -> Tuple[seg.Block, List[int]]:
    """A segment's sample and rows of its tail (its last rows, in order) as one block, by row number, each once."""
    k = bisect.bisect_left(ia, ib[0])
    paths = list(dict.fromkeys(list(a.cols) + list(b.cols)))
    cols = {p: (a.cols[p][:k] if p in a.cols else [seg.ABSENT] * k) + (b.cols[p] if p in b.cols else
                                                                         [seg.ABSENT] * b.n) for p in paths}
    shapes = list(dict.fromkeys(a.shapes + b.shapes))
    return seg.Block(k + b.n, cols, shapes, None), ia[:k] + ib


def _fold_sample(records: RankRecords, block: seg.Block, rows: List[int], tail: List[int],
                 others: Sequence[Tuple[int, bytes]], budget: _Budget, stride: int, first: bool,
                 index: Optional[List[int]] = None) -> int:
    """The rows of a sample a reading at ``stride`` keeps: multiples of the stride, the rank's first rows (``first``:
    the segment is the rank's first; the sample then does not depend on where segments were closed or merged),
    those around the other records (``index``: each block row's number in its segment, when the block is a sample),
    and ``tail``. Returns the step records kept as lines (:func:`fold_segment`)."""
    number = index if index is not None else list(range(block.n))
    near = {p + d for p, _ in others for d in (-1, 0)}
    steps = block.cols.get(("step",)) or [None] * block.n
    tail_set = set(tail)
    keep = [i for i in sorted(set(rows) | tail_set)
            if i in tail_set or (first and number[i] < seg.HEAD_ROWS) or number[i] in near
            or (type(steps[i]) is int and steps[i] % stride == 0)]
    placed = [(_upto(number, p, 0), line) for p, line in others]  # others at their place among the block's rows
    return fold_segment(records, block, placed, budget, None if len(keep) == block.n else keep)


def _add_stats(records: RankRecords, stats: Any) -> None:
    """A segment's aggregates (``runlog.segments.column_stats``) merged into the rank's, by column name."""
    if not isinstance(stats, list):
        return
    for item in stats:
        got = _stats(item)
        if got is None:
            continue
        name, s = got
        old = records.stats.get(name)
        records.stats[name] = s if old is None else old.merge(s)


def _stats(item: Any) -> Optional[Tuple[str, ColStats]]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and isinstance(item[1], dict)):
        return None
    path = tuple(k for k in item[0] if isinstance(k, str))
    if not path or len(path) != len(item[0]):
        return None
    name = PATH_COLUMNS.get(path) or extra_name(path)
    d = item[1]
    n, lo, hi, total = d.get("n"), _num(d.get("min")), _num(d.get("max")), _num(d.get("sum"))
    if name is None or not isinstance(n, int) or isinstance(n, bool) or n <= 0 or None in (lo, hi, total):
        return None
    return name, ColStats(n, lo, hi, total, _at(d.get("min_at")), _at(d.get("max_at")))


def _num(v: Any) -> Optional[float]:
    x = _number(v)
    return None if x != x else x


def _at(v: Any) -> Tuple[Optional[float], Optional[float]]:
    if isinstance(v, list) and len(v) == 2:
        return _num(v[0]), _num(v[1])
    return None, None
