"""Many ranks on one screen: each figure's distribution over the ranks, grouped by node, and the outliers by name.

A job of 1,024 ranks is read as distributions: for each figure (a rank's steps, its peak reserved memory, its host
RSS, its step time) the minimum, median and maximum over the ranks with the rank at the maximum, and the same over
the nodes (a node's value: the largest of its ranks', or for host memory their sum, the machine's RAM in use). What
stands out is named: the stragglers (``runlog.stragglers``), the rank with the most memory against the median rank,
and the ranks the verdict names (the one a hang is stuck on, the first failure of a crash, an OOM). Every rank stays
in the report's JSON and HTML; ``report`` and ``top`` print this instead of a row per rank past :data:`MANY_RANKS`.

Pure functions over rows (one dict per rank, with ``rank`` and, where known, ``node`` and ``host``); no I/O.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

#: past this many ranks, the text and ``top`` show distributions, not a row per rank
MANY_RANKS = 16


@dataclass(frozen=True)
class Figure:
    """A per-rank figure: its key in the rows, its label, its unit (``bytes``, ``seconds``, ``ratio``, ``count``),
    and how a node's value is made of its ranks' (``max``, or ``sum`` for memory its ranks share: the host's)."""

    key: str
    label: str
    unit: str
    node: str = "max"


#: the report's figures (``runlog.summary``'s rank rows)
REPORT_FIGURES = (
    Figure("steps", "steps", "count"),
    Figure("peak_reserved_bytes", "peak reserved", "bytes"),
    Figure("peak_allocated_bytes", "peak allocated", "bytes"),
    Figure("outside_torch_bytes", "outside torch", "bytes"),
    Figure("peak_device_bytes", "device peak", "bytes"),
    Figure("host_rss_peak_bytes", "host RSS", "bytes", "sum"),
    Figure("plan_ratio", "vs plan", "ratio"),
    Figure("step_seconds_median", "step time (median)", "seconds"),
    Figure("data_seconds_median", "loading data (median)", "seconds"),
    Figure("gpu_probe_seconds_median", "GPU probe (median)", "seconds"),
)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def distribution(rows: Sequence[Dict[str, Any]], fig: Figure) -> Optional[Dict[str, Any]]:
    """``{key, label, unit, ranks, min, median, max, min_rank, max_rank, nodes}`` over the rows that have the figure
    (None when none has it); ``nodes``: ``{count, how, min, median, max, max_node}`` over the rows' nodes, or None
    when the rows name fewer than two."""
    vals = [(r[fig.key], r["rank"]) for r in rows if _number(r.get(fig.key))]
    if not vals:
        return None
    lo = min(vals, key=lambda x: (x[0], x[1]))
    hi = max(vals, key=lambda x: (x[0], -x[1]))
    out = {"key": fig.key, "label": fig.label, "unit": fig.unit, "ranks": len(vals), "min": lo[0],
           "median": statistics.median(v for v, _ in vals), "max": hi[0], "min_rank": lo[1], "max_rank": hi[1],
           "nodes": None}
    groups: Dict[str, List[float]] = {}
    for r in rows:
        if _number(r.get(fig.key)) and isinstance(r.get("node"), str):
            groups.setdefault(r["node"], []).append(r[fig.key])
    if len(groups) >= 2:
        per = {n: (sum(v) if fig.node == "sum" else max(v)) for n, v in groups.items()}
        top = max(per, key=lambda n: (per[n], -_order(n)))
        out["nodes"] = {"count": len(per), "how": fig.node, "min": min(per.values()),
                        "median": statistics.median(per.values()), "max": per[top], "max_node": top}
    return out


def _order(node: str) -> int:
    """``node 12`` -> 12 (ties go to the lower node); other names sort after."""
    tail = node.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 1 << 30


def distributions(rows: Sequence[Dict[str, Any]], figures: Iterable[Figure]) -> List[Dict[str, Any]]:
    """:func:`distribution` of each figure some row has."""
    return [d for d in (distribution(rows, f) for f in figures) if d is not None]


def where(row: Optional[Dict[str, Any]]) -> str:
    """A rank's place in words: ``node 12, gpu-node-012``."""
    if not row:
        return ""
    parts = [p for p in (row.get("node"), row.get("host")) if isinstance(p, str) and p]
    if len(parts) == 2 and parts[0].startswith("host ") and parts[0][5:] == parts[1]:
        parts = parts[1:]
    return ", ".join(parts)


def memory_outlier(rows: Sequence[Dict[str, Any]], keys: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The rank with the most memory by the first of ``keys`` any row has: ``{kind: memory, rank, figure, value,
    median, ratio}`` (ratio: its value over the median rank's)."""
    for key in keys:
        d = distribution(rows, Figure(key, key, "bytes"))
        if d is not None and d["ranks"] >= 2:
            return {"kind": "memory", "rank": d["max_rank"], "figure": key, "value": d["max"],
                    "median": d["median"], "ratio": d["max"] / d["median"] if d["median"] else None}
    return None


def verdict_outliers(verdict: Dict[str, Any], limit: int = 4) -> List[Dict[str, Any]]:
    """The ranks a verdict names: the stuck rank of a hang, the first failure of a crash, the ranks out of memory."""
    kind = verdict.get("kind")
    names = {"hang": "hang", "crash": "crash", "oom": "oom"}
    if kind not in names:
        return []
    ranks = [r for r in verdict.get("ranks") or [] if isinstance(r, int)]
    return [{"kind": names[kind], "rank": r, "reason": verdict.get("reason")} for r in ranks[:limit]]
