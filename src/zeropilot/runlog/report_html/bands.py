"""Charts of many ranks: bands over the ranks, the outliers drawn on top (``runlog.spread``).

Past :data:`~zeropilot.runlog.spread.MANY_RANKS` ranks a line per rank is a smear. Two shapes instead:

- **over time**: at each moment the band from the lowest to the highest rank (their values in that bucket of
  time), the median rank as a line, and each outlier rank's own line, named;
- **over the ranks**: one column per rank (x is the rank, nodes marked), a bar from the lowest to the highest value
  the rank recorded and a dot at its peak; the outliers in their own colour, named.

Every rank is in them: the band and the bars are made of all of them.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from zeropilot.runlog.report_html.downsample import bucket_index, minmax
from zeropilot.runlog.report_html.svg import Chart, esc, nice_ticks

WIDTH = 1100.0
BUCKETS = 240
OUTLIER_CLASSES = ("o0", "o1", "o2", "o3", "o4", "o5")
NAMES = {"memory": "most memory", "straggler": "straggler", "hang": "hung", "crash": "failed first",
         "oom": "out of memory"}


def outlier_ranks(summary: Dict[str, Any], limit: int = len(OUTLIER_CLASSES)) -> List[Tuple[int, str]]:
    """``(rank, what)`` of the outliers the spread names, each rank once, at most ``limit``."""
    out: Dict[int, str] = {}
    for o in (summary.get("spread") or {}).get("outliers") or []:
        if o["rank"] not in out and len(out) < limit:
            out[o["rank"]] = NAMES.get(o["kind"], o["kind"])
    return list(out.items())


def over_time(series: Dict[int, Tuple[Sequence[float], Sequence[float]]], x_range: Tuple[float, float],
              outliers: List[Tuple[int, str]], chart: Chart, what: str) -> None:
    """The band of every rank's ``(xs, ys)`` per bucket of x, the median rank, and the outliers' own lines."""
    x0, x1 = x_range
    per: List[List[float]] = [[] for _ in range(BUCKETS)]
    for xs, ys in series.values():
        index = bucket_index(xs, x0, x1, BUCKETS)
        best: Dict[int, float] = {}
        for b, y in zip(index, ys):
            if b >= 0 and y == y and (b not in best or y > best[b]):
                best[b] = y  # the rank's highest value in the bucket
        for b, y in best.items():
            per[b].append(y)
    width = (x1 - x0) / BUCKETS if x1 > x0 else 1.0
    mids = [(x0 + (b + 0.5) * width, sorted(v)) for b, v in enumerate(per) if v]
    if not mids:
        return
    top = [(x, v[-1]) for x, v in mids]
    bottom = [(x, v[0]) for x, v in reversed(mids)]
    pts = " ".join(f"{chart.px(x):.1f},{chart.py(y):.1f}" for x, y in top + bottom)
    chart.parts.append(f'<polygon class="band" points="{pts}"><title>{esc(what)}: from the lowest to the highest '
                       f'of {len(series)} ranks</title></polygon>')
    chart.line([(x, statistics.median(v)) for x, v in mids], "series median",
               title=f"{what}: the median rank")
    for (rank, name), cls in zip(outliers, OUTLIER_CLASSES):
        if rank in series:
            xs, ys = series[rank]
            index = bucket_index(xs, x0, x1, BUCKETS) if len(xs) > 2 * BUCKETS else None
            chart.line(minmax(xs, ys, index, BUCKETS), f"series outlier {cls}", attrs=f'data-rank="{rank}"',
                       title=f"rank {rank} ({name}): {what}")


def over_ranks(rows: List[Dict[str, Any]], low: str, high: str, label, title: str, chart_id: str,
               outliers: List[Tuple[int, str]], nodes: Optional[List[Tuple[str, int]]] = None,
               y_ticks=None) -> Optional[str]:
    """One column per rank: a bar from its ``low`` to its ``high`` value (keys of ``rows``), a dot at ``high``;
    ``nodes``: ``(name, first rank)`` of each node, marked on the x axis; ``y_ticks(chart)``: the y axis' ticks."""
    pts = [(r["rank"], r.get(low), r.get(high)) for r in rows if _num(r.get(high))]
    if not pts:
        return None
    ranks = [p[0] for p in pts]
    y_top = max(p[2] for p in pts) * 1.08 or 1.0
    chart = Chart(chart_id, WIDTH, 230, (min(ranks) - 0.5, max(ranks) + 0.5), (0.0, y_top), x_label=lambda v: f"{v:.0f}",
                  y_label=label, title=title)
    ticks = _node_ticks(nodes, ranks) if nodes else None
    chart.axes(x_ticks=ticks, y_ticks=y_ticks(chart) if y_ticks else None)
    named = dict(outliers)
    cls_of = {rank: cls for (rank, _), cls in zip(outliers, OUTLIER_CLASSES)}
    bar = max(0.6, (WIDTH - 80) / max(len(ranks), 1) * 0.7)
    for rank, lo, hi in pts:
        lo = lo if _num(lo) else hi
        cls = f"rbar {cls_of[rank]}" if rank in cls_of else "rbar"
        x = chart.px(rank)
        tip = f"rank {rank}: {label(lo)} to {label(hi)}" + (f" ({named[rank]})" if rank in named else "")
        chart.parts.append(f'<line class="{cls}" x1="{x:.1f}" x2="{x:.1f}" y1="{chart.py(lo):.1f}" '
                           f'y2="{chart.py(hi):.1f}" stroke-width="{bar:.1f}" data-rank="{rank}">'
                           f'<title>{esc(tip)}</title></line>')
    for rank, name in outliers:
        row = next((p for p in pts if p[0] == rank), None)
        if row is not None:
            chart.marker(rank, row[2], f"opt {cls_of[rank]}", f"rank {rank} ({name}): {label(row[2])}")
            chart.labels.append((chart.py(row[2]) - 3, f"rank {rank}: {name}", cls_of[rank]))
    return chart.svg()


def _node_ticks(nodes: List[Tuple[str, int]], ranks: List[int]) -> List[float]:
    """Ranks where nodes begin, at most about 12 of them labelled on the axis."""
    firsts = [first for _, first in nodes]
    every = max(1, math.ceil(len(firsts) / 12))
    return [float(f) for f in firsts[::every]] if firsts else nice_ticks(min(ranks), max(ranks), n=8)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
