"""Following the sections of a live run, for the hang watchdog: where each rank is, and what each section took.

:class:`SectionWatch` is polled with the ranks' heartbeats. It reads what the ranks appended to ``rank-N.jsonl``
since the last poll (new whole lines only, as ``zeropilot top`` does), folds each record into that rank's
:class:`~zeropilot.runlog.timeouts.RankClock` and adds the durations it completes to the learned timeouts, which it
writes to ``timeouts.json`` (atomically, at most every :data:`WRITE_EVERY_S`). From the heartbeats it knows the
section each rank is in and since when; :meth:`SectionWatch.deadline` is the deadline in force: the longest among
the sections the ranks are in (a rank in a save rightly keeps the others waiting). When the watchdog stops a job in
a one-off section it calls :meth:`SectionWatch.cut`: the next attempt, or a later run pointed at this directory,
gives that section :data:`~zeropilot.runlog.timeouts.CUT_FACTOR` times longer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.errors import InputError
from zeropilot.runlog import timeouts as tmo
from zeropilot.runlog.layout import RunDir

WRITE_EVERY_S = 2.0
#: verdicts under which a section was still working when stopped: it may only have been slow (a slow disk, a long
#: compilation, a straggler). The others (a rank gone, a lock, a save on some ranks only, different collectives)
#: say what is broken: no longer deadline would have helped.
SLOW_CLASSES = ("slow_storage", "straggler", "user_code", "collective", "build_stalled", "startup", "data_loading")


class SectionWatch:
    """The sections of one run directory's ranks, and the timeouts learned from them (module docstring)."""

    def __init__(self, root: Path, fixed_s: float, plan: Optional[Dict[str, Any]] = None,
                 timeouts_file: Optional[Path] = None) -> None:
        from zeropilot.runlog.live import _Tail

        self.dir = RunDir(Path(root))
        self.fixed_s, self.plan = fixed_s, plan
        self.file = Path(timeouts_file) if timeouts_file is not None else self.dir.timeouts_file
        self.notes: List[str] = []
        self.learned = self._load()
        self.learned.note_run(str(self.dir.root))
        self._tail_cls = _Tail
        self._tails: Dict[int, Any] = {}
        self.clocks: Dict[int, tmo.RankClock] = {}
        self.entered: Dict[int, Tuple[str, float]] = {}  # rank -> (section, since)
        self._dirty, self._written = True, float("-inf")  # written at the first poll

    def _load(self) -> tmo.Learned:
        """What the file holds already (an earlier attempt, ``--timeouts-from``); a broken one is noted and left to
        be replaced."""
        import os

        if not os.path.lexists(self.file):
            return tmo.Learned()
        try:
            return tmo.read(self.file)
        except InputError as exc:
            self.notes.append(f"{self.file}: {exc.reason}: learning afresh")
            return tmo.Learned()

    def poll(self, beats: Dict[int, Dict[str, Any]], now: Optional[float] = None) -> None:
        """Read the new records, follow each rank's section from its heartbeat, write the file when due."""
        from zeropilot.runlog.live import _record

        now = time.time() if now is None else now
        for r in self.dir.ranks("rank"):
            tail = self._tails.setdefault(r, self._tail_cls(self.dir.events(r)))
            clock = self.clocks.setdefault(r, tmo.RankClock())
            for raw in tail.lines():
                rec = _record(raw)
                for section, seconds in tmo.observe(clock, rec) if rec is not None else ():
                    if tmo.learns(section, r, self.clocks):
                        self.learned.add(section, seconds)
                        self._dirty = True
        for r, hb in beats.items():
            phase = hb.get("phase") if isinstance(hb.get("phase"), str) else None
            section = tmo.section_of(phase, self.clocks.get(r, tmo.RankClock()).stepped)
            if section is None:
                self.entered.pop(r, None)
            elif self.entered.get(r, ("",))[0] != section:
                since = hb.get("phase_since")
                ok = isinstance(since, (int, float)) and not isinstance(since, bool) and since <= now
                self.entered[r] = (section, float(since) if ok else now)
        if self._dirty and now - self._written >= WRITE_EVERY_S:
            self.flush(now)

    def deadline(self) -> tmo.Deadline:
        """The deadline in force: the longest among the sections the ranks are in (``startup`` before any)."""
        sections = {s for s, _ in self.entered.values()} or {"startup"}
        return max((tmo.deadline(s, self.learned, self.fixed_s, self.plan) for s in sorted(sections)),
                   key=lambda d: d.seconds)

    def elapsed(self, section: str, now: Optional[float] = None) -> Optional[float]:
        """How long the ranks in ``section`` have been in it (the longest), None when none is."""
        now = time.time() if now is None else now
        times = [now - since for s, since in self.entered.values() if s == section]
        return max(times) if times else None

    def cut(self, deadline: tmo.Deadline, verdict_class: Optional[str], now: Optional[float] = None) -> bool:
        """The watchdog stopped the job in ``deadline.section``: a one-off section stopped under a verdict of
        slowness is kept as having taken at least that long (the next deadline grows). True when kept."""
        seconds = self.elapsed(deadline.section, now)
        if deadline.section not in tmo.ONE_OFF or verdict_class not in SLOW_CLASSES or seconds is None:
            return False
        self.learned.cut(deadline.section, seconds)
        self.flush(now)
        return True

    def flush(self, now: Optional[float] = None) -> None:
        """Write ``timeouts.json`` now (a failed write is noted: the run goes on)."""
        try:
            tmo.write(self.file, self.learned)
        except OSError as exc:
            self.notes.append(f"{self.file}: not written ({exc.__class__.__name__}: {exc})")
        self._dirty, self._written = False, time.time() if now is None else now
