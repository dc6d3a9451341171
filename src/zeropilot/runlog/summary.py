"""From a run directory's records to the report: the verdict, per-rank peaks, saves.

:func:`summarize` returns the object ``zeropilot report DIR --format json`` prints (schema
:data:`REPORT_SCHEMA`, documented in ``docs/run-dir.md``). Pure: it reads :class:`RunRecords` only.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional

from zeropilot.runlog.events import MEMORY_FIELDS
from zeropilot.runlog.read import RankRecords, RunRecords

REPORT_SCHEMA = "zeropilot.report/1"
VERDICTS = ("ok", "oom", "hang", "crash", "running")


def _finite(values) -> List[float]:
    return [v for v in values if not math.isnan(v)]


def _max(values) -> Optional[int]:
    vals = _finite(values)
    return int(max(vals)) if vals else None


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


def _mem_peak(mem: Any, key: str) -> Optional[int]:
    if isinstance(mem, dict) and isinstance(mem.get(key), (int, float)) and not isinstance(mem.get(key), bool):
        return int(mem[key])
    return None


def _rank_summary(rec: RankRecords, plan_bytes: Optional[int]) -> Dict[str, Any]:
    cols = rec.steps
    peak_reserved = _max(cols["peak_reserved_bytes"])
    peak_alloc = _max(cols["peak_allocated_bytes"])
    for e in rec.events:  # saves, loads and OOMs can peak between steps
        for key in ("mem_peak", "mem_after", "mem"):
            peak_reserved = _larger(peak_reserved, _mem_peak(e.get(key), "peak_reserved_bytes"))
            peak_alloc = _larger(peak_alloc, _mem_peak(e.get(key), "peak_allocated_bytes"))
    ended = any(e.get("event") == "end" for e in rec.events)
    last_t = max(_finite(cols["t"]) + [e["t"] for e in rec.events if isinstance(e.get("t"), (int, float))],
                 default=None)
    steps = _finite(cols["step"])
    return {
        "rank": rec.rank,
        "steps": int(max(steps)) if steps else 0,
        "peak_reserved_bytes": peak_reserved,
        "peak_allocated_bytes": peak_alloc,
        "outside_torch_bytes": _max(cols["outside_torch_bytes"]),
        "device_total_bytes": _max(cols["device_total_bytes"]),
        "host_rss_peak_bytes": _max(cols["host_rss_bytes"]),
        "alloc_retries": _max(cols["alloc_retries"]),
        "plan_bytes": plan_bytes,
        "ended": ended,
        "last_record_t": last_t,
    }


def _larger(a: Optional[int], b: Optional[int]) -> Optional[int]:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _first_step_after(rec: RankRecords, t: float, before_counter: Optional[float]) -> Optional[Dict[str, Any]]:
    cols = rec.steps
    for i, ts in enumerate(cols["t"]):
        if ts > t:
            mem = {name: (None if math.isnan(cols[name][i]) else int(cols[name][i])) for name in MEMORY_FIELDS}
            return {"step": int(cols["step"][i]), "seconds": cols["seconds"][i], "mem": mem,
                    "window_peak_reserved_bytes": window_peak(before_counter, cols["peak_reserved_bytes"][i])}
    return None


def _checkpoint_ops(records: RunRecords, kind: str) -> List[Dict[str, Any]]:
    ops = []
    for rank, rec in sorted(records.ranks.items()):
        for e in rec.of(kind):
            after = e.get("mem_after") if isinstance(e.get("mem_after"), dict) else {}
            counter = after.get("peak_reserved_bytes")
            op = {k: e.get(k) for k in ("step", "tag", "path", "bytes", "seconds", "phases",
                                        "mem_before", "mem_peak", "mem_after")}
            op["rank"] = rank
            op["t"] = e.get("t")
            if kind == "save" and isinstance(e.get("t"), (int, float)):
                op["first_step_after"] = _first_step_after(rec, e["t"], counter)
            ops.append(op)
    return sorted(ops, key=lambda o: (o.get("t") or 0, o["rank"]))


def _verdict(records: RunRecords, ranks: List[Dict[str, Any]]) -> Dict[str, Any]:
    run = records.run or {}
    if records.hang:
        v = records.hang.get("verdict") if isinstance(records.hang.get("verdict"), dict) else {}
        return {"kind": "hang", "ranks": v.get("ranks", []), "where": v.get("where", []),
                "reason": v.get("reason", "no progress within the hang timeout")}
    if records.ooms:
        first = min(records.ooms.items(), key=lambda kv: kv[1].get("t", math.inf))
        v = first[1].get("verdict") if isinstance(first[1].get("verdict"), dict) else {}
        return {"kind": "oom", "ranks": sorted(records.ooms), "where": first[1].get("where", []),
                "reason": v.get("summary") or f"out of memory on rank {first[0]}", "class": v.get("kind")}
    errors = [(e.get("t", math.inf), r, e) for r, rec in records.ranks.items() for e in rec.of("error")]
    exit_code = run.get("exit_code")
    not_ended = [r for r in ranks if not r["ended"]]
    if errors:
        t, rank, e = min(errors, key=lambda x: (x[0], x[1]))
        return {"kind": "crash", "ranks": [rank], "where": e.get("where", []),
                "reason": f"{e.get('type', 'error')}: {e.get('message', '')}".strip()}
    if "ended_at" not in run and exit_code is None:
        return {"kind": "running", "ranks": [], "where": [], "reason": "the run has not ended (or its supervisor died)"}
    if exit_code not in (0, None) or run.get("signal") or not_ended:
        dead = sorted(not_ended, key=lambda r: (r["last_record_t"] or 0, r["rank"]))
        first = [dead[0]["rank"]] if dead else []
        why = f"exit status {exit_code}" if exit_code not in (0, None) else "a rank ended without finishing"
        if run.get("signal"):
            why = f"killed by {run['signal']}"
        return {"kind": "crash", "ranks": first, "where": [], "reason": why +
                (f"; rank {first[0]} stopped recording first" if first else "")}
    return {"kind": "ok", "ranks": [], "where": [], "reason": "every rank finished"}


def summarize(records: RunRecords) -> Dict[str, Any]:
    """The report of a run: verdict, steps, per-rank peaks against the plan, saves, loads."""
    run = records.run or {}
    plan = run.get("plan") if isinstance(run.get("plan"), dict) else None
    plan_bytes = plan.get("peak_bytes_per_rank") if plan else None
    ranks = [_rank_summary(rec, plan_bytes if isinstance(plan_bytes, int) else None)
             for _, rec in sorted(records.ranks.items())]
    secs = [s for rec in records.ranks.values() for s in _finite(rec.steps["seconds"])]
    return {
        "schema": REPORT_SCHEMA,
        "run_dir": str(records.root),
        "command": run.get("command"),
        "exit_code": run.get("exit_code"),
        "verdict": _verdict(records, ranks),
        "steps": max((r["steps"] for r in ranks), default=0),
        "step_seconds": {"median": statistics.median(secs) if secs else None,
                         "max": max(secs) if secs else None},
        "ranks": ranks,
        "saves": _checkpoint_ops(records, "save"),
        "loads": _checkpoint_ops(records, "load"),
        "ooms": [dict(rec, rank=r) for r, rec in sorted(records.ooms.items())],
        "hang": records.hang,
        "plan": plan,
        "environment": run.get("environment"),
        "problems": records.problems,
    }
