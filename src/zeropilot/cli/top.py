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
    """The whole table: a header, the verdict so far, one line per rank."""
    from zeropilot.runlog.text import clean

    command = " ".join(map(str, live.run.get("command") or []))
    started, ended = live.run.get("started_at"), live.run.get("ended_at")
    end = ended if isinstance(ended, (int, float)) else now
    elapsed = f"  {_secs(end - started)} elapsed" if isinstance(started, (int, float)) else ""
    lines = [clean(f"zeropilot top  {live.root}  {time.strftime('%H:%M:%S', time.localtime(now))}{elapsed}"),
             clean(f"  {command}")[:400], verdict_line(live.verdict_so_far())]
    lines += straggler_lines(live.stragglers() + live.gpu_stragglers()) + ["", _row(list(COLUMNS))]
    lines += [rank_row(live.ranks[r], now) for r in sorted(live.ranks)]
    lines += [clean(f"note: {p}") for p in live.problems[:3]]
    return lines


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
        "gpu_stragglers": live.gpu_stragglers(), "final": final, "problems": list(live.problems)})


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
