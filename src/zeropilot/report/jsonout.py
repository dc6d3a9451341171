"""JSON output: one versioned envelope shared by every command, and the ``check`` payload.

Every command's JSON starts with ``{"schema": "zeropilot.<command>/<major>", "tool": {...}}``; the major
number changes only when a field is removed or changes meaning (adding fields does not). The schemas are
documented in ``docs/json-schema.md``. Other commands build theirs with :func:`envelope`.
"""

from __future__ import annotations

import json
from typing import Any, Dict

from zeropilot import __version__
from zeropilot.report import CheckResult

CHECK_SCHEMA = "zeropilot.check/1"
RULES_SCHEMA = "zeropilot.rules/1"
PLAN_SCHEMA = "zeropilot.plan/1"
CALIBRATE_SCHEMA = "zeropilot.calibrate/1"
CKPT_INSPECT_SCHEMA = "zeropilot.ckpt-inspect/1"
# ``repro`` and ``report`` (also printed by ``run --format json``) name theirs where their documents are built:
# ``zeropilot.repro.verdict.SCHEMA`` and ``zeropilot.runlog.summary.REPORT_SCHEMA`` / ``COMPARE_SCHEMA``.


def envelope(schema: str, payload: Dict[str, Any]) -> Dict[str, Any]:
    """``{"schema": schema, "tool": {"name", "version"}, **payload}``.

    Args:
        schema: ``zeropilot.<command>/<major>``.
        payload: the command's own fields; they must not use the keys ``schema`` or ``tool``.
    """
    if "schema" in payload or "tool" in payload:
        raise ValueError("payload keys 'schema' and 'tool' belong to the envelope")
    return {"schema": schema, "tool": {"name": "zeropilot", "version": __version__}, **payload}


def rewrap(document: Dict[str, Any]) -> Dict[str, Any]:
    """A document that already names its ``schema`` (a repro verdict, a run report), in the envelope."""
    payload = dict(document)
    return envelope(payload.pop("schema"), payload)


def dumps(document: Dict[str, Any]) -> str:
    """The JSON text every command prints: indented, UTF-8 kept, one newline at the end."""
    return json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n"


def check_payload(result: CheckResult) -> Dict[str, Any]:
    """The ``zeropilot.check/1`` document (see ``docs/json-schema.md``)."""
    ws = result.world_size
    return envelope(CHECK_SCHEMA, {
        "findings": [f.as_dict() for f in result.findings],
        "versions": result.versions.as_dict(),
        "world_size": {"value": ws.value, "reason": ws.reason,
                       "file": str(ws.file) if ws.file else None, "line": ws.line},
        "summary": result.summary(),
        "files": list(result.files),
        "read_errors": [{"file": e.path, "line": e.line, "col": e.col, "message": e.reason}
                        for e in result.read_errors],
        "skipped": [{"file": file, "reason": why} for file, why in result.skipped],
        "notices": list(result.notices),
    })


def render(result: CheckResult) -> str:
    return dumps(check_payload(result))
