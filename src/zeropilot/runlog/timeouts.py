"""Learned timeouts: each section's deadline from the durations the run itself measured.

A rank is always in one **section**: ``startup`` (from its interpreter's start to ``deepspeed.initialize``
returning or the Trainer's first setup: imports, op builds, ZeRO-3 init), ``first_step`` (from then, or from a
checkpoint load, to the first optimizer step: warm-up, compilation), ``step`` (inside every later step: its
forward, backward and optimizer step), ``idle`` (between steps: loading a batch, logging, evaluating, and whatever
the script does after its last step), ``save`` and ``load``. The records a rank writes (``rank-N.jsonl``) say how
long each section took (:func:`observe`); those durations are kept in ``timeouts.json`` in the run directory
(:class:`Learned`, ``RunDir.timeouts_file``) and give each section its **deadline** (:func:`deadline`): how long
the hang watchdog lets every rank stay silent in it.

- ``step``, seen :data:`MIN_STEPS` times or more: ``max(STEP_MEDIAN_FACTOR × median, LONGEST_FACTOR × longest,
  STEP_FLOOR_S)``. A step is seen hundreds of times: one far past its median is a hang, even under the fixed
  ``--hang-timeout``.
- ``idle``: ``--hang-timeout``, never learned: what a script does between and after its steps is its own (a final
  ``save_model`` of a large model, an evaluation) and a short deadline there would stop healthy jobs at their end.
- the one-off sections (``startup``, ``first_step``, ``save``, ``load``): their deadline before any was seen
  (``--hang-timeout``; for ``save`` and ``load`` at least twice the plan's save time plus a minute), raised to
  ``LONGEST_FACTOR × longest`` seen and to ``CUT_FACTOR ×`` the time one ran before the watchdog stopped it
  (:meth:`Learned.cut`). Seen once or twice, they can only lengthen: a save that took 20 minutes on a slow disk is
  not a hang on the next attempt.

Pure functions and a small file format; no torch. ``docs/run.md`` ("Learned timeouts") and ``docs/run-dir.md``
describe them for users.
"""

from __future__ import annotations

import heapq
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from zeropilot import safefile
from zeropilot.errors import InputError
from zeropilot.runlog.layout import RunDir, write_json_atomic
from zeropilot.runlog.read import PHASE_COLUMNS

TIMEOUTS_SCHEMA = "zeropilot.timeouts/1"
SECTIONS = ("startup", "first_step", "step", "idle", "save", "load")
ONE_OFF = ("startup", "first_step", "save", "load")
STEP_PHASES = ("forward", "backward", "step")  # the heartbeat's phases inside an optimizer step
STEP_MEDIAN_FACTOR = 5.0
LONGEST_FACTOR = 2.0
CUT_FACTOR = 4.0
STEP_FLOOR_S = 5.0  # below it, a pause of the interpreter (garbage collection, a log flush) is no hang
MIN_STEPS = 5  # steps seen before the step's deadline is learned
MAX_SAMPLES = 256  # newest durations kept per section
MAX_FILE = 1 << 20
MAX_RUNS = 32  # run directories named as having contributed
MAX_SECONDS = 1e7  # no section of a real run takes 115 days: a larger figure is hostile or corrupt
POLICY = {"step_median_factor": STEP_MEDIAN_FACTOR, "longest_factor": LONGEST_FACTOR, "cut_factor": CUT_FACTOR,
          "step_floor_s": STEP_FLOOR_S, "min_steps": MIN_STEPS}


def _seconds(value: Any) -> Optional[float]:
    """A duration in seconds: finite, non-negative, below :data:`MAX_SECONDS`; else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) and 0.0 <= x < MAX_SECONDS else None


def _time(value: Any) -> Optional[float]:
    """A Unix time: finite and non-negative (a record's ``t``), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    x = float(value)
    return x if math.isfinite(x) and 0.0 <= x < 1e12 else None


# -- what the records say ------------------------------------------------------------------------------------


@dataclass
class RankClock:
    """Where one rank's records have put it so far (:func:`observe` folds them in, in file order)."""

    live_since: Optional[float] = None  # the interpreter's start (``start`` record)
    ready_t: Optional[float] = None  # startup or a load ended: the next step is a first step
    stepped: bool = False  # a step record since ``ready_t``
    op_in_step: bool = False  # a save or load since the last step: that step's ``seconds`` holds it
    started_up: bool = False


def _step_seconds(clock: RankClock, rec: Dict[str, Any]) -> Optional[float]:
    """The step's own duration: its ``seconds`` less the saves and loads inside it (``phase_seconds``)."""
    seconds = _seconds(rec.get("seconds"))
    phases = rec.get("phase_seconds")
    if seconds is None:
        return None
    if isinstance(phases, dict):
        held = sum(_seconds(phases.get(p)) or 0.0 for p in ("save", "load"))
        return max(seconds - held, 0.0)
    return None if clock.op_in_step else seconds  # a record without phases: a step that held a save is no sample


def observe(clock: RankClock, rec: Dict[str, Any]) -> List[Tuple[str, float]]:
    """Fold one record of a rank into its clock; the ``(section, seconds)`` durations it completed."""
    kind, t = rec.get("event"), _time(rec.get("t"))
    out: List[Tuple[str, float]] = []
    if kind == "start":
        clock.live_since = _time(rec.get("live_since")) or t
    elif kind in ("init", "setup") and not clock.started_up and t is not None:
        clock.started_up, clock.ready_t, clock.stepped = True, t, False
        if clock.live_since is not None and t >= clock.live_since:
            out.append(("startup", t - clock.live_since))
    elif kind == "step":
        if not clock.stepped:
            if clock.ready_t is not None and t is not None and t >= clock.ready_t:
                out.append(("first_step", t - clock.ready_t))
        else:
            seconds = _step_seconds(clock, rec)
            if seconds is not None:
                out.append(("step", seconds))
        clock.stepped, clock.op_in_step = True, False
    elif kind in ("save", "load"):
        seconds = _seconds(rec.get("seconds"))
        if seconds is not None and not rec.get("error"):
            out.append((kind, seconds))
        clock.op_in_step = True
        if kind == "load" and t is not None:
            clock.ready_t, clock.stepped = t, False
    return out


def learns(section: str, rank: int, ranks: Iterable[int]) -> bool:
    """Whether ``rank``'s duration of ``section`` is learned: every rank's, but a step only from the lowest rank
    (every rank's step ends in the same collectives, so one rank's step times are the job's, and :data:`MIN_STEPS`
    counts steps, not ranks)."""
    return section != "step" or rank == min(ranks)


def section_of(phase: Optional[str], stepped: bool) -> Optional[str]:
    """The section a rank is in, from its heartbeat's phase and whether it stepped since its start or last load;
    None once it is exiting. A phase this module does not know counts as ``idle`` (its deadline is never short)."""
    name = (phase or "").partition(":")[0]
    if name in ("startup", "init", ""):
        return "startup"
    if name in ("save", "load"):
        return name
    if name == "exit":
        return None
    if not stepped:
        return "first_step"
    return "step" if name in STEP_PHASES else "idle"


# -- what was learned ----------------------------------------------------------------------------------------


@dataclass
class Seen:
    """The durations of one section: the newest :data:`MAX_SAMPLES`, how many in all, the longest, and the
    longest time one ran before the watchdog stopped it (``cut_s``: it would have taken longer)."""

    count: int = 0
    samples: List[float] = field(default_factory=list)
    longest_s: Optional[float] = None
    cut_s: Optional[float] = None

    @property
    def median_s(self) -> Optional[float]:
        return statistics.median(self.samples) if self.samples else None


@dataclass
class Learned:
    """The content of ``timeouts.json``: what each section was seen to take, in this run and the runs before it."""

    sections: Dict[str, Seen] = field(default_factory=dict)
    runs: List[str] = field(default_factory=list)  # the run directories whose sections these are, oldest first
    updated_at: Optional[float] = None

    def seen(self, section: str) -> Seen:
        return self.sections.setdefault(section, Seen())

    def add(self, section: str, seconds: float) -> None:
        """A section completed in ``seconds``."""
        s = self.seen(section)
        s.count += 1
        s.samples = (s.samples + [seconds])[-MAX_SAMPLES:]
        s.longest_s = seconds if s.longest_s is None else max(s.longest_s, seconds)
        if s.cut_s is not None and seconds >= s.cut_s:
            s.cut_s = None  # a completed one explains the cut: it took that long

    def cut(self, section: str, seconds: float) -> None:
        """The watchdog stopped the job ``seconds`` into ``section``, while it was still working."""
        s = self.seen(section)
        s.cut_s = seconds if s.cut_s is None else max(s.cut_s, seconds)

    def note_run(self, run_dir: str) -> None:
        if run_dir not in self.runs:
            self.runs = (self.runs + [run_dir])[-MAX_RUNS:]

    def to_json(self) -> Dict[str, Any]:
        return {"schema": TIMEOUTS_SCHEMA, "updated_at": self.updated_at, "policy": dict(POLICY),
                "runs": list(self.runs),
                "sections": {name: {"count": s.count, "median_s": s.median_s, "longest_s": s.longest_s,
                                    "cut_s": s.cut_s, "samples": [round(x, 6) for x in s.samples]}
                             for name, s in sorted(self.sections.items(), key=lambda kv: SECTIONS.index(kv[0]))}}


def from_json(data: Any, where: str) -> Learned:
    """A :class:`Learned` from a ``timeouts.json`` object (a stranger's file: every value checked, lists bounded).

    Raises:
        InputError: not a ``zeropilot.timeouts/1`` object.
    """
    if not isinstance(data, dict) or data.get("schema") != TIMEOUTS_SCHEMA:
        raise InputError(f"not a learned-timeouts file (schema {TIMEOUTS_SCHEMA} expected) — its deadlines cannot "
                         "be trusted — pass the run directory or its timeouts.json", path=where)
    learned = Learned(updated_at=_time(data.get("updated_at")))
    runs = data.get("runs")
    learned.runs = [r[:4096] for r in runs if isinstance(r, str)][-MAX_RUNS:] if isinstance(runs, list) else []
    sections = data.get("sections") if isinstance(data.get("sections"), dict) else {}
    for name in SECTIONS:
        raw = sections.get(name)
        if not isinstance(raw, dict):
            continue
        samples = raw.get("samples") if isinstance(raw.get("samples"), list) else []
        kept = [x for x in (_seconds(v) for v in samples[-MAX_SAMPLES:]) if x is not None]
        count = raw.get("count")
        longest = _seconds(raw.get("longest_s"))
        learned.sections[name] = Seen(
            count=max(count if isinstance(count, int) and not isinstance(count, bool) and count < 1 << 53 else 0,
                      len(kept)),
            samples=kept, longest_s=max([x for x in [longest] + kept if x is not None], default=None),
            cut_s=_seconds(raw.get("cut_s")))
    return learned


def read(path: Path) -> Learned:
    """``timeouts.json`` at ``path`` (a regular file of at most :data:`MAX_FILE` bytes).

    Raises:
        InputError: missing, not a regular file, too large, not JSON, or not a timeouts file.
    """
    try:
        data = json.loads(safefile.read_bytes(path, MAX_FILE, follow_symlinks=False))
    except (ValueError, RecursionError):
        raise InputError("not JSON — a learned-timeouts file is JSON — pass the run directory or its "
                         "timeouts.json", path=path) from None
    return from_json(data, str(path))


def write(path: Path, learned: Learned) -> None:
    """Replace ``timeouts.json`` atomically."""
    learned.updated_at = time.time()
    write_json_atomic(path, learned.to_json())


# -- deadlines -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    """How long every rank may stay silent in a section: ``source`` is ``learned``, ``plan`` or ``fixed``
    (``--hang-timeout``), ``basis`` says which figure set it, in words."""

    section: str
    seconds: float
    source: str
    basis: str

    def to_json(self) -> Dict[str, Any]:
        return {"section": self.section, "seconds": round(self.seconds, 3), "source": self.source,
                "basis": self.basis}


def plan_seconds(plan: Optional[Dict[str, Any]]) -> Optional[float]:
    """The plan's estimate of a save (a load reads what a save wrote: the same estimate), or None."""
    checkpoint = (plan or {}).get("checkpoint") if isinstance(plan, dict) else None
    value = _seconds(checkpoint.get("save_seconds")) if isinstance(checkpoint, dict) else None
    return value if value else None


def _before_seen(section: str, fixed_s: float, plan: Optional[Dict[str, Any]]) -> Deadline:
    """The deadline of a section not seen yet: ``--hang-timeout``, for saves and loads at least the plan's."""
    estimate = plan_seconds(plan) if section in ("save", "load") else None
    if estimate is not None and 2 * estimate + 60 > fixed_s:
        return Deadline(section, 2 * estimate + 60, "plan", f"twice the plan's save time ({estimate:.0f} s) plus "
                        "a minute")
    return Deadline(section, fixed_s, "fixed", "--hang-timeout")


def _secs(x: float) -> str:
    return f"{x:.2f} s" if x < 10 else f"{x:.0f} s"


def deadline(section: str, learned: Optional[Learned], fixed_s: float,
             plan: Optional[Dict[str, Any]] = None) -> Deadline:
    """The deadline of ``section`` from what was learned, the plan and ``--hang-timeout`` (module docstring)."""
    seen = learned.sections.get(section) if learned is not None else None
    if section == "step":
        if seen is None or len(seen.samples) < MIN_STEPS or seen.median_s is None:
            return _before_seen(section, fixed_s, plan)
        median, longest = seen.median_s, seen.longest_s or 0.0
        options = [(STEP_MEDIAN_FACTOR * median, f"{STEP_MEDIAN_FACTOR:g} × the median step {_secs(median)} over "
                    f"{len(seen.samples)} steps"),
                   (LONGEST_FACTOR * longest, f"{LONGEST_FACTOR:g} × the longest step seen, {_secs(longest)}"),
                   (STEP_FLOOR_S, f"the floor of a learned step deadline, {STEP_FLOOR_S:g} s")]
        seconds, basis = max(options, key=lambda o: o[0])
        return Deadline(section, seconds, "learned", basis)
    base = _before_seen(section, fixed_s, plan)
    if seen is None:
        return base
    options = [(base.seconds, base.basis, base.source)]
    if seen.longest_s is not None:
        options.append((LONGEST_FACTOR * seen.longest_s, f"{LONGEST_FACTOR:g} × the longest {section} seen, "
                        f"{_secs(seen.longest_s)}", "learned"))
    if seen.cut_s is not None:
        options.append((CUT_FACTOR * seen.cut_s, f"{CUT_FACTOR:g} × the {_secs(seen.cut_s)} one ran before the "
                        "watchdog stopped it", "learned"))
    seconds, basis, source = max(options, key=lambda o: o[0])
    return Deadline(section, seconds, source, basis)


def deadlines(learned: Optional[Learned], fixed_s: float, plan: Optional[Dict[str, Any]] = None
              ) -> Dict[str, Deadline]:
    """Every section's deadline."""
    return {s: deadline(s, learned, fixed_s, plan) for s in SECTIONS}


# -- from a run directory ------------------------------------------------------------------------------------


def learn_from_records(records: Any) -> Learned:
    """What the records of a run directory (:class:`zeropilot.runlog.read.RunRecords`) say each section took:
    for a run whose ``timeouts.json`` is missing (made before there was one, or its watchdog never wrote it)."""
    learned = Learned()
    lowest = (min(records.ranks),) if records.ranks else ()  # what ``learns`` asks of the ranks, found once
    for rank in sorted(records.ranks):
        clock = RankClock()
        for rec in rank_stream(records.ranks[rank], every_step=learns("step", rank, lowest)):
            for section, seconds in observe(clock, rec):
                if learns(section, rank, lowest):
                    learned.add(section, seconds)
    learned.note_run(str(records.root))
    return learned


def rank_stream(rank_records: Any, every_step: bool = True) -> Iterator[Dict[str, Any]]:
    """One rank's records in time order, its step columns as records again (what :func:`observe` reads), one at a
    time: a run of millions of steps is read in bounded memory. ``every_step=False``: of the steps, only the first
    after each other record (a first step; the steps of a rank other than the lowest teach nothing else)."""
    cols = rank_records.steps
    phase_cols = [(name, cols[col]) for name, col in PHASE_COLUMNS]

    def step(i: int) -> Dict[str, Any]:
        t, seconds = cols["t"][i], cols["seconds"][i]
        phases = {name: col[i] for name, col in phase_cols if col[i] == col[i]}  # NaN: not recorded
        return {"event": "step", "t": t if t == t else None, "seconds": seconds if seconds == seconds else None,
                "phase_seconds": phases or None}

    events = sorted(((_time(e.get("t")) or 0.0, 1, i) for i, e in enumerate(rank_records.events)))
    steps = (((t if t == t else 0.0), 2, i) for i, t in enumerate(cols["t"]))
    wanted = True
    for _, kind, i in heapq.merge(events, steps):
        if kind == 1:
            wanted = True
            yield rank_records.events[i]
        elif every_step or wanted:
            wanted = False
            yield step(i)


def load_source(source: Path) -> Learned:
    """The learned timeouts of ``--timeouts-from``: a run directory's ``timeouts.json``, else what its records say;
    or a ``timeouts.json`` given by path.

    Raises:
        InputError: no such file or folder, or neither a timeouts file nor a run directory.
    """
    kind = safefile.kind_of(source, follow_symlinks=True)
    if kind == "dir":
        path = RunDir(source).timeouts_file
        if safefile.kind_of(path, follow_symlinks=False) is not None:
            learned = read(path)
        else:
            from zeropilot.runlog.read import read_run

            learned = learn_from_records(read_run(source))
        if not learned.sections:
            raise InputError("the run directory holds no section durations (no init, step, save or load record) — "
                             "there is nothing to learn from — pass a run that got further", path=source)
        learned.note_run(str(Path(source).resolve()))
        return learned
    if kind is None:
        raise InputError("no such file or folder — --timeouts-from takes a run directory or its timeouts.json",
                         path=source)
    return read(source)


def report(records: Any) -> Dict[str, Any]:
    """The report's ``timeouts``: each section's durations (``timeouts.json``, else what the records say), and the
    deadlines they give with this run's ``--hang-timeout`` and plan (None when run.json does not name them)."""
    learned, source = None, "timeouts.json"
    if records.timeouts is not None:
        try:
            learned = from_json(records.timeouts, "timeouts.json")
        except InputError as exc:
            records.problems.append(f"timeouts.json: {exc.reason}")
    if learned is None:
        learned, source = learn_from_records(records), "records"
    run = records.run if isinstance(records.run, dict) else {}
    fixed = _seconds(run.get("hang_timeout_s"))
    plan = run.get("plan") if isinstance(run.get("plan"), dict) else None
    return {"source": source, "runs": list(learned.runs),
            "sections": {name: {"count": s.count, "median_s": s.median_s, "longest_s": s.longest_s, "cut_s": s.cut_s}
                         for name, s in learned.sections.items()},
            "deadlines": {name: d.to_json() for name, d in deadlines(learned, fixed, plan).items()} if fixed
            else None}
