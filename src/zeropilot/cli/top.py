"""``zeropilot top DIR``: a live view of a running ``zeropilot run``, one line per rank, from the run directory only.

A command of its own rather than ``report --follow``: ``report`` renders what a run left (text, JSON, HTML, with
``--compare``), once; ``top`` redraws while the job runs and ends with it, as ``nvidia-smi -l``/``nvitop`` do in
the second terminal people already keep open. It reads the files the guard writes (``runlog.live``) and never
touches the job. On a terminal it redraws in place with three ANSI sequences (cursor home, clear to the end of
the line, clear below: any terminal over SSH, no curses); when standard output is not a terminal it prints one
plain line per step record as the ranks write them, and every change of the verdict. When the run ends it prints
the run's summary (``zeropilot report DIR``) and exits 0 if the verdict is ok, 1 if not.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from zeropilot.errors import InputError

HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
ENDED_WITHOUT_RUN_END_S = 30.0  # every rank wrote end/error, run.json still open: the supervisor is gone


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "top", help="live view of a running `zeropilot run`: one line per rank, refreshed from its directory",
        description="Follow the run directory of a running `zeropilot run`: step, phase, step time, memory "
                    "against the limit, memory outside PyTorch, host RSS and heartbeat age per rank, and the "
                    "verdict so far. Reads the directory only; exits when the run ends, with its summary.")
    p.add_argument("run_dir", metavar="DIR", type=Path, help="the run directory (zeropilot run --out DIR)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes (default 1)")
    p.add_argument("--once", action="store_true", help="print the current state once and exit")
    p.add_argument("--plain", action="store_true",
                   help="line output even on a terminal (the default when stdout is not a terminal)")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: one zeropilot.top/1 document per refresh, one per line (with --once: one "
                        "document); docs/json-schema.md")
    p.set_defaults(func=run)


def _size(value: Optional[int]) -> str:
    if value is None:
        return "-"
    if value >= 1 << 30:
        return f"{value / (1 << 30):.1f}G"
    return f"{value / (1 << 20):.0f}M"


def _secs(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}s" if value < 10 else f"{value:.0f}s"


def _phase(state, now: float) -> str:
    from zeropilot.runlog.text import clean

    if state.oom:
        return "OOM"
    if state.error:
        return "ERROR"
    if state.ended:
        return "ended"
    beat = state.heartbeat
    phase = clean(beat.get("phase") or state.event or "-")[:14]
    since = beat.get("phase_since")
    if isinstance(since, (int, float)) and not isinstance(since, bool) and now - since >= 1:
        phase += f" {_secs(now - since)}"
    return phase


def _peak(state) -> str:
    peak = state.peak_reserved if state.peak_reserved is not None else state.peak_allocated
    text = f"{_size(peak)}/{_size(state.limit)}"
    if peak is not None and state.limit:
        text += f" {100 * peak / state.limit:.0f}%"
    return text


#: OWN-T: the newest step's own seconds (loading data; the forward below ZeRO-3), which stragglers inflate
COLUMNS = ("RANK", "STEP", "PHASE", "STEP-T", "OWN-T", "ALLOC", "RESERVED", "PEAK/LIMIT", "OUTSIDE", "HOST-RSS", "BEAT")
WIDTHS = (4, 6, 18, 7, 6, 7, 8, 17, 7, 8, 6)


def _row(cells: List[str]) -> str:
    return "  ".join(c.rjust(w) if i not in (2, 7) else c.ljust(w) for i, (c, w) in enumerate(zip(cells, WIDTHS)))


def rank_row(state, now: float) -> str:
    """One rank's line of the table."""
    from zeropilot.runlog.live import seconds_since

    mem = state.mem
    beat_t = state.heartbeat.get("t") if isinstance(state.heartbeat.get("t"), (int, float)) else None
    return _row([str(state.rank), "-" if state.step is None else str(state.step), _phase(state, now),
                 _secs(state.step_seconds), _secs(state.own_seconds), _size(mem.get("allocated_bytes")),
                 _size(mem.get("reserved_bytes")),
                 _peak(state), _size(mem.get("outside_torch_bytes")), _size(mem.get("host_rss_bytes")),
                 "-" if state.ended else _secs(seconds_since(beat_t, now))])


def verdict_line(verdict: Dict[str, Any]) -> str:
    from zeropilot.runlog.text import clean

    who = f" (rank {', '.join(map(str, verdict['ranks']))})" if verdict["ranks"] else ""
    return f"verdict so far: {verdict['kind'].upper()}{who}: {clean(verdict['reason'])}"


def straggler_lines(found: List[Dict[str, Any]]) -> List[str]:
    """The ranks straggling over their newest steps (``LiveRun.stragglers``), in words."""
    from zeropilot.runlog.stragglers import describe
    from zeropilot.runlog.text import clean

    return [clean(f"straggler: {describe(s)}") for s in found]


def screen(live, now: float) -> List[str]:
    """The whole table: a header, the verdict so far, one line per rank (past ``runlog.spread.MANY_RANKS`` ranks:
    each column's distribution over the ranks and nodes, the outliers by name and their rows)."""
    from zeropilot.runlog import stragglers as strag
    from zeropilot.runlog.spread import MANY_RANKS
    from zeropilot.runlog.text import clean

    command = " ".join(map(str, live.run.get("command") or []))
    started, ended = live.run.get("started_at"), live.run.get("ended_at")
    end = ended if isinstance(ended, (int, float)) else now
    elapsed = f"  {_secs(end - started)} elapsed" if isinstance(started, (int, float)) else ""
    lines = [clean(f"zeropilot top  {live.root}  {time.strftime('%H:%M:%S', time.localtime(now))}{elapsed}"),
             clean(f"  {command}")[:400], verdict_line(live.verdict_so_far())]
    found = live.stragglers() + live.gpu_stragglers()
    if len(live.ranks) > MANY_RANKS:  # at most 3 of each evidence in words: the screen stays one screen
        lines += straggler_lines(strag.few(found)) + [""] + spread_screen(live, now, found)
    else:
        lines += straggler_lines(found) + ["", _row(list(COLUMNS))]
        lines += [rank_row(live.ranks[r], now) for r in sorted(live.ranks)]
    lines += [clean(f"note: {p}") for p in live.problems[:3]]
    return lines


#: what ``top`` shows of each column past ``runlog.spread.MANY_RANKS`` ranks; the end that matters of each: a rank
#: behind (the lowest step), else the highest
def _top_figures():
    from zeropilot.runlog.spread import Figure

    return (Figure("step", "STEP", "count"), Figure("step_seconds", "STEP-T", "seconds"),
            Figure("own_seconds", "OWN-T (data)", "seconds"), Figure("allocated_bytes", "ALLOC", "bytes"),
            Figure("reserved_bytes", "RESERVED", "bytes"), Figure("peak_bytes", "PEAK", "bytes"),
            Figure("peak_share", "PEAK/LIMIT", "ratio"), Figure("outside_torch_bytes", "OUTSIDE", "bytes"),
            Figure("host_rss_bytes", "HOST-RSS", "bytes", "sum"), Figure("gpu_probe_seconds", "GPU probe", "seconds"),
            Figure("beat_age_s", "BEAT", "seconds"))


def live_rows(live, now: float) -> List[Dict[str, Any]]:
    """One row per rank of the live state, in the keys of :func:`_top_figures` (``runlog.spread``'s rows)."""
    from zeropilot.runlog.live import seconds_since

    rows = []
    for r in sorted(live.ranks):
        st = live.ranks[r]
        place = st.place or {}
        node = f"node {place['node_rank']}" if isinstance(place.get("node_rank"), int) else (
            f"host {place['host']}" if place.get("host") else None)
        peak = st.peak_reserved if st.peak_reserved is not None else st.peak_allocated
        beat_t = st.heartbeat.get("t") if isinstance(st.heartbeat.get("t"), (int, float)) else None
        rows.append({"rank": r, "node": node, "host": place.get("host"), "step": st.step,
                     "step_seconds": st.step_seconds, "own_seconds": st.own_seconds,
                     "allocated_bytes": st.mem.get("allocated_bytes"), "reserved_bytes": st.mem.get("reserved_bytes"),
                     "peak_bytes": peak, "peak_share": peak / st.limit if peak is not None and st.limit else None,
                     "outside_torch_bytes": st.mem.get("outside_torch_bytes"),
                     "host_rss_bytes": st.mem.get("host_rss_bytes"),
                     "gpu_probe_seconds": st.probes[-1][1] if st.probes else None,
                     "beat_age_s": None if st.ended or st.error or st.oom else seconds_since(beat_t, now)})
    return rows


#: a rank whose heartbeat is this much older than the median rank's, and at least QUIET_S old, is named
QUIET_FACTOR, QUIET_S = 3.0, 10.0


def spread_state(live, now: float, found: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``{ranks, nodes, figures, outliers}`` of the live state (``runlog.spread``): stragglers, the rank with the
    most memory, a rank behind the others, the quietest heartbeat, the ranks the verdict so far names."""
    from zeropilot.runlog import spread

    rows = live_rows(live, now)
    figures = spread.distributions(rows, _top_figures())
    by = {d["key"]: d for d in figures}
    outliers = [{"kind": "straggler", "evidence": s.get("evidence"), "rank": s["rank"],
                 "figure": "gpu_probe_seconds" if s.get("evidence") == "gpu" else "own_seconds",
                 "value": s["own_seconds"], "median": s["peers_seconds"], "ratio": s["ratio"], "reason": None}
                for s in found]
    memory = spread.memory_outlier(rows, ("peak_bytes", "reserved_bytes", "host_rss_bytes"))
    if memory is not None:
        outliers.append(dict(memory, reason=None))
    step = by.get("step")
    if step and step["min"] < step["max"]:
        outliers.append({"kind": "behind", "rank": step["min_rank"], "figure": "step", "value": step["min"],
                         "median": step["median"], "ratio": None, "reason": None})
    beat = by.get("beat_age_s")
    if beat and beat["max"] >= max(QUIET_S, QUIET_FACTOR * beat["median"]):
        outliers.append({"kind": "quiet", "rank": beat["max_rank"], "figure": "beat_age_s", "value": beat["max"],
                         "median": beat["median"], "ratio": None, "reason": None})
    outliers += [dict(o, figure=None, value=None, median=None, ratio=None)
                 for o in spread.verdict_outliers(live.verdict_so_far())]
    where = {r["rank"]: r for r in rows}
    for o in outliers:
        o.setdefault("evidence", None)
        o.update(node=where.get(o["rank"], {}).get("node"), host=where.get(o["rank"], {}).get("host"))
    return {"ranks": len(rows), "nodes": len({r["node"] for r in rows if r["node"]}), "figures": figures,
            "outliers": outliers}


def spread_screen(live, now: float, found: List[Dict[str, Any]]) -> List[str]:
    """Many ranks in one screen: each column's minimum, median and maximum over the ranks (and the rank at the end
    that matters), the nodes' spread, the outliers in words and their own rows."""
    from zeropilot.runlog.spread import where
    from zeropilot.runlog.text import clean, figure

    sp = spread_state(live, now, found)
    rows = {r["rank"]: r for r in live_rows(live, now)}
    lines = [f"{sp['ranks']} ranks" + (f" on {sp['nodes']} nodes" if sp["nodes"] > 1 else "")
             + ": over the ranks (STEP: the rank behind at the min)",
             f"  {'':18}{'min':>9}{'median':>9}{'max':>9}  at the max"]
    for d in sp["figures"]:
        end = d["min_rank"] if d["key"] == "step" else d["max_rank"]
        at = "-" if d["min"] == d["max"] else f"rank {end} ({clean(where(rows.get(end)))})"
        lines.append(f"  {d['label']:<18}{_short(d['unit'], d['min']):>9}{_short(d['unit'], d['median']):>9}"
                     f"{_short(d['unit'], d['max']):>9}  {at}")
    nodes = [d for d in sp["figures"] if d["nodes"] and d["key"] in ("peak_bytes", "host_rss_bytes", "own_seconds")]
    for d in nodes:
        n = d["nodes"]
        label = "node " + d["label"] + (" sum" if n["how"] == "sum" else "")
        lines.append(f"  {label:<18}{_short(d['unit'], n['min']):>9}{_short(d['unit'], n['median']):>9}"
                     f"{_short(d['unit'], n['max']):>9}  {clean(n['max_node'])}")
    named = []
    for o in sp["outliers"]:
        named.append(o["rank"])
        if o["kind"] == "straggler":
            continue  # in words above
        who = f"rank {o['rank']} ({clean(where(rows.get(o['rank'])))})"
        if o["kind"] == "memory":
            lines.append(f"  most memory: {who}: {figure('bytes', o['value'])}"
                         + (f", {100 * (o['ratio'] - 1):.0f}% above the median rank" if o.get("ratio") else ""))
        elif o["kind"] == "behind":
            lines.append(f"  behind: {who} at step {o['value']:.0f}, the median rank at {o['median']:.0f}")
        elif o["kind"] == "quiet":
            lines.append(f"  quietest: {who}: last heartbeat {_secs(o['value'])} ago (the median rank's "
                         f"{_secs(o['median'])})")
        else:
            lines.append(f"  {o['kind'].upper()}: {who}" + (f": {clean(o['reason'])}" if o.get("reason") else ""))
    shown = list(dict.fromkeys(named))[:8]
    if shown:
        lines += ["", _row(list(COLUMNS))] + [rank_row(live.ranks[r], now) for r in shown if r in live.ranks]
    return lines


def _short(unit: str, value: Optional[float]) -> str:
    if unit == "bytes":
        return _size(None if value is None else int(value))
    if unit == "seconds" and value is not None and 0 < value < 0.1:
        return f"{1e3 * value:.1f}ms"  # a GPU probe reading: milliseconds
    if unit == "seconds" and value is not None and value >= 86400:
        return f"{value / 86400:.0f}d"
    if unit == "seconds":
        return _secs(value)
    if unit == "ratio":
        return "-" if value is None else f"{100 * value:.0f}%"
    return "-" if value is None else f"{value:.0f}"


def step_line(live, new: Dict[str, Any], now: float) -> str:
    """The plain-output line of one step record."""
    state = live.ranks[new["rank"]]
    mem = state.mem
    return (f"{time.strftime('%H:%M:%S', time.localtime(now))} rank {new['rank']} step {new['step']} "
            f"{_secs(new['seconds'])} alloc {_size(mem.get('allocated_bytes'))} reserved "
            f"{_size(mem.get('reserved_bytes'))} peak {_peak(state)} outside {_size(mem.get('outside_torch_bytes'))} "
            f"rss {_size(mem.get('host_rss_bytes'))}")


def rank_json(state, now: float) -> Dict[str, Any]:
    """One rank's state as ``zeropilot.top/1`` lists it."""
    from zeropilot.runlog.live import seconds_since

    mem, beat = state.mem, state.heartbeat
    beat_t = beat.get("t") if isinstance(beat.get("t"), (int, float)) and not isinstance(beat.get("t"), bool) \
        else None
    phase = beat.get("phase") if isinstance(beat.get("phase"), str) else None
    return {"rank": state.rank, "step": state.step, "phase": phase, "event": state.event,
            "step_seconds": state.step_seconds, "own_seconds": state.own_seconds, "steps_seen": state.steps_seen,
            "allocated_bytes": mem.get("allocated_bytes"), "reserved_bytes": mem.get("reserved_bytes"),
            "peak_allocated_bytes": state.peak_allocated, "peak_reserved_bytes": state.peak_reserved,
            "limit_bytes": state.limit, "outside_torch_bytes": mem.get("outside_torch_bytes"),
            "host_rss_bytes": mem.get("host_rss_bytes"),
            "heartbeat_age_s": None if state.ended else seconds_since(beat_t, now),
            "ended": state.ended, "error": state.error, "oom": state.oom, "skipped_lines": state.skipped_lines}


def document(live, now: float, final: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The ``zeropilot.top/1`` document of one refresh (``final``: the run's verdict once it ended)."""
    from zeropilot.envelope import TOP_SCHEMA, envelope

    command = live.run.get("command")
    return envelope(TOP_SCHEMA, {
        "run_dir": str(live.root), "t": now,
        "command": [str(c) for c in command] if isinstance(command, list) else [],
        "ended": live.ended, "verdict_so_far": live.verdict_so_far(),
        "ranks": [rank_json(live.ranks[r], now) for r in sorted(live.ranks)], "stragglers": live.stragglers(),
        "gpu_stragglers": live.gpu_stragglers(),
        "spread": spread_state(live, now, live.stragglers() + live.gpu_stragglers()),
        "final": final, "problems": list(live.problems)})


def _json_line(doc: Dict[str, Any]) -> str:
    import json

    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"


def _final(live, fmt: str = "text") -> int:
    from zeropilot.runlog import read_run, summarize
    from zeropilot.runlog.text import render

    summary = summarize(read_run(live.root))
    verdict = summary["verdict"]
    if fmt == "json":
        sys.stdout.write(_json_line(document(live, time.time(), {
            "kind": verdict.get("kind"), "reason": verdict.get("reason"), "ranks": verdict.get("ranks") or []})))
    else:
        sys.stdout.write("\n" + render(summary))
    return 0 if verdict["kind"] == "ok" else 1


def _supervisor_gone(live, since: Dict[str, float], now: float) -> bool:
    """Every rank wrote ``end`` or ``error`` long ago and ``run.json`` never got its end."""
    if not live.ranks or not all(s.ended or s.error or s.oom for s in live.ranks.values()):
        since.pop("done", None)
        return False
    return now - since.setdefault("done", now) > ENDED_WITHOUT_RUN_END_S


def run(args: argparse.Namespace) -> int:
    from zeropilot.runlog.live import LiveRun

    if not 0.05 <= args.interval <= 3600:
        raise InputError(f"--interval {args.interval:g}: give seconds between 0.05 and 3600")
    live = LiveRun.open(args.run_dir)
    if getattr(args, "format", "text") == "json":
        return _run_json(live, args)
    tty = sys.stdout.isatty() and not args.plain
    out = sys.stdout
    if tty and not args.once:
        out.write("\x1b[2J")
    last_verdict, last_named, since = None, [], {}
    if not tty and not args.once:
        out.write(f"zeropilot top: {live.root}\n")
    try:
        while True:
            new = live.refresh()
            now = time.time()
            if tty or args.once:
                lines = screen(live, now)
                if tty:
                    width = shutil.get_terminal_size((120, 40)).columns
                    out.write(HOME + "".join(ln[:width] + CLEAR_LINE + "\n" for ln in lines) + CLEAR_BELOW)
                else:
                    out.write("\n".join(lines) + "\n")
            else:
                for step in new:
                    out.write(step_line(live, step, now) + "\n")
                verdict = verdict_line(live.verdict_so_far())
                if verdict != last_verdict:
                    out.write(verdict + "\n")
                    last_verdict = verdict
                found = live.stragglers() + live.gpu_stragglers()
                named = [(s["rank"], s.get("evidence")) for s in found]
                if named != last_named:  # a straggler appears or goes: said once, not at every step
                    out.write("".join(ln + "\n" for ln in straggler_lines(found)) if named else
                              "stragglers: none now\n")
                    last_named = named
            out.flush()
            if args.once:
                return 0
            if live.ended:
                return _final(live)
            if _supervisor_gone(live, since, now):
                out.write("zeropilot top: every rank ended but run.json has no end (was `zeropilot run` "
                          "killed?)\n")
                return _final(live)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        out.write("\n")
        return 0


def _run_json(live, args: argparse.Namespace) -> int:
    """``--format json``: a document per refresh (JSON Lines) until the run ends, then one with ``final``."""
    from zeropilot.envelope import dumps

    out, since = sys.stdout, {}
    try:
        while True:
            live.refresh()
            now = time.time()
            if args.once:
                out.write(dumps(document(live, now)))
                return 0
            if live.ended or _supervisor_gone(live, since, now):
                return _final(live, "json")
            out.write(_json_line(document(live, now)))
            out.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
