"""The attempts of a ``zeropilot run --heal`` (``heal.json``) in the report: normalized, and as a timeline.

``heal.json`` is written by :mod:`zeropilot.heal.record`; a run directory may come from a stranger, so the report
copies only the documented keys, with bounded sizes (:mod:`zeropilot.runlog.normalize`). The report's ``heal`` is
null for a run without healing.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from zeropilot.runlog import normalize as nz

MAX_ATTEMPTS = 64
MAX_DIFF = 20000


def _d(value: Any) -> Dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _failure(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    return {"kind": nz.text(value.get("kind")), "class": nz.text(value.get("class")),
            "step": nz.integer(value.get("step")), "ranks": nz.ints(value.get("ranks")),
            "reason": nz.text(value.get("reason")), "restart": _flag(value.get("restart")),
            "why": nz.text(value.get("why"))}


def _flag(value: Any) -> Optional[bool]:
    return value if isinstance(value, bool) else None


def _fix(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    files = [{"original": nz.text(_d(f).get("original")), "copy": nz.text(_d(f).get("copy"))}
             for f in (value.get("files") if isinstance(value.get("files"), list) else [])[:nz.MAX_ITEMS]]
    diff = value.get("diff")
    return {"key": nz.text(value.get("key")), "fix": nz.text(value.get("fix")),
            "settings": nz.texts(value.get("settings")), "files": files,
            "diff": diff[:MAX_DIFF] if isinstance(diff, str) else None, "passed": _passed(value.get("passed"))}


def _passed(value: Any) -> List[Dict[str, Any]]:
    items = value if isinstance(value, list) else []
    return [{"fix": nz.text(_d(p).get("fix")), "key": nz.text(_d(p).get("key")), "why": nz.text(_d(p).get("why"))}
            for p in items[:nz.MAX_ITEMS]]


def _candidate(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    return {"path": nz.text(value.get("path")), "tag": nz.text(value.get("tag")), "step": nz.integer(value.get("step")),
            "why_not": nz.text(value.get("why_not"))}


def _resume(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    skipped = value.get("skipped") if isinstance(value.get("skipped"), list) else []
    return {"chosen": _candidate(value.get("chosen")), "how": nz.text(value.get("how")),
            "skipped": [c for c in (_candidate(s) for s in skipped[:nz.MAX_ITEMS]) if c is not None]}


def _resumed(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    return {"really": _flag(value.get("really")), "loaded_step": nz.integer(value.get("loaded_step")),
            "first_step": nz.integer(value.get("first_step")), "note": nz.text(value.get("note"))}


def _pair(value: Any) -> List[Optional[int]]:
    items = value if isinstance(value, list) else []
    return [nz.integer(v) for v in items[:2]]


def _shrink(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    ck = _d(value.get("checkpoint"))
    return {"nodes_lost": nz.ints(value.get("nodes_lost")), "ranks_lost": nz.ints(value.get("ranks_lost")),
            **{k: _pair(value.get(k)) for k in ("world_size", "micro_batch", "grad_accum", "samples_per_step")},
            "from": nz.text(ck.get("from")), "tag": nz.text(ck.get("tag")), "to": nz.text(ck.get("to")),
            "verdict": nz.text(ck.get("verdict")), "settings": nz.texts(value.get("settings"))}


def _node_wait(value: Any) -> Optional[Dict[str, Any]]:
    if not isinstance(value, dict):
        return None
    nodes = value.get("nodes")
    return {"nodes": nz.ints(nodes) if isinstance(nodes, list) else None,
            "timeout_s": nz.integer(value.get("timeout_s")), "why": nz.text(value.get("why")),
            "what": nz.text(value.get("what"))}


def _attempt(value: Any) -> Dict[str, Any]:
    a = _d(value)
    return {"attempt": nz.integer(a.get("attempt")), "dir": nz.text(a.get("dir")),
            "command": nz.texts(a.get("command")), "started_at": nz.num(a.get("started_at")),
            "ended_at": nz.num(a.get("ended_at")), "exit_code": nz.integer(a.get("exit_code")),
            "failure": _failure(a.get("failure")), "fix": _fix(a.get("fix")), "resume": _resume(a.get("resume")),
            "resumed": _resumed(a.get("resumed")), "steps_redone": nz.integer(a.get("steps_redone")),
            "backoff_s": nz.num(a.get("backoff_s")), "shrink": _shrink(a.get("shrink")),
            "node_wait": _node_wait(a.get("node_wait"))}


def section(doc: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The report's ``heal``: the outcome and every attempt, or None without a heal record."""
    if not isinstance(doc, dict):
        return None
    outcome = _d(doc.get("outcome"))
    attempts = doc.get("attempts") if isinstance(doc.get("attempts"), list) else []
    return {"status": nz.text(outcome.get("status")), "why": nz.text(outcome.get("why")),
            "exit_code": nz.integer(outcome.get("exit_code")), "passed": _passed(outcome.get("passed")),
            "restarts": nz.integer(doc.get("restarts")),
            "allow": nz.texts(doc.get("allow")), "attempts": [_attempt(a) for a in attempts[:MAX_ATTEMPTS]]}


# -- text -----------------------------------------------------------------------------------------------------

def _failure_words(f: Optional[Dict[str, Any]]) -> str:
    if f is None:
        return "running"
    if f["kind"] == "ok":
        return "OK: every rank finished"
    what = (f["kind"] or "?").upper() + (f" ({f['class']})" if f.get("class") else "")
    at = f" after step {f['step']}" if f.get("step") is not None else ""
    return f"{what}{at}: {f.get('reason') or ''}".rstrip(": ")


def _resume_words(a: Dict[str, Any]) -> List[str]:
    r = a.get("resume")
    if r is None:
        return []
    c = r.get("chosen")
    redone = a.get("steps_redone")
    line = ("resumed from " + (f"{c['path']} (step {c['step']})" if c else "nothing: no complete checkpoint")
            + (f", {redone} step(s) redone" if redone is not None else ""))
    done = a.get("resumed") or {}
    if done.get("note"):
        line += f"; {done['note']}"
    out = [line]
    out += [f"skipped {s['path']} ({s['tag']}): {s['why_not']}" for s in r.get("skipped") or []]
    return out


def _shrink_words(a: Dict[str, Any]) -> List[str]:
    s, w = a.get("shrink"), a.get("node_wait")
    if w:
        return [f"waits for the lost node: {w.get('what') or ''} ({w.get('why') or ''})"]
    if not s:
        return []
    (m, m2), (g, g2), (r, r2), (n, n2) = [(s[k] + [None, None])[:2] for k in ("micro_batch", "grad_accum",
                                                                             "world_size", "samples_per_step")]
    return [f"shrunk: node {', '.join(map(str, s['nodes_lost']))} lost: {r} -> {r2} ranks, micro batch {m} -> {m2}, "
            f"gradient accumulation {g} -> {g2} ({n} -> {n2} samples per step); {s.get('verdict') or ''}"]


def timeline(heal: Dict[str, Any], clean: Any) -> List[str]:
    """The heal section as report lines (``clean``: the terminal-safe text function)."""
    status = clean(heal.get("status") or "running").upper().replace("_", " ")
    lines = [f"heal: {status}: {clean(heal.get('why') or '')}".rstrip(": ")]
    for a in heal["attempts"]:
        head = f"  attempt {a['attempt']} ({clean(a['dir'] or '.')}): {clean(_failure_words(a['failure']))}"
        lines.append(head)
        fix = a.get("fix")
        if fix:
            lines.append(f"    fix applied: {clean(fix['fix'] or fix['key'] or '')}"
                         + (f" ({clean('; '.join(fix['settings']))})" if fix.get("settings") else ""))
            lines += [f"      on a copy: {clean(f['copy'])} (of {clean(f['original'] or '?')})" for f in fix["files"]
                      if f.get("copy")]
        lines += [f"    {clean(w)}" for w in _shrink_words(a) + _resume_words(a)]
        f = a.get("failure") or {}
        if f.get("kind") not in (None, "ok") and f.get("why"):
            then = "then" if f.get("kind") == "preempted" else "restart" if f.get("restart") else "no restart"
            lines.append(f"    {then}: {clean(f['why'])}")
    lines += [f"  not applied: {clean(p['fix'] or p['key'] or '?')}: {clean(p['why'] or '')}"
              for p in heal.get("passed") or []]
    return lines
