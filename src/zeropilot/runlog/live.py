"""The live state of a run, from its run directory only: what ``zeropilot top`` shows while the job runs.

Each refresh reads what the ranks appended to ``rank-N.jsonl`` since the last one (the tail only: a file
is never read twice, so a refresh costs what was written since), each rank's heartbeat, and whether the
watchdog or an OOM wrote its verdict. Nothing here talks to the job: no signal, no socket, no ``/proc``.
Files are opened like every run-directory file (:mod:`zeropilot.safefile`: regular files only, no symlink,
bounded), and a stranger's directory costs bounded memory: one state per rank, the newest records only.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.runlog.layout import RunDir, live_rank
from zeropilot.runlog.read import MAX_LINE, MAX_SIDE_FILE, PHASE_COLUMNS
from zeropilot.runlog import stragglers as strag
from zeropilot.runlog import segments as seg

TAIL_START = 4 << 20  # a file larger than this when first seen is read from its last 4 MiB on
#: ``zeropilot top`` reads less at its first look: the last 256 KiB of each live file and its first 64 KiB (the
#: rank's start, init and setup records), the other records and newest steps of its closed segments
FIRST_LOOK = 256 << 10
HEAD_WINDOW = 64 << 10
RECENT_STEPS = 64  # steps per rank kept for the straggler view: it names a rank that straggles now
RECENT_PROBES = 2 * strag.MIN_WINDOWS * strag.PROBE_WINDOW  # GPU probe readings per rank kept for the same view
#: step records read per rank at a first look (and after a pause): those holding the newest RECENT_STEPS steps and
#: RECENT_PROBES probes at the guard's default interval (``guard.gpu_probe.EVERY``); a compacted segment's tail
RECENT_ROWS = seg.TAIL_ROWS
READ_PER_REFRESH = 16 << 20  # bytes of one rank file read per refresh at most (the rest at the next)
_decode = json.JSONDecoder().decode


@dataclass
class RankLive:
    """What one rank did so far, as the newest records say."""

    rank: int
    step: Optional[int] = None
    step_seconds: Optional[float] = None
    steps_seen: int = 0
    mem: Dict[str, Any] = field(default_factory=dict)  # the newest step's (or init's) memory fields
    peak_reserved: Optional[int] = None  # the largest peak counter seen (a running max of cumulative peaks)
    peak_allocated: Optional[int] = None
    limit: Optional[int] = None  # the allocator's cap if set, else the device's memory
    last_record_t: Optional[float] = None
    event: Optional[str] = None  # the newest record's kind
    ended: bool = False
    error: Optional[str] = None
    oom: Optional[str] = None  # the OOM verdict's summary, from oom-rank-N.json
    heartbeat: Dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0
    zero_stage: Optional[int] = None  # from the setup or init record: which phases are the rank's own
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))  # StepTimes of the newest steps
    probes: deque = field(default_factory=lambda: deque(maxlen=RECENT_PROBES))  # (step, gpu_probe_seconds), newest
    place: Dict[str, Any] = field(default_factory=dict)  # host, node rank, local rank, GPU (stragglers.place)

    @property
    def own_seconds(self) -> Optional[float]:
        """The newest step's own seconds (loading data; the forward below ZeRO-3), None when not recorded."""
        return strag.own_seconds(self.recent[-1], strag.own_phases(self.zero_stage)) if self.recent else None


class _Tail:
    """New whole lines of one rank's live file (``rank-N.jsonl``), from where the last read stopped.

    The rank's writer closes its live file as a segment (a rename, ``runlog.events``) and begins a new one: the tail
    reads the rest of the closed file first (the same file, by its inode), then the new one from its start. A closed
    segment the supervisor compacted before this reader came back to it (``runlog.compact`` waits a minute) is read
    from its columns: the records after the last line this tail returned.
    """

    def __init__(self, path: Path, tail_start: Optional[int] = None) -> None:
        self.path = path
        self.tail_start = TAIL_START if tail_start is None else tail_start
        self.offset: Optional[int] = None  # None: not opened yet
        self.partial = b""
        self.skip_first = False  # the next line is the end of a line cut off (tail start, a too-long line)
        self.started_in_middle = False
        self.ident: Optional[tuple] = None  # (device, inode) of the file the offset is in
        self.moved = False  # the file we read was renamed (closed as a segment): the next live file starts at 0
        self.last_line = b""

    def lines(self) -> List[bytes]:
        out: List[bytes] = []
        try:
            fd = safefile.open_regular(self.path, follow_symlinks=False)
        except InputError:
            if self.ident is not None:  # renamed: closed as a segment (or the run's last one, at its end)
                out, self.ident, self.moved = self._drain_moved(), None, True
            return out
        try:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
            if self.ident is not None and ident != self.ident:
                out, self.moved = self._drain_moved(), True
            if self.moved:
                self.offset, self.partial, self.skip_first, self.moved = 0, b"", False, False
            elif self.offset is None or st.st_size < self.offset:  # first look, or the file was replaced
                self.offset, self.partial, self.skip_first = 0, b"", False
                if st.st_size > self.tail_start:
                    self.offset = st.st_size - self.tail_start
                    self.skip_first = self.started_in_middle = True
            self.ident = ident
            os.lseek(fd, self.offset, os.SEEK_SET)
            data = os.read(fd, min(st.st_size - self.offset, READ_PER_REFRESH)) if st.st_size > self.offset else b""
        except OSError:
            return out
        finally:
            os.close(fd)
        self.offset += len(data)
        return out + self._split(data)

    def _split(self, data: bytes) -> List[bytes]:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # an unfinished last line waits for the next refresh
        if self.skip_first and lines:
            lines, self.skip_first = lines[1:], False
        if len(self.partial) > MAX_LINE:  # never a record: drop it, and its end when it comes
            self.partial, self.skip_first = b"", True
        lines = [ln for ln in lines if ln.strip()]
        if lines:
            self.last_line = lines[-1]
        return lines

    def _drain_moved(self) -> List[bytes]:
        """The rest of the file this tail was reading, now a closed segment: from its JSON lines (the same inode),
        else from its compacted columns (the records after the last line returned)."""
        rank = live_rank(self.path.name)
        if rank is None or self.offset is None:
            return []
        newest = RunDir(self.path.parent).segments().get(rank, [])[-3:]
        for s in reversed(newest):
            try:
                st = os.stat(s.jsonl, follow_symlinks=False) if s.jsonl is not None else None
            except OSError:
                st = None
            if st is not None and (st.st_dev, st.st_ino) == self.ident:
                try:
                    data = safefile.read_bytes(s.jsonl, MAX_REST, follow_symlinks=False)[self.offset:]
                except InputError:
                    return []
                got = self._split(data)
                self.partial = b""  # a torn last line of a closed segment never ends
                return got
        return _records_after(newest, self.last_line)


MAX_REST = 1 << 30


def _records_after(segs: List[Any], last_line: bytes) -> List[bytes]:
    """The records of compacted segments after the one whose line is ``last_line`` (by its time), as JSON lines."""
    from zeropilot.runlog.segread import read_records

    last = _record(last_line) if last_line else None
    t = last.get("t") if isinstance(last, dict) and isinstance(last.get("t"), (int, float)) else None
    out = []
    for s in segs:
        if s.col is None or s.jsonl is not None:
            continue
        for rec in read_records(s.col):
            rt = rec.get("t")
            if t is None or (isinstance(rt, (int, float)) and rt > t):
                out.append(json.dumps(rec, separators=(",", ":"), default=str).encode("utf-8"))
    return out


@dataclass
class LiveRun:
    """A run directory followed refresh by refresh (:meth:`refresh`)."""

    root: Path
    ranks: Dict[int, RankLive] = field(default_factory=dict)
    run: Dict[str, Any] = field(default_factory=dict)
    hang: Optional[Dict[str, Any]] = None
    problems: List[str] = field(default_factory=list)
    _tails: Dict[int, _Tail] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, root: Path) -> "LiveRun":
        """Follow ``root``; an input error if it is not a folder."""
        root = Path(root)
        if safefile.kind_of(root) != "dir":
            raise InputError("not a run directory (" + ("not a folder" if os.path.lexists(root) else
                                                        "no such folder") + ")", path=root)
        return cls(root)

    @property
    def ended(self) -> bool:
        """``run.json`` says the launch ended (what ``zeropilot run`` writes last)."""
        return "ended_at" in self.run or self.run.get("exit_code") is not None

    def refresh(self) -> List[Dict[str, Any]]:
        """Read what is new; returns the new step records (``rank``, ``step``, ``seconds``) in file order."""
        d = RunDir(self.root)
        problems: List[str] = []
        self.run = _side_json(d.run_file, problems) or _node_runs(d, problems) or self.run
        new_steps: List[Dict[str, Any]] = []
        segs: Optional[Dict[int, List[Any]]] = None
        for r in d.ranks("rank"):
            state = self.ranks.setdefault(r, RankLive(r))
            tail = self._tails.get(r)
            first = tail is None
            if first:
                tail = self._tails[r] = _Tail(d.events(r), FIRST_LOOK)
                segs = d.segments() if segs is None else segs
                earlier, peaks = _earlier(segs.get(r, []), problems)  # closed segments: before the live file
                for rec in earlier:
                    _apply(state, rec)
                state.peak_reserved = _larger(state.peak_reserved, peaks.get("peak_reserved_bytes"))
                state.peak_allocated = _larger(state.peak_allocated, peaks.get("peak_allocated_bytes"))
            lines = tail.lines()
            if first and tail.started_in_middle:
                lines = _head_window(d.events(r)) + lines
            for raw in _newest(lines, state):
                rec = _record(raw)
                if rec is None:
                    state.skipped_lines += 1
                    continue
                if _apply(state, rec):
                    new_steps.append({"rank": r, "step": state.step, "seconds": state.step_seconds})
        for r in d.ranks("heartbeat-rank"):
            beat = _side_json(d.heartbeat(r), problems)
            if beat is not None:
                self.ranks.setdefault(r, RankLive(r)).heartbeat = beat
        for r in d.ranks("oom-rank"):
            state = self.ranks.setdefault(r, RankLive(r))
            if state.oom is None:
                oom = _side_json(d.oom(r), problems) or {}
                verdict = oom.get("verdict") if isinstance(oom.get("verdict"), dict) else {}
                state.oom = str(verdict.get("summary") or "out of memory")
        if self.hang is None and safefile.kind_of(d.hang_file, follow_symlinks=False) == "file":
            self.hang = _side_json(d.hang_file, problems)
        self.problems = problems
        return new_steps

    def stragglers(self) -> List[Dict[str, Any]]:
        """The ranks straggling over their newest :data:`RECENT_STEPS` steps (``runlog.stragglers.find``)."""
        stage = next((s.zero_stage for s in self.ranks.values() if s.zero_stage is not None), None)
        return strag.find({r: list(s.recent) for r, s in self.ranks.items()}, stage,
                          {r: s.place for r, s in self.ranks.items()})

    def gpu_stragglers(self) -> List[Dict[str, Any]]:
        """The ranks whose GPU is slow over their newest :data:`RECENT_PROBES` probes (``runlog.stragglers.find_gpu``)."""
        return strag.find_gpu({r: list(s.probes) for r, s in self.ranks.items()},
                              {r: s.place for r, s in self.ranks.items()})

    def verdict_so_far(self) -> Dict[str, Any]:
        """``kind`` (``running``, ``hang``, ``oom``, ``crash``, ``ended``), ``ranks`` and ``reason``.

        A hang, an OOM or an error is shown as soon as its file or record appears; the final verdict of an ended
        run is :func:`zeropilot.runlog.summary.summarize`'s (``zeropilot top`` prints it at the end).
        """
        if self.hang is not None:
            v = self.hang.get("verdict") if isinstance(self.hang.get("verdict"), dict) else {}
            return {"kind": "hang", "ranks": _ints(v.get("ranks")),
                    "reason": str(v.get("reason") or "no progress within the hang timeout")}
        ooms = [s for s in self.ranks.values() if s.oom]
        if ooms:
            return {"kind": "oom", "ranks": [s.rank for s in ooms], "reason": ooms[0].oom}
        errors = [s for s in self.ranks.values() if s.error]
        if errors:
            return {"kind": "crash", "ranks": [s.rank for s in errors], "reason": errors[0].error}
        if self.ended:
            return {"kind": "ended", "ranks": [], "reason": f"exit status {self.run.get('exit_code')}"}
        steps = [s.step for s in self.ranks.values() if s.step is not None]
        if not self.ranks:
            return {"kind": "running", "ranks": [], "reason": "waiting for the ranks to start"}
        where = f"step {min(steps)}" + (f"-{max(steps)}" if steps and max(steps) != min(steps) else "") \
            if steps else "before the first step"
        return {"kind": "running", "ranks": [], "reason": f"{len(self.ranks)} rank(s), {where}"}


def _node_runs(d: RunDir, problems: List[str]) -> Optional[Dict[str, Any]]:
    """The nodes' ``run-node-K.json`` as one ``run.json`` (a job whose nodes share this directory), or None."""
    from zeropilot.runlog.read import merge_runs

    runs = {}
    for path in d.node_run_files():
        got = _side_json(path, problems)
        if got is not None:
            runs[path.name[len("run-node-"):-len(".json")]] = got
    if not runs:
        return None
    merged = merge_runs(runs, [])
    if any("ended_at" not in r for r in runs.values()):
        merged.pop("ended_at", None)  # the job goes on while one node's supervisor runs
        merged.pop("exit_code", None)
    return merged


def _is_step(raw: bytes) -> bool:
    return b'"event":"step"' in raw or b'"event": "step"' in raw


def _newest(lines: List[bytes], state: RankLive) -> List[bytes]:
    """A long batch of lines (a first look, a pause) as ``top`` needs it: every record but steps, and the steps
    :func:`_old_steps` keeps (the others are counted as seen: the memory counters are cumulative, the newest say
    the peak)."""
    if len(lines) <= 4 * RECENT_ROWS:
        return lines
    old = _old_steps([(_is_step(ln), b'"gpu_probe_seconds"' in ln) for ln in lines])
    state.steps_seen += len(old)
    return [ln for i, ln in enumerate(lines) if i not in old]


def _old_steps(kinds: List[Tuple[bool, bool]]) -> set:
    """The step records ``top`` does not need among records whose ``(is a step, holds a GPU probe)`` are ``kinds``:
    all but the newest :data:`RECENT_STEPS` steps and the newest :data:`RECENT_PROBES` steps with a probe reading."""
    steps = [i for i, (step, _) in enumerate(kinds) if step]
    probes = [i for i in steps if kinds[i][1]]
    return set(steps[:-RECENT_STEPS]) - set(probes[-RECENT_PROBES:])


def _head_window(path: Path) -> List[bytes]:
    """The records but steps among the first :data:`HEAD_WINDOW` bytes of a live file read from its end."""
    try:
        fd = safefile.open_regular(path, follow_symlinks=False)
    except InputError:
        return []
    try:
        data = os.read(fd, HEAD_WINDOW)
    except OSError:
        return []
    finally:
        os.close(fd)
    return [ln for ln in data.split(b"\n")[:-1] if ln.strip() and not _is_step(ln)]


def _earlier(segs: List[Any], problems: List[str]) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
    """What ``top`` takes from a rank's closed segments at its first look: every record but steps and the newest
    segment's last steps, in their order; and the highest memory counters over all their steps."""
    from zeropilot.runlog.segread import front_records

    out: List[Dict[str, Any]] = []
    peaks: Dict[str, int] = {}
    for i, s in enumerate(segs):
        newest = i == len(segs) - 1
        if s.jsonl is not None:
            try:
                data = safefile.read_bytes(s.jsonl, MAX_REST, follow_symlinks=False)
            except InputError:
                continue
            lines = [ln for ln in data.split(b"\n")[:-1] if ln.strip()]
            drop = (_old_steps([(_is_step(ln), b'"gpu_probe_seconds"' in ln) for ln in lines]) if newest else
                    {j for j, ln in enumerate(lines) if _is_step(ln)})
            out += [r for j, ln in enumerate(lines) if j not in drop for r in [_record(ln)] if r is not None]
        elif s.col is not None:
            recs, highs = front_records(s.col, newest, problems, _old_steps)
            out += recs
            for key, value in highs.items():
                peaks[key] = max(peaks.get(key, value), value)
    return out, peaks


def _ints(values: Any) -> List[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)] if isinstance(values, list) else []


def _side_json(path: Path, problems: List[str]) -> Optional[Dict[str, Any]]:
    """A small JSON object file of the run (run.json, a heartbeat), or None (absent, being replaced, unreadable)."""
    try:
        data = json.loads(safefile.read_bytes(path, MAX_SIDE_FILE, follow_symlinks=False))
    except InputError as exc:
        if os.path.lexists(path):
            problems.append(f"{path.name}: {exc.reason}")
        return None
    except (ValueError, RecursionError):
        problems.append(f"{path.name}: not JSON")
        return None
    return data if isinstance(data, dict) else None


def _record(raw: bytes) -> Optional[Dict[str, Any]]:
    if len(raw) > MAX_LINE:
        return None
    try:
        rec = _decode(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) else None


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e18:
        return None
    return value


def _int(value: Any) -> Optional[int]:
    v = _num(value)
    return int(v) if v is not None else None


def _larger(a: Optional[int], b: Optional[int]) -> Optional[int]:
    return b if a is None else a if b is None else max(a, b)


def _apply(state: RankLive, rec: Dict[str, Any]) -> bool:
    """Fold one record into the rank's state; True for a step record."""
    kind = rec.get("event")
    state.event = kind if isinstance(kind, str) else state.event
    state.last_record_t = _num(rec.get("t")) or state.last_record_t
    mem = rec.get("mem") if isinstance(rec.get("mem"), dict) else None
    if kind in ("start", "init"):
        device = rec.get("device") if isinstance(rec.get("device"), dict) else {}
        state.limit = _int(rec.get("allocator_limit_bytes")) or _int(device.get("total_bytes")) or state.limit
        if kind == "start":  # where it runs; its GPU once init names it
            state.place = dict(strag.place([rec]), gpu=state.place.get("gpu"))
        else:
            state.place = dict(state.place, gpu=strag.place([rec])["gpu"])
    if kind in ("setup", "init") and state.zero_stage is None:
        state.zero_stage = strag.zero_stage([rec])
    if mem is not None and kind in ("init", "step"):
        state.mem = {k: _int(v) for k, v in mem.items() if isinstance(k, str)}
    if mem is not None:
        state.peak_reserved = _larger(state.peak_reserved, _int(mem.get("peak_reserved_bytes")))
        state.peak_allocated = _larger(state.peak_allocated, _int(mem.get("peak_allocated_bytes")))
        if state.limit is None:
            state.limit = _int(mem.get("device_total_bytes"))
    if kind == "step":
        state.step = _int(rec.get("step"))
        state.step_seconds = _num(rec.get("seconds"))
        state.steps_seen += 1
        if state.step is not None:
            times = _step_times(state.step, state.step_seconds, rec)
            state.recent.append(times)
            if times.probe is not None:
                state.probes.append((state.step, times.probe))
        return True
    if kind == "end":
        state.ended = True
    elif kind == "error":
        state.error = f"{rec.get('type') or 'error'}: {rec.get('message') or ''}".strip().rstrip(":")
    return False


def _step_times(step: int, seconds: Optional[float], rec: Dict[str, Any]) -> "strag.StepTimes":
    """A step record's times; a phase it did not enter took 0 s, a record without ``phase_seconds`` tells none."""
    phases = rec.get("phase_seconds")
    data, probe = strag.own_time(rec.get("data_seconds")), strag.own_time(rec.get("gpu_probe_seconds"))
    if not isinstance(phases, dict):
        return strag.StepTimes(step, seconds, None, None, data, probe)
    own = {name: _num(phases.get(name, 0.0)) for name, _ in PHASE_COLUMNS if name in ("idle", "forward")}
    return strag.StepTimes(step, seconds, own["idle"], own["forward"], data, probe)


def seconds_since(value: Optional[float], now: Optional[float] = None) -> Optional[float]:
    """Seconds from a record's time to now (None when unknown)."""
    if value is None:
        return None
    return max((time.time() if now is None else now) - value, 0.0)
