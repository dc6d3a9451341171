"""The report's text sections as HTML: verdict, ranks, saves, OOM, hang, event log, environment.

Every value from the run directory goes through :func:`esc`; nothing is emitted as a link, so the
page never asks for anything when it is opened or clicked.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from zeropilot.runlog import normalize as nz
from zeropilot.runlog.read import RunRecords
from zeropilot.runlog.report_html.svg import esc
from zeropilot.runlog.text import gib, main_mem, secs, size

MAX_LOG_ROWS = 3000


def table(head: List[str], rows: List[List[str]], cls: str = "") -> str:
    """A table; cells are markup already escaped by the caller."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _e(v: Any) -> str:
    return "-" if v is None else esc(v)


def verdict(summary: Dict[str, Any]) -> str:
    v = summary["verdict"]
    who = f" on rank {', '.join(str(r) for r in v['ranks'])}" if v.get("ranks") else ""
    where = "".join(f"<li><code>{esc(f)}</code></li>" for f in (v.get("where") or [])[-6:])
    cause = f"<p>cause: {esc(v['cause'])}</p>" if v.get("cause") else ""
    return (f'<section id="verdict" class="verdict v-{esc(v["kind"])}"><h2>{esc(v["kind"].upper())}{esc(who)}</h2>'
            f'<p>{esc(v.get("reason") or "")}</p>{cause}{"<ul>" + where + "</ul>" if where else ""}</section>')


def facts(summary: Dict[str, Any]) -> str:
    st = summary["step_seconds"]
    cmd = summary["command"]
    cmd = " ".join(cmd) if isinstance(cmd, list) else cmd
    items = [("run directory", summary["run_dir"]), ("command", cmd), ("exit code", summary["exit_code"]),
             ("ranks", len(summary["ranks"])), ("steps", summary["steps"]),
             ("step time", None if st["median"] is None else
              f"median {secs(st['median'])}, p90 {secs(st['p90'])}, max {secs(st['max'])}"
              + (f", first {secs(st['first'])}" if st["first"] is not None else ""))]
    return '<dl class="facts">' + "".join(f"<dt>{esc(k)}</dt><dd>{_e(v)}</dd>" for k, v in items) + "</dl>"


def _peak_at(at: Optional[Dict[str, Any]]) -> str:
    return "-" if not at else esc(f"{at['event']} {at['step'] if at['step'] is not None else ''}".strip())


RANK_COLUMNS = (
    ("rank", lambda r: str(r["rank"])),
    ("steps", lambda r: str(r["steps"])),
    ("peak reserved", lambda r: gib(r["peak_reserved_bytes"])),
    ("peak at", lambda r: _peak_at(r.get("peak_reserved_at"))),
    ("peak allocated", lambda r: gib(r["peak_allocated_bytes"])),
    ("outside PyTorch", lambda r: gib(r["outside_torch_bytes"])),
    ("device peak", lambda r: gib(r.get("peak_device_bytes"))),
    ("capacity", lambda r: gib(r["device_total_bytes"])),
    ("allocator limit", lambda r: gib(r.get("allocator_limit_bytes"))),
    ("host RSS", lambda r: gib(r["host_rss_peak_bytes"])),
    ("plan", lambda r: gib(r["plan_bytes"])),
    ("vs plan", lambda r: "-" if r.get("plan_ratio") is None else f"{r['plan_ratio'] * 100:.0f}%"),
    ("median step", lambda r: secs(r["step_seconds_median"])),
    ("ended", lambda r: "yes" if r["ended"] else "<b>no</b>"),
)


def ranks(summary: Dict[str, Any]) -> str:
    """Peaks per rank against the plan; columns no rank has a value for (GPU ones on CPU) are left out."""
    cells = [[fn(r) for _, fn in RANK_COLUMNS] for r in summary["ranks"]]
    keep = [i for i in range(len(RANK_COLUMNS)) if i < 2 or any(row[i] != "-" for row in cells)]
    return table([RANK_COLUMNS[i][0] for i in keep], [[row[i] for i in keep] for row in cells], "ranks")


def ops(summary: Dict[str, Any], kind: str) -> str:
    rows = []
    for s in summary[kind]:
        peak = (s["mem_peak"] or {}).get("peak_reserved_bytes") or main_mem(s["mem_peak"])
        phases = ", ".join(f"{p['name']} {secs(p['seconds'])}" for p in s["phases"])
        nxt = s.get("first_step_after") or {}
        took = secs(s["seconds"]) + (f'<br><b class="failed" title="{esc(s["error"])}">failed: '
                                     f'{esc(s["error"][:100])}{"…" if len(s["error"]) > 100 else ""}</b>'
                                     if s["error"] else "")
        rows.append([_e(s["step"]), str(s["rank"]), size(s["bytes"]), took, esc(phases) or "-", gib(main_mem(s["mem_before"])), gib(peak),
                     gib(main_mem(s["mem_after"])), gib(nxt.get("window_peak_reserved_bytes")), _e(s["tag"])])
    if not rows:
        return f"<p>no {kind[:-1]} recorded</p>"
    return table(["step", "rank", "size", "seconds", "phases", "memory before", "at peak", "after",
                  "new peak in next step", "tag"], rows, kind)


def _fixes(fixes: List[Dict[str, Any]]) -> str:
    """Ranked fixes: each with its predicted peak against the limit and whether it fits (or "not ranked")."""
    if not fixes:
        return ""
    items = []
    for f in fixes:
        pred = ""
        if f.get("predicted_peak_bytes") is not None:
            verdict = {True: '<b class="fits">fits</b>', False: '<b class="nofit">does not fit</b>'}.get(f.get("fits"), "")
            pred = (f" → predicted peak {gib(f['predicted_peak_bytes'])}"
                    + (f" of {gib(f['limit_bytes'])}" if f.get("limit_bytes") else "") + (f": {verdict}" if verdict else ""))
        elif f.get("ranked") is False:
            pred = ' <span class="why">(not ranked: from the OOM record, the plan does not predict it)</span>'
        elif f.get("expected_bytes"):
            pred = f" (saves about {gib(f['expected_bytes'])})"
        where = f"<br><span class=why>where: {esc(f['applies_to'])}</span>" if f.get("applies_to") else ""
        why = f"<br><span class=why>{esc(f['why'])}</span>" if f.get("why") else ""
        items.append(f"<li><b>{esc(f['fix'])}</b>{pred}{where}{why}</li>")
    return f'<h4>fixes, best first</h4><ol class="fixes">{"".join(items)}</ol>'


def frames_list(where: List[str], recorded: Optional[List[Dict[str, Any]]]) -> str:
    """The frames worth reading (the user's and the model's, and the innermost), library plumbing folded."""
    from zeropilot.runlog.frames import display, folded_line

    shown, folded = display(where, recorded)
    if not shown:
        return ""
    items = "".join(f"<li><code>{esc(f)}</code></li>" for f in shown)
    fold = (f'<details class="folded"><summary>{esc(folded_line(folded))}</summary><ol class=frames>'
            + "".join(f"<li><code>{esc(f)}</code></li>" for f in folded) + "</ol></details>") if folded else ""
    return f"<ol class=frames>{items}</ol>{fold}"


def mem_bar(m: Dict[str, Any], request: Optional[int], limit: Optional[int]) -> str:
    """The card at the failure as one stacked bar: allocated, reserved but free, outside PyTorch, free; the request.

    Under an allocator limit (``set_per_process_memory_fraction``, an emulated smaller card) the bar is the
    limit: PyTorch's reserved memory and what is left of the limit.
    """
    total = limit or m.get("device_total_bytes")
    if not total:
        return ""
    reserved = m.get("reserved_bytes")
    left = max(limit - reserved, 0) if limit and reserved is not None else None
    parts = [("allocated", m.get("allocated_bytes"), "#1f77b4"),
             ("reserved, not allocated", m.get("unallocated_reserved_bytes"), "#ff7f0e")]
    parts += ([("left under the allocator limit", left, "#e8f5e9")] if limit else
              [("outside PyTorch", m.get("outside_torch_bytes"), "#7f7f7f"), ("free", m.get("device_free_bytes"), "#e8f5e9")])
    x, rects = 0.0, []
    for name, value, color in parts:
        if value is None:
            continue
        w = min(value / total, 1.0 - x) * 1000
        rects.append(f'<rect x="{x * 1000:.1f}" y="0" width="{w:.1f}" height="26" fill="{color}">'
                     f'<title>{esc(name)}: {gib(value)}</title></rect>')
        x += w / 1000
    legend = " · ".join(f"{esc(n)} {gib(v)}" for n, v, _ in parts if v is not None)
    ask = ""
    if request:
        w = min(request / total, 1.0) * 1000
        ask = (f'<rect x="{max(0.0, 1000 - w):.1f}" y="30" width="{w:.1f}" height="8" fill="#c62828">'
               f'<title>asked for {gib(request)}</title></rect>')
    return (f'<svg class="membar" viewBox="0 0 1000 40" preserveAspectRatio="none" role="img" '
            f'aria-label="memory at the failure">{"".join(rects)}{ask}</svg>'
            f'<p class="why">{legend} of {"the allocator limit " if limit else ""}{gib(total)}; red: the request '
            f'({gib(request)})</p>')


def oom(summary: Dict[str, Any]) -> str:
    """One block per OOM: classification, evidence, memory at the failure, frames, ranked fixes."""
    parts = []
    for o in summary["ooms"]:
        v, m = o["verdict"], o["mem"] or {}
        mem_rows = [[esc(k.replace("_bytes", "").replace("_", " ")), gib(val) if k.endswith("_bytes") else _e(val)]
                    for k, val in m.items() if val is not None]
        evidence = "".join(f"<li>{esc(e)}</li>" for e in v["evidence"])
        frames = frames_list(o["where"], o.get("frames"))
        parts.append(
            f'<div class="oom" data-rank="{o["rank"]}"><h3>rank {o["rank"]}: out of memory at step {_e(o["step"])} '
            f'({_e(o["phase"])}), asked for {gib(o["request_bytes"])}</h3>'
            f'<p class="kind">{_e(v["kind"])}: {_e(v["summary"])}</p>'
            + (f"<p>just before: {esc(o['just_before'])}</p>" if o["just_before"] and not any(
                str(e).startswith("just before:") for e in v["evidence"]) else "")
            + (f"<h4>the card at the failure</h4>{mem_bar(m, o['request_bytes'], o['allocator_limit_bytes'])}"
               if m.get("device_total_bytes") or o["allocator_limit_bytes"] else "")
            + (f"<h4>evidence</h4><ul>{evidence}</ul>" if evidence else "")
            + _fixes(o["fixes"])
            + (f"<h4>memory at the failure</h4>{table(['field', 'value'], mem_rows, 'mem')}" if mem_rows else "")
            + (f"<h4>where</h4>{frames}" if frames else "")
            + (f"<p>memory snapshot (PyTorch memory_viz): <code>{esc(o['snapshot'])}</code></p>"
               if o["snapshot"] else "") + "</div>")
    return "".join(parts)


def hang(summary: Dict[str, Any]) -> str:
    """The watchdog's verdict, each rank's phase, and each rank's stacks as recorded."""
    h = summary["hang"]
    v = h["verdict"]
    rows = [[str(r["rank"]) + (" <b>stuck</b>" if r["rank"] in v["ranks"] else ""),
             {True: "yes", False: "<b>no</b>", None: "-"}[r["alive"]], _e(r["phase"]), _e(r["step"]),
             "-" if r["phase_since"] is None or h["t"] is None else secs(h["t"] - r["phase_since"]),
             f"<code>{esc(r['where'][-1])}</code>" if r["where"] else "-"]
            for r in h["ranks"]]
    stacks = "".join(f'<details class="stack" data-rank="{s["rank"]}"{" open" if s["rank"] in v["ranks"] else ""}>'
                     f'<summary>rank {s["rank"]}: {esc(s["main_frames"][0] if s["main_frames"] else "no frames")}'
                     f'</summary><pre>{esc(s["text"])}</pre></details>'
                     for s in summary["hang_stacks"])
    d = h.get("deadline")
    judged = f"the {esc(d['section'])} deadline {secs(d['seconds'])} ({esc(d['basis'])})" if d and d.get("section") \
        else f"timeout {secs(h['timeout_s'])}"
    return (f'<p>{_e(v["reason"])}</p>' + (f"<p>cause: {esc(v['cause'])}</p>" if v["cause"] else "")
            + f"<p>{judged}, action {_e(h['action'])}</p>"
            + table(["rank", "alive", "phase", "step", "in phase for", "waiting in"], rows, "hangranks")
            + _fixes(v["fixes"]) + _hang_extras(h) + stacks)


def _hang_extras(h: Dict[str, Any]) -> str:
    """Op-build locks and the NCCL flight recorder's reading, where the watchdog found them."""
    out = ""
    if h["locks"]:
        out += "<h4>op-build locks</h4>" + table(["lock", "age", "state", "taken by this job"], [
            [f"<code>{_e(x['path'])}</code>", secs(x["age_s"]), _e(x.get("state")),
             {True: "yes", False: "no", None: "-"}[x.get("ours")]] for x in h["locks"]], "locks")
    if h.get("builds"):
        out += "<h4>op builds the watchdog waited for</h4>" + builds_table(h["builds"])
    fr = h["flight_recorder_summary"]
    if fr and fr["text"]:
        out += f"<h4>NCCL flight recorder</h4><pre>{esc(fr['text'])}</pre>"
    elif h["flight_recorder"]:
        out += ("<p>NCCL flight recorder dumps: " + ", ".join(f"<code>{esc(f)}</code>" for f in h["flight_recorder"])
                + " (read with <code>python -m torch.distributed.flight_recorder.fr_trace</code>)</p>")
    return out


def _detail(e: Dict[str, Any]) -> str:
    kind = e.get("event")
    if kind == "start":
        dev = e.get("device") if isinstance(e.get("device"), dict) else {}
        return f"host {nz.text(e.get('host'))}, pid {nz.integer(e.get('pid'))}, device {nz.text(dev.get('name'))}"
    if kind == "init":
        return f"ZeRO stage {nz.integer(e.get('zero_stage'))}, {secs(nz.num(e.get('seconds')))}"
    if kind in ("save", "load"):
        failed = f"; failed: {nz.text(e.get('error'))}" if e.get("error") else ""
        return (f"{nz.text(e.get('tag')) or ''} {size(nz.size(e.get('bytes')))} "
                f"in {secs(nz.num(e.get('seconds')))}{failed}")
    if kind == "oom":
        return f"phase {nz.text(e.get('phase'))}, asked for {gib(nz.integer(e.get('request_bytes')))}"
    if kind == "error":
        peer = " (noticed a failed peer)" if e.get("peer_failure") is True else ""
        return f"{nz.text(e.get('type'))}: {nz.text(e.get('message'))}{peer}"
    if kind == "end":
        return f"{nz.integer(e.get('steps'))} steps"
    return ""


def event_log(records: RunRecords, t0: float) -> str:
    """Every record but the steps, across ranks, in time order (at most :data:`MAX_LOG_ROWS`)."""
    events = [(nz.num(e.get("t")), r, e) for r, rec in records.ranks.items() for e in rec.events]
    events.sort(key=lambda x: (x[0] is None, x[0] or 0.0, x[1]))
    rows = [[("-" if t is None else f"{t - t0:.2f} s"), str(r), f'<span class="ev ev-{esc(nz.text(e.get("event")))}">'
             f'{_e(nz.text(e.get("event")))}</span>', _e(nz.integer(e.get("step"))), esc(_detail(e))]
            for t, r, e in events[:MAX_LOG_ROWS]]
    more = f"<p>{len(events) - MAX_LOG_ROWS} more records not shown</p>" if len(events) > MAX_LOG_ROWS else ""
    return table(["time", "rank", "event", "step", "detail"], rows, "log") + more


def environment(summary: Dict[str, Any]) -> str:
    """Allocator settings, timeouts, launcher variables and versions that were in force."""
    env = summary.get("environment") or {}
    rows = [[esc(k), f"<code>{esc(v)}</code>"] for k, v in sorted(env.items())]
    for k in ("hang_timeout_s", "on_hang", "world_size", "signal"):
        if summary.get(k) is not None:
            rows.append([esc(k), esc(summary[k])])
    for r in summary["ranks"]:
        for k, v in sorted((r.get("allocator_settings") or {}).items()):
            rows.append([f"rank {r['rank']} allocator", f"<code>{esc(k)}={esc(v)}</code>"])
        if r.get("device"):
            d = r["device"]
            rows.append([f"rank {r['rank']} device", esc(f"{d['name']} ({d['backend']}, {gib(d['total_bytes'])})")])
    vers = [[esc(k), esc(v)] for k, v in sorted((summary.get("versions") or {}).items())]
    return (table(["setting", "value"], rows, "env") if rows else "<p>no environment recorded</p>") + \
        (table(["package", "version"], vers, "versions") if vers else "")


def builds_table(builds: List[Dict[str, Any]]) -> str:
    return table(["op", "compiling seen for", "compilers"], [[_e(b["op"]), secs(b["seconds"]),
                                                              esc(", ".join(b["compilers"][:4]))] for b in builds], "builds")


def machine(summary: Dict[str, Any]) -> Optional[str]:
    """Op builds the watchdog waited for, and op-build locks zeropilot run removed after the job."""
    out = ""
    if summary.get("builds"):
        out += "<p>op builds are progress, not a hang: the watchdog waited for these</p>" + builds_table(summary["builds"])
    if summary.get("locks_removed"):
        out += ("<p>op-build locks this job's build took and was stopped before giving back, removed at the end "
                "(the next launch builds afresh)</p>" + table(["lock", "age"], [
                    [f"<code>{_e(x['path'])}</code>", secs(x["age_s"])] for x in summary["locks_removed"]], "locks"))
    return out or None


def problems(summary: Dict[str, Any]) -> Optional[str]:
    items = "".join(f"<li>{esc(p)}</li>" for p in summary.get("problems") or [])
    return f"<ul>{items}</ul>" if items else None


def nodes(summary: Dict[str, Any]) -> Optional[str]:
    """A job across nodes: one row per node, how clocks were aligned, findings; the checkpoint check."""
    n, ck = summary.get("nodes"), summary.get("checkpoint")
    if not n and not ck:
        return None
    out = ""
    if n:
        rows = [[esc(x["node"]), esc(", ".join(x["hostnames"])) or "-", esc(", ".join(map(str, x["ranks"]))),
                 _e(x["steps"]), gib(x["outside_torch_bytes"]), gib(x["host_rss_peak_bytes"]),
                 gib(x["host_rss_sum_bytes"]), _e(x["exit_code"]),
                 esc(", ".join(x["dirs"])) or "-"] for x in n["list"]]
        out += table(["node", "host", "ranks", "steps", "outside torch", "host RSS per rank", "host RSS, node",
                      "exit", "directory"], rows, "nodes")
        clock = n.get("clock") or {}
        if clock.get("how"):
            out += f"<p>clocks: {esc(clock['how'])}</p>"
        items = "".join(f"<li>{esc(f['message'])}</li>" for f in n.get("findings") or [])
        out += f"<ul>{items}</ul>" if items else ""
    if ck:
        probs = "".join(f"<li>{esc(p)}</li>" for p in ck.get("problems") or [])
        out += (f"<h3>checkpoint <code>{_e(ck['path'])}</code>: {esc(str(ck['verdict']).upper())}</h3>"
                f"<p>saved by {_e(ck.get('world_size'))} ranks; resume on: "
                f"{_e(ck.get('resume_on') or ck.get('resumable'))}</p>" + (f"<ul>{probs}</ul>" if probs else ""))
    return out


def stragglers(summary: Dict[str, Any]) -> Optional[str]:
    """Ranks whose own share of the step stayed above their peers' (``runlog.stragglers``)."""
    from zeropilot.runlog.stragglers import describe, evidence

    rows = []
    for x in summary.get("stragglers") or []:
        place = x.get("place") or {}
        rows.append([str(x["rank"]), "-" if x["ratio"] is None else f"{x['ratio']:.2f}×",
                     f"{x['steps']} ({x['first_step']}-{x['last_step']})", evidence(x),
                     secs(x["own_seconds"]), secs(x["peers_seconds"]), secs(x["excess_seconds"]),
                     _e(place.get("host")), _e(place.get("node_rank")), _e(place.get("local_rank")),
                     _e(place.get("gpu"))])
    found = (summary.get("stragglers") or []) + (summary.get("gpu_stragglers") or [])
    if not found:
        return None
    words = "".join(f"<li>{esc(describe(x))}</li>" for x in found)
    return f"<ul>{words}</ul>" + (table(["rank", "ratio", "steps in a row", "evidence", "own", "peers' median",
                                          "others wait", "host", "node", "local rank", "GPU"], rows, "stragglers")
                                   if rows else "")


def deadlines(summary: Dict[str, Any]) -> Optional[str]:
    """Each section's durations and the watchdog's deadline for it (``runlog.timeouts``)."""
    t = summary.get("timeouts") or {}
    secs_seen = t.get("sections") or {}
    dl = t.get("deadlines") or {}
    names = [n for n in ("startup", "first_step", "step", "idle", "save", "load") if n in secs_seen or n in dl]
    if not names:
        return None
    rows = []
    for n in names:
        seen, d = secs_seen.get(n) or {}, dl.get(n) or {}
        rows.append([esc(n.replace("_", " ")), _e(seen.get("count")), secs(seen.get("median_s")),
                     secs(seen.get("longest_s")), secs(seen.get("cut_s")), secs(d.get("seconds")), _e(d.get("source")),
                     _e(d.get("basis"))])
    runs = f", runs: {esc(', '.join(t['runs']))}" if t.get("runs") else ""
    head = ["section", "seen", "median", "longest", "stopped at", "deadline", "source", "set by"]
    return f"<p>durations from {esc(t.get('source'))}{runs}</p>" + table(head, rows, "deadlines")


def step_time(summary: Dict[str, Any]) -> Optional[str]:
    """The step split into the phases the guard sees, beside the plan's prediction (``runlog.timing``): the text
    report's table and lines (``runlog.text``), as a table and paragraphs."""
    from zeropilot.runlog.text import batch_text, time_findings, time_rows
    from zeropilot.runlog.timing import left_out_text

    t = summary.get("time")
    if not t:
        return None
    m = t["measured"]
    if m["step_s"] is None:
        return f"<p>{esc(m['reason'])}</p>"
    head = f"<p>medians of {m['steps']} steady steps (left out: {esc(left_out_text(m))})"
    head += (f"; {esc(batch_text(m))}" if batch_text(m) else "") + "</p>"
    rows = time_rows(summary)
    pred = t.get("predicted") is not None
    differ = sorted(rows[0][3])
    cells = [[esc(label), secs(meas)] + ([secs(guess)] if pred else []) + [secs(per_rank[r]) for r in differ]
             for label, meas, guess, per_rank in rows]
    if t.get("ratio") is not None:
        cells[0][2] += f" <span class=why>(measured {t['ratio']:.2f}×)</span>"
    body = table(["per optimizer step", "measured"] + (["predicted"] if pred else [])
                 + [f"rank {r}" for r in differ], cells, "time")
    notes = [f"{h['steps']} step(s) holding a {name}: {secs(h['median_s'])} of {name} each (median), left out above"
             for name, h in m["held"].items()]
    notes += ([m["reason"]] if m.get("reason") else []) + time_findings(summary)
    items = "".join(f"<li>{esc(n)}</li>" for n in notes)
    return head + body + (f"<ul>{items}</ul>" if items else "")
