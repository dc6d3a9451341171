"""Values from a run directory, made safe to report: right types, bounded sizes, nothing else.

A run directory may come from a stranger, so every record the report copies out (OOM forensics,
the watchdog's verdict, the environment) goes through these functions first: numbers that are not
finite become None, strings are cut at :data:`MAX_TEXT` characters, lists at :data:`MAX_ITEMS`, and
only the documented keys survive. The report then has one shape whatever the input held, which is
what ``docs/report.schema.json`` promises.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from zeropilot.runlog.events import MEMORY_FIELDS

MAX_TEXT = 4000
MAX_ITEMS = 200
MAX_RANKS = 1 << 16  # per-rank lists (hang.json's ranks): every rank of a large job is kept


LIMIT = float(1 << 62)  # no time, step, second or byte count of a real run comes near 4.6e18


def num(value: Any) -> Optional[float]:
    """A float of magnitude below :data:`LIMIT` (so sums and ratios stay finite), or None."""
    t = type(value)  # an int or a float first, by exact type: a report of 1,024 ranks asks millions of times
    if t is not int and t is not float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return None
    return float(value) if -LIMIT < value < LIMIT else None


def integer(value: Any) -> Optional[int]:
    """An int (floats rounded down), or None."""
    x = num(value)
    return None if x is None else int(x)


def size(value: Any) -> Optional[int]:
    """A byte count: a non-negative int, or None."""
    x = num(value)
    if x is None:
        return None
    i = int(x)
    return i if i >= 0 else None


def text(value: Any) -> Optional[str]:
    """A string cut at :data:`MAX_TEXT` characters; numbers become their text; anything else None."""
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)[:MAX_TEXT]
    return None


def texts(value: Any) -> List[str]:
    """A list of strings (frames, evidence): non-strings are skipped, objects become ``file:line in function``."""
    if not isinstance(value, list):
        return []
    out = []
    for item in value[:MAX_ITEMS]:
        if isinstance(item, dict):
            item = frame(item)
        s = text(item)
        if s is not None:
            out.append(s)
    return out


def frame(item: Dict[str, Any]) -> Optional[str]:
    """One stack frame recorded as an object, as one line."""
    where = text(item.get("file") or item.get("filename")) or "?"
    line = integer(item.get("line") or item.get("lineno"))
    func = text(item.get("function") or item.get("name"))
    return where + (f":{line}" if line is not None else "") + (f" in {func}" if func else "")


def ints(value: Any) -> List[int]:
    """A list of ints (rank lists)."""
    if not isinstance(value, list):
        return []
    return [i for i in (integer(v) for v in value[:MAX_ITEMS]) if i is not None]


def mem(value: Any) -> Optional[Dict[str, Optional[int]]]:
    """A memory object with exactly :data:`MEMORY_FIELDS` (ints or None), or None when not an object."""
    if not isinstance(value, dict):
        return None
    return {name: size(value.get(name)) for name in MEMORY_FIELDS}


def _scalar_text(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if v is None:
        return "null"
    s = text(v)
    return s if s is not None else f"<{type(v).__name__}>"  # nested deeper: named, not printed


def str_map(value: Any) -> Dict[str, str]:
    """A flat ``{name: text}`` object (environment, versions, allocator settings).

    One level of nesting is flattened to ``outer.inner`` (the guard's ``allocator_settings`` is
    ``{environment: {...}, in_force: {...}, source}``); anything deeper is named by its type, not printed.
    """
    if not isinstance(value, dict):
        return {}
    out: Dict[str, str] = {}
    for k, v in list(value.items())[:MAX_ITEMS]:
        if isinstance(v, dict):
            for k2, v2 in list(v.items())[:MAX_ITEMS]:
                out[f"{str(k)[:200]}.{str(k2)[:200]}"] = _scalar_text(v2)
        else:
            out[str(k)[:200]] = _scalar_text(v)
    return out


def _flag_or_none(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def _change(value: Any) -> Dict[str, Any]:
    """A fix's change: ``{plan input: value}`` with scalar values only (numbers bounded, text cut)."""
    if not isinstance(value, dict):
        return {}
    out: Dict[str, Any] = {}
    for k, v in list(value.items())[:MAX_ITEMS]:
        if isinstance(v, bool) or v is None:
            out[str(k)[:200]] = v
        elif isinstance(v, (int, float)):
            out[str(k)[:200]] = num(v)
        elif isinstance(v, str):
            out[str(k)[:200]] = v[:MAX_TEXT]
    return out


def fixes(value: Any) -> List[Dict[str, Any]]:
    """Ranked fixes, best first (a bare string is a fix without a why).

    ``{fix, why, expected_bytes, key, change, applies_to, predicted_peak_bytes, limit_bytes, fits, ranked,
    evidence}``: the change as plan inputs, where it is made, the plan's predicted peak against the budget and
    whether it fits; ``ranked`` false for fixes from the record's evidence alone (older records: null).
    """
    if not isinstance(value, list):
        return []
    out = []
    for item in value[:MAX_ITEMS]:
        if isinstance(item, str):
            item = {"fix": item}
        if isinstance(item, dict) and text(item.get("fix")):
            out.append({"fix": text(item.get("fix")), "why": text(item.get("why")),
                        "expected_bytes": size(item.get("expected_bytes")), "key": text(item.get("key")),
                        "change": _change(item.get("change")), "applies_to": text(item.get("applies_to")),
                        "predicted_peak_bytes": size(item.get("predicted_peak_bytes")),
                        "limit_bytes": size(item.get("limit_bytes")), "fits": _flag_or_none(item.get("fits")),
                        "ranked": _flag_or_none(item.get("ranked")), "evidence": text(item.get("evidence"))})
    return out


def frames(value: Any) -> List[Dict[str, Any]]:
    """Recorded stack frames ``{func, file, line, kind}``, innermost last."""
    if not isinstance(value, list):
        return []
    return [{"func": text(f.get("func")), "file": text(f.get("file")), "line": integer(f.get("line")),
             "kind": text(f.get("kind"))} for f in value[:MAX_ITEMS] if isinstance(f, dict)]


def _batch(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    return {"micro_batch_size": size(value.get("micro_batch_size")), "seq_len": size(value.get("seq_len")),
            "tokens": size(value.get("tokens"))}


def _batch_history(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    return {"steps": size(value.get("steps")), "median_seq_len": size(value.get("median_seq_len")),
            "max_seq_len": size(value.get("max_seq_len"))}


def setup(value: Any) -> Optional[Dict[str, Dict[str, str]]]:
    """What the rank trained (the ``setup`` record): ``model`` (config sizes flattened), ``zero``, ``train``."""
    if not isinstance(value, dict):
        return None
    return {part: str_map(value.get(part)) for part in ("model", "zero", "train")}


def phases(value: Any) -> List[Dict[str, Any]]:
    """Save/load phases ``{name, seconds}`` in recorded order."""
    if not isinstance(value, list):
        return []
    return [{"name": text(p.get("name")) or "?", "seconds": num(p.get("seconds"))}
            for p in value[:MAX_ITEMS] if isinstance(p, dict)]


def oom(record: Dict[str, Any], rank: int) -> Dict[str, Any]:
    """An ``oom-rank-N.json`` record in the report's shape."""
    v = record.get("verdict") if isinstance(record.get("verdict"), dict) else {}
    return {
        "rank": rank,
        "t": num(record.get("t")),
        "step": integer(record.get("step")),
        "phase": text(record.get("phase")),
        "request_bytes": size(record.get("request_bytes")),
        "mem": mem(record.get("mem")),
        "just_before": text(record.get("just_before")),
        "where": texts(record.get("where")),
        "verdict": {"kind": text(v.get("kind")), "summary": text(v.get("summary")),
                    "evidence": texts(v.get("evidence"))},
        "fixes": fixes(record.get("fixes")),
        "snapshot": text(record.get("snapshot")),
        "allocator_limit_bytes": size(record.get("allocator_limit_bytes")),
        "frames": frames(record.get("frames")),
        "batch": _batch(record.get("batch")),
        "batch_history": _batch_history(record.get("batch_history")),
        "setup": setup(record.get("setup")),
    }


def _flag(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def locks(value: Any) -> List[Dict[str, Any]]:
    """Op-build locks: ``{path, age_s, op, state (live | stale), ours, pid}`` (older records: the first two)."""
    if not isinstance(value, list):
        return []
    return [{"path": text(x.get("path")), "age_s": num(x.get("age_s")), "op": text(x.get("op")),
             "state": text(x.get("state")), "ours": _flag(x.get("ours")), "pid": integer(x.get("pid"))}
            for x in value[:MAX_ITEMS] if isinstance(x, dict)]


def builds(value: Any) -> List[Dict[str, Any]]:
    """Op builds the watchdog waited for (progress, not a hang): ``{op, folder, seconds, compilers}``."""
    if not isinstance(value, list):
        return []
    out = []
    for b in value[:MAX_ITEMS]:
        if isinstance(b, dict):
            secs = num(b.get("seconds"))
            if secs is None and num(b.get("last_t")) is not None and num(b.get("first_t")) is not None:
                secs = num(b["last_t"] - b["first_t"])
            out.append({"op": text(b.get("op")), "folder": text(b.get("folder")), "seconds": secs,
                        "compilers": texts(b.get("compilers"))})
    return out


def _flight_summary(value: Any) -> Optional[Dict[str, Any]]:
    """The watchdog's reading of the NCCL flight recorder: where ranks' collectives diverged, and its text."""
    if not isinstance(value, dict):
        return None
    return {"desync": integer(value.get("desync")), "text": text(value.get("text"))}


def hang(record: Dict[str, Any]) -> Dict[str, Any]:
    """``hang.json`` in the report's shape."""
    v = record.get("verdict") if isinstance(record.get("verdict"), dict) else {}
    ranks = []
    for r in record.get("ranks") if isinstance(record.get("ranks"), list) else []:
        if isinstance(r, dict) and integer(r.get("rank")) is not None:
            ranks.append({"rank": integer(r.get("rank")), "phase": text(r.get("phase")),
                          "phase_since": num(r.get("phase_since")), "step": integer(r.get("step")),
                          "alive": _flag(r.get("alive")), "where": texts(r.get("where")),
                          "stack_file": text(r.get("stack_file"))})
    return {
        "t": num(record.get("t")),
        "timeout_s": num(record.get("timeout_s")),
        "action": text(record.get("action")),
        "ranks": ranks[:MAX_RANKS],
        "locks": locks(record.get("locks")),
        "builds": builds(record.get("builds")),
        "flight_recorder": texts(record.get("flight_recorder")),
        "flight_recorder_summary": _flight_summary(record.get("flight_recorder_summary")),
        "verdict": {"class": text(v.get("class")), "ranks": ints(v.get("ranks")), "where": texts(v.get("where")),
                    "reason": text(v.get("reason")), "cause": text(v.get("cause")), "fixes": fixes(v.get("fixes")),
                    "ranks_detail": texts(v.get("ranks_detail")), "culprits": _culprits(v.get("culprits")),
                    "nodes_lost": ints(v.get("nodes_lost"))},
        "named_by": _named_by(record.get("named_by")),
        "deadline": _deadline(record.get("deadline")),
    }


def _deadline(value: Any) -> Optional[Dict[str, Any]]:
    """The deadline the watchdog judged by: the section the ranks were in and its learned, planned or fixed
    seconds (``runlog.timeouts``); None in a ``hang.json`` from before deadlines were learned."""
    if not isinstance(value, dict):
        return None
    return {"section": text(value.get("section")), "seconds": num(value.get("seconds")),
            "source": text(value.get("source")), "basis": text(value.get("basis"))}


def _culprits(value: Any) -> List[Dict[str, Any]]:
    """The verdict's culprit ranks with their node (a watchdog across nodes)."""
    out = []
    for c in value if isinstance(value, list) else []:
        if isinstance(c, dict) and integer(c.get("rank")) is not None:
            out.append({"rank": integer(c.get("rank")), "node_rank": integer(c.get("node_rank")),
                        "host": text(c.get("host")), "where": texts(c.get("where"))})
    return out[:MAX_ITEMS]


def _named_by(value: Any) -> Optional[Dict[str, Any]]:
    """The node whose watchdog judged (the verdict every node took from the job's store)."""
    if not isinstance(value, dict):
        return None
    return {"host": text(value.get("host")), "node_rank": integer(value.get("node_rank")),
            "run_dir": text(value.get("run_dir"))}
