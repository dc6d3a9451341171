"""Compacting a run directory: closed segments of JSON lines into columns (``runlog.segments``), by the supervisor.

While the job runs, :class:`Compactor` (a thread of ``zeropilot run``) turns every closed segment
(``rank-N.seg-K.jsonl``, which the rank's writer renamed from its live file: ``runlog.events``) that has been closed
for :data:`MIN_AGE_S` into ``rank-N.seg-K.col``; once the job ended, :func:`finish` closes and compacts the live file
of each of this machine's ranks that had closed a segment (a run that never did keeps its plain ``rank-N.jsonl``).

Each segment is compacted on its own and atomically: the new file is written under a temporary name, synced, renamed
into place and the folder synced; only then are the JSON lines removed. A compaction stopped at any point leaves the
JSON lines (a reader prefers them while they are there), or both files, or the new file alone: never a segment read
twice or lost. Two supervisors sharing a directory may compact one segment at once: both write the same bytes.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.runlog import segments as seg
from zeropilot.runlog.layout import RunDir, Segment, write_bytes_durable

MIN_AGE_S = 60.0  # a closed segment this old was read by every live reader that follows the ranks (top, watchdog)
EVERY_S = 10.0
MAX_SOURCE = 1 << 30  # a closed segment is a few MB (``runlog.events.SEGMENT_BYTES``); a larger one is not compacted
MAX_LINE = 1 << 20


def compact_segment(d: RunDir, rank: int, s: Segment) -> Optional[Dict[str, int]]:
    """Compact one closed segment; ``{"lines_bytes", "col_bytes", "rows", "records"}``, or None when there was nothing
    to do (no JSON lines: compacted already, or by another supervisor meanwhile).

    Raises:
        OSError: the new file could not be written (the JSON lines stay).
        InputError: the JSON lines are not a regular file, or too large.
    """
    if s.jsonl is None:
        return None
    dst = d.segment_col(rank, s.seq)
    try:
        data = safefile.read_bytes(s.jsonl, MAX_SOURCE, follow_symlinks=False)
    except InputError:
        if not os.path.lexists(s.jsonl):
            return None  # compacted by another supervisor meanwhile
        raise
    segment = seg.from_lines(rank, s.seq, data.split(b"\n"), MAX_LINE)
    payload = seg.encode(segment)
    if not (s.col is not None and _same(dst, payload)):
        write_segment(d, segment, payload)
    try:
        os.unlink(s.jsonl)
    except FileNotFoundError:
        pass
    return {"lines_bytes": len(data), "col_bytes": len(payload), "rows": segment.rows.n,
            "records": segment.rows.n + len(segment.others)}


def write_segment(d: RunDir, segment: seg.Segment, payload: Optional[bytes] = None) -> int:
    """Write a compacted segment where it belongs, durably (``layout.write_bytes_durable``); its size. The one way a
    ``rank-N.seg-K.col`` is written: by the supervisor, and by the test suite's synthetic jobs."""
    payload = seg.encode(segment) if payload is None else payload
    write_bytes_durable(d.segment_col(segment.rank, segment.seq, segment.last), payload)
    return len(payload)


def _same(path: Path, payload: bytes) -> bool:
    """The file there already holds these bytes (a compaction stopped after its rename, before its unlink)."""
    try:
        return safefile.read_bytes(path, len(payload) + 1, follow_symlinks=False) == payload
    except InputError:
        return False


def compact_closed(root: Path, min_age_s: float = MIN_AGE_S, now: Optional[float] = None) -> List[Dict[str, int]]:
    """Compact every closed segment of JSON lines closed at least ``min_age_s`` ago (its last write); what was done."""
    d = RunDir(Path(root))
    now = time.time() if now is None else now
    done = []
    for rank, segs in d.segments().items():
        for s in segs:
            if s.covered and s.col is not None:
                _drop_covered(s)
            if s.jsonl is None:
                continue
            try:
                if now - os.stat(s.jsonl, follow_symlinks=False).st_mtime < min_age_s:
                    continue
                got = compact_segment(d, rank, s)
            except (OSError, InputError) as exc:
                print(f"zeropilot run: {s.jsonl.name} not compacted ({getattr(exc, 'reason', None) or exc}); its "
                      "records stay as JSON lines", file=sys.stderr)
                continue
            if got is not None:
                done.append(dict(got, rank=rank, segment=s.seq))
    return done


def _drop_covered(s: Segment) -> None:
    """The files a merged file holds, left by a merge stopped before it removed them: removed once it reads."""
    from zeropilot.runlog.segread import open_col

    if open_col(s.col, []) is None:
        return
    for c in s.covered:
        for old in (c.col, c.jsonl):
            if old is not None:
                try:
                    os.unlink(old)
                except FileNotFoundError:
                    pass


def finish(root: Path, host: Optional[str] = None) -> List[Dict[str, int]]:
    """After the job: each rank of this machine (its heartbeat's host; a rank without one counts as this machine's)
    that closed a segment gets its live file closed as its last segment; every closed segment is compacted, and each
    such rank's compacted segments merged into one file (:func:`merge_rank`)."""
    d = RunDir(Path(root))
    host = socket.gethostname() if host is None else host
    closed = [rank for rank in d.segments() if _ours(d, rank, host)]
    for rank in closed:
        close_live(d, rank)
    done = compact_closed(d.root, min_age_s=0.0)
    for rank, segs in d.segments().items():
        if rank in closed:
            merge_rank(d, rank, segs)
    return done


def finish_rank(d: RunDir, rank: int) -> List[Dict[str, int]]:
    """:func:`finish` for one rank that closed a segment (the synthetic jobs of the test suite write ranks in
    parallel processes, each ending its own)."""
    if rank not in d.segments():
        return []
    close_live(d, rank)
    done = []
    for s in d.segments()[rank]:
        got = compact_segment(d, rank, s)
        if got is not None:
            done.append(dict(got, rank=rank, segment=s.seq))
    merge_rank(d, rank, d.segments()[rank])
    return done


def close_live(d: RunDir, rank: int) -> None:
    """A rank's live file closed as its last segment (a rename, as its writer closes one), when it is a file."""
    live = d.events(rank)
    if not os.path.isfile(live) or os.path.islink(live):
        return
    try:
        os.rename(live, d.segment_jsonl(rank, d.next_segment(rank)))
    except OSError:
        pass


def merge_rank(d: RunDir, rank: int, segs: List[Segment]) -> Optional[Path]:
    """A rank's compacted segments as one file (``rank-N.seg-K-L.col``): the report opens one file per rank. Written
    durably before the files it replaces are removed; a reader takes it for them as soon as it is there. Left as
    they are when a segment is still JSON lines or cannot be read whole."""
    from zeropilot.runlog.segread import decode_segment

    if len(segs) < 2 or any(s.jsonl is not None or s.col is None for s in segs):
        return None
    parts = []
    for s in segs:
        got = decode_segment(s.col, whole=True)
        if got is None:
            return None
        parts.append(got)
    merged = seg.concat(parts)
    path = d.segment_col(rank, merged.seq, merged.last)
    write_segment(d, merged)
    for s in segs:
        for old in (s.col,) + tuple(c.col for c in s.covered) + tuple(c.jsonl for c in s.covered):
            if old is not None and old != path:
                try:
                    os.unlink(old)
                except FileNotFoundError:
                    pass
    return path


def finish_quietly(root: Path) -> List[Dict[str, int]]:
    """:func:`finish` for the supervisor's end: a failure is one line on stderr (the JSON lines stay), never the end of
    ``zeropilot run`` before it records how the job ended."""
    try:
        return finish(root)
    except Exception as exc:  # noqa: BLE001 - the run's end must be recorded whatever happens here
        print(f"zeropilot run: compaction at the end stopped ({exc.__class__.__name__}: {exc}); the records stay as "
              "JSON lines", file=sys.stderr)
        return []


def _ours(d: RunDir, rank: int, host: str) -> bool:
    from zeropilot.runlog.read import read_side_json

    beat = read_side_json(d.heartbeat(rank), []) if os.path.lexists(d.heartbeat(rank)) else None
    return beat is None or beat.get("host") in (None, host)


class Compactor:
    """The supervisor's thread: :func:`compact_closed` every :data:`EVERY_S` seconds until :meth:`stop`."""

    def __init__(self, root: Path, every_s: float = EVERY_S, min_age_s: float = MIN_AGE_S) -> None:
        self.root, self.every_s, self.min_age_s = Path(root), every_s, min_age_s
        self.done: List[Dict[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="zeropilot-compact", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.done += compact_closed(self.root, self.min_age_s)
            except Exception as exc:  # noqa: BLE001 - never the supervisor's end: the JSON lines stay readable
                print(f"zeropilot run: compaction stopped ({exc.__class__.__name__}: {exc}); the records stay as "
                      "JSON lines", file=sys.stderr)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=600)
