"""The terminal summary of a run: verdict, steps, peaks per rank against the plan, saves, OOM and hang.

Strings in a report come from the run directory, which may come from a stranger: :func:`clean`
replaces control characters so that nothing in it can drive the terminal (colours, cursor moves,
a fake prompt).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from zeropilot.runlog.spread import MANY_RANKS

GiB = float(1 << 30)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(value: Any) -> str:
    """Text safe to print: control characters (ESC and friends) become ``?``."""
    return _CONTROL.sub("?", str(value))


def gib(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / GiB:.2f} GiB"


def secs(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def main_mem(mem: Optional[Dict[str, Any]]) -> Optional[int]:
    """The memory figure to show for a moment: reserved on a GPU, else the host's RSS."""
    if not mem:
        return None
    return mem.get("reserved_bytes") if mem.get("reserved_bytes") is not None else mem.get("host_rss_bytes")


def _verdict(summary: Dict[str, Any]) -> List[str]:
    v = summary["verdict"]
    who = f" (rank {', '.join(str(r) for r in v['ranks'])})" if v.get("ranks") else ""
    lines = [f"verdict: {v['kind'].upper()}{who}: {clean(v.get('reason') or '')}"]
    if v.get("cause"):
        lines.append(f"  cause: {clean(v['cause'])}")
    lines += [f"  at {clean(frame)}" for frame in (v.get("where") or [])[-4:]]
    return lines


def _steps(summary: Dict[str, Any]) -> List[str]:
    st = summary["step_seconds"]
    line = f"steps: {summary['steps']}"
    if st["median"] is not None:
        line += f", step time median {secs(st['median'])}, p90 {secs(st['p90'])}, max {secs(st['max'])}"
        if st.get("first") is not None:
            line += f" (first step {secs(st['first'])})"
    read = summary.get("reading") or {}
    if read.get("sample_every"):
        return [line, f"  {read['step_records']:,} step records: medians over every {read['sample_every']}th step of "
                      f"each rank ({read['rows_read']:,} read); peaks, maxima, counts and means over all of them"]
    return [line]


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def time_rows(summary: Dict[str, Any]) -> List[tuple]:
    """The step and its phases as rows ``(label, measured, predicted, {rank: measured})`` for the text and HTML
    tables: the job's medians, the prediction, and each rank whose split differs (``runlog.timing``)."""
    from zeropilot.runlog.timing import LABELS, SPLIT

    t = summary["time"]
    m, p = t["measured"], t.get("predicted") or {}
    ranks = {r["rank"]: r for r in m["ranks"] if r["rank"] in m["ranks_differ"]}
    rows = [("step", m["step_s"], p.get("step_s"), {r: x["step_s"] for r, x in ranks.items()})]
    if m["phase_steps"]:
        for name, _ in SPLIT:
            rows.append((LABELS[name], m["phases"].get(name), (p.get("phases") or {}).get(name),  # idle: no term
                         {r: x["phases"].get(name) for r, x in ranks.items()}))
    return rows


def time_findings(summary: Dict[str, Any]) -> List[str]:
    """The prediction's lines for people: what it is for, slower than predicted (and where), a faster
    configuration, or why there is no prediction; then the notes."""
    from zeropilot.runlog.timing import LABELS

    t = summary["time"]
    m, p = t["measured"], t.get("predicted")
    lines = []
    if p is None:
        lines.append(f"no prediction: {t.get('reason') or 'unknown'}")
    else:
        est = f" (estimated figures: {', '.join(p['estimated'])})" if p["estimated"] else " (measured figures)"
        lines.append(f"predicted for {p['inputs']['config']}, {p['inputs']['seq_len']} tokens, on {p['card']}{est}")
        tps = m.get("tokens_per_s")
        lines.append(f"tokens/s per GPU: {'-' if tps is None else f'{tps:,.0f}'} measured, "
                     f"{'-' if p['tokens_per_s'] is None else format(p['tokens_per_s'], ',.0f')} predicted; "
                     f"MFU {_pct(p.get('measured_mfu'))} measured, {_pct(p['mfu'])} predicted")
    slow = t.get("slower_than_predicted")
    if slow:
        where = (f"; most of the difference is in {LABELS[slow['phase']]} (+{secs(slow['phase_excess_s'])} of "
                 f"+{secs(slow['excess_s'])})" if slow["phase"] else "")
        lines.append(f"SLOWER than predicted: {slow['ratio']:.2f}x ({secs(m['step_s'])} against {secs(p['step_s'])})"
                     + where)
    fast = t.get("faster")
    if fast:
        lines.append(f"faster: {fast['config']}: predicted {secs(fast['step_s'])} per step against "
                     f"{secs(m['step_s'])} measured, {fast['gain']:.2f}x ({fast['gain_predicted']:.2f}x against "
                     "this launch's prediction)")
    return lines + [f"note: {n}" for n in t.get("notes") or []]


def batch_text(m: Dict[str, Any]) -> Optional[str]:
    """The steady steps' batch and throughput: ``micro batch 2 x 1 of 16 tokens (padded), 849 tokens/s per GPU``."""
    b = m.get("batch")
    if not b:
        return None
    tps = m.get("tokens_per_s")
    return (f"micro batch {b['micro_batch_size']} x {b['micro_batches']} of {b['seq_len']} tokens (padded)"
            + ("" if tps is None else f", {tps:,.0f} tokens/s per GPU"))


def _time(summary: Dict[str, Any]) -> List[str]:
    """The step time split into the phases the guard sees, beside the plan's prediction (``runlog.timing``)."""
    from zeropilot.runlog.timing import left_out_text

    t = summary.get("time")
    if not t:
        return []
    m = t["measured"]
    if m["step_s"] is None:
        return [f"time per optimizer step: {clean(m['reason'])}"]
    lines = [f"time per optimizer step: median {secs(m['step_s'])} over {m['steps']} steady steps "
             f"(left out: {left_out_text(m)})"]
    if batch_text(m):
        lines.append(f"  {batch_text(m)}")
    rows = time_rows(summary)
    pred = t.get("predicted") is not None
    differ = sorted(rows[0][3])
    if len(rows) > 1 or pred:
        lines.append(f"  {'':22}{'measured':>10}" + (f"{'predicted':>11}" if pred else "")
                     + "".join(f"{'rank ' + str(r):>10}" for r in differ))
        for label, meas, guess, per_rank in rows:
            lines.append(f"  {label:22}{secs(meas):>10}" + (f"{secs(guess):>11}" if pred else "")
                         + "".join(f"{secs(per_rank[r]):>10}" for r in differ))
        if t.get("ratio") is not None:
            lines[-len(rows)] += f"   measured {t['ratio']:.2f}x the prediction"
    if differ:
        lines.append(f"  {'rank' if len(differ) == 1 else 'ranks'} {', '.join(map(str, differ))}: "
                     f"{'its' if len(differ) == 1 else 'their'} own medians, where they differ from the job's")
    for name, h in m["held"].items():
        lines.append(f"  {h['steps']} step(s) holding a {name}: {secs(h['median_s'])} of {name} each (median), "
                     "left out above")
    if m.get("reason"):
        lines.append(f"  {clean(m['reason'])}")
    return lines + [f"  {clean(x)}" for x in time_findings(summary)]


def _peak_at(at: Optional[Dict[str, Any]]) -> str:
    if not at:
        return "-"
    return at["event"] + (f" {at['step']}" if at.get("step") is not None else "")


#: the per-rank table: header, width, cell; columns no rank has a value for (GPU ones on CPU) are left out
_RANK_COLUMNS = (
    ("rank", 4, lambda r: str(r["rank"])),
    ("steps", 6, lambda r: str(r["steps"])),
    ("peak reserved", 13, lambda r: gib(r["peak_reserved_bytes"])),
    ("at", -10, lambda r: _peak_at(r.get("peak_reserved_at"))),
    ("peak allocated", 14, lambda r: gib(r["peak_allocated_bytes"])),
    ("outside torch", 13, lambda r: gib(r["outside_torch_bytes"])),
    ("device peak", 11, lambda r: gib(r.get("peak_device_bytes"))),
    ("capacity", 10, lambda r: gib(r["device_total_bytes"])),
    ("limit", 10, lambda r: gib(r.get("allocator_limit_bytes"))),
    ("host RSS", 9, lambda r: gib(r["host_rss_peak_bytes"])),
    ("plan", 10, lambda r: gib(r["plan_bytes"])),
    ("vs plan", 7, lambda r: "-" if r.get("plan_ratio") is None else f"{r['plan_ratio'] * 100:.0f}%"),
)


def _ranks(summary: Dict[str, Any]) -> List[str]:
    if not summary["ranks"]:
        return ["no rank recorded anything"]
    if len(summary["ranks"]) > MANY_RANKS and summary.get("spread"):
        return spread_lines(summary["spread"], summary["ranks"])
    cells = [[fn(r) for _, _, fn in _RANK_COLUMNS] for r in summary["ranks"]]
    keep = [i for i in range(len(_RANK_COLUMNS)) if i < 2 or any(row[i] != "-" for row in cells)]

    def fmt(values: List[str]) -> str:
        out = []
        for i in keep:
            width = _RANK_COLUMNS[i][1]
            out.append(values[i].ljust(-width) if width < 0 else values[i].rjust(width))
        return "  ".join(out).rstrip()
    return [fmt([h for h, _, _ in _RANK_COLUMNS])] + [fmt(row) for row in cells]


def figure(unit: str, value: Optional[float]) -> str:
    """A figure of ``runlog.spread`` in its unit."""
    if value is None:
        return "-"
    if unit == "bytes":
        return gib(value)
    if unit == "seconds" and 0 < value < 0.01:
        return f"{1e3 * value:.2f} ms"  # a GPU probe reading
    if unit == "seconds":
        return secs(value)
    if unit == "ratio":
        return _pct(value)
    return f"{value:,.0f}"


def spread_lines(sp: Dict[str, Any], ranks: List[Dict[str, Any]]) -> List[str]:
    """Many ranks in a few lines (``runlog.spread``): each figure's minimum, median and maximum over the ranks and
    over the nodes, the rank or node at the maximum, then the outliers by name."""
    from zeropilot.runlog.spread import where

    by_rank = {r["rank"]: r for r in ranks}
    nodes = f" on {sp['nodes']} nodes" if sp.get("nodes", 0) > 1 else ""
    lines = [f"ranks: {sp['ranks']}{nodes}; over the ranks:{'min':>8}{'median':>12}{'max':>12}  at the max"]
    for d in sp["figures"]:
        at = "-" if d["min"] == d["max"] else f"rank {d['max_rank']}" + (
            f" ({clean(where(by_rank.get(d['max_rank'])))})" if where(by_rank.get(d["max_rank"])) else "")
        lines.append(f"  {d['label']:<26}{figure(d['unit'], d['min']):>12}{figure(d['unit'], d['median']):>12}"
                     f"{figure(d['unit'], d['max']):>12}  {at}")
    per_node = [d for d in sp["figures"] if d["nodes"] and d["unit"] != "count" and d["key"] != "plan_ratio"
                and d["nodes"]["min"] != d["nodes"]["max"]]  # alike on every node, or the plan's ratio: nothing more
    if per_node:
        lines.append(f"  over the nodes (a node: the largest of its ranks; host RSS: their sum)")
        for d in per_node:
            n = d["nodes"]
            at = "-" if n["min"] == n["max"] else clean(n["max_node"])
            lines.append(f"  {d['label']:<26}{figure(d['unit'], n['min']):>12}{figure(d['unit'], n['median']):>12}"
                         f"{figure(d['unit'], n['max']):>12}  {at}")
    for o in sp["outliers"]:
        if o["kind"] != "straggler":  # named above, in a line of their own
            lines.append(outlier_line(o, by_rank.get(o["rank"])))
    lines.append("  every rank: --format json (ranks) or --format html (a band over the ranks, the outliers drawn)")
    return lines


def outlier_line(o: Dict[str, Any], row: Optional[Dict[str, Any]]) -> str:
    """One outlier of ``runlog.spread`` in words."""
    from zeropilot.runlog.spread import where

    place = clean(where(row) or "")
    who = f"rank {o['rank']}" + (f" ({place})" if place else "")
    if o["kind"] == "memory":
        above = f", {100 * (o['ratio'] - 1):.0f}% above the median rank's {gib(o['median'])}" if o.get("ratio") else ""
        at = (row or {}).get("peak_reserved_at")
        first = f" (peak reserved first at {_peak_at(at)})" if at and o["figure"] != "host_rss_peak_bytes" else ""
        name = {"peak_device_bytes": "device peak", "peak_reserved_bytes": "peak reserved"}.get(o["figure"], "host RSS")
        return f"  most memory: {who}: {name} {gib(o['value'])}{above}{first}"
    if o["kind"] == "straggler":
        ratio = f"{o['ratio']:.1f}x" if o.get("ratio") else "far above"
        return (f"  straggler: {who}: {ratio} its peers' median time of its own each step ({secs(o['value'])} "
                f"against {secs(o['median'])})")
    what = {"hang": "hung", "crash": "failed first", "oom": "out of memory"}.get(o["kind"], o["kind"])
    return f"  {what}: {who}" + (f": {clean(o['reason'])}" if o.get("reason") else "")


def size(value: Optional[float]) -> str:
    """A file size in decimal units, as file managers show it."""
    if value is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def _group_line(kind: str, ops: List[Dict[str, Any]]) -> List[str]:
    """One save (or load) across the ranks that took part: size, slowest rank, its phases and memory."""
    slow = max(ops, key=lambda o: o["seconds"] if o["seconds"] is not None else -1.0)
    ranks = sorted(o["rank"] for o in ops)
    sizes = [o["bytes"] for o in ops if o["bytes"] is not None]
    took = "-" if slow["seconds"] is None else f"{slow['seconds']:.2f} s"
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks"
    lines = [f"{kind} at step {slow.get('step')} ({who}): {size(sum(sizes) if sizes else None)}"
             f"{' in all' if len(ranks) > 1 else ''}, {took}"
             + (f" (slowest: rank {slow['rank']})" if len(ranks) > 1 else "")
             + (f" [{clean(slow['tag'])}]" if slow.get("tag") else "")]
    for o in ops:
        if o.get("error"):
            lines.append(f"    FAILED on rank {o['rank']}: {clean(o['error'])}")
    if slow.get("phases"):
        lines.append("    phases: " + ", ".join(f"{clean(p['name'])} {secs(p['seconds'])}" for p in slow["phases"]))
    worst = max(ops, key=lambda o: _op_peak(o) or 0)
    mems = (("before", main_mem(worst.get("mem_before"))), ("at peak", _op_peak(worst)),
            ("after", main_mem(worst.get("mem_after"))))
    if any(m is not None for _, m in mems):
        lines.append("    memory " + ", ".join(f"{name} {gib(m)}" for name, m in mems if m is not None)
                     + (f" (rank {worst['rank']}, the highest)" if len(ops) > 1 else ""))
    news = [(o["first_step_after"]["window_peak_reserved_bytes"], o["rank"], o["first_step_after"]["step"])
            for o in ops if o.get("first_step_after") and o["first_step_after"].get("window_peak_reserved_bytes")]
    if news:
        peak, rank, step = max(news)
        lines.append(f"    the first step after it (step {step}) set a new peak: {gib(peak)} on rank {rank}")
    return lines


def _op_peak(o: Dict[str, Any]) -> Optional[int]:
    peak = o.get("mem_peak") or {}
    return peak.get("peak_reserved_bytes") or main_mem(peak) or None


def _ops(kind: str, ops: List[Dict[str, Any]], limit: int = 12) -> List[str]:
    """Saves or loads grouped by step; a long run shows its first and last ones (``limit`` in all: the first
    ``limit // 2``, the rest from the end)."""
    groups: Dict[Any, List[Dict[str, Any]]] = {}
    for o in ops:
        groups.setdefault((o.get("step"), o.get("tag")), []).append(o)
    keys = list(groups)
    head = limit // 2
    shown = keys if len(keys) <= limit else keys[:head] + keys[head - limit:]
    lines: List[str] = []
    if len(keys) > limit:
        slowest = [max((o["seconds"] for o in g if o["seconds"] is not None), default=None) for g in groups.values()]
        took = sorted(x for x in slowest if x is not None)
        lines.append(f"{len(keys)} {kind}s" + (f", the slowest rank's {secs(took[len(took) // 2])} (median), "
                                              f"{secs(took[-1])} at most" if took else "") + ":")
    for i, key in enumerate(shown):
        if len(keys) > limit and i == head:
            lines.append(f"... {len(keys) - limit} more {kind}s (all in --format json or html)")
        lines += _group_line(kind, groups[key])
    return lines


def fix_line(f: Dict[str, Any]) -> str:
    """One fix with its prediction: ``change -> peak X of Y: fits`` (or why it is not ranked)."""
    line = clean(f["fix"])
    if f.get("predicted_peak_bytes") is not None:
        verdict = {True: "fits", False: "does not fit"}.get(f.get("fits"), "")
        line += (f" -> predicted peak {gib(f['predicted_peak_bytes'])}"
                 + (f" of {gib(f['limit_bytes'])}" if f.get("limit_bytes") else "") + (f": {verdict}" if verdict else ""))
    elif f.get("ranked") is False:
        line += " (not ranked: from the OOM record, the plan does not predict it)"
    elif f.get("expected_bytes"):
        line += f" (saves about {gib(f['expected_bytes'])})"
    return line


def _fixes(fixes: List[Dict[str, Any]], limit: int = 8) -> List[str]:
    lines = ["  fixes, best first:"] if fixes else []
    for i, f in enumerate(fixes[:limit], 1):
        lines.append(f"    {i}. {fix_line(f)}")
        if f.get("applies_to"):
            lines.append(f"       where: {clean(f['applies_to'])}")
        if f.get("why"):
            lines.append(f"       why: {clean(f['why'])}")
    if len(fixes) > limit:
        lines.append(f"    ... {len(fixes) - limit} more (--format json or html)")
    return lines


def _frames(where: List[str], recorded: Optional[List[Dict[str, Any]]], indent: str = "  ") -> List[str]:
    from zeropilot.runlog.frames import display, folded_line

    shown, folded = display(where, recorded)
    lines = [f"{indent}at {clean(x)}" for x in shown]  # innermost last, as in a traceback
    if folded:
        lines.append(f"{indent}   ({clean(folded_line(folded))})")
    return lines


def _oom(o: Dict[str, Any]) -> List[str]:
    v = o["verdict"]
    lines = [f"OOM on rank {o['rank']} at step {o['step']} ({clean(o['phase'] or 'phase unknown')}), "
             f"asked for {gib(o['request_bytes'])}: {clean(v['kind'] or 'unclassified')}"]
    if v.get("summary"):
        lines.append(f"  {clean(v['summary'])}")
    evidence = [str(e) for e in v.get("evidence") or []]
    if o.get("just_before") and not any(e.startswith("just before:") for e in evidence):
        lines.append(f"  just before: {clean(o['just_before'])}")
    lines += [f"  evidence: {clean(e)}" for e in evidence]
    lines += _frames(o.get("where") or [], o.get("frames"))
    lines += _fixes(o.get("fixes") or [])
    if o.get("snapshot"):
        lines.append(f"  memory snapshot (open in PyTorch's memory_viz): {clean(o['snapshot'])}")
    return lines


def _hang(summary: Dict[str, Any]) -> List[str]:
    h = summary["hang"]
    v = h["verdict"]
    d = h.get("deadline")
    judged = f"the {clean(d['section'])} deadline {secs(d['seconds'])}: {clean(d['basis'])}" if d and d.get("section") \
        else f"timeout {secs(h['timeout_s'])}"
    lines = [f"HANG: {clean(v['reason'] or 'no progress')} ({judged}, action {clean(h['action'])})"]
    if v.get("cause"):
        lines.append(f"  cause" + (f" ({clean(v['class'])})" if v.get("class") else "") + f": {clean(v['cause'])}")
    for who, r in _hang_rows(h["ranks"], v["ranks"]):
        odd = " <- stuck" if r["rank"] in v["ranks"] else ""
        dead = " (process gone)" if r.get("alive") is False else ""
        waits = f", in {clean(r['where'][-1])}" if r.get("where") else ""
        lines.append(f"  {who}: phase {clean(r['phase'])} at step {r['step']}{waits}{dead}{odd}")
    shown = sum(1 if who.startswith("rank ") else int(who.split()[0]) for who, _ in _hang_rows(h["ranks"], v["ranks"]))
    if shown < len(h["ranks"]):
        lines.append(f"  ... {len(h['ranks']) - shown} more ranks elsewhere (--format json: hang.ranks)")
    for lock in h.get("locks") or []:
        state = {"live": ", a build is working on it", "stale": ", no live build holds it"}.get(lock.get("state") or "", "")
        lines.append(f"  op-build lock: {clean(lock['path'])} ({secs(lock['age_s'])} old{state}"
                     + (", taken by this job" if lock.get("ours") else "") + ")")
    fr = h.get("flight_recorder_summary") or {}
    if fr.get("text"):
        lines += [f"  flight recorder: {clean(ln)}" for ln in fr["text"].splitlines()[:8]]
    stacks = {s["rank"]: s["main_frames"] for s in summary.get("hang_stacks") or []}
    for rank in v["ranks"]:
        # faulthandler writes the most recent call first: the first frames are where the rank waits
        lines += [f"    rank {rank} stack: {clean(ln)}" for ln in stacks.get(rank, [])[:4]]
    return lines + _fixes(v.get("fixes") or [])


def _hang_rows(ranks: List[Dict[str, Any]], stuck: List[int], limit: int = 6) -> List[Tuple[str, Dict[str, Any]]]:
    """The watchdog's ranks as ``(who, row)``: one each up to :data:`MANY_RANKS`; past it, the stuck ranks one each
    and the others grouped by where they wait (phase, step, frame, alive), the largest groups first."""
    if len(ranks) <= MANY_RANKS:
        return [(f"rank {r['rank']}", r) for r in ranks]
    out = [(f"rank {r['rank']}", r) for r in ranks if r["rank"] in stuck][:limit]
    groups: Dict[Any, List[Dict[str, Any]]] = {}
    for r in ranks:
        if r["rank"] not in stuck:
            key = (r.get("phase"), r.get("step"), (r.get("where") or [None])[-1], r.get("alive"))
            groups.setdefault(key, []).append(r)
    for rows in sorted(groups.values(), key=len, reverse=True)[:max(limit - len(out), 1)]:
        out.append((f"rank {rows[0]['rank']}" if len(rows) == 1 else f"{len(rows)} ranks ({_span(rows)})", rows[0]))
    return out


def _span(rows: List[Dict[str, Any]]) -> str:
    nums = [r["rank"] for r in rows]
    return f"{min(nums)}-{max(nums)}" if len(nums) == max(nums) - min(nums) + 1 else f"{min(nums)}..{max(nums)}"


def _machine(summary: Dict[str, Any]) -> List[str]:
    """Op builds the watchdog waited for, and the locks zeropilot run removed after the job."""
    lines = []
    for b in summary.get("builds") or []:
        lines.append(f"op build {clean(b['op'])}: the watchdog waited for it ({secs(b['seconds'])} of compiling seen: "
                     f"{clean(', '.join(b['compilers'][:3]))}): progress, not a hang")
    for lock in summary.get("locks_removed") or []:
        lines.append(f"removed op-build lock {clean(lock['path'])} (age {secs(lock['age_s'])}): this job's build took it "
                     "and was stopped before it gave it back; the next launch builds afresh")
    return lines


def _environment(summary: Dict[str, Any]) -> List[str]:
    env = summary.get("environment") or {}
    keep = [k for k in sorted(env) if k.startswith(("PYTORCH_", "TORCH_", "NCCL_")) or "TIMEOUT" in k]
    lines = [f"  {clean(k)}={clean(env[k])}" for k in keep]
    if summary.get("hang_timeout_s") is not None:
        lines.append(f"  hang timeout: {secs(summary['hang_timeout_s'])}, on hang: {clean(summary.get('on_hang'))}")
    lines += _deadlines(summary)
    return ["environment:"] + lines if lines else []


def _deadlines(summary: Dict[str, Any]) -> List[str]:
    """The watchdog's deadline per section, those set by the same figure on one line (``runlog.timeouts``)."""
    deadlines = (summary.get("timeouts") or {}).get("deadlines") or {}
    by_basis: Dict[tuple, List[str]] = {}
    for name, d in deadlines.items():
        by_basis.setdefault((d["seconds"], d["basis"]), []).append(name.replace("_", " "))
    if not any(d["source"] != "fixed" for d in deadlines.values()):
        return []
    return ["  hang deadlines: " + "; ".join(f"{', '.join(names)} {secs(seconds)} ({clean(basis)})"
                                             for (seconds, basis), names in by_basis.items())]


def stragglers(summary: Dict[str, Any]) -> List[str]:
    """One line per straggler (``runlog.stragglers``)."""
    from zeropilot.runlog.stragglers import describe

    found = (summary.get("stragglers") or []) + (summary.get("gpu_stragglers") or [])
    if len(summary["ranks"]) <= MANY_RANKS:
        return [f"straggler: {clean(describe(s))}" for s in found]
    from zeropilot.runlog.stragglers import few

    shown = few(found)  # one screen: at most 3 of each evidence
    more = [f"straggler: ... {len(found) - len(shown)} more (--format json: stragglers, gpu_stragglers)"]
    return [f"straggler: {clean(describe(s))}" for s in shown] + (more if len(found) > len(shown) else [])


def render(summary: Dict[str, Any]) -> str:
    """The whole terminal report of one run (a heal run's attempts first, when it is one)."""
    from zeropilot.runlog.heal import timeline

    lines: List[str] = []
    if summary.get("heal"):
        lines += timeline(summary["heal"], clean) + [f"report of {clean(summary['run_dir'])}:"]
    lines += _verdict(summary) + _steps(summary) + _time(summary) + stragglers(summary) + _ranks(summary)
    lines += nodes(summary)
    many = len(summary["ranks"]) > MANY_RANKS
    lines += _ops("save", summary["saves"], 2 if many else 12) + _ops("load", summary["loads"], 2 if many else 12)
    for o in summary["ooms"]:
        lines += _oom(o)
    if summary.get("hang"):
        lines += _hang(summary)
    lines += _machine(summary)
    lines += _environment(summary)
    problems = summary.get("problems") or []
    cut = 5 if many else len(problems)
    lines += [f"note: {clean(p)}" for p in problems[:cut]]
    if len(problems) > cut:
        lines.append(f"note: ... {len(problems) - cut} more notes (--format json: problems)")
    lines.append(f"run directory: {clean(summary['run_dir'])}")
    return "\n".join(lines) + "\n"


def _many_nodes(n: Dict[str, Any]) -> List[str]:
    """Nodes past :data:`MANY_RANKS`: what is not in the distributions above (exits, supervisors without an end,
    the clocks, findings), in a few lines."""
    failed = [x for x in n["list"] if x.get("exit_code") not in (0, None)]
    silent = [x for x in n["list"] if x.get("exit_code") is None and x.get("supervisor_ended") is False]
    lines = [f"  exit status 0 on {len(n['list']) - len(failed) - len(silent)} nodes"
             + "".join(f"; {x['node']}: exit {x['exit_code']}" for x in failed[:4])
             + (f"; no end recorded by the supervisor of {', '.join(clean(x['node']) for x in silent[:4])}"
                + (f" and {len(silent) - 4} more" if len(silent) > 4 else "") if silent else "")]
    clock = n.get("clock") or {}
    moved = [x for x in clock.get("nodes") or [] if x.get("applied")]
    if moved:
        worst = max(moved, key=lambda x: abs(x["offset_s"]))
        lines.append(f"  clocks: aligned on {clean(clock.get('anchor') or '?')}: {len(moved)} node(s) shifted, by up "
                     f"to {abs(worst['offset_s']):.3f} s ({clean(worst['node'])})")
    elif clock.get("how"):
        lines.append(f"  clocks: {clean(clock['how'])}")
    lines += [f"  finding: {clean(f['message'])}" for f in (n.get("findings") or [])[:4]]
    return lines


def nodes(summary: Dict[str, Any]) -> List[str]:
    """A job across nodes: one line per node (its ranks, host, memory outside PyTorch, host RSS, exit), how the
    clocks were aligned, findings across nodes, and the checkpoint check (``report --checkpoint``)."""
    n = summary.get("nodes")
    lines: List[str] = []
    if n:
        lines.append(f"nodes: {n['count']}" + (f" of {n['expected']}" if n.get("expected") else "")
                     + (f", world size {n['world_size']}" if n.get("world_size") else ""))
    if n and (len(n["list"]) > MANY_RANKS or len(summary["ranks"]) > MANY_RANKS):  # the spread has each figure's
        lines += _many_nodes(n)  # nodes: what is left fits a few lines
    elif n:
        for node in n["list"]:
            ranks = node["ranks"]
            who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}" \
                if ranks == list(range(ranks[0], ranks[-1] + 1)) else "ranks " + ", ".join(map(str, ranks))
            parts = [f"{clean(node['node'])} ({', '.join(clean(h) for h in node['hostnames']) or 'host ?'}): {who}",
                     f"{node['steps']} steps"]
            if node.get("outside_torch_bytes") is not None:
                parts.append(f"outside torch {gib(node['outside_torch_bytes'])}")
            if node.get("host_rss_peak_bytes") is not None:
                parts.append(f"host RSS {gib(node['host_rss_peak_bytes'])} per rank, "
                             f"{gib(node['host_rss_sum_bytes'])} in all")
            if node.get("exit_code") is not None:
                parts.append(f"exit {node['exit_code']}")
            elif node.get("supervisor_ended") is False:
                parts.append("its zeropilot run recorded no end")
            lines.append("  " + ", ".join(parts))
        clock = n.get("clock") or {}
        if clock.get("how"):
            lines.append(f"  clocks: {clean(clock['how'])}")
        lines += [f"  finding: {clean(f['message'])}" for f in n.get("findings") or []]
    ck = summary.get("checkpoint")
    if ck:
        lines.append(f"checkpoint {clean(ck['path'])}: {clean(ck['verdict']).upper()}"
                     + (f", saved by {ck['world_size']} ranks" if ck.get("world_size") else ""))
        if ck.get("resume_on"):
            lines.append(f"  resume on: {clean(ck['resume_on'])}")
        elif ck.get("resumable"):
            lines.append(f"  resumable: {clean(ck['resumable'])}")
        lines += [f"  problem: {clean(p)}" for p in (ck.get("problems") or [])[:8]]
    return lines


#: a compared metric (its JSON name, ``runlog.summary.compare``) in the words of the report's own table and lines
METRIC_LABELS = {
    "peak_reserved_bytes": "peak reserved", "peak_allocated_bytes": "peak allocated",
    "outside_torch_bytes": "outside torch", "host_rss_peak_bytes": "host RSS", "steps": "steps",
    "step_seconds_median": "step time median", "step_seconds_max": "step time max",
    "save_seconds_median": "save time median", "save_bytes": "largest save",
    "save_peak_reserved_bytes": "peak reserved at a save",
}


def metric_label(metric: str) -> str:
    """A compared metric as people read it (its JSON name when it has no words yet)."""
    return METRIC_LABELS.get(metric, metric)


def metric_value(metric: str, x: Optional[float]) -> str:
    """A compared metric's value as the text and HTML reports show it (``-`` when the run has none)."""
    if x is None:
        return "-"
    if metric == "save_bytes":
        return size(x)
    if metric.endswith("_bytes"):
        return gib(x)
    if "seconds" in metric:
        return secs(x)
    return f"{x:g}"


def render_compare(cmp: Dict[str, Any]) -> str:
    """Two runs side by side: A (first DIR) and B (--compare DIR2)."""
    a, b = cmp["a"], cmp["b"]
    lines = [f"A: {clean(a['run_dir'])}: {a['verdict']['kind'].upper()}",
             f"B: {clean(b['run_dir'])}: {b['verdict']['kind'].upper()}",
             f"{'':26}{'A':>14}{'B':>14}  change"]
    for m in cmp["metrics"]:
        if m["a"] is None and m["b"] is None:
            continue
        change = "-" if m["ratio"] is None else f"{(m['ratio'] - 1) * 100:+.1f}%"
        lines.append(f"{metric_label(m['metric']):<26}{metric_value(m['metric'], m['a']):>14}"
                     f"{metric_value(m['metric'], m['b']):>14}  {change}")
    for r in cmp["ranks"]:
        m = r["peak_reserved_bytes"] if r["peak_reserved_bytes"]["a"] or r["peak_reserved_bytes"]["b"] \
            else r["host_rss_peak_bytes"]
        lines.append(f"{'rank ' + str(r['rank']) + ' ' + metric_label(m['metric']):<26}"
                     f"{metric_value(m['metric'], m['a']):>14}{metric_value(m['metric'], m['b']):>14}")
    return "\n".join(lines) + "\n"
