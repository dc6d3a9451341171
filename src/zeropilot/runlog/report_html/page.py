"""The whole HTML page: one self-contained file, no script, no network.

The page's Content-Security-Policy (``default-src 'none'``, inline styles only) means a browser
loads nothing and runs nothing, even if an escaping bug let markup from a run directory through.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from zeropilot.runlog.read import RunRecords
from zeropilot.runlog.report_html import bands, charts, sections
from zeropilot.runlog.spread import MANY_RANKS
from zeropilot.runlog.report_html.svg import esc
from zeropilot.runlog.text import metric_label, metric_value

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; base-uri 'none'; form-action 'none'"

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:12px 20px;color:#1d232a}
h1{font-size:20px;margin:6px 0}h2{font-size:17px;margin:18px 0 6px}h3{font-size:15px;margin:10px 0 4px}
h4{font-size:13px;margin:8px 0 2px}code,pre{font:12px/1.35 ui-monospace,monospace}
pre{background:#f4f5f7;padding:8px;overflow:auto;max-height:360px}
.verdict{border-left:6px solid #888;padding:4px 12px;background:#f4f5f7}.verdict h2{margin:4px 0}
.v-ok{border-color:#2e7d32}.v-oom,.v-crash{border-color:#c62828;background:#fdecea}
.v-hang{border-color:#ef6c00;background:#fff3e0}.v-running{border-color:#1565c0}
table{border-collapse:collapse;margin:4px 0 10px;font-size:13px}
th,td{border-bottom:1px solid #e2e4e8;padding:2px 8px;text-align:right;vertical-align:top}
th{background:#f4f5f7}td:first-child,th:first-child{text-align:left}
table.log td,table.env td,table.versions td,table.log th{text-align:left}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:8px 0}dt{color:#5f6b7a}dd{margin:0}
svg.chart{width:100%;height:auto;display:block;background:#fff}svg.membar{width:100%;height:40px;display:block}
.grid{stroke:#eceef1;stroke-width:1}.tick{font-size:10px;fill:#5f6b7a}.ref{font-size:10px}
polyline{fill:none;stroke-width:1.4;stroke-linejoin:round}
.s-alloc{stroke:#1f77b4}.s-reserved{stroke:#ff7f0e}.s-peak{stroke:#d62728;stroke-dasharray:4 3;stroke-width:1}
.s-outside{stroke:#7f7f7f}.s-rss{stroke:#9467bd;stroke-dasharray:2 2}.s-used{stroke:#17becf;stroke-width:1.1}
line.cap{stroke:#111;stroke-width:1.2}text.cap{fill:#111}line.plan{stroke:#2ca02c;stroke-dasharray:6 4;stroke-width:1.4}
text.plan{fill:#2ca02c}line.oomline{stroke:#c62828;stroke-width:2}
line.errline{stroke:#c62828;stroke-width:1.5;stroke-dasharray:3 3}circle.oompt{fill:#c62828;stroke:#fff}circle.pt{fill:none;stroke-width:3}
table.log td:first-child{white-space:nowrap}.failed{color:#c62828}
rect.op{fill:#7b61ff;opacity:.10}rect.load{fill:#00897b;opacity:.12}rect.phase{opacity:.22}
.ph-gather_16bit{fill:#e377c2}.ph-model_states{fill:#8c564b}.ph-optimizer_states{fill:#bcbd22}.ph-write{fill:#17becf}
.ph-wait{fill:#7f7f7f}
.c0{stroke:#1f77b4}.c1{stroke:#ff7f0e}.c2{stroke:#2ca02c}.c3{stroke:#d62728}.c4{stroke:#9467bd}.c5{stroke:#8c564b}
.c6{stroke:#e377c2}.c7{stroke:#17becf}
.legend{font-size:12px;color:#5f6b7a;margin:2px 0 8px}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:4px}
.oom{border:1px solid #f3b8b4;background:#fffafa;padding:4px 12px;margin:8px 0}.why{color:#5f6b7a}
.ev-oom,.ev-error{color:#c62828;font-weight:600}.ev-save,.ev-load{color:#5e35b1}
.compare{display:grid;grid-template-columns:1fr 1fr;gap:12px}
b.fits{color:#2e7d32}b.nofit{color:#c62828}details.folded summary{color:#5f6b7a;font-size:12px}
polygon.band{fill:#1f77b4;opacity:.18;stroke:none}.median{stroke:#1f77b4;stroke-width:1.2}.outlier{stroke-width:1.8}
.rbar{stroke:#9bb7d4}.o0{stroke:#d62728;fill:#d62728}.o1{stroke:#ff7f0e;fill:#ff7f0e}.o2{stroke:#2ca02c;fill:#2ca02c}
.o3{stroke:#9467bd;fill:#9467bd}.o4{stroke:#8c564b;fill:#8c564b}.o5{stroke:#e377c2;fill:#e377c2}
polyline.o0,polyline.o1,polyline.o2,polyline.o3,polyline.o4,polyline.o5{fill:none}text.o0,text.o1,text.o2{stroke:none}
"""

LEGEND_MEM = (("#1f77b4", "allocated"), ("#ff7f0e", "reserved"), ("#d62728", "peak reserved (counter)"),
              ("#7f7f7f", "outside PyTorch"), ("#17becf", "in use on the device"), ("#9467bd", "host RSS (CPU)"),
              ("#111", "capacity"),
              ("#2ca02c", "plan (device peak)"),
              ("rgba(123,97,255,.3)", "save/load span, phases inside"), ("#c62828", "OOM / error (dashed)"))
LEGEND_PHASES = (("rgba(227,119,194,.45)", "phase gather_16bit"), ("rgba(140,86,75,.45)", "model_states"),
                 ("rgba(188,189,34,.45)", "optimizer_states"), ("rgba(23,190,207,.45)", "write"),
                 ("rgba(127,127,127,.45)", "wait"))
RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def legend(items) -> str:
    return '<div class="legend">' + "".join(f'<span><i style="background:{c}"></i>{esc(n)}</span>'
                                            for c, n in items) + "</div>"


def rank_legend(ranks: List[int]) -> str:
    return legend([(RANK_COLORS[r % 8], f"rank {r}") for r in ranks])


def document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{body}</body></html>\n")


def section(sid: str, title: str, content: Optional[str]) -> str:
    return "" if content is None else f'<section id="{sid}"><h2>{esc(title)}</h2>{content}</section>'


def _memory_sections(records: RunRecords, summary: Dict[str, Any]) -> Tuple[str, str]:
    t0 = charts.run_start(records)
    end = charts.x_end(records, summary, t0)
    ranks = sorted(records.ranks)
    prep = charts.prepare(records, t0, end)
    gpu = charts.gpu_fields(records)
    if len(ranks) > MANY_RANKS:
        overview = _many_memory(records, summary, prep, end, gpu)
    else:
        overview = (rank_legend(ranks) + charts.overview_chart(prep, summary, end, "overview", gpu, t0)
                    if ranks else "<p>no rank recorded anything</p>")
    events = {r: rec.events for r, rec in records.ranks.items()}
    drawn = charts.ranks_to_chart(summary)
    per_rank = "".join(f"<h3>rank {r}</h3>" + charts.memory_chart(prep[r], summary, r, end, t0, gpu, events)
                       for r in drawn)
    if len(drawn) < len(ranks):
        per_rank = (f"<p>{len(ranks)} ranks: drawn one by one are the verdict's, the first and last, and the highest "
                    f"peaks ({', '.join(map(str, drawn))}); every rank is in the chart above.</p>" + per_rank)
    mem_legend = legend(LEGEND_MEM if gpu else (("#9467bd", "host RSS"),) + LEGEND_MEM[6:]) + legend(LEGEND_PHASES)
    return overview, (mem_legend + per_rank if per_rank else "")


def band_legend(summary: Dict[str, Any]) -> str:
    """The legend of the charts of many ranks: the band, the median rank, each outlier."""
    colors = ("#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
    return legend([("rgba(31,119,180,.3)", "from the lowest to the highest rank"), ("#1f77b4", "the median rank")]
                  + [(c, f"rank {r}: {what}") for (r, what), c in zip(bands.outlier_ranks(summary), colors)])


def _many_memory(records: RunRecords, summary: Dict[str, Any], prep: Dict[int, Any], end: float, gpu: bool) -> str:
    """Memory of many ranks: a band over time and a bar per rank, the outliers drawn (``report_html.bands``)."""
    field = "reserved_bytes" if gpu else "host_rss_bytes"
    peak = "peak_reserved_bytes" if gpu else "host_rss_peak_bytes"
    outliers = bands.outlier_ranks(summary)
    chart = charts.Chart("overview", charts.WIDTH, 260, (0.0, end), (0.0, charts._y_top(
        [r.get(peak) for r in summary["ranks"]])), x_label=charts.fmt_time, y_label=charts.fmt_gib,
        title="memory of every rank")
    chart.axes(y_ticks=charts.gib_ticks(chart))
    bands.over_time({r: (p.xs, p.cols[field]) for r, p in prep.items()}, (0.0, end), outliers, chart,
                    field.replace("_bytes", "").replace("_", " "))
    plan = summary["ranks"][0]["plan_bytes"] if summary["ranks"] else None
    if plan is not None and plan <= chart.y_range[1]:
        chart.hline(plan, "plan", f"plan {charts.fmt_gib(plan)}")
    rows = [{"rank": r["rank"], "low": records.ranks[r["rank"]].col_min(field), "high": r.get(peak)}
            for r in summary["ranks"] if r["rank"] in records.ranks]
    nodes = [(n["node"], n["ranks"][0]) for n in (summary.get("nodes") or {}).get("list") or [] if n["ranks"]]
    per_rank = bands.over_ranks(rows, "low", "high", charts.fmt_gib, "memory of each rank: lowest to peak",
                                "ranks-memory", outliers, nodes, charts.gib_ticks)
    data = {r["rank"]: (r.get("phases") or {}).get("idle") for r in summary["time"]["measured"]["ranks"]}
    waits = bands.over_ranks([{"rank": r, "low": 0.0, "high": v} for r, v in sorted(data.items())], "low", "high",
                             lambda v: f"{v:.3g} s", "loading data each step, median per rank", "ranks-data",
                             outliers, nodes)
    return (band_legend(summary) + chart.svg() + "<h3>each rank (x: the rank; node boundaries marked)</h3>"
            + (per_rank or "") + (waits or ""))


def render(records: RunRecords, summary: Dict[str, Any]) -> str:
    """The page for one run."""
    t0 = charts.run_start(records)
    overview, per_rank = _memory_sections(records, summary)
    if len(records.ranks) > MANY_RANKS:
        steps = charts.step_band(records, summary, "steptime")
    else:
        steps = charts.step_chart(records, "steptime")
    body = "".join([
        "<h1>zeropilot report</h1>",
        sections.verdict(summary),
        sections.facts(summary),
        section("nodes", "Nodes", sections.nodes(summary)),
        section("oom", "Out of memory", sections.oom(summary) if summary["ooms"] else None),
        section("hang", "Hang", sections.hang(summary) if summary["hang"] else None),
        section("time", "Time per optimizer step, measured and predicted", sections.step_time(summary)),
        section("stragglers", "Stragglers", sections.stragglers(summary)),
        section("builds", "Op builds and locks", sections.machine(summary)),
        section("memory", "Memory, all ranks", overview),
        section("ranks", "Peaks per rank against the plan", sections.ranks(summary)),
        section("memory-per-rank", "Memory per rank over time", per_rank or None),
        section("steps", "Step time", ((band_legend(summary) if len(records.ranks) > MANY_RANKS
                                         else rank_legend(sorted(records.ranks))) + steps) if steps else None),
        section("saves", "Saves", sections.ops(summary, "saves")),
        section("loads", "Loads", sections.ops(summary, "loads") if summary["loads"] else None),
        section("log", "Event log", sections.event_log(records, t0)),
        section("deadlines", "Hang deadlines per section", sections.deadlines(summary)),
        section("environment", "Environment", sections.environment(summary)),
        section("problems", "Notes on the run directory", sections.problems(summary)),
    ])
    return document(f"zeropilot report: {summary['run_dir']}", body)


def render_compare(rec_a: RunRecords, rec_b: RunRecords, cmp: Dict[str, Any]) -> str:
    """Two runs side by side: the metrics table, then each run's verdict and memory chart."""
    rows = []
    for m in cmp["metrics"]:
        if m["a"] is None and m["b"] is None:
            continue
        change = "-" if m["ratio"] is None else f"{(m['ratio'] - 1) * 100:+.1f}%"
        rows.append([esc(metric_label(m["metric"])), metric_value(m["metric"], m["a"]),
                     metric_value(m["metric"], m["b"]), change])
    for r in cmp["ranks"]:
        m = r["peak_reserved_bytes"] if (r["peak_reserved_bytes"]["a"] or r["peak_reserved_bytes"]["b"]) \
            else r["host_rss_peak_bytes"]
        rows.append([esc(f"rank {r['rank']} {metric_label(m['metric'])}"), metric_value(m["metric"], m["a"]),
                     metric_value(m["metric"], m["b"]), "-" if m["ratio"] is None else
                     f"{(m['ratio'] - 1) * 100:+.1f}%"])
    cols = []
    for label, rec, s in (("A", rec_a, cmp["a"]), ("B", rec_b, cmp["b"])):
        t0 = charts.run_start(rec)
        end = charts.x_end(rec, s, t0)
        chart = charts.overview_chart(charts.prepare(rec, t0, end), s, end, f"overview-{label.lower()}",
                                      charts.gpu_fields(rec), t0) if rec.ranks else "<p>no rank recorded anything</p>"
        cols.append(f'<div id="run-{label.lower()}"><h2>{label}: <code>{esc(s["run_dir"])}</code></h2>'
                    f"{sections.verdict(s)}{rank_legend(sorted(rec.ranks))}{chart}</div>")
    body = ("<h1>zeropilot report: two runs</h1>" + section("metrics", "A against B", sections.table(
        ["", "A", "B", "B vs A"], rows, "compare-metrics")) + f'<div class="compare">{"".join(cols)}</div>')
    return document(f"zeropilot report: {cmp['a']['run_dir']} against {cmp['b']['run_dir']}", body)
