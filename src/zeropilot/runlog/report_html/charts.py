"""The report's charts: memory per rank over time, all ranks' memory together, step time per rank.

Time on the x axis is seconds since the run's first record. Memory comes from the step records
(columns of the reader) plus the moments other records measured (init, each save's before and
after, an OOM), so a save's spike shows between two steps. Each series is downsampled with
:func:`downsample.minmax`, so peaks survive whatever the run's length.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.runlog import normalize as nz
from zeropilot.runlog.read import RankRecords, RunRecords
from zeropilot.runlog.report_html.downsample import bucket_index, minmax
from zeropilot.runlog.report_html.svg import Chart, esc, nice_ticks

GiB = float(1 << 30)
BUCKETS = 700
MAX_RANK_CHARTS = 16


def buckets_for(n_ranks: int) -> int:
    """Buckets per series: 700 up to 16 ranks, fewer beyond, so a page of many ranks stays a few MB."""
    return max(60, min(BUCKETS, BUCKETS * 16 // max(n_ranks, 1)))
WIDTH = 1100.0
#: series drawn for each rank: field, css class, legend name
MEMORY_SERIES = (
    ("allocated_bytes", "s-alloc", "allocated"),
    ("reserved_bytes", "s-reserved", "reserved"),
    ("peak_reserved_bytes", "s-peak", "peak reserved (allocator counter)"),
    ("outside_torch_bytes", "s-outside", "outside PyTorch"),
    ("device_used_bytes", "s-used", "in use on the device (total - free: reserved + outside PyTorch)"),
)
HOST_SERIES = ("host_rss_bytes", "s-rss", "host RSS")
EVENT_MEM_KEYS = (("mem_before", "start"), ("mem_peak", "mid"), ("mem_after", "end"), ("mem", "end"))


def fmt_gib(v: float) -> str:
    return f"{v / GiB:.0f} GiB" if v >= 10 * GiB or v == 0 else f"{v / GiB:.3g} GiB"


def gib_ticks(chart: Chart) -> List[float]:
    """Round GiB values on the memory axis."""
    return [t * GiB for t in nice_ticks(chart.y_range[0] / GiB, chart.y_range[1] / GiB)]


def fmt_time(s: float) -> str:
    if abs(s) >= 1e6:
        return f"{s / 3600:.3g} h"
    if abs(s) >= 7200:
        return f"{s / 3600:.1f} h"
    if abs(s) >= 120:
        return f"{s / 60:.0f} min"
    return f"{s:.3g} s"


def run_start(records: RunRecords) -> float:
    """The earliest time any rank recorded (the x origin of every time chart)."""
    firsts = [nz.num(e.get("t")) for rec in records.ranks.values() for e in rec.events[:3]]
    firsts += [rec.steps["t"][0] for rec in records.ranks.values() if rec.n_steps]
    firsts = [t for t in firsts if t is not None and not math.isnan(t)]
    return min(firsts) if firsts else 0.0


def _event_points(rec: RankRecords) -> List[Tuple[float, Dict[str, Any]]]:
    """(t, mem) for the moments other records measured; a save's mem_before sits at its start."""
    pts = []
    for e in rec.events:
        t, secs = nz.num(e.get("t")), nz.num(e.get("seconds"))
        if t is None:
            continue
        start = t - secs if secs is not None and e.get("event") in ("save", "load") else t
        for key, where in EVENT_MEM_KEYS:
            m = nz.mem(e.get(key))
            if m:
                pts.append(({"start": start, "mid": (start + t) / 2, "end": t}[where], m))
    return pts


def _oom_point(oom: Optional[Dict[str, Any]]) -> List[Tuple[float, Dict[str, Any]]]:
    """The OOM record's memory at the failure (the observer read it there): where the rank's lines end."""
    if not isinstance(oom, dict):
        return []
    t, m = nz.num(oom.get("t")), nz.mem(oom.get("mem"))
    return [(t, m)] if t is not None and m else []


def rank_columns(rec: RankRecords, fields: List[str], oom: Optional[Dict[str, Any]] = None
                 ) -> Tuple[array, Dict[str, array]]:
    """x (t) and the named memory columns: step records merged with the events' moments (and the OOM's), in order."""
    extra = _event_points(rec) + _oom_point(oom)
    xs = array("d", rec.steps["t"])
    cols = {f: array("d", rec.steps[f]) for f in fields}
    if not extra:
        return xs, cols
    for t, m in extra:
        xs.append(t)
        for f in fields:
            cols[f].append(float(m[f]) if m.get(f) is not None else math.nan)
    order = sorted(range(len(xs)), key=xs.__getitem__)
    return array("d", (xs[i] for i in order)), {f: array("d", (c[i] for i in order)) for f, c in cols.items()}


def _has(col: array) -> bool:
    return any(v == v for v in col)  # NaN != NaN


def _index(xs: array, x0: float, x1: float, buckets: int) -> Optional[List[int]]:
    return bucket_index(xs, x0, x1, buckets) if len(xs) > 2 * buckets else None


@dataclass
class RankSeries:
    """One rank's memory columns on the chart's time axis, with their buckets, computed once per page."""

    xs: array
    cols: Dict[str, array]
    index: Optional[List[int]]
    buckets: int

    def points(self, name: str):
        return minmax(self.xs, self.cols[name], self.index, self.buckets)


def prepare(records: RunRecords, t0: float, x_end: float) -> Dict[int, RankSeries]:
    """Every rank's memory columns (steps and the events' moments), shifted to start at 0, bucketed."""
    fields = [f for f, _, _ in MEMORY_SERIES[:-1]] + [HOST_SERIES[0], "device_total_bytes", "device_free_bytes"]
    out = {}
    buckets = buckets_for(len(records.ranks))
    for rank, rec in sorted(records.ranks.items()):
        xs, cols = rank_columns(rec, fields, records.ooms.get(rank))
        xs = array("d", (x - t0 for x in xs))
        cols["device_used_bytes"] = array("d", (t - f for t, f in zip(cols["device_total_bytes"],
                                                                      cols["device_free_bytes"])))
        out[rank] = RankSeries(xs, cols, _index(xs, 0.0, x_end, buckets), buckets)
    return out


def gpu_fields(records: RunRecords) -> bool:
    """True when any rank recorded device memory (else the charts show the host's RSS)."""
    if any(_has(rec.steps["reserved_bytes"]) or _has(rec.steps["allocated_bytes"]) for rec in records.ranks.values()):
        return True
    mems = [e.get(k) for rec in records.ranks.values() for e in rec.events[:50] for k, _ in EVENT_MEM_KEYS]
    mems += [o.get("mem") for o in records.ooms.values() if isinstance(o, dict)]
    return any(isinstance(m, dict) and nz.size(m.get("reserved_bytes")) is not None for m in mems)


def _ops_spans(chart: Chart, summary: Dict[str, Any], rank: int, t0: float) -> None:
    """Saves and loads of this rank as spans, each phase a band of its own inside."""
    for kind in ("saves", "loads"):
        for op in summary[kind]:
            if op["rank"] != rank or op["t"] is None:
                continue
            start = op["start_t"] if op["start_t"] is not None else op["t"]
            size = "" if op["bytes"] is None else f", {op['bytes'] / 1e9:.2f} GB"
            took = "" if op["seconds"] is None else f" in {op['seconds']:.2f} s"
            phases = "".join(f"\n{p['name']}: {p['seconds']:.2f} s" for p in op["phases"] if p["seconds"] is not None)
            chart.span(start - t0, op["t"] - t0, f"op {kind[:-1]}",
                       f"{kind[:-1]} at step {op['step']}{size}{took}{phases}", attrs=f'data-kind="{kind[:-1]}"')
            _phase_bands(chart, op, start - t0)


def _phase_bands(chart: Chart, op: Dict[str, Any], at: float) -> None:
    """Each phase as a band inside its save, one after the other.

    Phases carry durations, not start times; they are drawn in sequence only when they add up to the
    save's duration (within 5%). When they add up to more, some ran inside others (a write inside
    model_states): then no band is drawn and the span's tooltip lists them.
    """
    phases = [p for p in op["phases"] if p["seconds"] is not None]
    total = sum(p["seconds"] for p in phases)
    if not phases or op["seconds"] is None or total > 1.05 * op["seconds"]:
        return
    for ph in phases:
        chart.span(at, at + ph["seconds"], f"phase ph-{esc(ph['name'].split(':')[0])}",
                   f"{ph['name']}: {ph['seconds']:.2f} s")
        at += ph["seconds"]


def _y_top(values: List[Optional[float]]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return max(vals) * 1.08 if vals and max(vals) > 0 else 1.0


def memory_chart(prep: RankSeries, summary: Dict[str, Any], rank: int, x_end: float, t0: float,
                 gpu: bool, rec_events: Dict[int, List[Dict[str, Any]]]) -> str:
    """One rank's memory over time, with capacity, plan, saves, loads and OOMs marked."""
    info = next(r for r in summary["ranks"] if r["rank"] == rank)
    series = list(MEMORY_SERIES) + [HOST_SERIES] if gpu else [HOST_SERIES]
    cols = prep.cols
    tops = [max((v for v in cols[f] if v == v), default=None) for f, _, _ in series]
    tops += [oom_need(o) for o in summary["ooms"] if o["rank"] == rank] if gpu else []
    cap, plan = info["device_total_bytes"], info["plan_bytes"]
    data_top = _y_top(tops + [plan, info.get("allocator_limit_bytes")])
    chart = Chart(f"mem-rank-{rank}", WIDTH, 230, (0.0, x_end), (0.0, _y_top(tops + [plan, info.get(
                  "allocator_limit_bytes"), cap if cap is not None and cap <= 2 * data_top else None])),
                  x_label=fmt_time, y_label=fmt_gib, title=f"rank {rank}: memory over time")
    chart.axes(y_ticks=gib_ticks(chart))
    _ops_spans(chart, summary, rank, t0)
    for f, cls, name in series:
        if _has(cols[f]):
            chart.line(prep.points(f), f"series {cls}",
                       attrs=f'data-rank="{rank}" data-field="{f}"', title=f"rank {rank}: {name}")
    if series[0][0] != "host_rss_bytes":
        _capacity(chart, cap, info.get("allocator_limit_bytes"), data_top)
    if plan is not None:
        chart.hline(plan, "plan", f"plan {fmt_gib(plan)}")
    oom_marks(chart, summary, [rank], t0, gpu)
    for t, title in errors_of(rec_events, rank):
        chart.vline(t - t0, "errline", title)
    return chart.svg()


def oom_need(o: Dict[str, Any]) -> Optional[int]:
    """What the failing allocation needed: allocated + the request (the point drawn for the OOM)."""
    m = o.get("mem") or {}
    if m.get("allocated_bytes") is None or o.get("request_bytes") is None:
        return None
    return m["allocated_bytes"] + o["request_bytes"]


def oom_marks(chart: Chart, summary: Dict[str, Any], ranks: List[int], t0: float, gpu: bool) -> None:
    """Each OOM of these ranks: a red line at its time and a point at allocated + request (what it needed)."""
    for o in summary["ooms"]:
        if o["rank"] not in ranks or o["t"] is None:
            continue
        need = oom_need(o) if gpu else None
        title = (f"rank {o['rank']}: OOM at step {o['step']} ({o['phase']})"
                 + (f": needed {fmt_gib(need)} (allocated + the {fmt_gib(o['request_bytes'])} asked)" if need else ""))
        chart.vline(o["t"] - t0, "oomline", title)
        if need is not None:
            chart.marker(o["t"] - t0, min(need, chart.y_range[1]), "oompt", title)


def errors_of(events: Dict[int, List[Dict[str, Any]]], rank: int) -> List[Tuple[float, str]]:
    """(t, title) of each error record of ``rank``: where the rank stopped."""
    out = []
    for e in events.get(rank, []):
        t = nz.num(e.get("t"))
        if e.get("event") == "error" and t is not None:
            peer = " (noticed a failed peer)" if e.get("peer_failure") is True else ""
            out.append((t, f"{nz.text(e.get('type')) or 'error'} at step {nz.integer(e.get('step'))}{peer}"))
    return out


def _capacity(chart: Chart, cap: Optional[int], limit: Optional[int], data_top: float) -> None:
    """The card's capacity as a line (a note at the top when it is far above the data), and the allocator's limit."""
    if limit is not None:
        chart.hline(limit, "cap", f"allocator limit {fmt_gib(limit)} (emulated card)")
    if cap is None:
        return
    if cap <= 2 * data_top:
        chart.hline(cap, "cap", f"capacity {fmt_gib(cap)}")
    else:
        chart.note(f"capacity {fmt_gib(cap)}: far above this chart")


def _all_ranks_spans(chart: Chart, summary: Dict[str, Any], t0: float) -> None:
    """Each save and load once, from the first rank's start to the last rank's end."""
    for kind in ("saves", "loads"):
        spans: Dict[Any, List[float]] = {}
        for op in summary[kind]:
            if op["t"] is None:
                continue
            start = op["start_t"] if op["start_t"] is not None else op["t"]
            a, b = spans.setdefault((op["step"], op["tag"]), [start, op["t"]])
            spans[(op["step"], op["tag"])] = [min(a, start), max(b, op["t"])]
        for (step, _), (a, b) in spans.items():
            chart.span(a - t0, b - t0, f"op {kind[:-1]}", f"{kind[:-1]} at step {step}: {b - a:.2f} s from the first "
                       f"rank's start to the last rank's end", attrs=f'data-kind="{kind[:-1]}"')


def overview_chart(prep: Dict[int, RankSeries], summary: Dict[str, Any], x_end: float, chart_id: str,
                   gpu: bool, t0: float) -> str:
    """Every rank's reserved memory (host RSS on CPU) on one chart: one series per rank."""
    field = "reserved_bytes" if gpu else "host_rss_bytes"
    lines, tops = [], []
    for rank, series in sorted(prep.items()):
        pts = series.points(field)
        tops += [max((y for _, y in pts), default=None)]
        lines.append((rank, pts))
    if gpu:
        tops += [oom_need(o) for o in summary["ooms"] if o["rank"] in prep]
    caps = [r["device_total_bytes"] for r in summary["ranks"]] if field == "reserved_bytes" else []
    cap = max((c for c in caps if c is not None), default=None)
    limits = [r.get("allocator_limit_bytes") for r in summary["ranks"] if r.get("allocator_limit_bytes")]
    limit = max(limits) if limits and field == "reserved_bytes" else None
    plan = summary["ranks"][0]["plan_bytes"] if summary["ranks"] else None
    data_top = _y_top(tops + [plan, limit])
    chart = Chart(chart_id, WIDTH, 260, (0.0, x_end), (0.0, _y_top(tops + [plan, limit, cap if cap is not None and
                                                                            cap <= 2 * data_top else None])),
                  x_label=fmt_time, y_label=fmt_gib, title="memory of every rank")
    chart.axes(y_ticks=gib_ticks(chart))
    _all_ranks_spans(chart, summary, t0)
    for rank, pts in lines:
        chart.line(pts, f"series rank-color c{rank % 8}", attrs=f'data-rank="{rank}" data-field="{field}"',
                   title=f"rank {rank}: {field.replace('_bytes', '').replace('_', ' ')}")
    _capacity(chart, cap, limit, data_top)
    if plan is not None:
        chart.hline(plan, "plan", f"plan {fmt_gib(plan)}")
    oom_marks(chart, summary, sorted(prep), t0, gpu)
    return chart.svg()


def step_chart(records: RunRecords, chart_id: str) -> Optional[str]:
    """Seconds per step against the step number, one series per rank."""
    ranks = [(r, rec) for r, rec in sorted(records.ranks.items()) if _has(rec.steps["seconds"])]
    if not ranks:
        return None
    steps = [s for _, rec in ranks for s in (min(rec.steps["step"]), max(rec.steps["step"])) if not math.isnan(s)]
    x0, x1 = (min(steps), max(steps)) if steps else (0.0, 1.0)
    tops = [max((v for v in rec.steps["seconds"] if not math.isnan(v)), default=None) for _, rec in ranks]
    chart = Chart(chart_id, WIDTH, 200, (x0, max(x1, x0 + 1)), (0.0, _y_top(tops)),
                  x_label=lambda v: f"{v:.0f}", y_label=lambda v: f"{v:.2g} s", title="seconds per step")
    chart.axes(x_ticks=[t for t in nice_ticks(*chart.x_range, n=8) if t == int(t)])
    buckets = buckets_for(len(ranks))
    for rank, rec in ranks:
        xs = rec.steps["step"]
        index = bucket_index(xs, x0, x1, buckets) if len(xs) > 2 * buckets else None
        chart.line(minmax(xs, rec.steps["seconds"], index, buckets), f"series rank-color c{rank % 8}",
                   attrs=f'data-rank="{rank}" data-field="seconds"', title=f"rank {rank}: seconds per step")
    return chart.svg()


def step_band(records: RunRecords, summary: Dict[str, Any], chart_id: str) -> Optional[str]:
    """Seconds per step of many ranks: the band over the ranks against the step, the outliers drawn."""
    from zeropilot.runlog.report_html import bands

    series = {r: (rec.steps["step"], rec.steps["seconds"]) for r, rec in records.ranks.items()
              if _has(rec.steps["seconds"])}
    if not series:
        return None
    steps = [s for xs, _ in series.values() for s in (min(xs), max(xs)) if not math.isnan(s)]
    x0, x1 = (min(steps), max(steps)) if steps else (0.0, 1.0)
    tops = [summary["step_seconds"]["p90"]]
    chart = Chart(chart_id, WIDTH, 200, (x0, max(x1, x0 + 1)), (0.0, _y_top(tops) * 1.5),
                  x_label=lambda v: f"{v:.0f}", y_label=lambda v: f"{v:.2g} s",
                  title="seconds per step (above the chart: steps that held a save)")
    chart.axes(x_ticks=[t for t in nice_ticks(*chart.x_range, n=8) if t == int(t)])
    clipped = {r: (xs, array("d", (min(y, chart.y_range[1]) if y == y else y for y in ys)))
               for r, (xs, ys) in series.items()}
    bands.over_time(clipped, chart.x_range, bands.outlier_ranks(summary), chart, "seconds per step")
    return chart.svg()


def ranks_to_chart(summary: Dict[str, Any]) -> List[int]:
    """Every rank, or with more than :data:`MAX_RANK_CHARTS`: the verdict's, rank 0, the outliers (with many ranks,
    ``runlog.spread``), the highest peaks, the last."""
    ranks = [r["rank"] for r in summary["ranks"]]
    if len(ranks) <= MAX_RANK_CHARTS:
        return ranks
    def peak(r: Dict[str, Any]) -> float:
        return float(r["peak_reserved_bytes"] or r["host_rss_peak_bytes"] or 0)
    pick = [r for r in summary["verdict"]["ranks"] if r in ranks][:4] + [ranks[0], ranks[-1]]
    pick += [o["rank"] for o in (summary.get("spread") or {}).get("outliers") or [] if o["rank"] in ranks][:6]
    for r in sorted(summary["ranks"], key=peak, reverse=True):
        if len(set(pick)) >= MAX_RANK_CHARTS:
            break
        pick.append(r["rank"])
    return sorted(set(pick))


def x_end(records: RunRecords, summary: Dict[str, Any], t0: float) -> float:
    """The right end of the time axis: the last record (or the watchdog's verdict)."""
    ends = [r["last_record_t"] for r in summary["ranks"] if r["last_record_t"] is not None]
    if summary.get("hang") and summary["hang"]["t"] is not None:
        ends.append(summary["hang"]["t"])
    return max(max(ends, default=t0) - t0, 1e-3)
