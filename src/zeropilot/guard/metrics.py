"""The guard's per-step figures in the job's own trackers: the Trainer's log and DeepSpeed's monitor.

zeropilot writes no tracker code of its own. On rank 0 it adds ``zeropilot/`` figures to what the job already
logs, so whatever the job reports to receives them:

- HF Trainer: a ``TrainerCallback`` placed first among the Trainer's callbacks adds the figures to the ``logs``
  of each training log call (every ``logging_steps``), before the ``report_to`` integrations (TensorBoard,
  W&B, MLflow, ...) see them. ``Trainer.log`` copies its logs into ``state.log_history`` before the callbacks
  run, so ``trainer_state.json`` holds no figure of ours. HF's integrations name non-eval keys ``train/KEY``:
  TensorBoard shows ``train/zeropilot/step_seconds``.
- DeepSpeed engine: where the job's ``monitor_config`` is on (TensorBoard, W&B, CSV, Comet), the figures go to
  ``engine.monitor.write_events`` after every optimizer step, at ``engine.global_steps``.

The figures come from the run directory, not from the ranks: rank 0 reads the records every rank appended to
``rank-N.jsonl`` (new lines only) and takes the max over ranks. No collective, no tensor, no change to the job's
computation; a rank's record of the step may land after rank 0 logs it, so another rank's figure can be one step
old. Only the ranks whose records this run directory holds count (one node, with one ``zeropilot run`` per node).

Environment (``zeropilot run --metrics`` sets the first): ``ZEROPILOT_METRICS`` = ``max`` (default: the max over
ranks), ``ranks`` (also ``zeropilot/rankN/...`` for every rank) or ``off``; ``ZEROPILOT_METRICS_PREFIX``
(default ``zeropilot/``). A failure here is printed once and turns the figures off; it never reaches the job.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple

MODE_ENV = "ZEROPILOT_METRICS"
PREFIX_ENV = "ZEROPILOT_METRICS_PREFIX"
MODES = ("max", "ranks", "off")
DEFAULT_PREFIX = "zeropilot/"
GIB = float(1 << 30)
STRAGGLERS_EVERY = 2  # steps between two comparisons of the ranks' own times
STRAGGLERS_WINDOW = 16  # newest steps per rank compared

#: figure name -> the step record's memory field it is read from (GiB: trackers plot numbers people read).
MEMORY_FIGURES = (
    ("peak_reserved_gib", "peak_reserved_bytes"),
    ("peak_allocated_gib", "peak_allocated_bytes"),
    ("reserved_gib", "reserved_bytes"),
    ("allocated_gib", "allocated_bytes"),
    ("unallocated_reserved_gib", "unallocated_reserved_bytes"),
    ("outside_torch_gib", "outside_torch_bytes"),
    ("host_rss_gib", "host_rss_bytes"),
)
COUNT_FIGURES = (("alloc_retries", "alloc_retries"), ("num_ooms", "num_ooms"))


def heal_figures(pre: str) -> Dict[str, float]:
    """Under ``zeropilot run --heal``: which attempt this is and the steps it redoes (set by the restart loop)."""
    from zeropilot.guard.resume import HEAL_ATTEMPT_ENV, STEPS_REDONE_ENV

    out = {}
    for name, env in (("heal_attempt", HEAL_ATTEMPT_ENV), ("steps_redone", STEPS_REDONE_ENV)):
        value = os.environ.get(env, "")
        if value.isdigit():
            out[pre + name] = float(value)
    return out


def mode() -> str:
    value = os.environ.get(MODE_ENV, "max").strip().lower() or "max"
    return value if value in MODES else "max"


def prefix() -> str:
    return os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)


def _num(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) > 1e18:
        return None
    return float(value)


class _RankWindow:
    """One rank's figures since the last log call."""

    def __init__(self) -> None:
        self.figures: Dict[str, float] = {}  # the newest step's memory figures
        self.step_seconds: List[float] = []
        self.data_seconds: List[float] = []  # the rank's own data time per step (guard.data_time)
        self.probe: Optional[float] = None  # the newest GPU probe reading (guard.gpu_probe)
        self.steps = 0  # step records in this window
        self.save_seconds: Optional[float] = None
        self.save_bytes: Optional[float] = None

    def fold(self, rec: Dict[str, Any]) -> None:
        kind = rec.get("event")
        if kind == "step":
            self.steps += 1
            mem = rec.get("mem") if isinstance(rec.get("mem"), dict) else {}
            for name, field in MEMORY_FIGURES:
                v = _num(mem.get(field))
                if v is not None:
                    self.figures[name] = v / GIB
            for name, field in COUNT_FIGURES:
                v = _num(mem.get(field))
                if v is not None:
                    self.figures[name] = v
            seconds = _num(rec.get("seconds"))
            if seconds is not None:
                self.step_seconds.append(seconds)
            data, probe = _num(rec.get("data_seconds")), _num(rec.get("gpu_probe_seconds"))
            if data is not None:
                self.data_seconds.append(data)
            if probe is not None:
                self.probe = probe
        elif kind == "save":
            seconds, size = _num(rec.get("seconds")), _num(rec.get("bytes"))
            if seconds is not None:
                self.save_seconds = (self.save_seconds or 0.0) + seconds
            if size is not None:
                self.save_bytes = (self.save_bytes or 0.0) + size

    def take(self) -> Dict[str, float]:
        """This window's figures; the window restarts (memory figures stay: they are levels, not sums)."""
        out = dict(self.figures)
        out["steps"] = float(self.steps)
        if self.step_seconds:
            out["step_seconds"] = sum(self.step_seconds) / len(self.step_seconds)
        if self.data_seconds:
            out["data_seconds"] = sum(self.data_seconds) / len(self.data_seconds)
        if self.probe is not None:
            out["gpu_probe_ms"] = 1e3 * self.probe
        if self.save_seconds is not None:
            out["save_seconds"] = self.save_seconds
        if self.save_bytes is not None:
            out["save_gib"] = self.save_bytes / GIB
        self.step_seconds, self.steps, self.save_seconds, self.save_bytes = [], 0, None, None
        self.data_seconds, self.probe = [], None
        return out


class Figures:
    """Every rank's records in one run directory, folded into the figures of the next log call."""

    def __init__(self, root: Any) -> None:
        from zeropilot.runlog.layout import RunDir
        from zeropilot.runlog.live import RankLive

        self.dir = RunDir(root)
        self._tails: Dict[int, Any] = {}
        self.windows: Dict[int, _RankWindow] = {}
        self.live: Dict[int, RankLive] = {}  # each rank's newest steps, for the straggler figures
        self._stragglers: Tuple[int, Dict[str, float]] = (-1, {})  # (steps read, figures) at the last comparison

    def read(self) -> None:
        from zeropilot.runlog.live import RankLive, _apply, _record, _Tail

        for r in self.dir.ranks("rank"):
            tail = self._tails.setdefault(r, _Tail(self.dir.events(r)))
            window = self.windows.setdefault(r, _RankWindow())
            state = self.live.setdefault(r, RankLive(r))
            for raw in tail.lines():
                rec = _record(raw)
                if rec is not None:
                    window.fold(rec)
                    _apply(state, rec)

    def stragglers(self, pre: str) -> Dict[str, float]:
        """``stragglers`` (how many ranks straggle over their newest steps: ``runlog.stragglers``) and, when one
        does, the slowest one's ``straggler_rank`` and ``straggler_ratio`` (its own seconds over its peers'); the same
        for a slow GPU over the newest probes (``gpu_stragglers``, ``gpu_straggler_rank``, ``gpu_straggler_ratio``).

        Compared every :data:`STRAGGLERS_EVERY` steps over the newest :data:`STRAGGLERS_WINDOW` (under a millisecond
        for 8 ranks on a loaded 2-core CPU, ``timeit``: at every step of a DeepSpeed monitor it would be felt);
        between, the last figures are logged again."""
        steps = max((s.steps_seen for s in self.live.values()), default=0)
        last = self._stragglers[0]
        if last < 0 or steps - last >= STRAGGLERS_EVERY:
            self._stragglers = (steps, self._compare(pre))
        return dict(self._stragglers[1])

    def _compare(self, pre: str) -> Dict[str, float]:
        from zeropilot.runlog.stragglers import find, find_gpu

        out: Dict[str, float] = {}
        if any(st.idle is not None or st.data is not None for s in self.live.values() for st in s.recent):
            stage = next((s.zero_stage for s in self.live.values() if s.zero_stage is not None), None)
            out.update(_named(pre, "", find({r: list(s.recent)[-STRAGGLERS_WINDOW:] for r, s in self.live.items()},
                                            stage)))
        if any(s.probes for s in self.live.values()):  # absent until a GPU probe was read (never on a CPU)
            out.update(_named(pre, "gpu_", find_gpu({r: list(s.probes) for r, s in self.live.items()})))
        return out

    def take(self, every_rank: bool, pre: str) -> Dict[str, float]:
        """``{prefix + name: value}``: the max over ranks, and each rank's own where ``every_rank``."""
        self.read()
        per_rank = {r: w.take() for r, w in sorted(self.windows.items())}
        out: Dict[str, float] = {pre + "ranks_reporting": float(sum(1 for f in per_rank.values() if f["steps"]))}
        for r, figures in per_rank.items():
            steps = figures.pop("steps")
            if not steps:
                figures.pop("step_seconds", None)
            for name, value in figures.items():
                key = pre + name
                out[key] = max(out.get(key, value), value)
        slow = {r: f["step_seconds"] for r, f in per_rank.items() if "step_seconds" in f}
        if slow:
            out[pre + "slowest_rank"] = float(max(slow, key=lambda r: (slow[r], -r)))
        out.update(self.stragglers(pre))
        if every_rank:
            for r, figures in per_rank.items():
                out.update({f"{pre}rank{r}/{name}": value for name, value in figures.items()})
        return out


def _named(pre: str, kind: str, found: List[Dict[str, Any]]) -> Dict[str, float]:
    """``{kind}stragglers`` and, when one is found, the slowest one's ``{kind}straggler_rank`` and ratio."""
    out = {f"{pre}{kind}stragglers": float(len(found))}
    if found:
        out[f"{pre}{kind}straggler_rank"] = float(found[0]["rank"])
        if found[0]["ratio"] is not None:
            out[f"{pre}{kind}straggler_ratio"] = float(found[0]["ratio"])
    return out


class _Sink:
    """The figures of this rank-0 process, shared by the Trainer callback and the engine monitor."""

    def __init__(self) -> None:
        self.figures: Dict[str, Figures] = {}  # one reader per consumer (trainer, engine): each has its windows
        self.failed = False
        self.engine: Optional[Any] = None  # a weakref to the engine whose monitor receives the figures
        self.tokens_seen: Optional[Tuple[int, int]] = None  # (global_step, num_input_tokens_seen) at the last log

    def take(self, consumer: str) -> Dict[str, float]:
        if self.failed or mode() == "off":
            return {}
        try:
            if consumer not in self.figures:
                from zeropilot.guard.rank import peek

                guard = peek()
                if guard is None:
                    return {}
                self.figures[consumer] = Figures(guard.dir.root)
            out = self.figures[consumer].take(mode() == "ranks", prefix())
            out.update(heal_figures(prefix()))
            return out
        except Exception as exc:  # noqa: BLE001 - the job must never pay for a figure
            self.fail(exc)
            return {}

    def fail(self, exc: BaseException) -> None:
        self.failed = True
        print(f"zeropilot guard: tracker figures turned off: {exc.__class__.__name__}: {exc}", file=sys.stderr)


_sink = _Sink()


def _tokens_per_step(state: Any) -> Optional[float]:
    """From the Trainer's own count (``include_num_input_tokens_seen``): tokens per optimizer step since the last
    log call, None when the Trainer does not count them."""
    seen, step = getattr(state, "num_input_tokens_seen", None), getattr(state, "global_step", None)
    if not isinstance(seen, int) or not isinstance(step, int) or seen <= 0:
        return None
    last, _sink.tokens_seen = _sink.tokens_seen, (step, seen)
    if last is None or step <= last[0]:
        return None
    return (seen - last[1]) / (step - last[0])


def make_callback_class() -> type:
    from transformers import TrainerCallback

    class ZeroPilotMetrics(TrainerCallback):  # type: ignore[misc, valid-type]
        """Adds the guard's figures to the Trainer's training logs on rank 0 (see :mod:`zeropilot.guard.metrics`)."""

        last_step = -1

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not isinstance(logs, dict) or not getattr(state, "is_world_process_zero", False):
                return
            if getattr(args, "report_to", None) in (None, [], ["none"], "none"):
                return  # no tracker: the figures would only lengthen the console's log lines
            step = getattr(state, "global_step", None)
            if not isinstance(step, int) or step <= self.last_step or any(k.startswith("eval_") for k in logs):
                return  # one set per step: the end-of-training summary and evaluations log at a step already seen
            self.last_step = step
            figures = _sink.take("trainer")
            if figures:
                tokens = _tokens_per_step(state)
                if tokens is not None:
                    figures[prefix() + "tokens_per_step"] = tokens
                for key, value in figures.items():
                    logs.setdefault(key, value)

    return ZeroPilotMetrics


_cls: Optional[type] = None


def add_to_trainer(trainer: Any) -> None:
    """Put the figures' callback first among ``trainer``'s callbacks (once), ahead of the ``report_to`` ones."""
    global _cls
    if mode() == "off":
        return
    handler = getattr(trainer, "callback_handler", None)
    callbacks = getattr(handler, "callbacks", None)
    if not isinstance(callbacks, list):
        return
    if _cls is None:
        _cls = make_callback_class()
    if not any(isinstance(cb, _cls) for cb in callbacks):
        callbacks.insert(0, _cls())


def watch_engine(engine: Any) -> None:
    """After every optimizer step of ``engine``, its monitor (when the job's ``monitor_config`` is on) receives
    the figures, on rank 0 only."""
    from zeropilot.guard.rank import on_step

    try:
        _sink.engine = weakref.ref(engine)
    except TypeError:
        return
    on_step(_engine_step)


def _engine_step(guard: Any) -> None:
    engine = _sink.engine() if _sink.engine is not None else None
    monitor = getattr(engine, "monitor", None)
    if guard.rank != 0 or monitor is None or not getattr(monitor, "enabled", False) or _sink.failed:
        return
    figures = _sink.take("engine")
    if not figures:
        return
    step = getattr(engine, "global_steps", guard.step)
    try:
        monitor.write_events([(key, value, step) for key, value in figures.items()])
    except Exception as exc:  # noqa: BLE001
        _sink.fail(exc)
