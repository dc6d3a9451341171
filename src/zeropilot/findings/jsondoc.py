"""``check``'s JSON document, ``zeropilot.check/1`` (see ``docs/json-schema.md``), in the shared envelope."""

from __future__ import annotations

from typing import Any, Dict

from zeropilot.envelope import CHECK_SCHEMA, dumps, envelope
from zeropilot.findings import CheckResult


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
