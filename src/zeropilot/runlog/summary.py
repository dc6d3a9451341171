"""From a run directory's records to the report: the verdict, per-rank peaks, saves.

:func:`summarize` returns the object ``zeropilot report DIR --format json`` prints (schema
:data:`REPORT_SCHEMA`, documented in ``docs/run-dir.md`` and ``docs/report.md``, machine-checked
by ``docs/report.schema.json``); :func:`compare` puts two of them side by side. Pure: it reads
:class:`RunRecords` only. Everything copied from the directory is normalized first
(:mod:`zeropilot.runlog.normalize`): the report has one shape whatever the directory held.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from typing import Any, Dict, List, Optional

from zeropilot.runlog import job, normalize as nz, spread, stragglers, timeouts, timing
from zeropilot.runlog.events import MEMORY_FIELDS
from zeropilot.runlog.frames import display
from zeropilot.runlog.heal import section as heal_section
from zeropilot.runlog.read import RankRecords, RunRecords

REPORT_SCHEMA = "zeropilot.report/1"
COMPARE_SCHEMA = "zeropilot.report-compare/1"
VERDICTS = ("ok", "oom", "hang", "crash", "running")


def _finite(values) -> List[float]:
    return [v for v in values if v == v]  # NaN != NaN


def window_peak(before: Optional[float], after: Optional[float]) -> Optional[int]:
    """The peak inside a window from the allocator's cumulative peak counter read at both ends.

    If the counter rose, the window set a new peak and the counter is it. If it did not rise, the
    window's peak is somewhere at or below the counter and is not known: None. (A counter that fell
    was reset by someone else inside the window; its new value is a peak of the window's tail.)
    """
    if after is None or (isinstance(after, float) and math.isnan(after)):
        return None
    if before is None or (isinstance(before, float) and math.isnan(before)) or after != before:
        return int(after)
    return None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    """``a / b`` as a finite float, or None (unknown, zero, or too large for a float: hostile values)."""
    if a is None or not b:
        return None
    try:
        x = a / b
    except (OverflowError, ZeroDivisionError):
        return None
    return x if math.isfinite(x) else None


def _mean(values: List[float]) -> Optional[float]:
    try:
        x = math.fsum(values) / len(values)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _mem_peak(mem: Any, key: str) -> Optional[int]:
    return nz.integer(mem.get(key)) if isinstance(mem, dict) else None


def _larger(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _peak_source(rec: RankRecords, events: List[Dict[str, Any]], key: str) -> Optional[Dict[str, Any]]:
    """Where rank's highest ``key`` counter was first seen: ``{event, step, t, bytes}``.

    The counters are cumulative, so the record that first shows the maximum closes the window that
    set it: a step (the peak happened in that step) or a save/load/init/oom (it happened there).
    """
    best: Optional[Dict[str, Any]] = None
    stats = rec.col_stats(key)  # over every step record, also when the reading holds a sample of them
    if stats is not None:
        best = {"event": "step", "step": nz.integer(stats.hi_at[0]), "t": nz.num(stats.hi_at[1]),
                "bytes": int(stats.hi)}
    for e in events:
        for field in ("mem_peak", "mem_after", "mem"):
            value = _mem_peak(e.get(field), key)
            t = nz.num(e.get("t"))
            if value is None:
                continue
            if best is None or value > best["bytes"] or (value == best["bytes"] and t is not None
                                                          and best["t"] is not None and t < best["t"]):
                best = {"event": nz.text(e.get("event")) or "?", "step": nz.integer(e.get("step")), "t": t,
                        "bytes": value}
    return best


def _start(rec: RankRecords) -> Dict[str, Any]:
    """Where the rank ran: its ``start`` record, with what ``init`` says after CUDA came up taking precedence."""
    merged: Dict[str, Any] = {}
    for kind in ("start", "init"):
        e = next((e for e in rec.events if e.get("event") == kind), {})
        merged.update({k: v for k, v in e.items() if v is not None})
    dev = merged.get("device") if isinstance(merged.get("device"), dict) else {}
    return {
        "host": nz.text(merged.get("host")),
        "pid": nz.integer(merged.get("pid")),
        "framework": nz.text(merged.get("framework")),
        "device": {"name": nz.text(dev.get("name")), "backend": nz.text(dev.get("backend")),
                   "total_bytes": nz.size(dev.get("total_bytes"))} if dev else None,
        "allocator_settings": nz.str_map(merged.get("allocator_settings")),
    }


_EVENT_MEMS = ("mem_before", "mem_peak", "mem_after", "mem")


_HIGHS = ("peak_reserved_bytes", "peak_allocated_bytes", "outside_torch_bytes", "device_total_bytes",
          "host_rss_bytes", "alloc_retries")  # the memory fields a rank's summary gives the highest of


def _event_highs(events: List[Dict[str, Any]]) -> Dict[str, Optional[int]]:
    """The highest value of each of :data:`_HIGHS` over every memory object of the other records (one pass)."""
    top: Dict[str, Optional[int]] = dict.fromkeys(_HIGHS)
    for e in events:
        for key in _EVENT_MEMS:
            mem = e.get(key)
            if isinstance(mem, dict):
                for field in _HIGHS:
                    top[field] = _larger(top[field], nz.integer(mem.get(field)))
    return top


def _column_max(rec: RankRecords, highs: Dict[str, Optional[int]], field: str) -> Optional[int]:
    """The highest value of a memory field over the step records and every memory object of the other records
    (``highs``: :func:`_event_highs`)."""
    high = rec.col_max(field)
    return _larger(None if high is None else int(high), highs[field])


def _with_oom(rec: RankRecords, oom: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The rank's non-step records, plus its OOM record's memory (the observer read it at the failure)."""
    if not oom:
        return rec.events
    return rec.events + [{"event": "oom", "t": oom.get("t"), "step": oom.get("step"), "mem": oom.get("mem")}]


def _allocator_limit(rec: RankRecords, oom: Optional[Dict[str, Any]]) -> Optional[int]:
    """The allocator's cap (``set_per_process_memory_fraction``: an emulated smaller card), where recorded."""
    for e in rec.events:
        if e.get("event") == "init" and nz.size(e.get("allocator_limit_bytes")) is not None:
            return nz.size(e.get("allocator_limit_bytes"))
    return nz.size((oom or {}).get("allocator_limit_bytes"))


def _rank_summary(rec: RankRecords, plan_bytes: Optional[int], oom: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    cols = rec.steps
    events = _with_oom(rec, oom)
    highs = _event_highs(events)
    peak_reserved = _column_max(rec, highs, "peak_reserved_bytes")  # saves, loads and OOMs peak between steps
    ended = any(e.get("event") == "end" for e in rec.events)
    times = [t for t in (rec.col_min("t"), rec.col_max("t")) if t is not None]
    times += [t for t in (nz.num(e.get("t")) for e in rec.events) if t is not None]
    last_step = rec.col_max("step")
    secs = _finite(cols["seconds"])
    outside = _column_max(rec, highs, "outside_torch_bytes")
    # what the plan predicts (gpu_peak_bytes) is the reserved peak plus memory outside PyTorch (FACTS.md)
    device_peak = peak_reserved + outside if peak_reserved is not None and outside is not None else None
    return {
        "rank": rec.rank,
        "steps": int(last_step) if last_step is not None else 0,
        "peak_reserved_bytes": peak_reserved,
        "peak_allocated_bytes": _column_max(rec, highs, "peak_allocated_bytes"),
        "outside_torch_bytes": outside,
        "device_total_bytes": _column_max(rec, highs, "device_total_bytes"),
        "allocator_limit_bytes": _allocator_limit(rec, oom),
        "host_rss_peak_bytes": _column_max(rec, highs, "host_rss_bytes"),
        "alloc_retries": _column_max(rec, highs, "alloc_retries"),
        "plan_bytes": plan_bytes,
        "ended": ended,
        "last_record_t": max(times, default=None),
        "first_record_t": min(times, default=None),
        "step_records": rec.step_records,
        "step_seconds_median": statistics.median(secs) if secs else None,
        "peak_reserved_at": _peak_source(rec, events, "peak_reserved_bytes"),
        "host_rss_peak_at": _peak_source(rec, events, "host_rss_bytes"),
        "peak_device_bytes": device_peak,
        "plan_ratio": ratio(device_peak, plan_bytes),
        **_start(rec),
    }


def _in_order(times) -> bool:
    """True when step times never go back (and hold no NaN): then a binary search finds a time."""
    return all(a <= b for a, b in zip(times, itertools.islice(times, 1, None)))


def _first_step_after(rec: RankRecords, t: float, before_counter: Optional[float],
                      in_order: bool) -> Optional[Dict[str, Any]]:
    cols = rec.steps
    times = cols["t"]
    for i in range(bisect.bisect_right(times, t) if in_order else 0, len(times)):
        if times[i] > t:
            mem = {name: (None if math.isnan(cols[name][i]) else int(cols[name][i])) for name in MEMORY_FIELDS}
            return {"step": nz.integer(cols["step"][i]), "seconds": nz.num(cols["seconds"][i]), "mem": mem,
                    "window_peak_reserved_bytes": window_peak(before_counter, cols["peak_reserved_bytes"][i])}
    return None


def _checkpoint_ops(records: RunRecords, kind: str) -> List[Dict[str, Any]]:
    ops = []
    for rank, rec in sorted(records.ranks.items()):
        in_order = kind == "save" and _in_order(rec.steps["t"])
        for e in rec.of(kind):
            t = nz.num(e.get("t"))
            seconds = nz.num(e.get("seconds"))
            op = {"step": nz.integer(e.get("step")), "tag": nz.text(e.get("tag")), "path": nz.text(e.get("path")),
                  "bytes": nz.size(e.get("bytes")), "seconds": seconds, "phases": nz.phases(e.get("phases")),
                  "mem_before": nz.mem(e.get("mem_before")), "mem_peak": nz.mem(e.get("mem_peak")),
                  "mem_after": nz.mem(e.get("mem_after")), "rank": rank, "t": t, "error": nz.text(e.get("error")),
                  "files": nz.integer(e.get("files")),
                  "start_t": (t - seconds) if t is not None and seconds is not None else t}
            if kind == "save" and t is not None:
                counter = (op["mem_after"] or {}).get("peak_reserved_bytes")
                op["first_step_after"] = _first_step_after(rec, t, counter, in_order)
            elif kind == "save":
                op["first_step_after"] = None
            ops.append(op)
    return sorted(ops, key=lambda o: (o["t"] if o["t"] is not None else 0.0, o["rank"]))


def _earliest(t: Optional[float], rank: int) -> tuple:
    """Sort key: earliest time first, unknown times last, then the lower rank."""
    return (t is None, t if t is not None else 0.0, rank)


def _verdict(records: RunRecords, ranks: List[Dict[str, Any]], ooms: List[Dict[str, Any]],
             hang: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    run = records.run or {}
    errors = [(nz.num(e.get("t")), r, e) for r, rec in records.ranks.items() for e in rec.of("error")]
    if hang is not None:
        v = hang["verdict"]
        lost = set(v.get("ranks") or [])
        if v.get("class") == "node_lost" and any(r in lost for _, r, _ in errors):
            # the other nodes saw these ranks fall silent; their own node's records say why: a crash, not a hang
            crash = _crash(records, ranks, errors)
            crash["reason"] = nz.text(f"{crash['reason']} (the other nodes' watchdog saw rank(s) "
                                      f"{', '.join(map(str, sorted(lost)))} fall silent and named a lost node; "
                                      "their own records show this crash)")
            return crash
        return {"kind": "hang", "ranks": v["ranks"], "where": v["where"],
                "reason": v["reason"] or "no progress within the hang timeout", "cause": v["cause"],
                "class": v["class"]}
    if ooms:
        first = min(ooms, key=lambda o: _earliest(o["t"], o["rank"]))
        return {"kind": "oom", "ranks": sorted(o["rank"] for o in ooms), "where": display(first["where"], first["frames"])[0],
                "reason": first["verdict"]["summary"] or f"out of memory on rank {first['rank']}",
                "class": first["verdict"]["kind"], "first_rank": first["rank"]}
    exit_code = nz.integer(run.get("exit_code"))
    not_ended = [r for r in ranks if not r["ended"]]
    signal = nz.text(run.get("signal"))
    if errors:
        return _crash(records, ranks, errors)
    if "ended_at" not in run and run.get("exit_code") is None:
        return {"kind": "running", "ranks": [], "where": [], "reason": "the run has not ended (or its supervisor died)"}
    if exit_code not in (0, None) or signal or not_ended:
        why = f"exit status {exit_code}" if exit_code not in (0, None) else "a rank ended without finishing"
        if signal:
            why = f"killed by {signal}"
        found = _first_failure(records, ranks) if not_ended else None
        if found is None:
            return {"kind": "crash", "ranks": [], "where": [], "reason": why}
        rank, what = found
        silent = next(r for r in ranks if r["rank"] == rank)
        return {"kind": "crash", "ranks": [rank], "where": [],
                "reason": nz.text(f"{why}; rank {rank} {what}, {_last_seen(records, silent)}")}
    return {"kind": "ok", "ranks": [], "where": [], "reason": "every rank finished"}


def _error_text(e: Dict[str, Any]) -> str:
    return nz.text(f"{nz.text(e.get('type')) or 'error'}: {nz.text(e.get('message')) or ''}".strip().rstrip(":"))


def _crash(records: RunRecords, ranks: List[Dict[str, Any]], errors: List[tuple]) -> Dict[str, Any]:
    """The rank that failed first, chosen by :func:`zeropilot.runlog.crash.first_failure` (one rule, one place).

    An ``error`` with ``peer_failure`` is a rank noticing a dead peer (gloo's "Connection reset by peer");
    when every error is one, the rank that stopped with neither ``error`` nor ``end`` (killed: SIGKILL,
    the kernel's OOM killer) and was not terminated by its launcher failed first.
    """
    found = _first_failure(records, ranks)
    if found is None:
        return {"kind": "crash", "ranks": [], "where": [], "reason": "a rank failed"}
    rank, why = found
    own = [e for _, r, e in errors if r == rank]
    if own:
        e = min(own, key=lambda e: _earliest(nz.num(e.get("t")), rank))
        return {"kind": "crash", "ranks": [rank], "where": nz.texts(e.get("where")), "reason": _error_text(e)}
    t, other, e = min(errors, key=lambda x: _earliest(x[0], x[1]))
    silent = next(r for r in ranks if r["rank"] == rank)
    return {"kind": "crash", "ranks": [rank], "where": [],
            "reason": nz.text(f"rank {rank} {why}, {_last_seen(records, silent)}; then rank {other} saw its "
                              f"peer fail: {_error_text(e)}")}


def _first_failure(records: RunRecords, ranks: List[Dict[str, Any]]) -> Optional[tuple]:
    """(rank, why) by :func:`zeropilot.runlog.crash.first_failure`: ranks the launcher terminated are not causes."""
    from zeropilot.runlog.crash import first_failure, terminated_ranks

    last_t = {r["rank"]: r["last_record_t"] for r in ranks}
    return first_failure({r: rec.events for r, rec in records.ranks.items()}, last_t,
                         terminated_ranks(records.stacks))


def _last_seen(records: RunRecords, rank: Dict[str, Any]) -> str:
    """Where a silent rank was last seen: its heartbeat if newer than its last record, else that record."""
    beat = records.heartbeats.get(rank["rank"]) or {}
    last_t = rank["last_record_t"]
    if nz.text(beat.get("phase")) and (last_t is None or (nz.num(beat.get("t")) or 0.0) >= last_t):
        step = nz.integer(beat.get("step"))
        return f"in phase {nz.text(beat.get('phase'))}" + (f" at step {step}" if step is not None else "")
    rec = records.ranks[rank["rank"]]
    last_step = rec.steps["step"][-1] if rec.n_steps else math.nan
    if rec.n_steps and (not rec.events or rec.steps["t"][-1] >= (nz.num(rec.events[-1].get("t")) or 0.0)):
        return f"after step {int(last_step)}" if last_step == last_step else "after a step"
    if rec.events:
        return f"after its {nz.text(rec.events[-1].get('event')) or '?'} record"
    return "before recording anything"


def _step_seconds(records: RunRecords) -> Dict[str, Any]:
    """Step time over every rank's steps: median, p90 (of the steps read: a sample of a long run's), max, mean and
    count (of every step record), and the first step's (warm-up)."""
    secs = sorted(s for rec in records.ranks.values() for s in _finite(rec.steps["seconds"]))
    firsts = [rec.steps["seconds"][0] for rec in records.ranks.values()
              if rec.n_steps and not math.isnan(rec.steps["seconds"][0])]
    if not secs:
        return {"median": None, "max": None, "p90": None, "mean": None, "count": 0, "first": None}
    stats = [s for s in (rec.col_stats("seconds") for rec in records.ranks.values()) if s is not None]
    count = sum(s.n for s in stats)
    return {"median": statistics.median(secs), "max": max(s.hi for s in stats),
            "p90": secs[min(len(secs) - 1, int(0.9 * len(secs)))],
            "mean": _mean_of(math.fsum(s.total for s in stats), count), "count": count,
            "first": max(firsts) if firsts else None}


def _mean_of(total: float, count: int) -> Optional[float]:
    x = total / count if count else None
    return x if x is not None and math.isfinite(x) else None


def reading(records: RunRecords) -> Dict[str, Any]:
    """How the step records were read: all of them, or a sample (``runlog.read``) whose medians the report gives."""
    every = next((rec.sample_every for rec in records.ranks.values() if rec.sample_every is not None), None)
    return {"step_records": sum(rec.step_records for rec in records.ranks.values()),
            "rows_read": sum(rec.n_steps for rec in records.ranks.values()), "sample_every": every}


def spread_section(records: RunRecords, ranks: List[Dict[str, Any]], time_section: Dict[str, Any],
                   found: List[Dict[str, Any]], verdict: Dict[str, Any]) -> Dict[str, Any]:
    """The distribution of each rank figure over the ranks and nodes, and the outliers by name (``runlog.spread``):
    what the text shows past :data:`~zeropilot.runlog.spread.MANY_RANKS` ranks. ``found``: the stragglers of every
    evidence (``runlog.stragglers``: ``data``, ``phases``, ``gpu``)."""
    idle = {r["rank"]: (r.get("phases") or {}).get("idle") for r in (time_section.get("measured") or {}).get("ranks")
            or []}
    rows = []
    for r in ranks:
        cols = records.ranks[r["rank"]].steps
        data = _median_of(cols["data_seconds"])  # the rank's DataLoader timed; else its time before the forward
        rows.append(dict(r, data_seconds_median=data if data is not None else idle.get(r["rank"]),
                         gpu_probe_seconds_median=_median_of(cols["gpu_probe_seconds"])))
    by_rank = {r["rank"]: r for r in rows}
    outliers = [{"kind": "straggler", "evidence": s.get("evidence"), "rank": s["rank"],
                 "figure": _STRAGGLER_FIGURE.get(s.get("evidence")) or ("data_seconds_median" if s.get("phase") ==
                                                                      "idle" else "forward_seconds_median"),
                 "value": s["own_seconds"], "median": s["peers_seconds"], "ratio": s["ratio"], "reason": None}
                for s in found]
    memory = spread.memory_outlier(rows, ("peak_device_bytes", "peak_reserved_bytes", "host_rss_peak_bytes"))
    if memory is not None:
        outliers.append(dict(memory, reason=None))
    outliers += [dict(o, figure=None, value=None, median=None, ratio=None) for o in spread.verdict_outliers(verdict)]
    for o in outliers:
        row = by_rank.get(o["rank"]) or {}
        o.setdefault("evidence", None)
        o.update(node=row.get("node"), host=row.get("host"))
    nodes = {r.get("node") for r in rows if r.get("node")}
    return {"ranks": len(rows), "nodes": len(nodes), "figures": spread.distributions(rows, spread.REPORT_FIGURES),
            "outliers": outliers}


#: the figure of ``runlog.spread.REPORT_FIGURES`` a straggler of each evidence stands out in
_STRAGGLER_FIGURE = {"data": "data_seconds_median", "gpu": "gpu_probe_seconds_median"}


def _median_of(col) -> Optional[float]:
    """The median of a column's numbers (NaN: none), or None when it has none."""
    got = [x for x in col if x == x]
    return statistics.median(got) if got else None


def main_frames(text: str) -> List[str]:
    """The frames of the thread that was running Python code, innermost first, from faulthandler's text.

    faulthandler marks the thread that dumped as ``Current thread``: the main thread when the dump came
    from a signal handler (how the guard takes it). Without that mark: the last thread that is not
    a bare ``threading`` worker.
    """
    blocks: List[tuple] = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append((s.startswith("Current"), []))
        elif s.startswith("File ") and blocks:
            blocks[-1][1].append(s)
    current = [frames for is_current, frames in blocks if is_current and frames]
    if current:
        return current[-1][: nz.MAX_ITEMS]
    busy = [frames for _, frames in blocks if frames and "_bootstrap" not in frames[-1]]
    return (busy or [frames for _, frames in blocks] or [[]])[-1][: nz.MAX_ITEMS]


def _stacks(records: RunRecords) -> List[Dict[str, Any]]:
    return [{"rank": r, "text": text, "main_frames": main_frames(text)} for r, text in sorted(records.stacks.items())]


def summarize(records: RunRecords, predictor: Optional[timing.Predictor] = None) -> Dict[str, Any]:
    """The report of a run: verdict, steps, per-rank peaks against the plan, saves, loads, the step time against
    the plan's prediction (``predictor``: how it is predicted, :class:`zeropilot.runlog.timing.Predictor`)."""
    run = records.run or {}
    plan = run.get("plan") if isinstance(run.get("plan"), dict) else None
    plan_bytes = nz.size(plan.get("peak_bytes_per_rank")) if plan else None
    ranks = [_rank_summary(rec, plan_bytes, records.ooms.get(r)) for r, rec in sorted(records.ranks.items())]
    ooms = [nz.oom(rec, r) for r, rec in sorted(records.ooms.items())]
    hang = nz.hang(records.hang) if records.hang is not None else None
    nodes = job.nodes_section(records, ranks)  # a job across nodes: ranks grouped, clocks, a lost node
    verdict = _verdict(records, ranks, ooms, hang)
    if nodes is not None:
        verdict = job.node_verdict(records, ranks, verdict)
    time_section = timing.section(records, ranks, predictor)
    found, gpu_found = stragglers.from_records(records), stragglers.gpu_from_records(records)
    return {
        "schema": REPORT_SCHEMA,
        "run_dir": str(records.root),
        "command": nz.texts(run.get("command")) if isinstance(run.get("command"), list) else nz.text(run.get("command")),
        "exit_code": nz.integer(run.get("exit_code")),
        "verdict": verdict,
        "steps": max((r["steps"] for r in ranks), default=0),
        "step_seconds": _step_seconds(records),
        "reading": reading(records),
        "time": time_section,
        "ranks": ranks,
        "saves": _checkpoint_ops(records, "save"),
        "loads": _checkpoint_ops(records, "load"),
        "ooms": ooms,
        "hang": hang,
        "hang_stacks": _stacks(records),
        "plan": plan,
        "environment": nz.str_map(run.get("environment")) if run.get("environment") is not None else None,
        "versions": nz.str_map(run.get("versions")),
        "started_at": nz.num(run.get("started_at")) if not isinstance(run.get("started_at"), str)
        else nz.text(run.get("started_at")),
        "ended_at": nz.num(run.get("ended_at")) if not isinstance(run.get("ended_at"), str)
        else nz.text(run.get("ended_at")),
        "signal": nz.text(run.get("signal")),
        "world_size": nz.integer(run.get("world_size")),
        "hang_timeout_s": nz.num(run.get("hang_timeout_s")),
        "on_hang": nz.text(run.get("on_hang")),
        "locks_removed": nz.locks(run.get("locks_removed")),
        "builds": nz.builds(run.get("builds")),
        "stragglers": found,
        "gpu_stragglers": gpu_found,
        "spread": spread_section(records, ranks, time_section, found + gpu_found, verdict),
        "timeouts": timeouts.report(records),
        "problems": records.problems,
        "nodes": nodes,
        "heal": heal_section(records.heal),
    }


def _metric(name: str, a: Optional[float], b: Optional[float]) -> Dict[str, Any]:
    return {"metric": name, "a": a, "b": b, "change": (b - a) if a is not None and b is not None else None,
            "ratio": ratio(b, a)}


def _top(summary: Dict[str, Any], key: str) -> Optional[int]:
    vals = [r[key] for r in summary["ranks"] if r.get(key) is not None]
    return max(vals) if vals else None


def _save_cost(summary: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """The slowest rank's seconds per save, median over saves; the largest save's bytes; its peak."""
    by_step: Dict[Any, float] = {}
    for s in summary["saves"]:
        if s["seconds"] is not None:
            by_step[s["step"]] = max(by_step.get(s["step"], 0.0), s["seconds"])
    peaks = [s["mem_peak"].get("peak_reserved_bytes") for s in summary["saves"] if s["mem_peak"]]
    sizes = [s["bytes"] for s in summary["saves"] if s["bytes"] is not None]
    return {"seconds": statistics.median(by_step.values()) if by_step else None,
            "bytes": max(sizes) if sizes else None,
            "peak_reserved_bytes": max((p for p in peaks if p is not None), default=None)}


def compare(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """Two reports side by side (before and after a fix): peaks, step time, save cost, per rank."""
    sa, sb = _save_cost(a), _save_cost(b)
    metrics = [
        _metric("peak_reserved_bytes", _top(a, "peak_reserved_bytes"), _top(b, "peak_reserved_bytes")),
        _metric("peak_allocated_bytes", _top(a, "peak_allocated_bytes"), _top(b, "peak_allocated_bytes")),
        _metric("outside_torch_bytes", _top(a, "outside_torch_bytes"), _top(b, "outside_torch_bytes")),
        _metric("host_rss_peak_bytes", _top(a, "host_rss_peak_bytes"), _top(b, "host_rss_peak_bytes")),
        _metric("steps", a["steps"], b["steps"]),
        _metric("step_seconds_median", a["step_seconds"]["median"], b["step_seconds"]["median"]),
        _metric("step_seconds_max", a["step_seconds"]["max"], b["step_seconds"]["max"]),
        _metric("save_seconds_median", sa["seconds"], sb["seconds"]),
        _metric("save_bytes", sa["bytes"], sb["bytes"]),
        _metric("save_peak_reserved_bytes", sa["peak_reserved_bytes"], sb["peak_reserved_bytes"]),
    ]
    ra = {r["rank"]: r for r in a["ranks"]}
    rb = {r["rank"]: r for r in b["ranks"]}
    per_rank = []
    for rank in sorted(set(ra) | set(rb)):
        x, y = ra.get(rank, {}), rb.get(rank, {})
        per_rank.append({"rank": rank,
                         "peak_reserved_bytes": _metric("peak_reserved_bytes", x.get("peak_reserved_bytes"),
                                                        y.get("peak_reserved_bytes")),
                         "host_rss_peak_bytes": _metric("host_rss_peak_bytes", x.get("host_rss_peak_bytes"),
                                                        y.get("host_rss_peak_bytes"))})
    return {"schema": COMPARE_SCHEMA, "a": a, "b": b, "metrics": metrics, "ranks": per_rank}
