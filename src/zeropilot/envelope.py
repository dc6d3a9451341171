"""The JSON every command prints: one versioned envelope, its schema names, and the text form.

Every command's JSON starts with ``{"schema": "zeropilot.<command>/<major>", "tool": {...}}``; the major
number changes only when a field is removed or changes meaning (adding fields does not). The schemas are
documented in ``docs/json-schema.md``. Commands build theirs with :func:`envelope`.
"""

from __future__ import annotations

import json
from typing import Any, Dict

from zeropilot import __version__

CHECK_SCHEMA = "zeropilot.check/1"
RULES_SCHEMA = "zeropilot.rules/1"
EXPLAIN_SCHEMA = "zeropilot.explain/1"
TOP_SCHEMA = "zeropilot.top/1"
PLAN_SCHEMA = "zeropilot.plan/1"
CALIBRATE_SCHEMA = "zeropilot.calibrate/1"
CKPT_INSPECT_SCHEMA = "zeropilot.ckpt-inspect/1"
CKPT_EXPORT_SCHEMA = "zeropilot.ckpt-export/1"
CKPT_VERIFY_SCHEMA = "zeropilot.ckpt-verify/1"
CKPT_UNIVERSAL_SCHEMA = "zeropilot.ckpt-universal/1"
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
