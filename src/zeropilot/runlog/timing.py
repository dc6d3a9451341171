"""A run's step time: measured and split into the phases the guard sees, beside what the plan's time model predicts.

**Measured.** Each step record carries ``seconds`` (since the previous step ended) and ``phase_seconds``, which add up
to it (``guard.rank``): ``idle`` (between steps: loading the batch, logging, evaluation), ``forward``, ``backward``,
``step`` (the optimizer step), and ``save``/``load`` (or ``init``/``startup``) where the step held one. The split is
the median of each phase over the **steady** steps: a rank's first :data:`WARMUP_STEPS` steps are left out (the
first has no previous end to count from, the next ones carry lazy set-up and the allocator's growth), and so is a
step that held a save, a load or set-up (its seconds are shown apart, per kind). Per rank and for the job (every
rank's steady steps together); a rank is shown on its own where its split differs from the job's
(:data:`DIFFERS`). On a GPU the phases are as the host sees them: a phase ends when its Python call returns, and
kernels it queued may still run in the next one (the optimizer step waits for the backward's).

**Predicted.** The plan's inputs for that launch (:func:`zeropilot.memory.from_run.plan_inputs`: the setup record
the guard wrote, at the median micro batch, padded length and accumulation of the steady steps), the card's speed
figures (the start record's device name; a hardware profile's measured figures where one is given or found, else
the card table's estimates) and the time model (:func:`zeropilot.memory.steptime.estimate_time`). The job is
*slower than predicted* when its median step is :data:`SLOWER` times the prediction or more: the phase with the
largest excess carries the difference. A *faster configuration* is the fitting candidate of ``plan --search`` (same
global batch, the device's memory) whose predicted step is at most :data:`FASTER` times this launch's.

Pure functions of the records and of a :class:`Predictor` (each part of the prediction replaceable); no torch.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from zeropilot.errors import InputError
from zeropilot.runlog import normalize as nz
from zeropilot.runlog.read import OTHER_PHASES, RankRecords, RunRecords

#: a rank's first steps, left out of the medians
WARMUP_STEPS = 2
#: the phases of a steady step, as the guard names them, with the column each is read from (``runlog.read``)
SPLIT = (("idle", "idle_seconds"), ("forward", "forward_seconds"), ("backward", "backward_seconds"),
         ("step", "step_phase_seconds"))
#: phases that make a step not steady: their seconds are shown apart
HELD = (("save", "save_seconds"), ("load", "load_seconds"))
#: the phases for people (one word per phase, as the heartbeat and ``zeropilot top`` name them, explained)
LABELS = {"idle": "idle (data, logging)", "forward": "forward", "backward": "backward", "step": "optimizer step",
          "save": "save", "load": "load"}
#: a rank's split differs from the job's when a phase (or the step) differs by this share of the job's step
DIFFERS = 0.10
#: the job is slower than predicted from this ratio of measured to predicted step time
SLOWER = 1.20
#: a candidate is named faster when its predicted step is at most this share of this launch's predicted step
FASTER = 0.90
#: candidates asked of the search (its ranking is by the plan; the report ranks them by predicted time)
CANDIDATES = 64


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _rows_in_spans(rec: RankRecords, kind: str) -> Set[int]:
    """The step rows whose interval (from the previous step's end to theirs) overlaps one of the rank's ``kind``
    records (save, load), whose span is ``t - seconds`` to ``t``: two bisections per record where the step times
    are in order (a save per hundreds of steps: far fewer records than steps), else one bisection per row."""
    t = rec.steps["t"]
    spans = sorted((end - (nz.num(e.get("seconds")) or 0.0), end) for e in rec.of(kind)
                   for end in [nz.num(e.get("t"))] if end is not None)
    if not spans:
        return set()
    if all(a <= b for a, b in zip(t, itertools.islice(t, 1, None))):  # NaN compares false: not in order
        return {i for start, end in spans
                for i in range(max(bisect.bisect_right(t, start), 1), min(bisect.bisect_left(t, end), len(t) - 1) + 1)
                if t[i - 1] < end and t[i] > start}
    starts, reach = [start for start, _ in spans], list(itertools.accumulate((end for _, end in spans), max))
    return {i for i in range(1, len(t))  # a span starting before this step ended and reaching past the previous end
            for j in [bisect.bisect_left(starts, t[i])] if j and reach[j - 1] > t[i - 1]}


def _steady(rec: RankRecords) -> Tuple[array, array, Dict[str, int], Dict[str, List[float]]]:
    """The rank's steady steps (row indices), those of them with phase times, how many were left out and why, and
    the seconds of the held phases (saves, loads) of the steps left out for them.

    A step with phase times is left out when it held a save, a load or set-up. A step without them (a guard before
    it recorded them) is left out when a save or load record's span falls between the previous step and it.
    """
    cols = rec.steps
    spans: Optional[Dict[str, Set[int]]] = None  # worked out once a step without phase times needs them
    keep, with_phases = array("l"), array("l")  # row numbers: 8 bytes each, for runs of millions of steps
    left = {"warmup": min(WARMUP_STEPS, rec.n_steps), "save": 0, "load": 0, "other": 0, "unrecorded": 0}
    seconds_held: Dict[str, List[float]] = {name: [] for name, _ in HELD}
    # one pass over the columns (a run may hold millions of steps); values are finite or NaN (``runlog.read``)
    rows = zip(cols["seconds"], *(cols[c] for _, c in SPLIT), cols["save_seconds"], cols["load_seconds"],
               cols[OTHER_PHASES])
    for i, (secs, idle, forward, backward, step, save, load, other) in enumerate(rows):
        if i < WARMUP_STEPS:
            continue
        if secs != secs:  # NaN: not recorded
            left["unrecorded"] += 1
            continue
        total = idle + forward + backward + step + save + load + other
        if total != total:  # no phase times: a save's or load's span between the previous step and this one
            spans = spans if spans is not None else {name: _rows_in_spans(rec, name) for name, _ in HELD}
            why = "save" if i in spans["save"] else "load" if i in spans["load"] else None
            if why is not None:
                left[why] += 1
            else:
                keep.append(i)
        elif save > 0 or load > 0:
            why = "save" if save > 0 else "load"
            left[why] += 1
            seconds_held[why].append(float(save if why == "save" else load))
        elif other > 0:
            left["other"] += 1
        else:
            keep.append(i)
            with_phases.append(i)
    return keep, with_phases, left, seconds_held


def _split(rows: List[Tuple[RankRecords, array, array]]) -> Dict[str, Any]:
    """Medians of the step over the given steady rows, and of each phase over those with phase times."""
    secs = [rec.steps["seconds"][i] for rec, idx, _ in rows for i in idx]
    timed = sum(len(idx) for _, _, idx in rows)
    phases = {name: _median([rec.steps[col][i] for rec, _, idx in rows for i in idx]) for name, col in SPLIT}
    return {"step_s": _median(secs), "phases": phases if timed else {}, "steps": len(secs), "phase_steps": timed}


def _batch(rows: List[Tuple[RankRecords, array, array]]) -> Optional[Dict[str, int]]:
    """The median micro batch, padded length and micro batches per step of the steady steps (None: not recorded)."""
    out = {}
    for key in ("micro_batch_size", "seq_len", "micro_batches"):
        col = [(rec.steps[key], idx) for rec, idx, _ in rows]
        counts = Counter(v for c, idx in col for i in idx for v in (c[i],) if v == v)  # NaN: not recorded
        values = sorted(counts)  # a few values, many times each
        n = sum(counts.values())
        if not n:
            return None
        below, median = 0, values[-1]
        for v in values:  # the lower median: a batch the run really had
            below += counts[v]
            if 2 * below >= n:
                median = v
                break
        if median < 1:
            return None
        out[key] = int(median)
    return out


def _differs(rank: Dict[str, Any], job: Dict[str, Any]) -> bool:
    if rank["step_s"] is None or job["step_s"] is None:
        return False
    bar = DIFFERS * job["step_s"]
    return abs(rank["step_s"] - job["step_s"]) > bar or any(
        abs((rank["phases"].get(p) or 0.0) - (job["phases"].get(p) or 0.0)) > bar for p, _ in SPLIT)


def measured(records: RunRecords) -> Dict[str, Any]:
    """The measured step time and its split (see the module's docstring), per rank and for the job."""
    steady = {r: _steady(rec) for r, rec in sorted(records.ranks.items())}
    rows = [(records.ranks[r], keep, timed) for r, (keep, timed, _, _) in steady.items()]
    job = _split(rows)
    left = {k: sum(s[2][k] for s in steady.values()) for k in ("warmup", "save", "load", "other", "unrecorded")}
    held = {}
    for name, _ in HELD:
        values = [v for _, _, _, h in steady.values() for v in h[name]]
        if values:
            held[name] = {"steps": len(values), "median_s": _median(values)}
    ranks = [{"rank": r, **_split([row])} for r, row in zip(steady, rows)]
    batch = _batch(rows)
    tokens = batch["micro_batch_size"] * batch["seq_len"] * batch["micro_batches"] if batch else None
    reason = None
    if job["step_s"] is None:
        reason = ("no step recorded" if not left["warmup"] else
                  f"no steady step ({left_out_text({'left_out': left, 'warmup_steps': WARMUP_STEPS})} left out)")
    elif not job["phase_steps"]:
        reason = "the step records carry no phase times (a guard before they were recorded): the step time only"
    return {**job, "warmup_steps": WARMUP_STEPS, "left_out": left, "held": held, "batch": batch,
            "tokens_per_step": tokens,
            "tokens_per_s": nz.num(tokens / job["step_s"]) if tokens and job["step_s"] else None,
            "ranks": ranks, "ranks_differ": [r["rank"] for r in ranks if _differs(r, job)], "reason": reason}


def left_out_text(m: Dict[str, Any]) -> str:
    """Which steps the medians leave out, in words (the text and HTML reports')."""
    left = dict(m["left_out"])
    first = left.pop("warmup", 0)
    parts = [f"each rank's first {m['warmup_steps']}"] if first else []
    words = {"save": "holding a save", "load": "holding a load", "other": "holding set-up (init)",
             "unrecorded": "without phase times"}
    parts += [f"{n} {words[k]}" for k, n in left.items() if n]
    return ", ".join(parts) or "none"


# -- predicted ----------------------------------------------------------------------------------------------------


def card_speed(card: Optional[str], profile: Any) -> Any:
    """The speed figures of ``card`` (the run's device name, as torch names it): a profile's measured figures, else
    the card table's entry for that device (:func:`zeropilot.memory.speed.speed_for`)."""
    from zeropilot.memory.speed import speed_of

    return speed_of(card, profile)


def search_candidates(inputs: Any, constants: Any, speed: Any = None) -> List[Any]:
    """The fitting configurations ``plan --search`` finds for ``inputs`` (same global batch, fastest first by the
    card's ``speed``), as plan inputs."""
    from zeropilot.memory.search import search

    ranked, _ = search(inputs, limit=CANDIDATES, constants=constants, speed=speed)
    return [c.plan.inputs for c in ranked if c.fits]


def _estimate(inputs: Any, speed: Any) -> Any:
    from zeropilot.memory.steptime import estimate_time

    return estimate_time(inputs, speed)


@dataclass(frozen=True)
class Predictor:
    """How the report predicts a run's step: every part replaceable (a test's own speed figures; a stand-in model).

    Attributes:
        profile: a hardware profile (``report --hardware FILE``); None: the one found for the run's card
            (:func:`zeropilot.memory.profile.find`, as ``plan`` finds it) where ``find_profile``.
        speed: speed figures to use as they are (no card table, no profile): a test's, a CPU's.
        estimate: the time model, ``(PlanInputs, Speed) -> StepTime``.
        speed_for: the card's figures, ``(card, profile) -> Speed``.
        candidates: the configurations to compare, ``(PlanInputs, Constants, Speed) -> [PlanInputs]``.
    """

    profile: Any = None
    speed: Any = None
    find_profile: bool = True
    estimate: Callable[[Any, Any], Any] = _estimate
    speed_for: Callable[[Optional[str], Any], Any] = card_speed
    candidates: Callable[..., List[Any]] = search_candidates


#: what a prediction may raise on a stranger's record, or before the time model lands: a reason, never a traceback
_CANNOT = (InputError, LookupError, ValueError, TypeError, ArithmeticError)


def _device(ranks: List[Dict[str, Any]]) -> Tuple[Optional[str], Optional[str]]:
    for r in ranks:
        dev = r.get("device") or {}
        if dev.get("name") or dev.get("backend"):
            return dev.get("name"), dev.get("backend")
    return None, None


def _speed(card: Optional[str], backend: Optional[str], world: int, p: Predictor) -> Tuple[Any, Optional[str]]:
    """(speed figures, None) or (None, why there are none)."""
    if p.speed is not None:
        return p.speed, None
    profile = p.profile
    if profile is None and p.find_profile and card and backend != "cpu":
        from zeropilot.memory.profile import find

        try:
            profile = find(card, world)
        except (InputError, OSError):
            profile = None
    if backend == "cpu" and profile is None:
        return None, ("the run trained on the CPU: the time model has speed figures for GPUs only (the card table, "
                      "or a GPU's `zeropilot calibrate` profile)")
    try:
        speed = p.speed_for(card, profile)
    except _CANNOT as exc:
        return None, f"no speed figures for the card {card or '(not recorded)'!s}: {exc}"
    if speed is None:
        return None, (f"no speed figures for the card {card or '(not recorded)'!s}: not in the card table; measure it "
                      "with `zeropilot calibrate` and pass the profile with --hardware FILE")
    return speed, None


def _setup(records: RunRecords) -> Optional[Dict[str, Any]]:
    """The last setup record of the lowest rank that wrote one, with that rank's allocator settings."""
    for _, rec in sorted(records.ranks.items()):
        setups = rec.of("setup")
        if setups:
            start = next((e for e in rec.events if e.get("event") == "start"), {})
            return {"setup": setups[-1], "allocator_settings": start.get("allocator_settings")}
    return None


def _budget(ranks: List[Dict[str, Any]]) -> Optional[int]:
    from zeropilot.memory.from_run import budget

    values = [budget(r.get("device_total_bytes") or (r.get("device") or {}).get("total_bytes"),
                     r.get("allocator_limit_bytes"), r.get("outside_torch_bytes")) for r in ranks]
    values = [v for v in values if v]
    return min(values) if values else None


def _outside(ranks: List[Dict[str, Any]]) -> Optional[int]:
    values = [r["outside_torch_bytes"] for r in ranks if r.get("outside_torch_bytes") is not None]
    return max(values) if values else None


def config_text(inputs: Any) -> str:
    """A configuration in a few words: ``ZeRO-2 without checkpointing, micro batch 4 x 2``."""
    parts = [f"ZeRO-{inputs.stage}"]
    if inputs.offload_optimizer != "none":
        parts.append(f"optimizer offloaded to {inputs.offload_optimizer.upper()}")
    if inputs.offload_param != "none":
        parts.append(f"parameters offloaded to {inputs.offload_param.upper()}")
    head = ", ".join(parts) + (" with checkpointing" if inputs.gradient_checkpointing else " without checkpointing")
    return head + f", micro batch {inputs.micro_batch} x {inputs.grad_accum}"


#: the fields a candidate of the search changes (``memory.search``), compared with this launch's
_CHANGED = ("stage", "offload_optimizer", "offload_param", "gradient_checkpointing", "micro_batch", "grad_accum",
            "reduce_bucket_size", "prefetch_bucket_size", "overlap")


def _changes(before: Any, after: Any) -> Dict[str, List[Any]]:
    return {k: [getattr(before, k), getattr(after, k)] for k in _CHANGED if getattr(before, k) != getattr(after, k)}


def _step_dict(step: Any) -> Dict[str, Any]:
    """A predicted step as the report's JSON holds it; ValueError when the model gave no finite positive time."""
    step_s = nz.num(step.step_s)
    if step_s is None or step_s <= 0:
        raise ValueError(f"no finite step time ({step.step_s!r} s)")
    return {"step_s": step_s, "phases": {k: nz.num(v) for k, v in step.phases().items()},
            "tokens_per_s": nz.num(step.tokens_per_s), "mfu": nz.num(step.mfu), "card": nz.text(step.card),
            "estimated": [nz.text(e) for e in step.estimated][: nz.MAX_ITEMS],
            "terms": [{"name": nz.text(t.name), "seconds": nz.num(t.seconds), "phase": nz.text(t.phase),
                       "reason": nz.text(t.reason)} for t in step.terms][: nz.MAX_ITEMS]}


def _inputs_dict(inputs: Any) -> Dict[str, Any]:
    return {"stage": inputs.stage, "micro_batch": inputs.micro_batch, "grad_accum": inputs.grad_accum,
            "seq_len": inputs.seq_len, "gradient_checkpointing": inputs.gradient_checkpointing,
            "offload_optimizer": inputs.offload_optimizer, "offload_param": inputs.offload_param,
            "lora_rank": inputs.lora_rank, "world_size": inputs.world_size, "config": config_text(inputs)}


def _faster(inputs: Any, step_s_now: float, measured_s: float, speed: Any, ranks: List[Dict[str, Any]],
            p: Predictor) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The fitting candidate of the search predicted fastest, when it beats this launch by :data:`FASTER`."""
    if inputs.hardware is None:
        return None, ["no search for a faster configuration: the device's memory is not recorded"]
    from zeropilot.memory.constants import DEFAULT
    from zeropilot.memory.profile import with_outside_torch

    outside = _outside(ranks)
    constants = DEFAULT if outside is None else with_outside_torch(DEFAULT, outside, "measured in this run")
    best: Optional[Tuple[float, Any, Any]] = None
    for cand in p.candidates(inputs, constants, speed):
        if not _changes(inputs, cand):
            continue
        try:
            step_s = nz.num(p.estimate(cand, speed).step_s)
        except _CANNOT:
            continue
        if step_s is not None and step_s > 0 and (best is None or step_s < best[0]):
            best = (step_s, cand)
    if best is None or best[0] > FASTER * step_s_now:
        return None, []
    step_s, cand = best
    return {"config": config_text(cand), "step_s": step_s, "gain": nz.num(measured_s / step_s),
            "gain_predicted": nz.num(step_s_now / step_s), "changes": _changes(inputs, cand),
            "budget_bytes": inputs.hardware.gpu_bytes}, []


def _slower(m: Dict[str, Any], predicted: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    ratio = m["step_s"] / predicted["step_s"]
    if ratio < SLOWER:
        return None
    excess = {name: (m["phases"].get(name) or 0.0) - (predicted["phases"].get(name) or 0.0) for name, _ in SPLIT}
    phase = max(excess, key=lambda k: excess[k]) if m["phases"] else None  # no phase times: the step only
    return {"ratio": ratio, "excess_s": m["step_s"] - predicted["step_s"], "phase": phase,
            "phase_excess_s": excess[phase] if phase else None}


def predicted(records: RunRecords, ranks: List[Dict[str, Any]], m: Dict[str, Any], p: Predictor) -> Dict[str, Any]:
    """The prediction for this launch against the measured split ``m``: ``predicted`` (or None with ``reason``),
    ``slower_than_predicted``, ``faster``, ``notes``."""
    none: Dict[str, Any] = {"predicted": None, "slower_than_predicted": None, "faster": None, "notes": []}
    if m["step_s"] is None or m["batch"] is None:
        return {**none, "reason": "no steady step recorded its batch (micro batch size, padded length): nothing to "
                                  "predict for"}
    rec = _setup(records)
    if rec is None:
        return {**none, "reason": "the guard recorded no setup (model, ZeRO and batch settings) in any rank"}
    card, backend = _device(ranks)
    from zeropilot.memory.from_run import plan_inputs

    rec["batch"] = m["batch"]
    inputs, why, notes = plan_inputs(rec, _budget(ranks))
    if inputs is None:
        return {**none, "reason": nz.text(why)}
    try:
        speed, why = _speed(card, backend, inputs.world_size, p)
        if speed is None:
            return {**none, "reason": nz.text(why)}
        out = _step_dict(p.estimate(inputs, speed))
        out.update(card=out["card"] or nz.text(getattr(speed, "card", None)) or card, inputs=_inputs_dict(inputs),
                   measured_mfu=nz.num(out["mfu"] * out["step_s"] / m["step_s"]) if out["mfu"] is not None else None)
        faster, more = _faster(inputs, out["step_s"], m["step_s"], speed, ranks, p)
    except _CANNOT as exc:
        return {**none, "reason": nz.text(f"the time model cannot take this run: {exc}")}
    train = rec["setup"].get("train")
    if isinstance(train, dict) and train.get("precision") == "fp32":
        notes.append("the run trains in fp32: the time model counts bf16 matrix products")
    return {"predicted": out, "reason": None, "slower_than_predicted": _slower(m, out), "faster": faster,
            "notes": [nz.text(n) for n in notes + more]}


def section(records: RunRecords, ranks: List[Dict[str, Any]], predictor: Optional[Predictor] = None
            ) -> Dict[str, Any]:
    """The report's ``time`` object: ``measured``, ``predicted`` (or None and ``reason``), ``ratio`` (measured over
    predicted), ``slower_than_predicted``, ``faster``, ``notes``."""
    m = measured(records)
    pred = predicted(records, ranks, m, predictor or Predictor())
    ratio = nz.num(m["step_s"] / pred["predicted"]["step_s"]) if pred["predicted"] else None
    return {"measured": m, "predicted": pred["predicted"], "reason": pred["reason"], "ratio": ratio,
            "slower_than_predicted": pred["slower_than_predicted"], "faster": pred["faster"], "notes": pred["notes"]}
