"""JSON output: ``{findings: [{code, severity, message, file, key, line, fix}], versions, summary}``."""

from __future__ import annotations

import json

from zeropilot import __version__
from zeropilot.report import CheckResult


def render(result: CheckResult) -> str:
    ws = result.world_size
    payload = {
        "tool": {"name": "zeropilot", "version": __version__},
        "findings": [f.as_dict() for f in result.findings],
        "versions": result.versions.as_dict(),
        "world_size": {"value": ws.value, "reason": ws.reason,
                       "file": str(ws.file) if ws.file else None, "line": ws.line},
        "summary": result.summary(),
        "read_errors": [{"file": e.path, "line": e.line, "col": e.col, "message": e.reason}
                        for e in result.read_errors],
    }
    return json.dumps(payload, indent=2) + "\n"
